//! Many concurrent requests over one context: continuous batching with
//! chunked prefill under a token budget, a shared KV pool with admission
//! and preemption, a prefix cache shared across requests, blocking and
//! async streams, and metrics.
//!
//! [`Engine::start`] spawns one worker thread that owns a [`Context`]
//! whose KV cache is the pool every sequence shares (`kv_unified`). Each
//! step the worker makes one [`Context::decode`] call holding one token of
//! every generating sequence first, then prefill chunks of the prompts
//! waiting for their first token, sharing the rest of the step's budget
//! between them, shortest first with a guaranteed share for the oldest (so
//! a long prompt never holds up a short one, and a running stream waits at
//! most one step). A finished sequence's cells
//! stay in the pool as a cached prefix: a later prompt that starts with
//! the same tokens (or with those of a running sequence) shares those
//! cells and prefills only the rest; a prompt whose prefix another
//! sequence is still prefilling waits for those cells instead of computing
//! them again (requests that arrive together with one system prompt
//! compute it once). When the pool is full, cached
//! prefixes are evicted (least recently used first) and then the
//! lowest-priority, most recently admitted sequence is preempted: its
//! cells are saved to host memory (llama.cpp's sequence state) and freed,
//! and it is requeued with its sampler, detokenizer and stop-string state;
//! at readmission the cells are restored (or, for a sequence whose cells
//! were mostly shared, recomputed from its prompt and the tokens it has
//! generated), so it continues as it would have.
//!
//! ```no_run
//! use std::sync::Arc;
//! use llamacpp::engine::{Engine, EngineConfig, Event, Request};
//! use llamacpp::{Model, ModelParams};
//!
//! # fn main() -> Result<(), llamacpp::Error> {
//! let model = Arc::new(Model::load("gemma-3-270m-q4_k_m.gguf", &ModelParams::default())?);
//! let engine = Engine::start(model, EngineConfig::default())?;
//! let requests = ["The capital of France is", "The capital of Japan is"]
//!     .map(|p| engine.submit(Request::text(p).max_tokens(16)));
//! for completion in requests {
//!     for event in completion? {
//!         match event {
//!             Event::Piece(piece) => print!("{}", piece.text),
//!             Event::Done(done) => println!("\n[{}; {:?}]", done.reason, done.usage),
//!         }
//!     }
//! }
//! println!("{:?}", engine.stats());
//! # Ok(())
//! # }
//! ```
//!
//! # Metrics
//!
//! [`Engine::stats`] returns a snapshot. The engine also reports to the
//! [`metrics`](https://docs.rs/metrics) facade: without an installed
//! recorder these calls do nothing; an application that installs one (for
//! example `metrics-exporter-prometheus`) gets these series:
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `llama_engine_requests_total{reason}` | counter | finished requests by finish reason (`length`, `stop`, `eog`, `cancelled`, `context_full`, `shutdown`, `failed`) |
//! | `llama_engine_prompt_tokens_total` | counter | prompt tokens of admitted requests |
//! | `llama_engine_prompt_tokens_evaluated_total` | counter | prompt tokens decoded (not shared; recomputation included) |
//! | `llama_engine_prefix_hit_tokens_total` | counter | prompt tokens shared from cached or running sequences |
//! | `llama_engine_completion_tokens_total` | counter | sampled tokens |
//! | `llama_engine_preemptions_total` | counter | sequences preempted for room |
//! | `llama_engine_steps_total` | counter | decode steps |
//! | `llama_engine_draft_tokens_total`, `llama_engine_draft_tokens_accepted_total` | counter | speculative draft tokens decoded, and confirmed by the sampler |
//! | `llama_engine_running`, `llama_engine_waiting` | gauge | requests |
//! | `llama_engine_kv_cells_used`, `llama_engine_kv_cells_total`, `llama_engine_cached_prefix_cells` | gauge | KV pool |
//! | `llama_engine_ttft_seconds`, `llama_engine_inter_token_seconds`, `llama_engine_e2e_seconds`, `llama_engine_queue_seconds` | histogram | latencies |
//!
//! [`Context`]: crate::Context
//! [`Context::decode`]: crate::Context::decode

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::llama::context::PerfCounters;
use crate::llama::model::Model;
pub use crate::text::generate::Usage;

