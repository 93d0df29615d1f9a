//! The KV pool side of the worker: admission (with prefix lookup), LRU
//! eviction of cached prefixes, and preemption when a step does not fit.

use super::*;

impl<'m> Worker<'m> {
    pub(super) fn cells_used(&self) -> usize {
        cells_in_use(self.running.iter().map(|s| &s.cells).chain(self.cached.iter().map(|c| &c.cells)))
    }

    /// The longest prefix of `tokens` (short of its last token, whose
    /// logits are needed) that a running sequence or cached prefix holds:
    /// its slot and length.
    pub(super) fn lookup(&mut self, tokens: &[Token]) -> Option<(SeqId, usize)> {
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

    /// The running sequence still prefilling the longest prefix of `tokens`
    /// (short of its last token), if following it gains at least
    /// [`MIN_FOLLOW`] positions over the `k` shareable now.
    fn leader_for(&self, tokens: &[Token], k: usize) -> Option<Follow> {
        if !self.prefix_sharing || tokens.len() < 2 {
            return None;
        }
        let limit = tokens.len() - 1;
        self.running
            .iter()
            .filter(|s| s.slot.is_some() && !s.decoding() && s.follow.is_none())
            .map(|s| {
                let common = s.tokens[..s.prefill_to].iter().zip(&tokens[..limit]).take_while(|(a, b)| a == b).count();
                Follow { leader: s.id, to: common }
            })
            .filter(|f| f.to >= k + MIN_FOLLOW)
            .max_by_key(|f| f.to)
    }

    /// Followers whose leader now holds their shared prefix take its cells;
    /// a follower whose leader is gone (finished, cancelled, preempted)
    /// takes what the prefix index offers and prefills the rest itself.
    fn catch_up(&mut self) {
        for i in 0..self.running.len() {
            let Some(follow) = self.running[i].follow else { continue };
            let leader = self.running.iter().find(|s| s.id == follow.leader).and_then(|s| Some((s.slot?, s.n_cached)));
            let source = match leader {
                Some((_, held)) if held < follow.to => continue, // not there yet
                Some((slot, _)) => Some((slot, follow.to)),
                None => {
                    let tokens = std::mem::take(&mut self.running[i].tokens);
                    let found = self.lookup(&tokens);
                    self.running[i].tokens = tokens;
                    found
                }
            };
            self.running[i].follow = None;
            let Some((src, to)) = source else { continue };
            let from = self.running[i].n_cached;
            let Some(slot) = self.running[i].slot else { continue };
            if to <= from || !swa_window_present(&mut self.ctx, src, to).unwrap_or(false) {
                continue;
            }
            let Some(src_cells) = self.source_cells(src) else { continue };
            if self.ctx.seq_cp(src, slot, Some(from as Pos), Some(to as Pos)).is_err() {
                continue;
            }
            let seq = &mut self.running[i];
            seq.cells.extend_from(&src_cells, from, to);
            seq.n_cached = to;
            seq.cached_tokens += to - from;
            self.index.extend(slot, &seq.tokens[..to]);
            self.stats.prefix_hit_tokens += (to - from) as u64;
            ::metrics::counter!("llama_engine_prefix_hit_tokens_total").increment((to - from) as u64);
        }
    }

    /// The cells of the running sequence or cached prefix in `slot`.
    fn source_cells(&mut self, slot: SeqId) -> Option<Cells> {
        if let Some(s) = self.running.iter().find(|s| s.slot == Some(slot)) {
            return Some(s.cells.clone());
        }
        let c = self.cached.iter_mut().find(|c| c.slot == slot)?;
        c.last_used = self.tick;
        Some(c.cells.clone())
    }

    /// Removes the least recently used cached prefix other than `keep`.
    pub(super) fn evict_one(&mut self, keep: Option<SeqId>) -> bool {
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
    pub(super) fn release_slot(&mut self, slot: SeqId) {
        // Removing a whole sequence never fails.
        let _ = self.ctx.seq_rm(Some(slot), None, None);
        self.index.remove(slot);
        self.free_slots.push(slot);
    }

    /// Admits waiting requests in order while there is a slot, room for
    /// the uncached prompt plus the reserve, and `max_running` allows.
    pub(super) fn admit(&mut self) {
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
            let follow =
                if self.waiting[0].saved.is_some() { None } else { self.leader_for(&self.waiting[0].tokens, k) };
            let will_share = follow.map_or(k, |f| f.to);
            let need = (self.waiting[0].tokens.len() - will_share).saturating_add(self.reserve);
            // The cells running sequences still add before they sample
            // (their uncached prompts, also of those admitted just now).
            let pending: usize = self.running.iter().map(Seq::pending).sum();
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
            seq.follow = follow.filter(|f| f.to > seq.n_cached);
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
    pub(super) fn preempt(&mut self, i: usize) {
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
        seq.follow = None;
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
    pub(super) fn plan_with_room(&mut self) -> bool {
        loop {
            self.catch_up();
            self.loads.clear();
            self.loads.extend(self.running.iter().map(|s| Load { remaining: s.remaining(), decoding: s.decoding() }));
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
    pub(super) fn make_room(&mut self) -> bool {
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

    /// Evicts cached prefixes beyond the configured count and share.
    pub(super) fn trim_cache(&mut self) {
        while self.cached.len() > self.max_cached
            || cells_in_use(self.cached.iter().map(|c| &c.cells)) > self.cached_cell_limit
        {
            if !self.evict_one(None) {
                break;
            }
        }
    }
}
