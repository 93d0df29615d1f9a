//! Options, finish reasons and statistics of a generation run.

use std::fmt;
use std::time::Duration;

use crate::llama::types::{FinishReason, SeqId};
use crate::llama::vocab::Special;
use crate::sampling::speculative::Speculation;

/// What to do when the context is full and another token must be decoded.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Overflow {
    /// Stop: the generation yields [`Error::ContextFull`](crate::Error::ContextFull) and finishes with
    /// [`FinishReason::ContextFull`].
    #[default]
    Error,
    /// Context shift, as llama.cpp's `completion` tool does it: keep the
    /// first `n_keep` tokens, discard half of the rest
    /// (`n_discard = (n_past - n_keep) / 2`) and move the remainder down.
    /// Needs a cache that can shift ([`Context::can_shift`](crate::Context::can_shift)); otherwise the
    /// generation yields [`Error::CannotShift`](crate::Error::CannotShift).
    Shift,
}

/// The limits and output of a generation, as a builder: the one options
/// type of [`Session::generate`](crate::generate::Session::generate),
/// [`CompleteOptions::generate`](crate::generate::CompleteOptions::generate),
/// [`Conversation::generate_options`](crate::chat::Conversation::generate_options)
/// and the engine's [`Request::generate`](crate::engine::Request::generate)
/// (most tokens, stop strings, stop at end-of-generation, control-token
/// output, speculation). `n_keep`, [`Overflow`] and the sequence are a
/// [`Session`](crate::generate::Session)'s: the engine places and bounds
/// its sequences itself.
///
/// Defaults: no token limit, no stop strings, stop at end-of-generation
/// tokens, `n_keep` 0, [`Overflow::Error`], sequence 0, control tokens
/// rendered as nothing, no speculative decoding (for an engine request:
/// the engine's default).
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    pub(crate) max_tokens: Option<usize>,
    pub(crate) stop: Vec<String>,
    pub(crate) stop_at_eog: bool,
    pub(crate) n_keep: usize,
    pub(crate) overflow: Overflow,
    pub(crate) seq: SeqId,
    pub(crate) special: Special,
    pub(crate) speculation: Option<Speculation>,
    /// [`GenerateOptions::speculation`] was called: the engine uses its
    /// own default otherwise.
    pub(crate) speculation_chosen: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: None,
            stop: Vec::new(),
            stop_at_eog: true,
            n_keep: 0,
            overflow: Overflow::Error,
            seq: 0,
            special: Special::Plain,
            speculation: None,
            speculation_chosen: false,
        }
    }
}

impl GenerateOptions {
    /// The most tokens to sample (finish reason [`FinishReason::Length`]).
    #[must_use]
    pub fn max_tokens(mut self, n: usize) -> Self {
        self.max_tokens = Some(n);
        self
    }

    /// Removes the token limit.
    #[must_use]
    pub fn unlimited(mut self) -> Self {
        self.max_tokens = None;
        self
    }

    /// Stop strings: generation ends when the text contains one of them;
    /// the text before it is yielded and the stop string itself never is.
    /// Empty strings are ignored.
    #[must_use]
    pub fn stop<I, S>(mut self, stops: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.stop = stops.into_iter().map(Into::into).filter(|s: &String| !s.is_empty()).collect();
        self
    }

    /// Whether an end-of-generation token (EOS, end of turn, …) ends the
    /// run (finish reason [`FinishReason::EndOfGeneration`]). When false,
    /// such tokens are decoded like any other.
    #[must_use]
    pub fn stop_at_eog(mut self, on: bool) -> Self {
        self.stop_at_eog = on;
        self
    }

    /// Tokens at the start of the sequence that a context shift keeps (for
    /// example the BOS token and a system prompt).
    #[must_use]
    pub fn n_keep(mut self, n: usize) -> Self {
        self.n_keep = n;
        self
    }

    /// What to do when the context is full.
    #[must_use]
    pub fn overflow(mut self, overflow: Overflow) -> Self {
        self.overflow = overflow;
        self
    }

    /// The sequence to generate in (default 0).
    #[must_use]
    pub fn seq(mut self, seq: SeqId) -> Self {
        self.seq = seq;
        self
    }

    /// Whether control tokens are rendered as their text
    /// ([`Special::Markup`]; default [`Special::Plain`]: they give no text).
    #[must_use]
    pub fn special(mut self, special: Special) -> Self {
        self.special = special;
        self
    }

    /// Speculative decoding with drafts from the sequence's own text (see
    /// [`crate::speculative`]): the same output distribution, several
    /// tokens per decode where the text repeats. [`Session::generate`](crate::generate::Session::generate)
    /// checks the settings and the context
    /// ([`Error::CannotSpeculate`](crate::Error::CannotSpeculate)).
    #[must_use]
    pub fn speculation(mut self, speculation: impl Into<Option<Speculation>>) -> Self {
        self.speculation = speculation.into();
        self.speculation_chosen = true;
        self
    }
}

