//! The worker's queues: taking requests in, dropping cancelled ones,
//! admitting waiting ones into the pool, preempting and making room.

use super::*;

impl<'m> Worker<'m> {
    /// Queues a new request behind every request of the same or higher
    /// priority.
    pub(super) fn accept(&mut self, mut s: Submission) {
        let compiled = s.checked.compiled.take();
        let sampler = match s.checked.request.sampling.sampler_with(self.model, compiled) {
            Ok(sampler) => sampler,
            Err(e) => {
                // Checked at submit; a failure here is still only this
                // request's.
                self.shared.queued.fetch_sub(1, Ordering::AcqRel);
                let cause = Cause::Failed(e.into());
                self.meter.finished(cause.label());
                let _ = s.events.try_send(Event::Done(Finish {
                    reason: cause.reason(),
                    usage: Usage { prompt_tokens: s.checked.prompt.len(), ..Usage::default() },
                    timings: Timings { total: s.submitted.elapsed(), ..Timings::default() },
                }));
                return;
            }
        };
        let seq = Seq::new(self.model, s, sampler);
        let at = self.waiting.iter().position(|w| w.priority < seq.priority).unwrap_or(self.waiting.len());
        self.waiting.insert(at, seq);
    }

    pub(super) fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].wants_out() {
                let seq = self.running.remove(i);
                self.finish(seq, Cause::Cancelled);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].wants_out() {
                let seq = self.waiting.remove(i).expect("index in range");
                self.finish(seq, Cause::Cancelled);
            } else {
                i += 1;
            }
        }
    }

    /// Admits waiting requests in order (skipping those whose sample is
    /// still out) while there is a slot, room for the uncached prompt plus
    /// the reserve, and `max_running` allows.
    pub(super) fn admit(&mut self) {
        // Preempted while its sampler was out: a sequence comes back in once
        // its token has; the ones behind it are not held up meanwhile.
        while self.running.len() < self.policy.max_running
            && let Some(at) = self.waiting.iter().position(|s| !s.awaiting())
        {
            let next = &self.waiting[at];
            // A preempted sequence with saved cells restores them (every
            // cell its own); others look for a prefix to share, now or
            // once a running sequence has prefilled it.
            let (share, follow) = if next.placement.saved.is_some() {
                (None, None)
            } else {
                let share = self.pool.longest_prefix(&mut self.ctx, &self.running, &next.tokens);
                let follow = self.pool.leader(&self.running, &next.tokens, share.map_or(0, |s| s.len));
                (share, follow)
            };
            let will_share = follow.map_or(share.map_or(0, |s| s.len), |f| f.to);
            let need = (next.tokens.len() - will_share).saturating_add(self.policy.reserve);
            if !self.pool.room_for(&mut self.ctx, &self.running, need, share.map(|s| s.slot)) {
                break;
            }
            let mut seq = self.waiting.remove(at).expect("found above");
            let restoring = seq.placement.saved.is_some();
            let shared = self.pool.place(&mut self.ctx, &self.running, &mut seq, share, follow, self.admissions);
            if !restoring {
                self.meter.count(Counter::PrefixLookups, u64::from(self.pool.sharing()));
            }
            self.admissions += 1;
            if !seq.clock.ever_admitted() {
                self.shared.queued.fetch_sub(1, Ordering::AcqRel);
                count_shared(&mut self.meter, &mut seq, shared);
                self.meter.count(Counter::PromptTokens, seq.usage.prompt_tokens as u64);
                let waited = seq.clock.admit(Instant::now());
                self.meter.record(LatencySeries::Queue, waited);
            }
            self.running.push(seq);
        }
    }

    /// Followers whose leader now holds their shared prefix take its cells;
    /// a follower whose leader is gone (finished, cancelled, preempted)
    /// takes what the prefix index offers and prefills the rest itself.
    pub(super) fn catch_up(&mut self) {
        for i in 0..self.running.len() {
            let Some(follow) = self.running[i].placement.follow else { continue };
            let leader = self
                .running
                .iter()
                .find(|s| s.id == follow.leader)
                .and_then(|s| Some((s.placement.slot?, s.placement.n_cached)));
            let source = match leader {
                Some((_, held)) if held < follow.to => continue, // not there yet
                Some((slot, _)) => Some(Share { slot, len: follow.to }),
                None => self.pool.longest_prefix(&mut self.ctx, &self.running, &self.running[i].tokens),
            };
            self.pool.stop_following(&mut self.running[i]);
            let Some(Share { slot: src, len }) = source else { continue };
            if len <= self.running[i].placement.n_cached
                || !swa_window_present(&mut self.ctx, src, len).unwrap_or(false)
            {
                continue;
            }
            let Some(src_cells) = self.pool.source_cells(&self.running, src) else { continue };
            let seq = &mut self.running[i];
            let shared = self.pool.share(&mut self.ctx, src, &src_cells, seq, len);
            count_shared(&mut self.meter, seq, shared);
        }
    }

    /// Frees a running sequence's cells and requeues it. Its cells are
    /// saved to host memory first (llama.cpp's sequence state) and
    /// restored when there is room again, so it continues exactly where it
    /// was; if saving or restoring fails, it is recomputed from its tokens.
    pub(super) fn preempt(&mut self, i: usize) {
        let mut seq = self.running.remove(i);
        self.pool.vacate(&mut self.ctx, &mut seq);
        seq.preempted();
        self.meter.count(Counter::Preemptions, 1);
        // Ahead of every waiting request of the same or lower priority.
        let at = self.waiting.iter().position(|w| w.priority <= seq.priority).unwrap_or(self.waiting.len());
        self.waiting.insert(at, seq);
    }

    /// Plans the step until its new tokens fit in the pool, evicting
    /// cached prefixes and then preempting sequences as needed. Returns
    /// false when nothing is left to run.
    pub(super) fn schedule_with_room(&mut self) -> bool {
        loop {
            self.catch_up();
            self.step.loads.clear();
            self.step
                .loads
                .extend(self.running.iter().map(|s| Load { remaining: s.remaining(), decoding: s.decoding() }));
            scheduler::split_budget(
                self.policy.budget,
                self.policy.prefill_cap,
                &self.step.loads,
                &mut self.step.tokens,
            );
            self.fit_media();
            let needed: usize = self.step.tokens.iter().sum();
            if needed == 0 {
                return false;
            }
            if self.pool.cells_used(&self.running) + needed <= self.pool.capacity() {
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
    pub(super) fn make_room(&mut self) -> bool {
        if self.pool.evict_lru(&mut self.ctx, None) {
            return true;
        }
        if self.running.len() > 1 {
            // Preempting a sequence frees its own cells and its tokens of
            // this step; one with neither would be preempted for nothing.
            let frees = |i: usize| {
                let s = &self.running[i];
                self.step.tokens.get(i).is_some_and(|&n| n > 0) || s.placement.cells.own(s.placement.own_run) > 0
            };
            let mut pool: Vec<usize> = (0..self.running.len()).filter(|&i| frees(i)).collect();
            if pool.is_empty() {
                pool = (0..self.running.len()).collect();
            }
            let candidates: Vec<Candidate> = pool
                .iter()
                .map(|&i| Candidate {
                    priority: self.running[i].priority,
                    admitted: self.running[i].placement.admitted_order,
                })
                .collect();
            let i = pool[scheduler::victim(&candidates).expect("running is not empty")];
            self.preempt(i);
            return true;
        }
        if let Some(seq) = self.running.pop() {
            self.finish(seq, Cause::ContextFull);
        }
        !self.running.is_empty()
    }
}
