//! Sampling off the step. A grammar's mask over the vocabulary can cost
//! far more than a decode (a grammar of thousands of alternatives took
//! seconds per token), and on the shared step that time is every other
//! request's too. So a request whose sampler holds a grammar is sampled on
//! a helper thread from a copy of its logits row: the worker sends the
//! sampler and the row out, and the request sits out the steps until its
//! token comes back. A step waits for such samples at most the engine's
//! `grammar_wait` after it sent them, and only for requests whose previous
//! sample came back within that time: a cheap grammar loses no step, an
//! expensive one delays nobody else by more than `grammar_wait` per step.
//!
//! There are as many helpers as requests can run at once, and a job goes
//! to an idle one: a slow grammar holds up only its own request's samples,
//! never another's (one helper, working in order, once made every
//! constrained request wait behind the slowest). A job whose request was
//! cancelled before a helper took it is handed back unsampled.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::cause::Failure;
use super::seq::token_logprob;
use super::{Worker, took};
use crate::llama::types::Token;
use crate::llama::vocab::Vocab;
use crate::sampling::sampler::Sampler;
use crate::serving::engine::TokenLogprob;

/// A request's sampler and logits row, sent out.
pub(super) struct Job<'m> {
    pub id: u64,
    pub sampler: Sampler<'m>,
    pub logits: Vec<f32>,
    /// Top log-probabilities to report, if asked for.
    pub top: Option<usize>,
    /// The request's cancel flag: a helper that finds it set skips the job.
    pub cancel: Arc<AtomicBool>,
}

/// The sampler back, with the token it chose.
pub(super) struct Sample<'m> {
    /// The helper that sampled it (idle again).
    helper: usize,
    pub id: u64,
    pub sampler: Sampler<'m>,
    pub token: Result<Token, Failure>,
    pub logprob: Option<TokenLogprob>,
    /// How long the sample took on the helper.
    pub took: Duration,
}

/// The worker's side: where jobs go, where samples come back, and which
/// are out.
pub(super) struct GrammarHelpers<'m> {
    /// Each helper's job channel.
    helpers: Vec<mpsc::Sender<Job<'m>>>,
    /// Helpers with no job.
    idle: Vec<usize>,
    /// Jobs waiting for an idle helper.
    queued: VecDeque<Job<'m>>,
    samples: mpsc::Receiver<Sample<'m>>,
    /// Requests with a job out: when it went, and whether steps wait for
    /// it.
    out: Vec<(u64, Instant, bool)>,
    wait: Duration,
}

impl<'m> GrammarHelpers<'m> {
    /// Starts `count` helper threads in `scope`; `None` if none can be
    /// started (requests with a grammar are then sampled on the step).
    pub fn start<'scope>(
        scope: &'scope std::thread::Scope<'scope, '_>,
        vocab: &'m Vocab,
        wait: Duration,
        count: usize,
    ) -> Option<GrammarHelpers<'m>>
    where
        'm: 'scope,
    {
        let (outbox, samples) = mpsc::channel();
        let mut helpers = Vec::with_capacity(count);
        for index in 0..count.max(1) {
            let (jobs, inbox) = mpsc::channel::<Job<'m>>();
            let outbox = outbox.clone();
            let started = std::thread::Builder::new()
                .name(format!("llama-engine-sampler-{index}"))
                .spawn_scoped(scope, move || helper(index, vocab, &inbox, &outbox));
            if started.is_err() {
                break;
            }
            helpers.push(jobs);
        }
        if helpers.is_empty() {
            return None;
        }
        let idle = (0..helpers.len()).rev().collect();
        Some(GrammarHelpers { helpers, idle, queued: VecDeque::new(), samples, out: Vec::new(), wait })
    }

    /// Sends `job` out (to an idle helper, or the queue for the next one);
    /// gives it back if the helper is gone. Steps wait for it when the
    /// request's last sample took at most `grammar_wait` (`last`; a first
    /// sample is waited for).
    pub fn send(&mut self, job: Job<'m>, last: Option<Duration>) -> Option<Job<'m>> {
        let (id, quick) = (job.id, last.is_none_or(|t| t <= self.wait));
        match self.idle.pop() {
            Some(helper) => {
                if let Err(e) = self.helpers[helper].send(job) {
                    self.idle.push(helper);
                    return Some(e.0);
                }
            }
            None => self.queued.push_back(job),
        }
        self.out.push((id, Instant::now(), quick));
        None
    }

    /// `helper` is idle: it takes the next queued job, if any.
    fn idle_again(&mut self, helper: usize) {
        match self.queued.pop_front() {
            Some(job) => {
                if let Err(e) = self.helpers[helper].send(job) {
                    // A helper that is gone: the job waits for another.
                    self.queued.push_front(e.0);
                }
            }
            None => self.idle.push(helper),
        }
    }

    /// Whether any job is out.
    pub fn busy(&self) -> bool {
        !self.out.is_empty()
    }

    /// The samples that are back: waiting until each quick job is back or
    /// its `grammar_wait` has passed, then taking whatever else is there.
    /// With `at_least` set and nothing back, waits up to that long for one.
    pub fn collect(&mut self, at_least: Option<Duration>) -> Vec<Sample<'m>> {
        let mut back = Vec::new();
        loop {
            let deadline = self.out.iter().filter(|o| o.2).map(|o| o.1 + self.wait).min();
            let now = Instant::now();
            let sample = match deadline {
                Some(d) if d > now => match self.samples.recv_timeout(d - now) {
                    Ok(s) => s,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                },
                Some(_) => {
                    // Past its deadline: steps stop waiting for it.
                    self.out.iter_mut().filter(|o| o.1 + self.wait <= now).for_each(|o| o.2 = false);
                    continue;
                }
                None => match self.samples.try_recv() {
                    Ok(s) => s,
                    Err(_) if back.is_empty() && self.busy() && at_least.is_some() => {
                        match self.samples.recv_timeout(at_least.expect("checked")) {
                            Ok(s) => s,
                            Err(_) => break,
                        }
                    }
                    Err(_) => break,
                },
            };
            self.out.retain(|o| o.0 != sample.id);
            self.idle_again(sample.helper);
            back.push(sample);
        }
        back
    }
}