/// Token counts of one request: a conversation turn
/// ([`Reply::usage`](crate::chat::Reply::usage)) or one of the engine's requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Of those, the ones shared from the prefix cache or a running
    /// sequence instead of being prefilled.
    pub cached_tokens: usize,
    /// Tokens sampled (including a final end-of-generation token).
    pub completion_tokens: usize,
    /// Of those, the ones a speculative draft proposed and the sampler
    /// confirmed (they took no decode step of their own).
    pub accepted_draft_tokens: usize,
    /// Draft tokens decoded and then rejected.
    pub rejected_draft_tokens: usize,
}

/// Counters and timings of one generation run.
///
/// The clock starts when the first piece is requested (the prefill runs
/// then, not in [`Session::generate`](crate::generate::Session::generate)).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationStats {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens the run decodes: the prompt minus the prefix reused
    /// from the KV cache (at least 1, since the cache holds no logits).
    /// A run cancelled during the prefill decoded fewer.
    pub prompt_evaluated: usize,
    /// Tokens sampled, including a final end-of-generation token.
    pub generated_tokens: usize,
    /// Draft tokens decoded for verification
    /// ([`GenerateOptions::speculation`]).
    pub drafted_tokens: usize,
    /// Draft tokens the model's samples confirmed: each is a generated
    /// token that took no decode step of its own.
    pub accepted_draft_tokens: usize,
    /// Context shifts performed ([`Overflow::Shift`]).
    pub context_shifts: usize,
    /// From the start to the first sampled token; `None` if none was.
    pub time_to_first_token: Option<Duration>,
    /// From the start until the prompt's logits were ready.
    pub prefill_time: Duration,
    /// From the first to the last sampled token: `generated_tokens - 1`
    /// decode-and-sample steps.
    pub decode_time: Duration,
    /// Bytes of an unfinished UTF-8 character still held when generation
    /// ended (yielded as U+FFFD). Normally 0.
    pub incomplete_utf8_bytes: usize,
    /// Why the run ended; `None` while it runs, or if it ended with an
    /// error other than a full context.
    pub finish_reason: Option<FinishReason>,
}

fn per_second(n: usize, time: Duration) -> f64 {
    let secs = time.as_secs_f64();
    if n == 0 || secs <= 0.0 { 0.0 } else { n as f64 / secs }
}

impl GenerationStats {
    /// Prompt tokens reused from the KV cache.
    pub fn reused_tokens(&self) -> usize {
        self.prompt_tokens.saturating_sub(self.prompt_evaluated)
    }

    /// Evaluated prompt tokens per second of prefill (0 if none).
    pub fn prefill_tokens_per_second(&self) -> f64 {
        per_second(self.prompt_evaluated, self.prefill_time)
    }

    /// Generated tokens per second after the first one (0 with fewer than
    /// two tokens).
    pub fn decode_tokens_per_second(&self) -> f64 {
        per_second(self.generated_tokens.saturating_sub(1), self.decode_time)
    }

    /// Milliseconds per output token after the first one (time per output
    /// token; 0 with fewer than two tokens).
    pub fn ms_per_token(&self) -> f64 {
        let steps = self.generated_tokens.saturating_sub(1);
        if steps == 0 { 0.0 } else { self.decode_time.as_secs_f64() * 1000.0 / steps as f64 }
    }
}

impl fmt::Display for GenerationStats {
    /// One line: prompt tokens (evaluated), TTFT, prefill tok/s, generated
    /// tokens, decode tok/s, ms/token, finish reason.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ttft = self.time_to_first_token.map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        write!(
            f,
            "prompt {} tokens ({} evaluated) | TTFT {:.1} ms | prefill {:.1} tok/s | generated {} tokens | decode {:.1} tok/s | {:.2} ms/token",
            self.prompt_tokens,
            self.prompt_evaluated,
            ttft,
            self.prefill_tokens_per_second(),
            self.generated_tokens,
            self.decode_tokens_per_second(),
            self.ms_per_token(),
        )?;
        if self.drafted_tokens > 0 {
            write!(f, " | draft {}/{} accepted", self.accepted_draft_tokens, self.drafted_tokens)?;
        }
        if self.context_shifts > 0 {
            write!(f, " | {} context shifts", self.context_shifts)?;
        }
        match &self.finish_reason {
            Some(reason) => write!(f, " | finish: {reason}"),
            None => f.write_str(" | finish: error"),
        }
    }
}