mod chat;
mod completion;
mod config;
mod kv;
mod media;
mod metrics;
mod request;
mod scheduler;
mod step_cost;
mod worker;

pub use crate::sampling::sampler::{MAX_TOP_LOGPROBS, SamplingParams};
pub use crate::sampling::speculative::Speculation;
pub use chat::ChatCompletion;
pub use completion::{Answer, Completion, Event, Finish, Piece, Timings, TokenLogprob};
pub use config::EngineConfig;
pub use metrics::Latency;
pub use request::{Prompt, Request};

/// A snapshot of the engine ([`Engine::stats`]).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct EngineStats {
    /// Requests admitted into the pool (prefilling or generating).
    pub running: usize,
    /// Requests waiting for admission (including preempted ones).
    pub waiting: usize,
    /// Sequences preempted for room so far.
    pub preemptions: u64,
    /// KV cells in use (shared cells counted once).
    pub kv_cells_used: usize,
    /// KV cells in the pool.
    pub kv_cells_total: usize,
    /// Cells held by cached prefixes (some may be shared with running
    /// sequences).
    pub cached_prefix_cells: usize,
    /// Cached prefixes.
    pub cached_prefixes: usize,
    /// Admissions that looked for a shared prefix.
    pub prefix_lookups: u64,
    /// Prompt tokens shared instead of prefilled.
    pub prefix_hit_tokens: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Prompt tokens decoded (including recomputation after preemption).
    pub prompt_tokens_evaluated: u64,
    /// Tokens sampled.
    pub completion_tokens: u64,
    /// Draft tokens decoded for verification (speculative decoding).
    pub draft_tokens: u64,
    /// Of those, the ones the sampler confirmed.
    pub draft_tokens_accepted: u64,
    /// Requests finished (any reason).
    pub requests_finished: u64,
    /// Decode steps.
    pub steps: u64,
    /// llama.cpp's own counters of the engine's context (a step with
    /// more than one token counts as prompt evaluation there).
    pub perf: PerfCounters,
    /// Submit to first token.
    pub time_to_first_token: Latency,
    /// Between consecutive tokens of a request.
    pub inter_token: Latency,
    /// Submit to finish.
    pub end_to_end: Latency,
    /// Submit to admission.
    pub queue: Latency,
}

