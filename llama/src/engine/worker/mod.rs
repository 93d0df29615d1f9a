//! The one thread that owns the engine's context, and its step loop:
//! take new requests → drop cancelled ones → admit waiting ones → plan the
//! step → make room in the pool → one decode → sample → send events →
//! publish stats. Policy lives in `scheduler`, pool bookkeeping in `kv`.
//!
//! This file holds the worker's state, the thread's body and the loop;
//! `pool` admits, evicts and preempts; `step` decodes, samples and ends
//! requests.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, TryRecvError};
use std::time::{Duration, Instant};

use super::kv::{Cells, PrefixIndex, cells_in_use};
use super::metrics::Histogram;
use super::request::Checked;
use super::scheduler::{self, Candidate, Load};
use super::{EngineConfig, EngineStats, Event, Finish, Piece, Shared, Timings, TokenLogprob, Usage, lock};
use crate::batch::{Batch, Logits, Pos, SeqId};
use crate::context::{Context, ContextParams, PerfCounters};
use crate::error::{Error, Result};
use crate::generate::{FinishReason, StopMatcher, swa_window_present};
use crate::model::Model;
use crate::sampler::Sampler;
use crate::vocab::{Detokenizer, Token};

mod pool;
mod step;

/// A checked request on its way to the worker.
#[derive(Debug)]
pub(crate) struct Submission {
    pub id: u64,
    pub request: Checked,
    pub events: async_channel::Sender<Event>,
    pub cancel: Arc<AtomicBool>,
    pub submitted: Instant,
    pub submit_step: u64,
}

/// Counters and histograms behind [`EngineStats`], updated by the worker
/// once per step.
#[derive(Debug, Default)]
pub(crate) struct StatsState {
    now: EngineStats,
    ttft: Histogram,
    inter_token: Histogram,
    end_to_end: Histogram,
    queue: Histogram,
}

impl StatsState {
    pub fn snapshot(&self) -> EngineStats {
        EngineStats {
            time_to_first_token: self.ttft.summary(),
            inter_token: self.inter_token.summary(),
            end_to_end: self.end_to_end.summary(),
            queue: self.queue.summary(),
            ..self.now.clone()
        }
    }
}

/// Latency samples of one step, recorded under the stats lock at its end.
#[derive(Debug, Default)]
struct Samples {
    ttft: Vec<Duration>,
    inter_token: Vec<Duration>,
    end_to_end: Vec<Duration>,
    queue: Vec<Duration>,
}

/// One request inside the worker.
struct Seq<'m> {
    id: u64,
    priority: i32,
    events: async_channel::Sender<Event>,
    cancel: Arc<AtomicBool>,
    /// The prompt, then every sampled token (the last one not yet decoded
    /// while generating).
    tokens: Vec<Token>,
    prompt_len: usize,
    /// `tokens[..n_cached]` are in the KV cells of `slot`.
    n_cached: usize,
    /// The sequence prefills until `n_cached` reaches this, then samples.
    prefill_to: usize,
    slot: Option<SeqId>,
    cells: Cells,
    /// The id of the run of cells this sequence decodes itself.
    own_run: u64,
    /// Admission order (for the preemption rule).
    admitted_order: u64,
    /// The KV cells of a preempted sequence (llama.cpp's sequence state)
    /// and how many positions they hold, restored at readmission.
    saved: Option<(Vec<u8>, usize)>,
    /// Still counted against `max_queue`.
    queued: bool,
    /// Waiting for a running sequence's prefill of the same prompt prefix
    /// instead of computing it twice.
    follow: Option<Follow>,
    sampler: Sampler<'m>,
    detokenizer: Detokenizer<'m>,
    stop: StopMatcher,
    piece: String,
    out: String,
    /// The sampled token not yet handed out in a piece, and its
    /// log-probabilities if asked for.
    out_token: Option<Token>,
    out_logprob: Option<TokenLogprob>,
    /// How many alternatives to report with each token's log-probability.
    top_logprobs: Option<usize>,
    generated: usize,
    max_tokens: Option<usize>,
    stop_at_eog: bool,
    max_context: usize,
    cached_tokens: usize,
    submitted: Instant,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    inter_token_sum: Duration,
    inter_token_max: Duration,
    submit_step: u64,
    steps_to_first_token: Option<u64>,
    preemptions: u32,
}

