//! The small types and limits that most of the crate shares: token ids,
//! positions, sequence ids, which output row to read, how many
//! sequences a context can have, and why a generation ended.
//!
//! They live in this leaf module (it imports nothing of the crate but
//! `sys`) so that batches, errors, the vocabulary and contexts can all name
//! them without importing each other. Each keeps its old path as a
//! re-export (`vocab::Token`, `batch::{Pos, SeqId}`,
//! `context::{Output, max_sequences}`) and its public one
//! (`llamacpp::Token`, `llamacpp::Pos`, `llamacpp::SeqId`, `llamacpp::Output`,
//! `llamacpp::max_sequences`).

use std::fmt;

use crate::sys;

/// A token id. Valid ids are `0..vocab.n_tokens()`; every call that takes a
/// `Token` checks that before llama.cpp sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct Token(pub i32);

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A sequence id: which of the context's independent token streams a token
/// belongs to (`0..n_seq_max`).
pub type SeqId = i32;
/// A position inside a sequence.
pub type Pos = i32;

/// Which output row of the last decode to read: the last one, or the row
/// of a batch token (by its index in the batch). A `usize` converts into
/// [`Output::Index`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Output {
    /// The last output of the last decode (after
    /// [`Context::eval`](crate::Context::eval), the last token's).
    Last,
    /// The output of the batch token at this index (it must have asked
    /// for logits, [`Logits::Yes`](crate::Logits::Yes)).
    Index(usize),
}

impl From<usize> for Output {
    fn from(i: usize) -> Output {
        Output::Index(i)
    }
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Output::Last => f.write_str("the last output"),
            Output::Index(i) => write!(f, "batch index {i}"),
        }
    }
}

/// The most sequences a context can have (256 in this llama.cpp).
#[doc(alias = "llama_max_parallel_sequences")]
pub fn max_sequences() -> u32 {
    // SAFETY: returns a compile-time constant of llama.cpp.
    unsafe { sys::llama_max_parallel_sequences() as u32 }
}

/// Why a generation ended.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_tokens` tokens were sampled.
    Length,
    /// This stop string appeared in the text.
    Stop(String),
    /// The model sampled an end-of-generation token.
    EndOfGeneration,
    /// Cancelled: the context's [`AbortHandle`](crate::AbortHandle), `Generation::cancel`, or
    /// a callback of `Generation::stream`.
    Cancelled,
    /// The context was full and the overflow policy was `Overflow::Error`
    /// (or a shift could free nothing); in the
    /// engine (`llamacpp::engine`), the request reached its `max_context` or
    /// could not get room in the KV pool even alone.
    ContextFull,
    /// The engine (`llamacpp::engine`) shut down while the request ran.
    Shutdown,
    /// The engine (`llamacpp::engine`) could not run the request (a failed
    /// decode, a sampler error): the message says why.
    Failed(String),
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FinishReason::Length => f.write_str("length"),
            FinishReason::Stop(s) => write!(f, "stop {s:?}"),
            FinishReason::EndOfGeneration => f.write_str("end of generation"),
            FinishReason::Cancelled => f.write_str("cancelled"),
            FinishReason::ContextFull => f.write_str("context full"),
            FinishReason::Shutdown => f.write_str("shutdown"),
            FinishReason::Failed(why) => write!(f, "failed: {why}"),
        }
    }
}
