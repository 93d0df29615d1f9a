//! Speculative decoding in the step: which sequences draft and how many
//! tokens, and the verification of a draft after the decode.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::cause::{Cause, Failure};
use super::{Worker, took};
use crate::llama::types::Pos;
use crate::serving::engine::metrics::Counter;

impl Worker<'_> {
    /// Gives the sequences that can draft what the planned step leaves:
    /// budget after every stream's token and the prefill chunks (at most
    /// `prefill_cap` while a prompt prefills), and cells the pool has free
    /// after the planned tokens. The budget is split evenly, each
    /// sequence's unused share going to those after it. With
    /// `draft_by_cost`, a draft is no longer than pays for itself by the
    /// step cost fitted so far and the chance its tokens hold (the
    /// sequence's acceptance rate, or what its match length says)
    /// ([`StepCost::draft_limit`](crate::engine::step_cost::StepCost::draft_limit)).
    pub(super) fn choose_drafts(&mut self) {
        self.step.drafts.clear();
        self.step.drafts.resize(self.running.len(), 0);
        let planned: usize = self.step.tokens.iter().sum();
        let prefilling = self.running.iter().zip(&self.step.tokens).any(|(s, &n)| n > 0 && !s.decoding());
        let streams = self.step.tokens.iter().filter(|&&n| n > 0).count();
        self.step.decode_rows = (!prefilling).then_some(streams);
        let eligible: Vec<usize> =
            (0..self.running.len()).filter(|&i| self.step.tokens[i] == 1 && self.running[i].can_draft()).collect();
        if eligible.is_empty() {
            return;
        }
        let free = self.pool.capacity().saturating_sub(self.pool.cells_used(&self.running) + planned);
        let mut left = self.policy.budget.saturating_sub(planned).min(free);
        if prefilling {
            left = left.min(self.policy.prefill_cap);
        }
        for (j, &i) in eligible.iter().enumerate() {
            let share = left / (eligible.len() - j);
            let seq = &mut self.running[i];
            let mut n = seq.make_draft(share);
            if self.policy.draft_by_cost {
                // Judged after drafting: how long the match is tells how
                // likely the draft holds.
                n = seq.cut_draft(self.step_cost.draft_limit(streams, seq.draft_confidence()));
            }
            self.step.drafts[i] = n;
            left -= n;
        }
        if let Some(rows) = &mut self.step.decode_rows {
            *rows += self.step.drafts.iter().sum::<usize>();
        }
    }

    /// Samples sequence `i` at its rows from `row` (its pending token's,
    /// then one per draft token) while the samples confirm the draft;
    /// the first sample that differs is kept, the draft's cells after the
    /// last confirmed token are removed. The cause if the request ends.
    pub(super) fn verify(&mut self, i: usize, row: usize, step: u64) -> Option<Cause> {
        let drafted = self.step.drafts[i];
        let (seq, ctx) = (&mut self.running[i], &mut self.ctx);
        let slot = seq.placement.slot.expect("running sequences have a slot");
        let mut accepted = 0;
        let mut end = None;
        for m in 0..=drafted {
            let sampled = match catch_unwind(AssertUnwindSafe(|| seq.sample(ctx, row + m, step))) {
                Ok(sampled) => sampled.map_err(Failure::from),
                Err(panic) => Err(Failure::panic(&*panic)),
            };
            end = took(&mut self.meter, &mut self.step.outbox, seq, sampled);
            // Not ended: the sampled token is the sequence's last.
            if end.is_some() || m == drafted || seq.tokens.last() != Some(&seq.draft()[m]) {
                break;
            }
            // The draft token in the cell after the cached ones is the
            // sampled one.
            self.pool.decoded(seq, 1);
            accepted += 1;
        }
        if accepted < drafted {
            // Removing a tail of an attention cache does not fail; a
            // failure would leave cells the accounting does not count,
            // which the next decode's slot search tolerates.
            let _ = ctx.seq_rm(Some(slot), Some(seq.placement.n_cached as Pos), None);
        }
        seq.verified(accepted);
        self.meter.count(Counter::DraftTokens, drafted as u64);
        self.meter.count(Counter::DraftTokensAccepted, accepted as u64);
        end
    }
}
