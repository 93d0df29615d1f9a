//! The decoding half of a [`Generation`]: the prompt's prefill, the
//! pending token (with a draft after it when speculating), dropping what a
//! draft left behind, and context shifts.

use std::time::Instant;

use super::Generation;
use crate::error::{Error, Result};
use crate::llama::batch::Logits;
use crate::llama::types::{Pos, Token};
use crate::text::generate::{FinishReason, Overflow};
use crate::text::placeholder::is_placeholder;

impl Generation<'_, '_, '_> {
    /// Decodes the uncached part of the prompt in chunks of `n_batch`,
    /// with logits for the last prompt token only.
    pub(super) fn prefill(&mut self) -> Result<()> {
        let start = Instant::now();
        self.start = Some(start);
        let batch = &mut self.session.batch;
        let total = self.session.tokens.len();
        while self.session.n_cached < total {
            if self.abort.take() {
                self.finish(FinishReason::Cancelled);
                return Ok(());
            }
            let from = self.session.n_cached;
            let to = total.min(from + batch.capacity());
            batch.clear();
            batch.push_sequence(&self.session.tokens[from..to], from as Pos, self.seq, Logits::from(to == total))?;
            if let Err(e) = self.ctx.decode(batch) {
                self.resync();
                return Err(e);
            }
            self.session.n_cached = to;
        }
        self.ctx.synchronize();
        // Added to: a conversation's media may have been decoded before.
        self.stats.prefill_time += start.elapsed();
        Ok(())
    }

    /// Decodes the last sampled token, making room first if the context
    /// is full, and a draft after it when speculating. Returns the draft's
    /// length: its cells are in the cache, not yet counted as cached.
    pub(super) fn decode_pending(&mut self, token: Token) -> Result<usize> {
        if self.session.n_cached >= self.n_ctx {
            match self.overflow {
                Overflow::Error => return Err(Error::ContextFull { n_ctx: self.n_ctx as u32 }),
                Overflow::Shift => self.shift()?,
            }
        }
        self.make_draft();
        let n_past = self.session.n_cached;
        let batch = &mut self.session.batch;
        batch.clear();
        batch.push(token, n_past as Pos, &[self.seq], Logits::Yes)?;
        for (i, &t) in self.draft.iter().enumerate() {
            batch.push(t, (n_past + 1 + i) as Pos, &[self.seq], Logits::Yes)?;
        }
        if let Err(e) = self.ctx.decode(batch) {
            self.resync();
            if !self.draft.is_empty() {
                self.drop_rejected(self.draft.len())?;
            }
            return Err(e);
        }
        self.session.n_cached += 1;
        self.stats.drafted_tokens += self.draft.len();
        Ok(self.draft.len())
    }

    /// The draft to decode after the pending token (the history's last):
    /// as long as the drafter offers, within the context, the batch and
    /// the tokens still to sample (a step samples one more than it drafts).
    fn make_draft(&mut self) {
        self.draft.clear();
        let Some(drafter) = &mut self.drafter else { return };
        let room = self.n_ctx - self.session.n_cached - 1;
        let to_sample = self.max_tokens.map_or(usize::MAX, |max| max - self.stats.generated_tokens);
        let max = room.min(self.session.batch.capacity() - 1).min(to_sample - 1);
        drafter.draft(&self.session.tokens, max, &mut self.draft);
        // A history with media holds placeholders, which are no tokens to
        // decode: the draft ends before one.
        if let Some(cut) = self.draft.iter().position(|&t| is_placeholder(t)) {
            self.draft.truncate(cut);
        }
    }

    /// Removes the cells after the cached tokens (`rejected` draft tokens,
    /// or a failed decode's), so the cache ends where the record says.
    pub(super) fn drop_rejected(&mut self, rejected: usize) -> Result<()> {
        if rejected == 0 {
            return Ok(());
        }
        self.ctx.seq_rm(Some(self.seq), Some(self.session.n_cached as Pos), None)?;
        self.session.epoch = self.ctx.seq_epoch(self.seq)?;
        Ok(())
    }

    /// Context shift: keep `n_keep` tokens, discard half of the rest.
    fn shift(&mut self) -> Result<()> {
        if !self.ctx.can_shift() {
            return Err(Error::CannotShift);
        }
        let n_past = self.session.n_cached;
        let keep = self.n_keep.min(n_past);
        let discard = (n_past - keep) / 2;
        if discard == 0 {
            return Err(Error::ContextFull { n_ctx: self.n_ctx as u32 });
        }
        if !self.ctx.seq_rm(Some(self.seq), Some(keep as Pos), Some((keep + discard) as Pos))? {
            return Err(Error::CannotShift);
        }
        self.ctx.seq_add(self.seq, Some((keep + discard) as Pos), Some(n_past as Pos), -(discard as Pos))?;
        self.session.epoch = self.ctx.seq_epoch(self.seq)?;
        self.session.tokens.drain(keep..keep + discard);
        self.session.n_cached -= discard;
        if let Some(drafter) = &mut self.drafter {
            drafter.reset();
        }
        self.stats.context_shifts += 1;
        Ok(())
    }
}
