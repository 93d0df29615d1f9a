//! Batches of tokens to decode.

use std::fmt;

use crate::error::{Error, Result};
use crate::sys;
// Defined in the leaf module `types` (errors and contexts use them too);
// kept here at their old paths.
pub use crate::llama::types::{Pos, SeqId};
use crate::llama::types::{Token, max_sequences};

/// Whether a batch token computes an output: its logits (or, while
/// embeddings are on, its embedding), read afterwards through
/// [`Output::Index`](crate::Output::Index).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Logits {
    /// Compute this token's output row.
    Yes,
    /// No output row (the usual case for all but a prompt's last token).
    #[default]
    No,
}

impl From<bool> for Logits {
    /// `true` is [`Logits::Yes`].
    fn from(yes: bool) -> Logits {
        if yes { Logits::Yes } else { Logits::No }
    }
}

impl Logits {
    fn flag(self) -> i8 {
        (self == Logits::Yes) as i8
    }
}

/// An owned, capacity-checked batch of tokens for [`Context::decode`].
///
/// Each token carries its position, the sequences it belongs to and whether
/// its logits are wanted. Pushing past the capacity is an error, never an
/// overflow; [`Context::decode`] checks the rest (token ids, sequence ids,
/// positions) against the context before llama.cpp sees the batch.
///
/// The arrays are Rust vectors that grow up to the capacity on first use
/// and keep their memory across [`Batch::clear`], so a reused batch
/// allocates nothing per decode.
///
/// [`Context::decode`]: crate::Context::decode
pub struct Batch {
    tokens: Vec<i32>,
    positions: Vec<Pos>,
    n_seq_ids: Vec<i32>,
    /// Sequence ids, `max_seqs_per_token` slots per token.
    seq_ids: Vec<SeqId>,
    /// `seq_ids` row pointers in the shape llama.cpp reads them; rebuilt
    /// whenever `seq_ids` moves.
    seq_rows: Vec<*mut SeqId>,
    logits: Vec<i8>,
    capacity: usize,
    max_seqs_per_token: usize,
    n_outputs: usize,
}

// SAFETY: the only raw pointers (`seq_rows`) point into the batch's own
// `seq_ids` vector, which moves with it; nothing else holds them.
unsafe impl Send for Batch {}
// SAFETY: `&Batch` only allows reads of the vectors.
unsafe impl Sync for Batch {}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch").field("len", &self.len()).field("capacity", &self.capacity).finish()
    }
}

impl Batch {
    /// A batch for up to `capacity` tokens (at most `i32::MAX`), each in at
    /// most `max_seqs_per_token` sequences (1 to 256). Memory is taken as
    /// tokens are pushed, not up front.
    pub fn new(capacity: usize, max_seqs_per_token: usize) -> Batch {
        Batch {
            tokens: Vec::new(),
            positions: Vec::new(),
            n_seq_ids: Vec::new(),
            seq_ids: Vec::new(),
            seq_rows: Vec::new(),
            logits: Vec::new(),
            capacity: capacity.clamp(1, i32::MAX as usize),
            max_seqs_per_token: max_seqs_per_token.clamp(1, max_sequences() as usize),
            n_outputs: 0,
        }
    }

    /// A batch holding `tokens` of sequence 0 at positions `start..`, with
    /// logits requested for the last token only.
    pub fn from_tokens(tokens: &[Token], start: Pos) -> Batch {
        let mut batch = Batch::new(tokens.len(), 1);
        // Cannot fail: the capacity is exactly the token count.
        let _ = batch.push_sequence(tokens, start, 0, Logits::Yes);
        batch
    }

    /// Appends one token.
    ///
    /// # Errors
    /// [`Error::BatchFull`] when the batch is full; [`Error::InvalidArgument`]
    /// when `seq_ids` is empty or longer than the batch allows.
    pub fn push(&mut self, token: Token, pos: Pos, seq_ids: &[SeqId], logits: Logits) -> Result<()> {
        if self.len() >= self.capacity {
            return Err(Error::BatchFull { capacity: self.capacity });
        }
        if seq_ids.is_empty() || seq_ids.len() > self.max_seqs_per_token {
            return Err(Error::InvalidArgument(format!(
                "a token needs 1..={} sequence ids, got {}",
                self.max_seqs_per_token,
                seq_ids.len()
            )));
        }
        self.tokens.push(token.0);
        self.positions.push(pos);
        self.n_seq_ids.push(seq_ids.len() as i32);
        let row_start = self.seq_ids.len();
        self.seq_ids.extend_from_slice(seq_ids);
        self.seq_ids.resize(row_start + self.max_seqs_per_token, -1);
        self.logits.push(logits.flag());
        self.n_outputs += logits.flag() as usize;
        self.sync_rows();
        Ok(())
    }

