//! The checks a batch passes before llama.cpp sees it.

use super::Context;
use crate::error::{Error, Result};
use crate::llama::batch::Batch;
use crate::llama::types::Pos;
use crate::sys;

impl Context<'_> {
    /// Checks everything llama.cpp would abort on, or reject with a less
    /// helpful message, before it sees the batch.
    pub(super) fn validate(&mut self, batch: &Batch) -> Result<()> {
        let n = batch.len();
        if n == 0 {
            return Err(Error::InvalidBatch("the batch is empty".into()));
        }
        if n > self.n_batch as usize {
            return Err(Error::InvalidBatch(format!(
                "{n} tokens exceed the context's n_batch of {}; split the batch",
                self.n_batch
            )));
        }
        // SAFETY: a read of a setting of the live context.
        let causal = unsafe { sys::llama_get_causal_attn(self.ptr.as_ptr()) };
        if (self.non_causal || !causal || self.embeddings && self.model.has_encoder()) && n > self.n_ubatch as usize {
            return Err(Error::InvalidBatch(format!(
                "a non-causal batch must fit in one micro-batch: {n} tokens > n_ubatch {}",
                self.n_ubatch
            )));
        }
        let mem = self.memory();
        const UNSEEN: i32 = i32::MIN;
        self.next_pos.fill(UNSEEN);
        self.seq_tokens.fill(0);
        let positions = batch.positions();
        for (i, &token) in batch.tokens().iter().enumerate() {
            if token.0 < 0 || token.0 >= self.n_vocab {
                return Err(Error::InvalidToken { token: token.0, n_vocab: self.n_vocab });
            }
            let seqs = batch.seq_ids(i);
            if seqs.len() > 1 && !self.kv_unified {
                return Err(Error::InvalidBatch(format!(
                    "token {i} belongs to {} sequences; that needs a context with kv_unified",
                    seqs.len()
                )));
            }
            let pos = positions[i];
            // Negative positions mark free cells in llama.cpp's KV cache, and
            // the next position after each one must still fit in an i32.
            if !(0..Pos::MAX).contains(&pos) {
                return Err(Error::InvalidBatch(format!(
                    "position {pos} at batch index {i} is outside 0..{}",
                    Pos::MAX
                )));
            }
            for &seq in seqs {
                self.check_seq(seq)?;
                let slot = &mut self.next_pos[seq as usize];
                if *slot == UNSEEN {
                    // SAFETY: `seq` is below n_seq_max, which is all
                    // pos_max asserts on; NULL memory is accepted.
                    let last = unsafe { sys::llama_memory_seq_pos_max(mem, seq) };
                    if last >= 0 && Some(pos) != last.checked_add(1) {
                        return Err(Error::InvalidBatch(format!(
                            "sequence {seq} ends at position {last} in the cache, so its next token must be at {} (got {pos})",
                            i64::from(last) + 1
                        )));
                    }
                } else if pos != *slot {
                    return Err(Error::InvalidBatch(format!(
                        "positions of sequence {seq} must be consecutive: expected {}, got {pos} at batch index {i}",
                        *slot
                    )));
                }
                *slot = pos + 1;
                self.seq_tokens[seq as usize] += 1;
            }
        }
        if self.embeddings && !self.per_token_embeddings {
            self.check_pooled_batch(n)?;
        }
        Ok(())
    }

    /// llama.cpp pools each sequence over the tokens of one micro-batch and
    /// keeps the last micro-batch's result, so a sequence split over several
    /// micro-batches gets a silently wrong pooled embedding. Splits happen
    /// when the batch exceeds `n_ubatch` or, with one cache stream per
    /// sequence (no `kv_unified`), when sequences have different lengths
    /// (llama.cpp then cuts equal-length slices).
    fn check_pooled_batch(&self, n: usize) -> Result<()> {
        if n > self.n_ubatch as usize {
            return Err(Error::InvalidBatch(format!(
                "pooled embeddings need the batch in one micro-batch: {n} tokens > n_ubatch {}",
                self.n_ubatch
            )));
        }
        if !self.kv_unified {
            let mut lengths = self.seq_tokens.iter().filter(|&&c| c > 0);
            if let Some(first) = lengths.next()
                && lengths.any(|c| c != first)
            {
                return Err(Error::InvalidBatch(
                    "pooled embeddings of sequences of different lengths in one batch need kv_unified \
                     (or one batch per sequence)"
                        .into(),
                ));
            }
        }
        Ok(())
    }
}