/// A sequence whose prompt starts with positions `..to` of another
/// sequence's prompt, which that sequence (the leader) is still
/// prefilling: the follower plans no tokens until the leader holds them,
/// then shares those cells (`seq_cp`) and prefills only the rest. This is
/// what makes requests that arrive together with one system prompt compute
/// it once.
#[derive(Clone, Copy, Debug)]
struct Follow {
    /// The leader's request id (its slot may change if it is preempted).
    leader: u64,
    to: usize,
}

/// A follower must gain at least this many positions over what it can
/// share at once, or it prefills them itself instead of waiting.
const MIN_FOLLOW: usize = 16;

impl Seq<'_> {
    fn decoding(&self) -> bool {
        self.n_cached >= self.prefill_to
    }

    /// Tokens this sequence still has to put through the model before it
    /// samples: its prefill, less what it will share from a leader.
    fn pending(&self) -> usize {
        let shared = self.follow.map_or(0, |f| f.to);
        self.prefill_to.saturating_sub(self.n_cached.max(shared))
    }

    /// Tokens to plan in the next step (none while it follows a leader).
    fn remaining(&self) -> usize {
        if self.follow.is_some() { 0 } else { self.tokens.len() - self.n_cached }
    }

    fn wants_out(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.events.is_closed()
    }
}

/// A finished sequence whose cells stay in the pool for later prompts.
struct Cached {
    slot: SeqId,
    tokens: Vec<Token>,
    cells: Cells,
    last_used: u64,
}

struct Worker<'m> {
    model: &'m Model,
    ctx: Context<'m>,
    shared: &'m Shared,
    budget: usize,
    prefill_cap: usize,
    max_running: usize,
    max_cached: usize,
    cached_cell_limit: usize,
    reserve: usize,
    capacity: usize,
    prefix_sharing: bool,
    running: Vec<Seq<'m>>,
    waiting: VecDeque<Seq<'m>>,
    cached: Vec<Cached>,
    free_slots: Vec<SeqId>,
    index: PrefixIndex,
    batch: Batch,
    loads: Vec<Load>,
    plan: Vec<usize>,
    /// For admissions and LRU: a counter, not a clock.
    tick: u64,
    next_run: u64,
    samples: Samples,
    stats: EngineStats,
    /// Events of this step, sent after the stats are published: a reader
    /// who got an event sees stats that include the step that made it.
    outbox: Vec<(async_channel::Sender<Event>, Event)>,
}

/// The context an engine with `config` creates: `n_ctx` cells shared by
/// `max_running + max_cached_prefixes` sequences (`kv_unified`), full-size
/// sliding-window cache.
pub(crate) fn context_params(config: &EngineConfig) -> ContextParams {
    let n_seq = config.max_running + config.max_cached_prefixes;
    let mut params = ContextParams::default()
        .n_ctx(config.n_ctx)
        .n_batch(config.n_batch)
        .n_ubatch(config.n_ubatch.min(config.n_batch))
        .n_seq_max(n_seq)
        .kv_unified(true)
        .swa_full(true)
        .kv_type(config.kv_type)
        .flash_attention(config.flash_attention);
    if let Some(n) = config.n_threads {
        params = params.n_threads(n).n_threads_batch(n);
    }
    params
}

