//! Batches of tokens to decode.

use std::fmt;

use crate::error::{Error, Result};
use crate::sys;
use crate::vocab::Token;

/// A sequence id: which of the context's independent token streams a token
/// belongs to (`0..n_seq_max`).
pub type SeqId = i32;
/// A position inside a sequence.
pub type Pos = i32;

/// An owned, capacity-checked batch of tokens for [`Context::decode`].
///
/// Each token carries its position, the sequences it belongs to and whether
/// its logits are wanted. Pushing past the capacity is an error, never an
/// overflow; [`Context::decode`] checks the rest (token ids, sequence ids,
/// positions) against the context before llama.cpp sees the batch.
///
/// [`Context::decode`]: crate::Context::decode
pub struct Batch {
    raw: sys::llama_batch,
    capacity: usize,
    max_seqs_per_token: usize,
    n_outputs: usize,
}

// SAFETY: the batch owns its malloc'd arrays exclusively; nothing else holds
// pointers to them, so moving it to another thread is fine.
unsafe impl Send for Batch {}
// SAFETY: `&Batch` only allows reads of the arrays.
unsafe impl Sync for Batch {}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch").field("len", &self.len()).field("capacity", &self.capacity).finish()
    }
}

impl Batch {
    /// A batch for up to `capacity` tokens, each in at most
    /// `max_seqs_per_token` sequences (both at least 1).
    #[doc(alias = "llama_batch_init")]
    pub fn new(capacity: usize, max_seqs_per_token: usize) -> Batch {
        let capacity = capacity.clamp(1, i32::MAX as usize);
        let max_seqs_per_token = max_seqs_per_token.clamp(1, crate::context::max_sequences() as usize);
        // SAFETY: positive sizes; `embd = 0` allocates the token array.
        let raw = unsafe { sys::llama_batch_init(capacity as i32, 0, max_seqs_per_token as i32) };
        Batch { raw, capacity, max_seqs_per_token, n_outputs: 0 }
    }

    /// A batch holding `tokens` of sequence 0 at positions `start..`, with
    /// logits requested for the last token only.
    pub fn from_tokens(tokens: &[Token], start: Pos) -> Batch {
        let mut batch = Batch::new(tokens.len(), 1);
        // Cannot fail: the capacity is exactly the token count.
        let _ = batch.push_sequence(tokens, start, 0, true);
        batch
    }

    /// Appends one token.
    ///
    /// # Errors
    /// [`Error::BatchFull`] when the batch is full; [`Error::InvalidArgument`]
    /// when `seq_ids` is empty or longer than the batch allows.
    pub fn push(&mut self, token: Token, pos: Pos, seq_ids: &[SeqId], logits: bool) -> Result<()> {
        let i = self.len();
        if i >= self.capacity {
            return Err(Error::BatchFull { capacity: self.capacity });
        }
        if seq_ids.is_empty() || seq_ids.len() > self.max_seqs_per_token {
            return Err(Error::InvalidArgument(format!(
                "a token needs 1..={} sequence ids, got {}",
                self.max_seqs_per_token,
                seq_ids.len()
            )));
        }
        // SAFETY: `i < capacity`, the length every array was allocated with;
        // each `seq_id[i]` row holds `max_seqs_per_token` ids, and
        // `seq_ids.len()` is at most that.
        unsafe {
            *self.raw.token.add(i) = token.0;
            *self.raw.pos.add(i) = pos;
            *self.raw.n_seq_id.add(i) = seq_ids.len() as i32;
            let row = *self.raw.seq_id.add(i);
            std::ptr::copy_nonoverlapping(seq_ids.as_ptr(), row, seq_ids.len());
            *self.raw.logits.add(i) = logits as i8;
        }
        self.raw.n_tokens += 1;
        self.n_outputs += logits as usize;
        Ok(())
    }

    /// Appends `tokens` of one sequence at positions `start..`, requesting
    /// logits for the last one if `logits_last`. Nothing is added on error.
    ///
    /// # Errors
    /// [`Error::BatchFull`] if they do not all fit.
    pub fn push_sequence(&mut self, tokens: &[Token], start: Pos, seq: SeqId, logits_last: bool) -> Result<()> {
        if self.len() + tokens.len() > self.capacity {
            return Err(Error::BatchFull { capacity: self.capacity });
        }
        let last = tokens.len().saturating_sub(1);
        for (k, &t) in tokens.iter().enumerate() {
            self.push(t, start + k as Pos, &[seq], logits_last && k == last)?;
        }
        Ok(())
    }

    /// Removes every token; the capacity stays.
    pub fn clear(&mut self) {
        self.raw.n_tokens = 0;
        self.n_outputs = 0;
    }

    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.raw.n_tokens as usize
    }

    /// Whether the batch holds no token.
    pub fn is_empty(&self) -> bool {
        self.raw.n_tokens == 0
    }

    /// The most tokens the batch holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many tokens request logits.
    pub fn n_outputs(&self) -> usize {
        self.n_outputs
    }

    /// The tokens.
    pub fn tokens(&self) -> &[Token] {
        // SAFETY: the first `len` entries were written by `push`; `Token`
        // is a `repr(transparent)` i32 like `llama_token`.
        unsafe { std::slice::from_raw_parts(self.raw.token.cast::<Token>(), self.len()) }
    }

    /// The positions.
    pub fn positions(&self) -> &[Pos] {
        // SAFETY: the first `len` entries were written by `push`.
        unsafe { std::slice::from_raw_parts(self.raw.pos, self.len()) }
    }

    /// The sequence ids of token `i`.
    pub fn seq_ids(&self, i: usize) -> &[SeqId] {
        if i >= self.len() {
            return &[];
        }
        // SAFETY: `i < len`; row `i` holds `n_seq_id[i]` ids written by `push`.
        unsafe { std::slice::from_raw_parts(*self.raw.seq_id.add(i), *self.raw.n_seq_id.add(i) as usize) }
    }

    /// Whether token `i` requests logits.
    pub fn has_logits(&self, i: usize) -> bool {
        // SAFETY: `i < len` is checked first.
        i < self.len() && unsafe { *self.raw.logits.add(i) } != 0
    }

    /// Requests (or not) the logits of token `i`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `i` is not a token of the batch.
    pub fn set_logits(&mut self, i: usize, logits: bool) -> Result<()> {
        if i >= self.len() {
            return Err(Error::InvalidArgument(format!("batch index {i} out of 0..{}", self.len())));
        }
        let was = self.has_logits(i);
        // SAFETY: `i < len <= capacity`.
        unsafe { *self.raw.logits.add(i) = logits as i8 };
        self.n_outputs = self.n_outputs + logits as usize - was as usize;
        Ok(())
    }

    pub(crate) fn raw(&self) -> sys::llama_batch {
        self.raw
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `llama_batch_init` and its `seq_id`
        // sentinel was never touched (we only write rows below capacity).
        unsafe { sys::llama_batch_free(self.raw) }
    }
}
