//! `/v1/embeddings` runs on a thread of its own with its own context (an
//! [`Embedder`]), so embedding requests neither block the runtime nor take
//! cells from the generation engine.

use std::sync::Arc;
use std::sync::mpsc;

use llama::embed::{EmbedParams, Embedder};
use llama::{Error, Model, Pooling};
use tokio::sync::oneshot;

/// Vectors in input order and the tokens they took.
pub type Embedded = Result<(Vec<Vec<f32>>, usize), Error>;

struct Job {
    texts: Vec<String>,
    reply: oneshot::Sender<Embedded>,
}

/// The handle of the embedding thread.
#[derive(Debug, Clone)]
pub struct EmbeddingWorker {
    jobs: mpsc::Sender<Job>,
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
                    Ok(e) => {
                        let _ = ready_tx.send(Ok(()));
                        e
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                for job in rx {
                    let result = (|| {
                        let tokens = job.texts.iter().map(|t| embedder.tokenize(t).map(|v| v.len())).sum::<Result<
                            usize,
                            Error,
                        >>(
                        )?;
                        Ok((embedder.embed(&job.texts)?, tokens))
                    })();
                    let _ = job.reply.send(result);
                }
            })
            .map_err(|e| Error::InvalidArgument(format!("cannot start the embeddings thread: {e}")))?;
        ready_rx.recv().map_err(|_| Error::InvalidArgument("the embeddings thread died".into()))??;
        Ok(EmbeddingWorker { jobs })
    }

    /// Embeds `texts` on the thread.
    pub async fn embed(&self, texts: Vec<String>) -> Embedded {
        let (reply, rx) = oneshot::channel();
        self.jobs
            .send(Job { texts, reply })
            .map_err(|_| Error::EngineStopped("the embeddings thread stopped".into()))?;
        rx.await.map_err(|_| Error::EngineStopped("the embeddings thread stopped".into()))?
    }
}
