//! The one thread that owns the engine's context, and its step loop:
//! take new requests → drop cancelled ones → admit waiting ones → plan the
//! step → make room in the pool → one decode → sample → send events →
//! publish stats. Requests with a grammar are sampled off the step, on a
//! helper thread (`grammar_helpers`).
//!
//! The [`Worker`] here decides and moves requests between its lists;
//! policy lives in `scheduler`, cell accounting in `kv`, what the pool
//! holds beyond the running requests in [`Pool`], one request's state in
//! [`Seq`], why requests end in [`Cause`], and the counters in
//! `metrics`.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, TryRecvError};
use std::time::{Duration, Instant};

use super::media::EngineMedia;
use super::metrics::{Counter, Gauge, LatencySeries, Meter};
use super::request::Checked;
use super::scheduler::{self, Candidate, Load};
use super::step_cost::StepCost;
use super::{EngineConfig, Event, Finish, Shared, Timings, Usage, lock};
use crate::error::{Error, Result};
use crate::llama::batch::{Batch, Logits};
use crate::llama::context::{Context, PerfCounters};
use crate::llama::model::Model;
use crate::llama::types::Pos;
use crate::text::generate::session::swa_window_present;

mod admission;
mod cause;
mod grammar_helpers;
pub(crate) use grammar_helpers::lower_priority;
mod pool;
mod seq;
mod speculate;

pub(crate) use cause::Exit;
use cause::{Cause, Failure};
use grammar_helpers::GrammarHelpers;
use pool::{Pool, Share};
use seq::{Sampled, Seq};

/// A checked request on its way to the worker.
#[derive(Debug)]
pub(crate) struct Submission {
    pub id: u64,
    pub checked: Checked,
    pub events: async_channel::Sender<Event>,
    pub cancel: Arc<AtomicBool>,
    pub submitted: Instant,
    pub submit_step: u64,
}

/// The worker thread's body: creates the context, reports the pool size
/// (or the error) through `ready`, then serves until every handle is gone;
/// drops `served` once every request has ended, before it waits for the
/// sampling helpers (one may be inside a long grammar sample).
pub(crate) fn run(
    model: &Model,
    config: &EngineConfig,
    media: Option<Arc<EngineMedia>>,
    inbox: mpsc::Receiver<Submission>,
    shared: &Shared,
    ready: mpsc::SyncSender<Result<usize>>,
    served: mpsc::Sender<()>,
) {
    std::thread::scope(|scope| {
        let mut worker = match Worker::new(model, config, media, shared) {
            Ok(worker) => worker,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        // One helper per request that can run: a slow grammar holds up its
        // own request only.
        worker.grammar_helpers =
            GrammarHelpers::start(scope, model.vocab(), config.grammar_wait, config.max_running as usize);
        serve(worker, &inbox, shared, ready);
        drop(served);
        // Leaving the scope joins the sampling helpers, which end once the
        // worker (their sender) is gone and their current sample is done.
    });
}

/// Runs `worker` until it stops, then ends whatever is left.
fn serve(
    mut worker: Worker<'_>,
    inbox: &mpsc::Receiver<Submission>,
    shared: &Shared,
    ready: mpsc::SyncSender<Result<usize>>,
) {
    worker.publish();
    let _ = ready.send(Ok(worker.pool.capacity()));
    let exit = match catch_unwind(AssertUnwindSafe(|| worker.serve(inbox))) {
        Ok(Ok(())) => Exit::Shutdown,
        Ok(Err(e)) => Exit::Failed(e.into()),
        Err(panic) => Exit::Failed(Failure::panic(&*panic)),
    };
    lock(&shared.stopped).get_or_insert_with(|| exit.clone());
    let cause = exit.cause();
    // Whatever is left ends now; a panic mid-step may have left a request
    // out of these lists, and its dropped sender tells its reader.
    worker.finish_all(&cause);
    // Submissions that reached the channel but not the worker end the same
    // way (after a failure the handles still hold the sender).
    while let Ok(s) = inbox.try_recv() {
        shared.queued.fetch_sub(1, Ordering::AcqRel);
        let _ = s.events.try_send(Event::Done(Finish {
            reason: cause.reason(),
            usage: Usage { prompt_tokens: s.checked.prompt.len(), ..Usage::default() },
            timings: Timings { total: s.submitted.elapsed(), queued: s.submitted.elapsed(), ..Timings::default() },
        }));
    }
    worker.publish();
}

struct Worker<'m> {
    model: &'m Model,
    ctx: Context<'m>,
    shared: &'m Shared,
    policy: Policy,
    /// Admitted, in admission order.
    running: Vec<Seq<'m>>,
    /// By priority, then arrival.
    waiting: VecDeque<Seq<'m>>,
    pool: Pool,
    /// Step time by rows, which bounds drafts to those that pay (when
    /// `draft_by_cost`).
    step_cost: StepCost,
    /// Admissions so far, for the preemption rule's "most recently
    /// admitted".
    admissions: u64,
    meter: Meter,
    /// What the current step builds (its buffers kept for the next one).
    step: Step,
    /// Where requests with a grammar are sampled (`None`: on the step).
    grammar_helpers: Option<GrammarHelpers<'m>>,
    /// The projector that encodes requests' media.
    media: Option<Arc<EngineMedia>>,
}

