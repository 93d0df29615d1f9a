//! `/v1/embeddings` runs on a thread of its own with its own context (an
//! [`Embedder`]), so embedding requests neither block the runtime nor take
//! cells from the generation engine. A request whose client goes away is
//! skipped if it has not started, and its decode is aborted if it has: a
//! large batch (2,048 long texts can take many minutes) does not keep
//! running for nobody while the next requests wait.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};

use llamacpp::embed::{EmbedParams, Embedder};
use llamacpp::{AbortHandle, Error, Model, Pooling};
use tokio::sync::oneshot;

/// Vectors in input order and the tokens they took.
pub type Embedded = Result<(Vec<Vec<f32>>, usize), Error>;

struct Job {
    id: u64,
    texts: Vec<String>,
    reply: oneshot::Sender<Embedded>,
    /// Set when the request's handler is dropped (its client went away).
    gone: Arc<AtomicBool>,
}

/// Which job the thread is embedding, and the abort handle of its context:
/// under one lock, so that a departing client aborts its own job and never
/// the next one.
#[derive(Debug)]
struct Running {
    job: Mutex<Option<u64>>,
    abort: AbortHandle,
}

/// The handle of the embedding thread.
#[derive(Debug, Clone)]
pub struct EmbeddingWorker {
    jobs: mpsc::Sender<Job>,
    running: Arc<Running>,
    next_id: Arc<AtomicU64>,
}

impl EmbeddingWorker {
    /// Starts the thread; its embedder uses `pooling` and L2-normalises
    /// (as OpenAI's embeddings are).
    pub fn start(model: Arc<Model>, pooling: Pooling, threads: i32) -> Result<EmbeddingWorker, Error> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("embeddings".into())
            .spawn(move || {
                let params =
                    EmbedParams::default().pooling(pooling).normalize(true).n_threads(threads).n_threads_batch(threads);
                let mut embedder = match Embedder::new(&model, &params) {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let running = Arc::new(Running { job: Mutex::new(None), abort: embedder.context_mut().abort_handle() });
                let _ = ready_tx.send(Ok(running.clone()));
                for job in rx {
                    {
                        let mut current = running.job.lock().unwrap_or_else(PoisonError::into_inner);
                        if job.gone.load(Ordering::Acquire) {
                            ::metrics::counter!("llama_server_embedding_requests_abandoned_total").increment(1);
                            continue;
                        }
                        running.abort.reset();
                        *current = Some(job.id);
                    }
                    ::metrics::gauge!("llama_server_embedding_running").set(1.0);
                    let result = embed(&mut embedder, &job.texts);
                    {
                        let mut current = running.job.lock().unwrap_or_else(PoisonError::into_inner);
                        *current = None;
                        running.abort.reset();
                    }
                    ::metrics::gauge!("llama_server_embedding_running").set(0.0);
                    if job.gone.load(Ordering::Acquire) {
                        ::metrics::counter!("llama_server_embedding_requests_abandoned_total").increment(1);
                    }
                    let _ = job.reply.send(result);
                }
            })
            .map_err(|e| Error::InvalidArgument(format!("cannot start the embeddings thread: {e}")))?;
        let running = ready_rx.recv().map_err(|_| Error::InvalidArgument("the embeddings thread died".into()))??;
        Ok(EmbeddingWorker { jobs, running, next_id: Arc::new(AtomicU64::new(0)) })
    }

    /// Embeds `texts` on the thread. Dropping the future (the client went
    /// away) abandons the job: skipped if queued, aborted if running.
    pub async fn embed(&self, texts: Vec<String>) -> Embedded {
        let (reply, rx) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let gone = Arc::new(AtomicBool::new(false));
        let mut abandon = Abandon { id, gone: gone.clone(), running: &self.running, armed: true };
        self.jobs
            .send(Job { id, texts, reply, gone })
            .map_err(|_| Error::EngineStopped("the embeddings thread stopped".into()))?;
        let result = rx.await;
        abandon.armed = false;
        result.map_err(|_| Error::EngineStopped("the embeddings thread stopped".into()))?
    }
}

/// Tokenizes each text once (the count is the usage) and embeds them.
fn embed(embedder: &mut Embedder<'_>, texts: &[String]) -> Embedded {
    let tokens = texts.iter().map(|t| embedder.tokenize(t)).collect::<Result<Vec<_>, Error>>()?;
    let count = tokens.iter().map(Vec::len).sum();
    Ok((embedder.embed_tokens(&tokens)?, count))
}

/// Marks its job abandoned when the request's future is dropped before the
/// reply came (`armed`), and aborts the decode if that job is the one
/// running.
struct Abandon<'a> {
    id: u64,
    gone: Arc<AtomicBool>,
    running: &'a Running,
    armed: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.gone.store(true, Ordering::Release);
        let current = self.running.job.lock().unwrap_or_else(PoisonError::into_inner);
        if *current == Some(self.id) {
            self.running.abort.abort();
        }
    }
}