/// What the handles and the worker share.
#[derive(Debug, Default)]
struct Shared {
    /// Requests counted against `max_queue`: submitted, not yet admitted.
    queued: AtomicUsize,
    /// Decode steps so far.
    steps: AtomicU64,
    /// Why the engine stopped, once it has.
    stopped: Mutex<Option<worker::Exit>>,
    stats: Mutex<metrics::Published>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The data under these locks is plain counters, valid at every point.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long [`Engine::shutdown`] waits for the sampling helpers once every
/// request has ended, before it leaves the worker thread to finish alone.
const HELPER_GRACE: Duration = Duration::from_secs(1);

/// The part of the handle whose drop stops the worker.
#[derive(Debug)]
struct Handle {
    model: Arc<Model>,
    commands: Mutex<Option<mpsc::Sender<worker::Submission>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Disconnected once the worker has ended every request.
    served: Mutex<Option<mpsc::Receiver<()>>>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    pool: usize,
    max_queue: usize,
    /// The engine's default for requests that do not choose.
    speculation: Option<crate::sampling::speculative::Speculation>,
    /// The projector, when the engine takes media.
    media: Option<Arc<media::EngineMedia>>,
    /// The context's micro-batch.
    n_ubatch: usize,
}

impl Handle {
    fn stop(&self) {
        lock(&self.shared.stopped).get_or_insert(worker::Exit::Shutdown);
        drop(lock(&self.commands).take());
        let thread = lock(&self.thread).take();
        if let Some(thread) = thread
            && thread.thread().id() != std::thread::current().id()
        {
            // The worker ends every request with `Shutdown` after its
            // current step; a panic there was already turned into failed
            // requests.
            if let Some(served) = lock(&self.served).take() {
                let _ = served.recv();
            }
            // Then it waits for the sampling helpers: one inside a long
            // grammar sample (which llama.cpp cannot interrupt) would hold
            // the shutdown for as long. It gets a moment; after that the
            // thread is left to finish on its own (it owns its `Arc` of the
            // model, so nothing it uses goes away).
            let deadline = Instant::now() + HELPER_GRACE;
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if thread.is_finished() {
                let _ = thread.join();
            } else {
                log::warn!(
                    "engine: a sampling helper is still inside a constrained sample; shutdown does not wait for it"
                );
            }
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A continuous-batching inference engine: a cheap, cloneable handle to
/// one worker thread that owns a context over an `Arc<Model>`.
///
/// The worker stops when the last handle is dropped or on
/// [`Engine::shutdown`]; requests still in flight then finish with
/// [`FinishReason::Shutdown`](crate::generate::FinishReason::Shutdown).
#[derive(Clone, Debug)]
pub struct Engine {
    handle: Arc<Handle>,
}

/// The most cells whose context fits `budget` with `config`'s other
/// settings.
fn pool_for_budget(model: &Model, config: &EngineConfig, budget: &crate::llama::plan::MemoryBudget) -> Result<u32> {
    let planner = crate::llama::plan::Planner::for_model(model)?;
    let n_seq = config.max_running + config.max_cached_prefixes;
    let fit = planner.fit(&config.context_params(), budget, crate::llama::plan::FitGoal::MaxContext { n_seq })?;
    Ok(fit.plan.n_ctx)
}

impl Engine {
    /// Starts the worker thread and creates its context: `n_ctx` cells
    /// shared by `max_running + max_cached_prefixes` sequences
    /// (`kv_unified`, full-size sliding-window cache).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for inconsistent settings, naming the
    /// setting (see [`EngineConfig`]: `max_running` 0 or above `n_batch`,
    /// `max_running + max_cached_prefixes` above `n_batch` or the 256
    /// sequences of a context, a share outside [0, 1], an
    /// `admission_reserve` above the pool); [`Error::InvalidArgument`] for
    /// models that cannot generate this way (vocabulary-only, encoder,
    /// encoder-decoder); [`Error::ContextCreate`] and the other errors of
    /// [`Context::new`](crate::Context::new); with a memory budget,
    /// [`Error::DoesNotFit`] when not even 256 cells fit it, and the errors of
    /// [`Planner::for_model`](crate::plan::Planner::for_model) (the model's
    /// file is read again).
    pub fn start(model: Arc<Model>, mut config: EngineConfig) -> Result<Engine> {
        if model.is_vocab_only() || !model.has_decoder() || model.has_encoder() {
            return Err(Error::InvalidArgument(
                "the engine generates with decoder-only models; this one is vocabulary-only, an encoder or \
                 encoder-decoder model"
                    .into(),
            ));
        }
        if let Some(budget) = config.memory_budget.clone() {
            // The other settings first (the pool size is not known yet),
            // then all of them with the pool the budget gives.
            config.clone().n_ctx(u32::MAX).check()?;
            config.context.n_ctx = pool_for_budget(&model, &config, &budget)?;
        }
        config.check()?;
        if config.speculation.is_some() {
            request::check_can_speculate(&model)?;
        }
        let media = media::EngineMedia::load(&model, &config.media)?;
        let shared = Arc::new(Shared::default());
        let (commands, inbox) = mpsc::channel();
        let (ready_tx, ready) = mpsc::sync_channel(1);
        let (served_tx, served) = mpsc::channel();
        let thread = {
            let model = Arc::clone(&model);
            let shared = Arc::clone(&shared);
            let config = config.clone();
            let media = media.clone();
            std::thread::Builder::new()
                .name("llama-engine".into())
                .spawn(move || worker::run(&model, &config, media, inbox, &shared, ready_tx, served_tx))
                .map_err(|e| Error::InvalidArgument(format!("cannot spawn the engine thread: {e}")))?
        };
        let pool = match ready.recv() {
            Ok(Ok(pool)) => pool,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(Error::EngineStopped("the worker failed while starting".into()));
            }
        };
        Ok(Engine {
            handle: Arc::new(Handle {
                model,
                commands: Mutex::new(Some(commands)),
                thread: Mutex::new(Some(thread)),
                served: Mutex::new(Some(served)),
                shared,
                next_id: AtomicU64::new(0),
                pool,
                max_queue: config.max_queue,
                speculation: config.speculation,
                media,
                n_ubatch: config.context.n_ubatch.min(config.context.n_batch) as usize,
            }),
        })
    }

    /// The model the engine runs.
    pub fn model(&self) -> &Arc<Model> {
        &self.handle.model
    }

    /// KV cells in the pool.
    pub fn pool_cells(&self) -> usize {
        self.handle.pool
    }

    /// Submits a request; its output arrives through the returned
    /// [`Completion`].
    ///
    /// The request is tokenized and checked here, so everything the worker
    /// could fail on is the caller's error now.
    ///
    /// # Errors
    /// [`Error::QueueFull`] when `max_queue` requests are waiting;
    /// [`Error::EngineStopped`] after shutdown;
    /// [`Error::EmptyPrompt`]; [`Error::PromptTooLong`] for a prompt longer
    /// than the pool or the request's `max_context`;
    /// [`Error::InvalidParameter`] for `max_tokens` 0, a `max_context` above
    /// the pool, or sampling values out of range; [`Error::InvalidToken`] for token ids outside
    /// the vocabulary (prompt or logit bias); [`Error::Grammar`] for a
    /// grammar that does not parse; tokenizer errors for text prompts.
    pub fn submit(&self, request: Request) -> Result<Completion> {
        let h = &*self.handle;
        if let Some(exit) = &*lock(&h.shared.stopped) {
            return Err(Error::EngineStopped(exit.to_string()));
        }
        let setup = request::EngineSetup {
            pool: h.pool,
            speculation: h.speculation,
            media: h.media.as_deref(),
            n_ubatch: h.n_ubatch,
        };
        let checked = request::check(&h.model, &setup, request)?;
        if h.shared
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < h.max_queue).then_some(n + 1))
            .is_err()
        {
            return Err(Error::QueueFull { capacity: h.max_queue });
        }
        let id = h.next_id.fetch_add(1, Ordering::Relaxed);
        let (events_tx, events) = async_channel::unbounded();
        let cancel = Arc::new(AtomicBool::new(false));
        let submission = worker::Submission {
            id,
            checked,
            events: events_tx,
            cancel: Arc::clone(&cancel),
            submitted: Instant::now(),
            submit_step: h.shared.steps.load(Ordering::Acquire),
        };
        let sent = lock(&h.commands).as_ref().is_some_and(|tx| tx.send(submission).is_ok());
        if !sent {
            h.shared.queued.fetch_sub(1, Ordering::AcqRel);
            let exit = lock(&h.shared.stopped).clone().unwrap_or(worker::Exit::Shutdown);
            return Err(Error::EngineStopped(exit.to_string()));
        }
        Ok(Completion { id, events: Box::pin(events), cancel, done: false })
    }

    /// A snapshot of the engine's state, counters and latency
    /// distributions (updated after every step).
    pub fn stats(&self) -> EngineStats {
        lock(&self.handle.shared.stats).snapshot()
    }

    /// Stops the worker after its current step; requests in flight finish
    /// with [`FinishReason::Shutdown`](crate::generate::FinishReason::Shutdown) and later submits fail with
    /// [`Error::EngineStopped`]. Waits for the worker to exit (unless
    /// called from it), but for a sampling helper inside a long constrained
    /// sample (which llama.cpp cannot interrupt) at most a second: the
    /// worker thread then finishes on its own. Every handle of this engine
    /// is affected.
    pub fn shutdown(&self) {
        self.handle.stop();
    }
}