/// The engine's settings the step loop decides by (from
/// [`EngineConfig`], fixed for the engine's life).
struct Policy {
    /// Tokens per step (the context's `n_batch`).
    budget: usize,
    /// The prompt tokens one prefill may take of a shared step
    /// (`scheduler::split_budget`; default a quarter of `n_batch`).
    prefill_cap: usize,
    max_running: usize,
    /// Free cells an admission needs beyond its uncached prompt.
    reserve: usize,
    /// Drafts are bounded to those that pay by the step's cost by rows.
    draft_by_cost: bool,
}

/// What one step builds and uses up: the batch, the split of its token
/// budget, the drafts, and the events it produced. The [`Worker`] keeps
/// what lasts across steps (queues, pool, sequences, meters); this is
/// rebuilt every step, its buffers reused.
struct Step {
    batch: Batch,
    /// What each running sequence asks of the step (the split's input).
    loads: Vec<Load>,
    /// Tokens each running sequence decodes in this step (the split of
    /// the step's budget, `scheduler::split_budget`).
    tokens: Vec<usize>,
    /// Draft tokens of each running sequence in this step (speculative
    /// decoding), decoded after its planned token.
    drafts: Vec<usize>,
    /// Rows with logits of the planned step when it has no prompt rows
    /// (the steps [`StepCost`] fits).
    decode_rows: Option<usize>,
    /// Events of this step, sent after the stats are published: a reader
    /// who got an event sees stats that include the step that made it.
    outbox: Vec<(async_channel::Sender<Event>, Event)>,
}