    /// Keeps `seq_rows[i]` pointing at row `i` of `seq_ids`, which may have
    /// moved when it grew.
    fn sync_rows(&mut self) {
        let stride = self.max_seqs_per_token;
        let base = self.seq_ids.as_mut_ptr();
        if self.seq_rows.first().is_some_and(|&p| p != base) {
            self.seq_rows.clear();
        }
        while self.seq_rows.len() < self.tokens.len() {
            // SAFETY: row `len` starts at `len * stride`, inside `seq_ids`,
            // which holds `stride` slots for every pushed token.
            let row = unsafe { base.add(self.seq_rows.len() * stride) };
            self.seq_rows.push(row);
        }
    }

    /// Appends `tokens` of one sequence at positions `start..`; `last` says
    /// whether the last of them computes logits (the others never do).
    /// Nothing is added on error.
    ///
    /// # Errors
    /// [`Error::BatchFull`] if they do not all fit.
    pub fn push_sequence(&mut self, tokens: &[Token], start: Pos, seq: SeqId, last: Logits) -> Result<()> {
        if self.len() + tokens.len() > self.capacity {
            return Err(Error::BatchFull { capacity: self.capacity });
        }
        let n = tokens.len().saturating_sub(1);
        if i32::try_from(n).ok().and_then(|l| start.checked_add(l)).is_none() {
            return Err(Error::InvalidArgument(format!("positions from {start} overflow for {} tokens", tokens.len())));
        }
        for (k, &t) in tokens.iter().enumerate() {
            self.push(t, start + k as Pos, &[seq], if k == n { last } else { Logits::No })?;
        }
        Ok(())
    }

    /// Removes every token; the capacity and the memory stay.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.positions.clear();
        self.n_seq_ids.clear();
        self.seq_ids.clear();
        self.seq_rows.clear();
        self.logits.clear();
        self.n_outputs = 0;
    }

    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the batch holds no token.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
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
        // SAFETY: `Token` is a `repr(transparent)` i32.
        unsafe { std::slice::from_raw_parts(self.tokens.as_ptr().cast::<Token>(), self.tokens.len()) }
    }

    /// The positions.
    pub fn positions(&self) -> &[Pos] {
        &self.positions
    }

    /// The sequence ids of token `i` (empty if there is no token `i`).
    pub fn seq_ids(&self, i: usize) -> &[SeqId] {
        let (Some(&n), stride) = (self.n_seq_ids.get(i), self.max_seqs_per_token) else { return &[] };
        &self.seq_ids[i * stride..i * stride + n as usize]
    }

    /// Whether token `i` requests logits.
    pub fn has_logits(&self, i: usize) -> bool {
        self.logits.get(i).is_some_and(|&l| l != 0)
    }

    /// Requests (or not) the logits of token `i`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `i` is not a token of the batch.
    pub fn set_logits(&mut self, i: usize, logits: Logits) -> Result<()> {
        let Some(flag) = self.logits.get_mut(i) else {
            return Err(Error::OutOfRange { what: "batch", index: i, len: self.tokens.len() });
        };
        let was = *flag != 0;
        *flag = logits.flag();
        self.n_outputs = self.n_outputs + logits.flag() as usize - was as usize;
        Ok(())
    }

    /// The C view of the batch, valid while `self` is neither moved nor
    /// changed. llama.cpp copies what it reads before `llama_decode`
    /// returns and writes nothing through these pointers.
    pub(crate) fn raw(&self) -> sys::llama_batch {
        sys::llama_batch {
            n_tokens: self.tokens.len() as i32,
            token: self.tokens.as_ptr().cast_mut(),
            embd: std::ptr::null_mut(),
            pos: self.positions.as_ptr().cast_mut(),
            n_seq_id: self.n_seq_ids.as_ptr().cast_mut(),
            seq_id: self.seq_rows.as_ptr().cast_mut(),
            logits: self.logits.as_ptr().cast_mut(),
        }
    }
}
