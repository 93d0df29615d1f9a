//! The one thread that owns the engine's context, and its step loop:
//! take new requests → drop cancelled ones → admit waiting ones → plan the
//! step → make room in the pool → one decode → sample → send events →
//! publish stats. Policy lives in `scheduler`, pool bookkeeping in `kv`.

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
use super::{EngineConfig, EngineStats, Event, Finish, Piece, Shared, Timings, Usage, lock};
use crate::batch::{Batch, Pos, SeqId};
use crate::context::{Context, ContextParams, PerfCounters};
use crate::error::{Error, Result};
use crate::generate::{FinishReason, StopMatcher, swa_window_present};
use crate::model::Model;
use crate::sampler::Sampler;
use crate::vocab::{Detokenizer, Token};

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
    sampler: Sampler<'m>,
    detokenizer: Detokenizer<'m>,
    stop: StopMatcher,
    piece: String,
    out: String,
    /// The sampled token not yet handed out in a piece.
    out_token: Option<Token>,
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

impl Seq<'_> {
    fn decoding(&self) -> bool {
        self.n_cached >= self.prefill_to
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
    let ctx = match model.new_context(&params) {
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
        let sampler = match r.sampling.build(self.model) {
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
            queued: true,
            sampler,
            detokenizer: Detokenizer::new(self.model.vocab(), r.special),
            stop: StopMatcher::new(&r.stop),
            piece: String::new(),
            out: String::new(),
            out_token: None,
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

    fn cells_used(&self) -> usize {
        cells_in_use(self.running.iter().map(|s| &s.cells).chain(self.cached.iter().map(|c| &c.cells)))
    }

    /// The longest prefix of `tokens` (short of its last token, whose
    /// logits are needed) that a running sequence or cached prefix holds:
    /// its slot and length.
    fn lookup(&mut self, tokens: &[Token]) -> Option<(SeqId, usize)> {
        if !self.prefix_sharing || tokens.len() < 2 {
            return None;
        }
        let limit = tokens.len() - 1;
        let (holders, depth) = self.index.lookup(&tokens[..limit])?;
        let mut found: Vec<(SeqId, usize)> = Vec::new();
        for &slot in holders {
            let held: &[Token] = if let Some(s) = self.running.iter().find(|s| s.slot == Some(slot)) {
                &s.tokens[..s.n_cached]
            } else if let Some(c) = self.cached.iter().find(|c| c.slot == slot) {
                &c.tokens
            } else {
                continue;
            };
            if held.len() < depth || held[..depth] != tokens[..depth] {
                continue; // a hash collision
            }
            let n = depth + held[depth..].iter().zip(&tokens[depth..limit]).take_while(|(a, b)| a == b).count();
            found.push((slot, n));
        }
        // The longest match whose source still holds every position the
        // new sequence attends to (a sliding-window cache may have dropped
        // old ones; the engine's is full-size, but the check is cheap).
        found.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
        found.into_iter().find(|&(slot, n)| swa_window_present(&mut self.ctx, slot, n).unwrap_or(false))
    }

    /// Removes the least recently used cached prefix other than `keep`.
    fn evict_one(&mut self, keep: Option<SeqId>) -> bool {
        let Some(i) = (0..self.cached.len())
            .filter(|&i| Some(self.cached[i].slot) != keep)
            .min_by_key(|&i| self.cached[i].last_used)
        else {
            return false;
        };
        let c = self.cached.swap_remove(i);
        self.release_slot(c.slot);
        true
    }

    /// Frees a slot's cells and index entries and makes it available.
    fn release_slot(&mut self, slot: SeqId) {
        // Removing a whole sequence never fails.
        let _ = self.ctx.seq_rm(Some(slot), None, None);
        self.index.remove(slot);
        self.free_slots.push(slot);
    }

    /// Admits waiting requests in order while there is a slot, room for
    /// the uncached prompt plus the reserve, and `max_running` allows.
    fn admit(&mut self) {
        while self.running.len() < self.max_running && !self.waiting.is_empty() {
            // A preempted sequence with saved cells restores them (every
            // cell its own); others look for a prefix to share.
            let shared = if self.waiting[0].saved.is_some() {
                None
            } else {
                let tokens = std::mem::take(&mut self.waiting[0].tokens);
                let shared = self.lookup(&tokens);
                self.waiting[0].tokens = tokens;
                shared
            };
            let keep = shared.map(|(slot, _)| slot);
            let k = shared.map_or(0, |(_, k)| k);
            let need = (self.waiting[0].tokens.len() - k).saturating_add(self.reserve);
            // The cells running sequences still add before they sample
            // (their uncached prompts, also of those admitted just now).
            let pending: usize = self.running.iter().map(|s| s.prefill_to.saturating_sub(s.n_cached)).sum();
            let capacity = self.capacity;
            let fits = move |used: usize| capacity.saturating_sub(used.saturating_add(pending)) >= need;
            if !self.running.is_empty() {
                // Evict only if evicting every other cached prefix would
                // make room: otherwise the request waits and the cache stays.
                let kept = cells_in_use(
                    self.running
                        .iter()
                        .map(|s| &s.cells)
                        .chain(self.cached.iter().filter(|c| Some(c.slot) == keep).map(|c| &c.cells)),
                );
                if !fits(kept) {
                    break;
                }
            }
            while self.free_slots.is_empty() || !fits(self.cells_used()) {
                if !self.evict_one(keep) {
                    break;
                }
            }
            // With nothing running, the request gets the whole pool: its
            // prompt fits (checked at submit), only the reserve may not.
            if self.free_slots.is_empty() || !fits(self.cells_used()) && !self.running.is_empty() {
                break;
            }
            let mut seq = self.waiting.pop_front().expect("not empty");
            let slot = self.free_slots.pop().expect("a free slot");
            seq.slot = Some(slot);
            seq.n_cached = 0;
            seq.cells.clear();
            seq.own_run = self.next_run;
            self.next_run += 1;
            let restoring = seq.saved.is_some();
            if let Some((state, n)) = seq.saved.take() {
                let restored = self.ctx.load_seq_state(&state, slot).is_ok()
                    && self.ctx.seq_pos_max(slot).ok().flatten() == Some(n as Pos - 1);
                if restored {
                    seq.n_cached = n;
                    seq.cells.append(seq.own_run, n);
                    self.index.extend(slot, &seq.tokens[..n]);
                } else {
                    // Recompute instead.
                    let _ = self.ctx.seq_rm(Some(slot), None, None);
                }
            }
            if let Some((src, k)) = shared {
                let src_cells = match self.running.iter().find(|s| s.slot == Some(src)) {
                    Some(s) => s.cells.prefix(k),
                    None => {
                        let c = self.cached.iter_mut().find(|c| c.slot == src).expect("a holder");
                        c.last_used = self.tick;
                        c.cells.prefix(k)
                    }
                };
                if self.ctx.seq_cp(src, slot, Some(0), Some(k as Pos)).is_ok() {
                    seq.n_cached = k;
                    seq.cells = src_cells;
                    self.index.extend(slot, &seq.tokens[..k]);
                }
            }
            if !restoring {
                self.stats.prefix_lookups += u64::from(self.prefix_sharing);
            }
            seq.prefill_to = seq.tokens.len();
            seq.admitted_order = self.tick;
            self.tick += 1;
            if seq.queued {
                seq.queued = false;
                self.shared.queued.fetch_sub(1, Ordering::AcqRel);
                seq.cached_tokens = seq.n_cached;
                self.stats.prefix_hit_tokens += seq.n_cached as u64;
                self.stats.prompt_tokens += seq.prompt_len as u64;
                ::metrics::counter!("llama_engine_prefix_hit_tokens_total").increment(seq.n_cached as u64);
                ::metrics::counter!("llama_engine_prompt_tokens_total").increment(seq.prompt_len as u64);
                let now = Instant::now();
                seq.admitted = Some(now);
                self.samples.queue.push(now - seq.submitted);
            }
            self.running.push(seq);
        }
    }

    /// Frees a running sequence's cells and requeues it. Its cells are
    /// saved to host memory first (llama.cpp's sequence state) and
    /// restored when there is room again, so it continues exactly where it
    /// was; if saving or restoring fails, it is recomputed from its tokens.
    fn preempt(&mut self, i: usize) {
        let mut seq = self.running.remove(i);
        if let Some(slot) = seq.slot.take() {
            // A sequence whose cells are mostly shared with others is
            // recomputed instead: its readmission shares them again, where
            // a restore would copy them.
            if seq.n_cached > 0
                && seq.cells.own(seq.own_run) * 2 >= seq.n_cached
                && let Ok(state) = self.ctx.save_seq_state(slot)
            {
                seq.saved = Some((state, seq.n_cached));
            }
            self.release_slot(slot);
        }
        seq.cells.clear();
        seq.n_cached = 0;
        seq.preemptions += 1;
        self.stats.preemptions += 1;
        ::metrics::counter!("llama_engine_preemptions_total").increment(1);
        // Ahead of every waiting request of the same or lower priority.
        let at = self.waiting.iter().position(|w| w.priority <= seq.priority).unwrap_or(self.waiting.len());
        self.waiting.insert(at, seq);
    }

    /// Plans the step until its new tokens fit in the pool, evicting
    /// cached prefixes and then preempting sequences as needed. Returns
    /// false when nothing is left to run.
    fn plan_with_room(&mut self) -> bool {
        loop {
            self.loads.clear();
            self.loads.extend(
                self.running.iter().map(|s| Load { remaining: s.tokens.len() - s.n_cached, decoding: s.decoding() }),
            );
            scheduler::plan(self.budget, self.prefill_cap, &self.loads, &mut self.plan);
            let needed: usize = self.plan.iter().sum();
            if needed == 0 {
                return false;
            }
            if self.cells_used() + needed <= self.capacity {
                return true;
            }
            if !self.make_room() {
                return false;
            }
        }
    }

    /// Frees some cells: a cached prefix, else a preempted sequence, else
    /// (a sequence alone in a full pool) that sequence ends. Returns false
    /// when nothing is running any more.
    fn make_room(&mut self) -> bool {
        if self.evict_one(None) {
            return true;
        }
        if self.running.len() > 1 {
            // Preempting a sequence frees its own cells and its tokens of
            // this step; one with neither would be preempted for nothing.
            let frees = |i: usize| {
                let s = &self.running[i];
                self.plan.get(i).is_some_and(|&n| n > 0) || s.cells.own(s.own_run) > 0
            };
            let mut pool: Vec<usize> = (0..self.running.len()).filter(|&i| frees(i)).collect();
            if pool.is_empty() {
                pool = (0..self.running.len()).collect();
            }
            let candidates: Vec<Candidate> = pool
                .iter()
                .map(|&i| Candidate { priority: self.running[i].priority, admitted: self.running[i].admitted_order })
                .collect();
            let i = pool[scheduler::victim(&candidates).expect("running is not empty")];
            self.preempt(i);
            return true;
        }
        if let Some(seq) = self.running.pop() {
            self.finish(seq, FinishReason::ContextFull);
        }
        !self.running.is_empty()
    }

    /// One decode over the planned tokens, then sampling.
    fn step(&mut self) -> Result<()> {
        let mut attempts = 0;
        loop {
            if !self.plan_with_room() {
                return Ok(());
            }
            self.batch.clear();
            for (seq, &n) in self.running.iter().zip(&self.plan) {
                if n == 0 {
                    continue;
                }
                let from = seq.n_cached;
                let slot = seq.slot.expect("running sequences have a slot");
                let last = from + n == seq.tokens.len();
                self.batch.push_sequence(&seq.tokens[from..from + n], from as Pos, slot, last)?;
            }
            match self.ctx.decode(&self.batch) {
                Ok(()) => break,
                // The accounting said it fits, but llama.cpp found no slot
                // (a pool fragmented by padding): free more and retry.
                Err(Error::NoKvSlot) if attempts < 8 => {
                    attempts += 1;
                    if !self.make_room() {
                        return Ok(());
                    }
                }
                Err(e @ Error::Poisoned { .. }) => return Err(e),
                Err(e) => {
                    if matches!(e, Error::Exception { .. }) {
                        return Err(e);
                    }
                    // This batch's sequences fail; the others go on.
                    let why = e.to_string();
                    let planned: Vec<usize> = (0..self.running.len()).filter(|&i| self.plan[i] > 0).rev().collect();
                    for i in planned {
                        let mut seq = self.running.remove(i);
                        if let Some(slot) = seq.slot.take() {
                            self.release_slot(slot);
                        }
                        self.finish(seq, FinishReason::Failed(why.clone()));
                    }
                    return Ok(());
                }
            }
        }
        self.stats.steps += 1;
        self.shared.steps.store(self.stats.steps, Ordering::Release);
        ::metrics::counter!("llama_engine_steps_total").increment(1);

        // Record what went in, and sample where the batch asked for logits.
        let mut row = 0i32;
        let mut to_sample = Vec::new();
        for (i, seq) in self.running.iter_mut().enumerate() {
            let n = self.plan[i];
            if n == 0 {
                continue;
            }
            if !seq.decoding() {
                self.stats.prompt_tokens_evaluated += n as u64;
                ::metrics::counter!("llama_engine_prompt_tokens_evaluated_total").increment(n as u64);
            }
            seq.n_cached += n;
            seq.cells.append(seq.own_run, n);
            let slot = seq.slot.expect("running sequences have a slot");
            self.index.extend(slot, &seq.tokens[..seq.n_cached]);
            row += n as i32;
            if seq.n_cached == seq.tokens.len() {
                to_sample.push((i, row - 1));
            }
        }
        let mut ended = Vec::new();
        for (i, row) in to_sample {
            let seq = &mut self.running[i];
            let outcome =
                catch_unwind(AssertUnwindSafe(|| sample(&mut self.ctx, seq, row, self.stats.steps, &mut self.outbox)));
            let outcome = match outcome {
                Ok(o) => o,
                Err(panic) => Err(Error::InvalidArgument(format!("panic: {}", panic_message(&*panic)))),
            };
            match outcome {
                Ok(Sampled { reason, first, gap }) => {
                    self.stats.completion_tokens += 1;
                    ::metrics::counter!("llama_engine_completion_tokens_total").increment(1);
                    if let Some(ttft) = first {
                        self.samples.ttft.push(ttft);
                    }
                    if let Some(gap) = gap {
                        self.samples.inter_token.push(gap);
                    }
                    if let Some(reason) = reason {
                        ended.push((i, reason));
                    }
                }
                Err(e) => ended.push((i, FinishReason::Failed(e.to_string()))),
            }
        }
        for (i, reason) in ended.into_iter().rev() {
            let seq = self.running.remove(i);
            self.finish(seq, reason);
        }
        Ok(())
    }

    /// Ends a request: flushes its text, sends the final event, and keeps
    /// its cells as a cached prefix (or frees them).
    fn finish(&mut self, mut seq: Seq<'m>, reason: FinishReason) {
        if !matches!(reason, FinishReason::Stop(_)) {
            let rest = seq.detokenizer.finish();
            if !rest.is_empty() {
                seq.stop.push(&rest, &mut seq.out);
            }
            seq.stop.flush(&mut seq.out);
        }
        if !seq.out.is_empty() || seq.out_token.is_some() {
            let piece = Piece { text: std::mem::take(&mut seq.out), token: seq.out_token.take() };
            self.outbox.push((seq.events.clone(), Event::Piece(piece)));
        }
        let now = Instant::now();
        let total = now - seq.submitted;
        let gaps = seq.generated.saturating_sub(1) as u32;
        let finish = Finish {
            usage: Usage {
                prompt_tokens: seq.prompt_len,
                cached_tokens: seq.cached_tokens,
                completion_tokens: seq.generated,
            },
            timings: Timings {
                queued: seq.admitted.map_or(total, |a| a - seq.submitted),
                time_to_first_token: seq.first_token.map(|t| t - seq.submitted),
                inter_token_mean: if gaps > 0 { seq.inter_token_sum / gaps } else { Duration::ZERO },
                inter_token_max: seq.inter_token_max,
                total,
                steps_to_first_token: seq.steps_to_first_token,
                preemptions: seq.preemptions,
            },
            reason,
        };
        log::debug!("request {} finished: {} ({:?})", seq.id, finish.reason, finish.usage);
        ::metrics::counter!("llama_engine_requests_total", "reason" => reason_label(&finish.reason)).increment(1);
        self.outbox.push((seq.events.clone(), Event::Done(finish)));
        self.samples.end_to_end.push(total);
        self.stats.requests_finished += 1;
        if seq.queued {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(slot) = seq.slot.take() {
            if self.prefix_sharing && self.max_cached > 0 && seq.n_cached > 0 {
                seq.tokens.truncate(seq.n_cached);
                self.cached.push(Cached { slot, tokens: seq.tokens, cells: seq.cells, last_used: self.tick });
                self.tick += 1;
                self.trim_cache();
            } else {
                self.release_slot(slot);
            }
        }
    }

    /// Evicts cached prefixes beyond the configured count and share.
    fn trim_cache(&mut self) {
        while self.cached.len() > self.max_cached
            || cells_in_use(self.cached.iter().map(|c| &c.cells)) > self.cached_cell_limit
        {
            if !self.evict_one(None) {
                break;
            }
        }
    }

    fn finish_all(&mut self, reason: FinishReason) {
        while let Some(seq) = self.running.pop() {
            self.finish(seq, reason.clone());
        }
        while let Some(seq) = self.waiting.pop_front() {
            self.finish(seq, reason.clone());
        }
    }

    /// Copies the counters into the shared snapshot and records the
    /// step's latency samples.
    fn publish(&mut self) {
        let s = &mut self.stats;
        s.running = self.running.len();
        s.waiting = self.waiting.len();
        s.kv_cells_used =
            cells_in_use(self.running.iter().map(|s| &s.cells).chain(self.cached.iter().map(|c| &c.cells)));
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

fn reason_label(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "length",
        FinishReason::Stop(_) => "stop",
        FinishReason::EndOfGeneration => "eog",
        FinishReason::Cancelled => "cancelled",
        FinishReason::ContextFull => "context_full",
        FinishReason::Shutdown => "shutdown",
        _ => "failed",
    }
}

/// What sampling one token did.
struct Sampled {
    /// The request ends.
    reason: Option<FinishReason>,
    /// Time to first token, if this was the first.
    first: Option<Duration>,
    /// Gap since the previous token, if any.
    gap: Option<Duration>,
}

/// Samples a sequence's next token from batch row `row`, releases its
/// text, and says whether the request ends.
fn sample(
    ctx: &mut Context<'_>,
    seq: &mut Seq<'_>,
    row: i32,
    step: u64,
    outbox: &mut Vec<(async_channel::Sender<Event>, Event)>,
) -> Result<Sampled> {
    let token = seq.sampler.sample(ctx, row)?;
    let now = Instant::now();
    seq.generated += 1;
    let mut sampled = Sampled { reason: None, first: None, gap: None };
    match seq.last_token {
        None => {
            seq.first_token = Some(now);
            seq.steps_to_first_token = Some(step - seq.submit_step);
            sampled.first = Some(now - seq.submitted);
        }
        Some(last) => {
            let gap = now - last;
            seq.inter_token_sum += gap;
            seq.inter_token_max = seq.inter_token_max.max(gap);
            sampled.gap = Some(gap);
        }
    }
    seq.last_token = Some(now);
    let vocab = ctx.model().vocab();
    if seq.stop_at_eog && vocab.is_eog(token) {
        sampled.reason = Some(FinishReason::EndOfGeneration);
        return Ok(sampled);
    }
    seq.tokens.push(token);
    seq.out_token = Some(token);
    seq.piece.clear();
    seq.detokenizer.push(token, &mut seq.piece)?;
    if let Some(i) = seq.stop.push(&seq.piece, &mut seq.out) {
        sampled.reason = Some(FinishReason::Stop(seq.stop.stops()[i].clone()));
    } else if seq.max_tokens.is_some_and(|max| seq.generated >= max) {
        sampled.reason = Some(FinishReason::Length);
    } else if seq.tokens.len() > seq.max_context {
        // The token just sampled would need a cell beyond the cap.
        sampled.reason = Some(FinishReason::ContextFull);
    } else {
        let piece = Piece { text: std::mem::take(&mut seq.out), token: seq.out_token.take() };
        outbox.push((seq.events.clone(), Event::Piece(piece)));
    }
    Ok(sampled)
}