impl<'m> Worker<'m> {
    fn new(
        model: &'m Model,
        config: &EngineConfig,
        media: Option<Arc<EngineMedia>>,
        shared: &'m Shared,
    ) -> Result<Self> {
        let ctx = model.new_context(&config.context_params())?;
        let capacity = ctx.n_ctx() as usize;
        let n_seq = (config.max_running + config.max_cached_prefixes) as usize;
        // A recurrent state cannot be shared in part.
        let sharing = !model.is_recurrent() && !model.is_hybrid();
        Ok(Worker {
            model,
            policy: Policy {
                budget: ctx.n_batch() as usize,
                prefill_cap: config.prefill_cap.map_or(config.context.n_batch as usize / 4, |c| c as usize).max(1),
                max_running: config.max_running as usize,
                reserve: config.admission_reserve,
                draft_by_cost: config.draft_by_cost,
            },
            ctx,
            shared,
            running: Vec::new(),
            waiting: VecDeque::new(),
            pool: Pool::new(config, capacity, n_seq, sharing),
            step_cost: StepCost::default(),
            admissions: 0,
            meter: Meter::default(),
            step: Step {
                batch: Batch::new(config.context.n_batch as usize, 1),
                loads: Vec::new(),
                tokens: Vec::new(),
                drafts: Vec::new(),
                decode_rows: None,
                outbox: Vec::new(),
            },
            grammar_helpers: None,
            media,
        })
    }

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
            // With nothing to decode until a sample comes back, wait for one
            // (briefly, to see new submissions too) instead of spinning.
            let idle = self.running.iter().all(Seq::awaiting);
            self.collect_samples(idle.then_some(Duration::from_millis(2)));
            self.drop_cancelled();
            self.admit();
            if !self.running.is_empty() {
                self.step()?;
            }
            self.publish();
        }
    }

    /// One decode over the planned tokens, then sampling.
    fn step(&mut self) -> Result<()> {
        let started = Instant::now();
        if !self.decode()? {
            return Ok(());
        }
        self.meter.count(Counter::Steps, 1);
        let step = self.meter.stats().steps;
        self.shared.steps.store(step, Ordering::Release);

        // Record what went in, and sample where the batch asked for logits.
        let mut row = 0usize;
        let mut to_sample = Vec::new();
        for (i, (seq, &n)) in self.running.iter_mut().zip(&self.step.tokens).enumerate() {
            if n == 0 {
                continue;
            }
            if !seq.decoding() {
                self.meter.count(Counter::PromptTokensEvaluated, n as u64);
            }
            self.pool.decoded(seq, n);
            row += n;
            if seq.placement.n_cached == seq.tokens.len() {
                to_sample.push((i, row - 1));
            }
            row += self.step.drafts[i];
        }
        let mut ended = Vec::new();
        for (i, row) in to_sample {
            if self.running[i].has_grammar() && self.send_off(i, row) {
                continue;
            }
            if self.step.drafts[i] > 0 {
                if let Some(cause) = self.verify(i, row, step) {
                    ended.push((i, cause));
                }
                continue;
            }
            let (seq, ctx) = (&mut self.running[i], &mut self.ctx);
            let sampled = match catch_unwind(AssertUnwindSafe(|| seq.sample(ctx, row, step))) {
                Ok(sampled) => sampled.map_err(Failure::from),
                Err(panic) => Err(Failure::panic(&*panic)),
            };
            if let Some(cause) = took(&mut self.meter, &mut self.step.outbox, seq, sampled) {
                ended.push((i, cause));
            }
        }
        if let Some(rows) = self.step.decode_rows {
            self.step_cost.record(rows, started.elapsed().as_secs_f64());
        }
        for (i, cause) in ended.into_iter().rev() {
            let seq = self.running.remove(i);
            self.finish(seq, cause);
        }
        Ok(())
    }

    /// Plans the step and makes the one decode call. Returns false when
    /// nothing was decoded (nothing to run, or the batch's sequences
    /// failed); `Err` when the context is unusable.
    fn decode(&mut self) -> Result<bool> {
        let mut attempts = 0;
        loop {
            if !self.schedule_with_room() {
                return Ok(false);
            }
            let media = self.decode_media()?;
            self.choose_drafts();
            if media {
                // The step's time went to media too: not a decode step to fit.
                self.step.decode_rows = None;
            }
            self.step.batch.clear();
            for ((seq, &n), &k) in self.running.iter().zip(&self.step.tokens).zip(&self.step.drafts) {
                if n == 0 {
                    continue;
                }
                let from = seq.placement.n_cached;
                let slot = seq.placement.slot.expect("running sequences have a slot");
                let last = from + n == seq.tokens.len();
                self.step.batch.push_sequence(&seq.tokens[from..from + n], from as Pos, slot, Logits::from(last))?;
                // A draft follows its sequence's pending token, each with
                // logits: the sampler verifies it position by position.
                for (j, &token) in seq.draft()[..k].iter().enumerate() {
                    self.step.batch.push(token, (from + n + j) as Pos, &[slot], Logits::Yes)?;
                }
            }
            if self.step.batch.is_empty() {
                return Ok(media);
            }
            match self.ctx.decode(&self.step.batch) {
                Ok(()) => return Ok(true),
                // The accounting said it fits, but llama.cpp found no slot
                // (a pool fragmented by padding): free more and retry.
                Err(Error::NoKvSlot) if attempts < 8 => {
                    attempts += 1;
                    if !self.make_room() {
                        return Ok(false);
                    }
                }
                Err(e @ (Error::Poisoned { .. } | Error::Exception { .. })) => return Err(e),
                Err(e) => {
                    // This batch's sequences fail; the others go on.
                    let failure = Failure::from(e);
                    let planned: Vec<usize> =
                        (0..self.running.len()).filter(|&i| self.step.tokens[i] > 0).rev().collect();
                    for i in planned {
                        let mut seq = self.running.remove(i);
                        self.pool.drop_failed(&mut self.ctx, &mut seq);
                        self.finish(seq, Cause::Failed(failure.clone()));
                    }
                    return Ok(false);
                }
            }
        }
    }

    /// Cuts each prefill of the step at its next medium, and gives a
    /// prefill that starts at one the whole medium: a medium is decoded
    /// whole, on its own ([`Worker::decode_media`]).
    fn fit_media(&mut self) {
        for (seq, n) in self.running.iter().zip(self.step.tokens.iter_mut()) {
            if *n == 0 || seq.decoding() {
                continue;
            }
            let from = seq.placement.n_cached;
            if let Some(len) = seq.media.starting_at(from) {
                *n = len;
            } else if let Some(start) = seq.media.next_start_after(from) {
                *n = (*n).min(start - from);
            }
        }
    }

    /// Decodes the media the step planned (a prefill at a medium's start),
    /// each in its own passes, before the step's batch; a sequence whose
    /// medium fails ends. Returns whether any was decoded.
    fn decode_media(&mut self) -> Result<bool> {
        let mut any = false;
        let mut i = 0;
        while i < self.running.len() {
            let seq = &self.running[i];
            let (n, from) = (self.step.tokens[i], seq.placement.n_cached);
            if n == 0 || seq.decoding() || seq.media.starting_at(from).is_none() {
                i += 1;
                continue;
            }
            let slot = seq.placement.slot.expect("running sequences have a slot");
            let result = match &self.media {
                Some(media) => media.decode(&mut self.ctx, &seq.media, from, slot),
                None => Err(Error::Unsupported("this engine has no projector for media".into())),
            };
            match result {
                Ok(()) => {
                    self.pool.decoded(&mut self.running[i], n);
                    self.meter.count(Counter::PromptTokensEvaluated, n as u64);
                    // Decoded: nothing of it goes into the batch.
                    self.step.tokens[i] = 0;
                    any = true;
                    i += 1;
                }
                Err(e @ (Error::Poisoned { .. } | Error::Exception { .. })) => return Err(e),
                Err(e) => {
                    let mut seq = self.running.remove(i);
                    self.step.tokens.remove(i);
                    self.pool.drop_failed(&mut self.ctx, &mut seq);
                    self.finish(seq, Cause::Failed(Failure::from(e)));
                }
            }
        }
        Ok(any)
    }

    /// Ends a request: sends its last piece and final event, and keeps its
    /// cells as a cached prefix (or frees them).
    fn finish(&mut self, mut seq: Seq<'m>, cause: Cause) {
        let (last, finish) = seq.end(&cause);
        if let Some(piece) = last {
            self.step.outbox.push((seq.events().clone(), Event::Piece(piece)));
        }
        log::debug!("request {} finished: {} ({:?})", seq.id, finish.reason, finish.usage);
        if let Some((fixed, per_row)) = self.step_cost.fit() {
            log::debug!("step cost: {:.2} ms + {:.2} ms a row", fixed * 1e3, per_row * 1e3);
        }
        self.meter.finished(cause.label());
        self.meter.record(LatencySeries::EndToEnd, finish.timings.total);
        self.step.outbox.push((seq.events().clone(), Event::Done(finish)));
        if !seq.clock.ever_admitted() {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
        }
        self.pool.retire(&mut self.ctx, &mut seq);
    }

    fn finish_all(&mut self, cause: &Cause) {
        while let Some(seq) = self.running.pop() {
            self.finish(seq, cause.clone());
        }
        while let Some(seq) = self.waiting.pop_front() {
            self.finish(seq, cause.clone());
        }
    }

    /// Publishes the stats and this step's latency samples, then sends
    /// the step's events.
    fn publish(&mut self) {
        let m = &mut self.meter;
        m.set(Gauge::Running, self.running.len());
        m.set(Gauge::Waiting, self.waiting.len());
        m.set(Gauge::KvCellsUsed, self.pool.cells_used(&self.running));
        m.set(Gauge::KvCellsTotal, self.pool.capacity());
        m.set(Gauge::CachedPrefixCells, self.pool.cached_cells());
        m.set(Gauge::CachedPrefixes, self.pool.cached_prefixes());
        m.set_perf(if m.stats().steps > 0 { self.ctx.perf() } else { PerfCounters::default() });
        m.publish(&self.shared.stats);
        for (to, event) in self.step.outbox.drain(..) {
            // A reader that went away cancels at the next step.
            let _ = to.try_send(event);
        }
    }
}

/// Prompt positions `seq` shares from another sequence instead of
/// prefilling them.
/// Counts a sampled token and queues its piece; the cause if the request
/// ends with it (or failed to sample).
fn took(
    meter: &mut Meter,
    outbox: &mut Vec<(async_channel::Sender<Event>, Event)>,
    seq: &mut Seq<'_>,
    sampled: std::result::Result<Sampled, Failure>,
) -> Option<Cause> {
    match sampled {
        Ok(Sampled { end, times }) => {
            meter.count(Counter::CompletionTokens, 1);
            if let Some(ttft) = times.first {
                meter.record(LatencySeries::TimeToFirstToken, ttft);
            }
            if let Some(gap) = times.gap {
                meter.record(LatencySeries::InterToken, gap);
            }
            if end.is_none() {
                let piece = seq.take_piece();
                outbox.push((seq.events().clone(), Event::Piece(piece)));
            }
            end
        }
        Err(failure) => Some(Cause::Failed(failure)),
    }
}

fn count_shared(meter: &mut Meter, seq: &mut Seq<'_>, positions: usize) {
    seq.usage.cached_tokens += positions;
    meter.count(Counter::PrefixHitTokens, positions as u64);
}