/// The worker thread's body: creates the context, reports the pool size
/// (or the error) through `ready`, then serves until every handle is gone.
pub(crate) fn run(
    model: &Model,
    config: &EngineConfig,
    inbox: mpsc::Receiver<Submission>,
    shared: &Shared,
    ready: mpsc::SyncSender<Result<usize>>,
) {
    let n_seq = config.max_running + config.max_cached_prefixes;
    let ctx = match model.new_context(&context_params(config)) {
        Ok(ctx) => ctx,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let capacity = ctx.n_ctx() as usize;
    let mut worker = Worker {
        model,
        budget: ctx.n_batch() as usize,
        ctx,
        shared,
        prefill_cap: config.prefill_cap.map_or(config.n_batch as usize / 4, |c| c as usize).max(1),
        max_running: config.max_running as usize,
        max_cached: config.max_cached_prefixes as usize,
        cached_cell_limit: (capacity as f64 * f64::from(config.prefix_cache_share)) as usize,
        reserve: config.admission_reserve,
        capacity,
        // A recurrent state cannot be shared in part.
        prefix_sharing: !model.is_recurrent() && !model.is_hybrid(),
        running: Vec::new(),
        waiting: VecDeque::new(),
        cached: Vec::new(),
        free_slots: (0..n_seq as SeqId).rev().collect(),
        index: PrefixIndex::new(config.prefix_block),
        batch: Batch::new(config.n_batch as usize, 1),
        loads: Vec::new(),
        plan: Vec::new(),
        tick: 0,
        next_run: 0,
        samples: Samples::default(),
        stats: EngineStats { kv_cells_total: capacity, ..EngineStats::default() },
        outbox: Vec::new(),
    };
    worker.publish();
    let _ = ready.send(Ok(capacity));
    let outcome = catch_unwind(AssertUnwindSafe(|| worker.serve(&inbox)));
    let why = match outcome {
        Ok(Ok(())) => "shut down".to_owned(),
        Ok(Err(e)) => e.to_string(),
        Err(panic) => format!("the worker panicked: {}", panic_message(&*panic)),
    };
    lock(&shared.stopped).get_or_insert(why.clone());
    let reason = if why == "shut down" { FinishReason::Shutdown } else { FinishReason::Failed(why) };
    // Whatever is left ends now; a panic mid-step may have left a request
    // out of these lists, and its dropped sender tells its reader.
    worker.finish_all(reason.clone());
    // Submissions that reached the channel but not the worker end the same
    // way (after a failure the handles still hold the sender).
    while let Ok(s) = inbox.try_recv() {
        shared.queued.fetch_sub(1, Ordering::AcqRel);
        let _ = s.events.try_send(Event::Done(Finish {
            reason: reason.clone(),
            usage: Usage { prompt_tokens: s.request.prompt.len(), ..Usage::default() },
            timings: Timings { total: s.submitted.elapsed(), queued: s.submitted.elapsed(), ..Timings::default() },
        }));
    }
    worker.publish();
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic".into())
}

impl<'m> Worker<'m> {
    /// The step loop. Returns when every handle is gone (`Ok`) or the
    /// context became unusable (`Err`).
    fn serve(&mut self, inbox: &mpsc::Receiver<Submission>) -> Result<()> {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                match inbox.recv() {
                    Ok(s) => self.accept(s),
                    Err(_) => return Ok(()),
                }
            }
            loop {
                match inbox.try_recv() {
                    Ok(s) => self.accept(s),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return Ok(()),
                }
            }
            self.drop_cancelled();
            self.admit();
            if !self.running.is_empty() {
                self.step()?;
            }
            self.publish();
        }
    }

    /// Builds the worker-side state of a new request and queues it.
    fn accept(&mut self, s: Submission) {
        let r = s.request;
        let sampler = match r.sampling.sampler(self.model) {
            Ok(sampler) => sampler,
            Err(e) => {
                // Checked at submit; a failure here is still only this
                // request's.
                self.shared.queued.fetch_sub(1, Ordering::AcqRel);
                self.stats.requests_finished += 1;
                ::metrics::counter!("llama_engine_requests_total", "reason" => "failed").increment(1);
                let _ = s.events.try_send(Event::Done(Finish {
                    reason: FinishReason::Failed(e.to_string()),
                    usage: Usage { prompt_tokens: r.prompt.len(), ..Usage::default() },
                    timings: Timings { total: s.submitted.elapsed(), ..Timings::default() },
                }));
                return;
            }
        };
        let seq = Seq {
            id: s.id,
            priority: r.priority,
            events: s.events,
            cancel: s.cancel,
            prompt_len: r.prompt.len(),
            prefill_to: r.prompt.len(),
            tokens: r.prompt,
            n_cached: 0,
            slot: None,
            cells: Cells::default(),
            own_run: 0,
            admitted_order: 0,
            saved: None,
            follow: None,
            queued: true,
            sampler,
            detokenizer: Detokenizer::new(self.model.vocab(), r.special),
            stop: StopMatcher::new(&r.stop),
            piece: String::new(),
            out: String::new(),
            out_token: None,
            out_logprob: None,
            top_logprobs: r.sampling.top_logprobs(),
            generated: 0,
            max_tokens: r.max_tokens,
            stop_at_eog: r.stop_at_eog,
            max_context: r.max_context,
            cached_tokens: 0,
            submitted: s.submitted,
            admitted: None,
            first_token: None,
            last_token: None,
            inter_token_sum: Duration::ZERO,
            inter_token_max: Duration::ZERO,
            submit_step: s.submit_step,
            steps_to_first_token: None,
            preemptions: 0,
        };
        // Behind every request of the same or higher priority.
        let at = self.waiting.iter().position(|w| w.priority < seq.priority).unwrap_or(self.waiting.len());
        self.waiting.insert(at, seq);
    }

    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].wants_out() {
                let seq = self.running.remove(i);
                self.finish(seq, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].wants_out() {
                let seq = self.waiting.remove(i).expect("index in range");
                self.finish(seq, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
    }

    /// Copies the counters into the shared snapshot and records the
    /// step's latency samples.
    fn publish(&mut self) {
        let used = self.cells_used();
        let s = &mut self.stats;
        s.running = self.running.len();
        s.waiting = self.waiting.len();
        s.kv_cells_used = used;
        s.cached_prefix_cells = cells_in_use(self.cached.iter().map(|c| &c.cells));
        s.cached_prefixes = self.cached.len();
        s.perf = if s.steps > 0 { self.ctx.perf() } else { PerfCounters::default() };
        let s = &self.stats;
        ::metrics::gauge!("llama_engine_running").set(s.running as f64);
        ::metrics::gauge!("llama_engine_waiting").set(s.waiting as f64);
        ::metrics::gauge!("llama_engine_kv_cells_used").set(s.kv_cells_used as f64);
        ::metrics::gauge!("llama_engine_kv_cells_total").set(s.kv_cells_total as f64);
        ::metrics::gauge!("llama_engine_cached_prefix_cells").set(s.cached_prefix_cells as f64);
        let mut guard = lock(&self.shared.stats);
        let StatsState { now, ttft, inter_token, end_to_end, queue } = &mut *guard;
        now.clone_from(&self.stats);
        for (samples, hist, name) in [
            (&mut self.samples.ttft, ttft, "llama_engine_ttft_seconds"),
            (&mut self.samples.inter_token, inter_token, "llama_engine_inter_token_seconds"),
            (&mut self.samples.end_to_end, end_to_end, "llama_engine_e2e_seconds"),
            (&mut self.samples.queue, queue, "llama_engine_queue_seconds"),
        ] {
            for d in samples.drain(..) {
                hist.record(d);
                ::metrics::histogram!(name).record(d.as_secs_f64());
            }
        }
        drop(guard);
        for (to, event) in self.outbox.drain(..) {
            // A reader that went away cancels at the next step.
            let _ = to.try_send(event);
        }
    }
}
