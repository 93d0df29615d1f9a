//! Speculative decoding without a draft model: drafts taken from the
//! sequence's own text, verified by the model in the same decode.
//!
//! Decoding is bound by reading the weights: a batch of a few tokens costs
//! little more than one. When the text repeats itself (a copy of part of
//! the prompt, code being edited, an answer quoting its sources), the
//! tokens that followed the last occurrence of the current n-gram are a
//! good guess for what follows now. [`Speculation`] turns that on for a
//! `Session` run
//! (`GenerateOptions::speculation`)
//! or a one-call [`Model::complete`](crate::Model::complete):
//!
//! * **Drafting.** The sequence's history (prompt and generated tokens) is
//!   indexed by n-grams of `ngram_min..=ngram_max` tokens (a hash of the n
//!   tokens → where they last ended; memory grows with the history, which
//!   the context bounds). The draft continues the longest n-gram that
//!   occurred before, as the text went on after it, and is at most as long
//!   as the stretch of text that matched there (up to 64 tokens): a long
//!   match is a copy in progress, a short one is often a common phrase
//!   that goes on differently.
//! * **Verification.** The sampled token and its draft go into one batch,
//!   with logits for each. The sampler samples at each position in turn
//!   and the draft is accepted while its samples equal the draft; the first
//!   sample that differs is kept (it is what the model chose there), the
//!   rest of the draft is removed from the cache. Every token is sampled by
//!   the same sampler from the same logits as without speculation, so the
//!   output has exactly the same distribution, whatever the sampler
//!   (grammars and constraints included): greedy output is the same text,
//!   up to the rounding differences between a batch and a single token.
//! * **Adaptive length.** A match of 16 tokens or more is a copy in
//!   progress and drafts up to `draft_max` at once; otherwise a draft
//!   accepted whole doubles the next one's
//!   length (up to `draft_max`), a partly accepted one sets it just past
//!   what was accepted, and drafts rejected at once halve it and, after two
//!   in a row, pause drafting for a while (doubling with each further miss,
//!   at most [`MAX_PAUSE`] tokens): text that does not repeat costs nothing
//!   measurable.
//!
//! It needs a cache that can drop a sequence's last positions: recurrent
//! and hybrid models, and a sliding-window cache without `swa_full` (which
//! may have dropped positions the kept tokens attend to), refuse it with
//! [`Error::CannotSpeculate`].

mod ngram;

pub(crate) use ngram::NgramDrafter;

use crate::error::{Error, Result};

/// The longest pause after drafts that were rejected outright, in tokens.
pub const MAX_PAUSE: usize = 64;

/// Speculative decoding with drafts from the sequence's own text: which
/// n-grams to look up and how long a draft may be, as a builder.
///
/// Defaults ([`Speculation::ngram`]): n-grams of 2 to 4 tokens, drafts of
/// at most 32 tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Speculation {
    pub(crate) ngram_min: usize,
    pub(crate) ngram_max: usize,
    pub(crate) draft_max: usize,
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation::ngram()
    }
}

impl Speculation {
    /// The longest n-gram [`Speculation::ngram_sizes`] accepts.
    pub const NGRAM_LIMIT: usize = 16;
    /// The longest draft [`Speculation::draft_max`] accepts.
    pub const DRAFT_LIMIT: usize = 64;

    /// Drafts from n-gram lookup in the sequence's history, with the
    /// defaults.
    pub fn ngram() -> Speculation {
        Speculation { ngram_min: 2, ngram_max: 4, draft_max: 32 }
    }

    /// The n-gram lengths looked up, longest first (default 2 to 4). A
    /// longer n-gram drafts less often and more accurately.
    #[must_use]
    pub fn ngram_sizes(mut self, min: usize, max: usize) -> Self {
        self.ngram_min = min;
        self.ngram_max = max;
        self
    }

    /// The most tokens one draft holds (default 32; measured in
    /// docs/speculative.md against 16, 24, 48 and 64): the batch of a step
    /// is at most this plus one.
    #[must_use]
    pub fn draft_max(mut self, n: usize) -> Self {
        self.draft_max = n;
        self
    }

    /// The most tokens one draft holds.
    pub fn max_draft(&self) -> usize {
        self.draft_max
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for n-gram sizes outside
    /// `1..=NGRAM_LIMIT` or `min > max`, or a `draft_max` outside
    /// `1..=DRAFT_LIMIT`.
    pub fn validate(&self) -> Result<()> {
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max || self.ngram_max > Self::NGRAM_LIMIT {
            return Err(Error::InvalidParameter {
                name: "ngram_sizes",
                message: format!(
                    "must be 1 <= min <= max <= {}, was {}..={}",
                    Self::NGRAM_LIMIT,
                    self.ngram_min,
                    self.ngram_max
                ),
            });
        }
        if self.draft_max == 0 || self.draft_max > Self::DRAFT_LIMIT {
            return Err(Error::InvalidParameter {
                name: "draft_max",
                message: format!("must be in 1..={}, was {}", Self::DRAFT_LIMIT, self.draft_max),
            });
        }
        Ok(())
    }
}