impl<'m> Worker<'m> {
    /// Sends sequence `i`'s sampler and logits row `row` to the helper.
    /// False if there is none (or it is gone): sample on the step.
    pub(super) fn send_off(&mut self, i: usize, row: usize) -> bool {
        let Some(grammar_helpers) = self.grammar_helpers.as_mut() else { return false };
        let seq = &mut self.running[i];
        // A missing row fails on the step, with its error.
        let Ok(logits) = self.ctx.logits(row).map(<[f32]>::to_vec) else { return false };
        let Some(sampler) = seq.lend_sampler() else { return false };
        let job = Job { id: seq.id, sampler, logits, top: seq.top_logprobs(), cancel: seq.cancel_flag() };
        match grammar_helpers.send(job, seq.last_sample) {
            None => true,
            Some(job) => {
                seq.return_sampler(job.sampler);
                false
            }
        }
    }

    /// Takes the samples that are back from off the step (waiting as
    /// `GrammarHelpers::collect` says) into their sequences, running or
    /// preempted; a request that ended meanwhile drops its sampler here.
    pub(super) fn collect_samples(&mut self, at_least: Option<Duration>) {
        let Some(grammar_helpers) = self.grammar_helpers.as_mut().filter(|o| o.busy()) else { return };
        let samples = grammar_helpers.collect(at_least);
        let step = self.meter.stats().steps;
        let vocab = self.model.vocab();
        for Sample { id, sampler, token, logprob, took: duration, .. } in samples {
            let (seq, running) = if let Some(i) = self.running.iter().position(|s| s.id == id) {
                (&mut self.running[i], Some(i))
            } else if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
                (&mut self.waiting[i], None)
            } else {
                continue;
            };
            seq.return_sampler(sampler);
            if seq.wants_out() {
                // Cancelled or its client gone: the step ends it as such;
                // its token (if the helper sampled one) is not used.
                continue;
            }
            seq.last_sample = Some(duration);
            let sampled = token.and_then(|t| seq.take_token(vocab, t, logprob, step).map_err(Failure::from));
            let Some(cause) = took(&mut self.meter, &mut self.step.outbox, seq, sampled) else { continue };
            let seq = match running {
                Some(i) => self.running.remove(i),
                None => {
                    let i = self.waiting.iter().position(|s| s.id == id).expect("found above");
                    self.waiting.remove(i).expect("index in range")
                }
            };
            self.finish(seq, cause);
        }
    }
}

/// A helper thread: samples each job's row with its sampler, catching a
/// panic as the worker does, until the worker drops its sender. A job
/// whose request was cancelled comes back unsampled.
fn helper<'m>(index: usize, vocab: &'m Vocab, jobs: &mpsc::Receiver<Job<'m>>, samples: &mpsc::Sender<Sample<'m>>) {
    lower_priority();
    for Job { id, mut sampler, logits, top, cancel } in jobs {
        let started = Instant::now();
        let token = if cancel.load(Ordering::Relaxed) {
            Err(Failure::from(crate::error::Error::Aborted))
        } else {
            match catch_unwind(AssertUnwindSafe(|| sampler.sample_logits(vocab, &logits))) {
                Ok(token) => token.map_err(Failure::from),
                Err(panic) => Err(Failure::panic(&*panic)),
            }
        };
        let logprob = match (&token, top) {
            (Ok(t), Some(top)) => Some(token_logprob(&logits, *t, top)),
            _ => None,
        };
        let sample = Sample { helper: index, id, sampler, token, logprob, took: started.elapsed() };
        if samples.send(sample).is_err() {
            return;
        }
    }
}

/// Nice value of the helper thread: the decode threads (every request's
/// step) win the cores when both want them; the helper still runs whenever
/// a core is free.
const HELPER_NICE: i32 = 19;

/// Lowers the calling thread's scheduling priority to [`HELPER_NICE`]
/// (Linux: a thread's nice value is its own). Elsewhere nothing changes.
pub(crate) fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority with PRIO_PROCESS and who = 0 changes only the
    // calling thread's nice value on Linux (see setpriority(2), "BUGS": the
    // nice value is a per-thread attribute); it takes no pointers, and a
    // failure (EACCES never applies to lowering) leaves the priority as it
    // was, which is harmless.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, HELPER_NICE);
    }
}
