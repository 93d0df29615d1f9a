//! Streaming generation: prompt in, text pieces out.
//!
//! A [`Session`] remembers which tokens are in the KV cache of one
//! sequence, so a later prompt that starts the same way only decodes what
//! is new (the prompt cache of llama.cpp's `completion` tool and server).
//! [`Session::generate`] returns a [`Generation`]: an iterator of text
//! pieces that
//!
//! * prefills the prompt in chunks of the context's `n_batch`, asking for
//!   logits on the last prompt token only;
//! * samples with [`Sampler::sample`] and decodes one token at a time,
//!   reusing one [`Batch`] and one output `String` (the allocation-free
//!   [`Generation::next_piece`] hands out `&str`; the [`Iterator`]
//!   implementation copies each piece into a new `String`);
//! * yields only whole UTF-8 characters ([`Detokenizer`]);
//! * never yields any part of a stop string, even one split across tokens
//!   ([`StopMatcher`]);
//! * stops at end-of-generation tokens, after `max_tokens`, at a stop
//!   string, when cancelled through the context's [`AbortHandle`], or when
//!   the context is full (or shifts it, see [`Overflow`]);
//! * measures itself ([`GenerationStats`]).
//!
//! ```no_run
//! use llama::generate::{GenerateOptions, Session};
//! use llama::{ContextParams, Model, ModelParams, Sampler};
//!
//! # fn main() -> Result<(), llama::Error> {
//! let model = Model::load("gemma-3-270m-q4_k_m.gguf", &ModelParams::default())?;
//! let mut ctx = model.new_context(&ContextParams::default())?;
//! let mut sampler = Sampler::greedy();
//! let prompt = model.vocab().tokenize("The capital of France is", true)?;
//!
//! let mut session = Session::new();
//! let options = GenerateOptions::default().max_tokens(32).stop(["\n"]);
//! let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options)?;
//! while let Some(piece) = generation.next_piece() {
//!     print!("{}", piece?);
//! }
//! eprintln!("\n{}", generation.stats());
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::batch::{Batch, Pos, SeqId};
use crate::context::{AbortHandle, Context};
use crate::error::{Error, Result};
use crate::sampler::Sampler;
use crate::vocab::{Detokenizer, Token};

/// What to do when the context is full and another token must be decoded.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Overflow {
    /// Stop: the generation yields [`Error::ContextFull`] and finishes with
    /// [`FinishReason::ContextFull`].
    #[default]
    Error,
    /// Context shift, as llama.cpp's `completion` tool does it: keep the
    /// first `n_keep` tokens, discard half of the rest
    /// (`n_discard = (n_past - n_keep) / 2`) and move the remainder down.
    /// Needs a cache that can shift ([`Context::can_shift`]); otherwise the
    /// generation yields [`Error::CannotShift`].
    Shift,
}

/// Options of one [`Session::generate`] run, as a builder.
///
/// Defaults: no token limit, no stop strings, stop at end-of-generation
/// tokens, `n_keep` 0, [`Overflow::Error`], sequence 0, control tokens
/// rendered as nothing.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    max_tokens: Option<usize>,
    stop: Vec<String>,
    stop_at_eog: bool,
    n_keep: usize,
    overflow: Overflow,
    seq: SeqId,
    special: bool,
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
            special: false,
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

    /// Whether control tokens are rendered as their text (default: they
    /// give no text).
    #[must_use]
    pub fn special(mut self, on: bool) -> Self {
        self.special = on;
        self
    }
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
    /// Cancelled: the context's [`AbortHandle`], [`Generation::cancel`], or
    /// a callback of [`Generation::stream`].
    Cancelled,
    /// The context was full and the overflow policy was [`Overflow::Error`]
    /// (or a shift could free nothing); in the
    /// [engine](crate::engine), the request reached its `max_context` or
    /// could not get room in the KV pool even alone.
    ContextFull,
    /// The [engine](crate::engine) shut down while the request ran.
    Shutdown,
    /// The [engine](crate::engine) could not run the request (a failed
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

/// Counters and timings of one generation run.
///
/// The clock starts when the first piece is requested (the prefill runs
/// then, not in [`Session::generate`]).
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
        if self.context_shifts > 0 {
            write!(f, " | {} context shifts", self.context_shifts)?;
        }
        match &self.finish_reason {
            Some(reason) => write!(f, " | finish: {reason}"),
            None => f.write_str(" | finish: error"),
        }
    }
}

/// The number of trailing bytes of `text` that must be held back because
/// they could be the start of a stop string: the length of the longest
/// suffix of `text` that is a prefix of one of `stops` (a complete stop
/// string counts too). Always on a character boundary of `text`.
pub fn stop_holdback<S: AsRef<str>>(text: &str, stops: &[S]) -> usize {
    let bytes = text.as_bytes();
    let mut best = 0;
    for stop in stops {
        let stop = stop.as_ref().as_bytes();
        let longest = stop.len().min(bytes.len());
        for k in (best + 1..=longest).rev() {
            // `text` ends with the first k bytes of a stop string: since
            // those start at a character boundary of the stop string (a
            // non-continuation byte), they start at one of `text` too.
            if bytes.ends_with(&stop[..k]) && text.is_char_boundary(bytes.len() - k) {
                best = k;
                break;
            }
        }
    }
    best
}

/// Finds stop strings in streamed text without ever releasing part of one.
///
/// Feed it pieces with [`StopMatcher::push`]: it releases the text that
/// can no longer belong to a stop string and holds back the longest
/// suffix that could still grow into one ([`stop_holdback`]). When a stop
/// string completes, it releases the text before it and reports which one
/// matched. Its buffers are reused, so pushing does not allocate once they
/// have grown to the longest stop string.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new<S: AsRef<str>>(stops: &[S]) -> Self {
        let mut matcher = StopMatcher::default();
        matcher.set_stops(stops);
        matcher
    }

    /// Replaces the stop strings and forgets held text.
    pub fn set_stops<S: AsRef<str>>(&mut self, stops: &[S]) {
        self.stops.clear();
        self.stops.extend(stops.iter().map(|s| s.as_ref()).filter(|s| !s.is_empty()).map(str::to_owned));
        self.held.clear();
    }

    /// The stop strings.
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// Text held back because it could be the start of a stop string.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Adds `piece` and appends to `out` the text that is now certain not
    /// to be part of a stop string. Returns the index (into
    /// [`StopMatcher::stops`]) of a stop string that completed, the one
    /// that starts first if several did: `out` then ends right before it,
    /// and the held text is dropped.
    pub fn push(&mut self, piece: &str, out: &mut String) -> Option<usize> {
        self.held.push_str(piece);
        let mut found: Option<(usize, usize)> = None;
        for (i, stop) in self.stops.iter().enumerate() {
            if let Some(at) = self.held.find(stop.as_str())
                && found.is_none_or(|(best, _)| at < best)
            {
                found = Some((at, i));
            }
        }
        if let Some((at, i)) = found {
            out.push_str(&self.held[..at]);
            self.held.clear();
            return Some(i);
        }
        let cut = self.held.len() - stop_holdback(&self.held, &self.stops);
        out.push_str(&self.held[..cut]);
        self.held.drain(..cut);
        None
    }

    /// Appends the held text to `out` (at the end of a run that no stop
    /// string ended).
    pub fn flush(&mut self, out: &mut String) {
        out.push_str(&self.held);
        self.held.clear();
    }
}

/// The tokens in the KV cache of one sequence, remembered across runs so
/// that a prompt sharing a prefix with them decodes only the rest.
///
/// A session also keeps the buffers of the generation loop (batch, text),
/// so successive runs allocate almost nothing. Use one session per
/// sequence, always with the same [`Context`]. A session trusts its record
/// of the cache only for the context and sequence it last ran on, and only
/// while [`Context::seq_epoch`] is unchanged and the cache ends where the
/// record says: after any other change to the sequence (removal, shift,
/// copy, clear, state load), or on another context, the next run decodes
/// the whole prompt again.
#[derive(Debug)]
pub struct Session {
    /// `tokens[..n_cached]` are at positions `0..n_cached` of `seq`; a run
    /// in progress keeps its prompt and the sampled, not yet decoded token
    /// after them.
    tokens: Vec<Token>,
    n_cached: usize,
    seq: SeqId,
    /// The context ([`Context::id`]) and the epoch of `seq` in it
    /// ([`Context::seq_epoch`]) that the record is valid for.
    ctx_id: u64,
    epoch: u64,
    /// The batch of the prefill and decode loop; [`Session::generate`]
    /// replaces it with one of the context's `n_batch` when that differs.
    batch: Batch,
    stop: StopMatcher,
    /// The text of the last sampled token.
    piece: String,
    /// The text handed out by [`Generation::next_piece`].
    out: String,
}

impl Default for Session {
    fn default() -> Self {
        Session {
            tokens: Vec::new(),
            n_cached: 0,
            seq: 0,
            ctx_id: 0,
            epoch: 0,
            // A placeholder: `generate` sizes the batch for its context.
            batch: Batch::new(1, 1),
            stop: StopMatcher::default(),
            piece: String::new(),
            out: String::new(),
        }
    }
}

impl Session {
    /// An empty session: nothing is known to be cached yet.
    pub fn new() -> Session {
        Session::default()
    }

    /// The tokens currently in the KV cache of [`Session::seq`], in order.
    pub fn tokens(&self) -> &[Token] {
        &self.tokens[..self.n_cached.min(self.tokens.len())]
    }

    /// The sequence of the last run.
    pub fn seq(&self) -> SeqId {
        self.seq
    }

    /// Forgets the cached tokens and removes them from the context's cache.
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`] if the session's sequence does not exist in
    /// `ctx`.
    pub fn clear(&mut self, ctx: &mut Context<'_>) -> Result<()> {
        self.tokens.clear();
        self.n_cached = 0;
        ctx.seq_rm(Some(self.seq), None, None)?;
        self.ctx_id = ctx.id();
        self.epoch = ctx.seq_epoch(self.seq)?;
        Ok(())
    }

    /// Starts generating after `prompt` in sequence `options.seq` of `ctx`.
    ///
    /// This call only prepares the run: it reuses the longest common prefix
    /// of `prompt` and the cached tokens (removing the rest of the
    /// sequence from the cache; when the whole prompt is cached, its last
    /// token is decoded again for its logits). A recurrent model's cache
    /// holds one state per sequence, which cannot drop its last tokens: it
    /// is reused when the prompt continues all of the cached tokens (the
    /// usual next turn of a chat) and cleared otherwise. The prefill and
    /// the sampling run as the returned [`Generation`] is driven. The
    /// sampler is used as it is (not reset).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty prompt or one longer than
    /// the context of a sequence ([`Context::n_ctx_seq`]);
    /// [`Error::InvalidToken`] for a token outside the vocabulary;
    /// [`Error::InvalidSeqId`] for a sequence outside the context.
    pub fn generate<'a, 'm, 's>(
        &'a mut self,
        ctx: &'a mut Context<'m>,
        sampler: &'a mut Sampler<'s>,
        prompt: &[Token],
        options: &GenerateOptions,
    ) -> Result<Generation<'a, 'm, 's>> {
        let seq = options.seq;
        ctx.check_seq(seq)?;
        if prompt.is_empty() {
            return Err(Error::InvalidArgument("the prompt has no tokens".into()));
        }
        let n_ctx = ctx.n_ctx_seq() as usize;
        if prompt.len() > n_ctx {
            return Err(Error::InvalidArgument(format!(
                "the prompt has {} tokens but the context holds {n_ctx} per sequence",
                prompt.len()
            )));
        }
        let vocab = ctx.model().vocab();
        for &token in prompt {
            vocab.check(token)?;
        }

        // What is in the cache: the record of the last run on this
        // sequence, if the cache still ends where that record says.
        if self.seq != seq || self.ctx_id != ctx.id() || self.epoch != ctx.seq_epoch(seq)? {
            self.seq = seq;
            self.ctx_id = ctx.id();
            self.n_cached = 0;
        }
        let end = ctx.seq_pos_max(seq)?.map_or(0, |p| p as usize + 1);
        if end != self.n_cached {
            self.n_cached = 0;
        }
        self.tokens.truncate(self.n_cached);

        let mut n_match = self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        if n_match == prompt.len() {
            // The cache holds no logits: decode the last token again.
            n_match -= 1;
        }
        if n_match > 0 && !swa_window_present(ctx, seq, n_match)? {
            n_match = 0;
        }
        if !ctx.seq_rm(Some(seq), Some(n_match as Pos), None)? {
            // A recurrent cache cannot drop a tail; drop the whole sequence
            // (which never fails) and decode everything.
            ctx.seq_rm(Some(seq), None, None)?;
            n_match = 0;
        }
        self.epoch = ctx.seq_epoch(seq)?;
        self.tokens.clear();
        self.tokens.extend_from_slice(prompt);
        self.n_cached = n_match;

        let n_batch = ctx.n_batch() as usize;
        if self.batch.capacity() != n_batch {
            self.batch = Batch::new(n_batch, 1);
        }
        self.stop.set_stops(&options.stop);
        self.piece.clear();
        self.out.clear();

        let stats = GenerationStats {
            prompt_tokens: prompt.len(),
            prompt_evaluated: prompt.len() - n_match,
            ..GenerationStats::default()
        };
        Ok(Generation {
            abort: ctx.abort_handle(),
            detokenizer: Detokenizer::new(vocab, options.special),
            session: self,
            ctx,
            sampler,
            max_tokens: options.max_tokens,
            stop_at_eog: options.stop_at_eog,
            n_keep: options.n_keep,
            overflow: options.overflow,
            seq,
            n_ctx,
            phase: Phase::Prefill,
            pending: None,
            start: None,
            first_token: None,
            error: None,
            stats,
        })
    }
}

/// Whether the cache of `seq` still holds every position that tokens
/// decoded from `n_past` on attend to. A sliding-window cache without
/// `swa_full` forgets positions older than the window; without a sliding
/// window nothing is forgotten. (The check must not run then: a recurrent
/// or hybrid model's cache reports its last position as its first, which
/// would fail it and defeat prefix reuse.)
pub(crate) fn swa_window_present(ctx: &mut Context<'_>, seq: SeqId, n_past: usize) -> Result<bool> {
    let window = ctx.model().n_swa();
    if window == 0 {
        return Ok(true);
    }
    let Some(pos_min) = ctx.seq_pos_min(seq)? else {
        return Ok(true);
    };
    Ok(pos_min as usize <= n_past.saturating_sub(window))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Prefill,
    Running,
    /// Finished: the held-back text is yet to be handed out.
    Flush,
    Done,
}

/// One generation run, created by [`Session::generate`]: drive it with
/// [`Generation::next_piece`], the [`Iterator`] implementation, or
/// [`Generation::stream`].
///
/// Every piece is non-empty, valid UTF-8 and free of stop strings. After
/// the last piece, an error that ended the run (if any) is yielded once;
/// then the generation is finished and [`Generation::stats`] is final.
pub struct Generation<'a, 'm, 's> {
    session: &'a mut Session,
    ctx: &'a mut Context<'m>,
    sampler: &'a mut Sampler<'s>,
    detokenizer: Detokenizer<'m>,
    abort: AbortHandle,
    max_tokens: Option<usize>,
    stop_at_eog: bool,
    n_keep: usize,
    overflow: Overflow,
    seq: SeqId,
    n_ctx: usize,
    phase: Phase,
    /// A sampled token that has not been decoded yet.
    pending: Option<Token>,
    start: Option<Instant>,
    first_token: Option<Instant>,
    /// An error to yield after the held-back text.
    error: Option<Error>,
    stats: GenerationStats,
}

impl fmt::Debug for Generation<'_, '_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Generation")
            .field("seq", &self.seq)
            .field("n_past", &self.session.n_cached)
            .field("phase", &self.phase)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Generation<'_, '_, '_> {
    /// The statistics so far (final once the generation is finished).
    pub fn stats(&self) -> &GenerationStats {
        &self.stats
    }

    /// Why the run ended, once it has.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.stats.finish_reason.as_ref()
    }

    /// Whether the run has ended (pieces may still be held back for the
    /// next call while it says true).
    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Flush | Phase::Done)
    }

    /// Tokens now in the KV cache of the sequence: the position the next
    /// token will be decoded at. At most the context length of a sequence
    /// ([`Context::n_ctx_seq`]); equal to it when the context is full (for
    /// example after a prompt of exactly that many tokens).
    pub fn n_past(&self) -> usize {
        self.session.n_cached
    }

    /// Ends the run now, with [`FinishReason::Cancelled`] unless it has
    /// already ended. Text held back is dropped.
    pub fn cancel(&mut self) {
        if !self.is_finished() {
            self.finish(FinishReason::Cancelled);
        }
        self.phase = Phase::Done;
        self.session.stop.held.clear();
    }

    /// The next piece of text, `None` when the run is over. No allocation:
    /// the piece borrows a buffer that the next call reuses.
    ///
    /// # Errors
    /// The error that ended the run, yielded once after the last piece:
    /// [`Error::ContextFull`] (with [`Overflow::Error`]),
    /// [`Error::CannotShift`], decoding and sampling errors. Cancellation
    /// is not an error.
    pub fn next_piece(&mut self) -> Option<Result<&str>> {
        loop {
            match self.phase {
                Phase::Done => return self.error.take().map(Err),
                Phase::Flush => {
                    self.phase = Phase::Done;
                    self.session.out.clear();
                    self.flush_text();
                    if !self.session.out.is_empty() {
                        return Some(Ok(&self.session.out));
                    }
                }
                Phase::Prefill | Phase::Running => {
                    self.session.out.clear();
                    if let Err(e) = self.step() {
                        self.fail(e);
                    } else if !self.session.out.is_empty() {
                        return Some(Ok(&self.session.out));
                    }
                }
            }
        }
    }

    /// Drives the run to its end, handing each piece to `on_piece`, and
    /// returns the final statistics. When `on_piece` breaks, the run ends
    /// as [`FinishReason::Cancelled`] and no more pieces are handed out.
    ///
    /// # Errors
    /// As [`Generation::next_piece`]; [`Generation::stats`] is still valid.
    pub fn stream(&mut self, mut on_piece: impl FnMut(&str) -> ControlFlow<()>) -> Result<GenerationStats> {
        while let Some(piece) = self.next_piece() {
            if on_piece(piece?).is_break() {
                self.cancel();
                break;
            }
        }
        Ok(self.stats.clone())
    }

    /// Records the end of the run; the held-back text goes out next.
    fn finish(&mut self, reason: FinishReason) {
        if self.stats.finish_reason.is_none() {
            self.stats.finish_reason = Some(reason);
        }
        self.phase = Phase::Flush;
        self.session.tokens.truncate(self.session.n_cached);
    }

    fn fail(&mut self, e: Error) {
        if matches!(e, Error::Aborted) {
            self.finish(FinishReason::Cancelled);
            return;
        }
        if matches!(e, Error::ContextFull { .. }) {
            self.finish(FinishReason::ContextFull);
        }
        self.error = Some(e);
        self.phase = Phase::Flush;
        self.session.tokens.truncate(self.session.n_cached);
    }

    /// Appends the text still held (an unfinished character, a possible
    /// stop-string start) to the output, unless a stop string ended the
    /// run (then what is held belongs to it, or follows it).
    fn flush_text(&mut self) {
        let pending = self.detokenizer.pending().len();
        self.stats.incomplete_utf8_bytes = pending;
        if matches!(self.stats.finish_reason, Some(FinishReason::Stop(_))) {
            return;
        }
        if pending > 0 {
            let rest = self.detokenizer.finish();
            let s = &mut *self.session;
            s.stop.push(&rest, &mut s.out);
        }
        let s = &mut *self.session;
        s.stop.flush(&mut s.out);
    }

    /// After a failed decode: the tokens of the sequence that did make it
    /// into the cache (an aborted decode keeps finished micro-batches).
    fn resync(&mut self) {
        let end = self.ctx.seq_pos_max(self.seq).ok().flatten().map_or(0, |p| p as usize + 1);
        self.session.n_cached = end.min(self.session.tokens.len());
    }

    /// One step: the prefill (first call), then decode the pending token
    /// and sample the next one, leaving its releasable text in
    /// `session.out`.
    fn step(&mut self) -> Result<()> {
        if self.abort.is_aborted() {
            self.finish(FinishReason::Cancelled);
            return Ok(());
        }
        if self.phase == Phase::Prefill {
            self.phase = Phase::Running;
            self.prefill()?;
            if self.is_finished() {
                return Ok(());
            }
        }
        if self.max_tokens.is_some_and(|max| self.stats.generated_tokens >= max) {
            self.finish(FinishReason::Length);
            return Ok(());
        }
        if let Some(token) = self.pending.take() {
            self.decode_pending(token)?;
        }

        let token = self.sampler.sample(self.ctx, -1)?;
        let now = Instant::now();
        self.stats.generated_tokens += 1;
        match self.first_token {
            None => {
                self.first_token = Some(now);
                self.stats.time_to_first_token = self.start.map(|s| now - s);
            }
            Some(first) => self.stats.decode_time = now - first,
        }
        let vocab = self.ctx.model().vocab();
        if self.stop_at_eog && vocab.is_eog(token) {
            self.finish(FinishReason::EndOfGeneration);
            return Ok(());
        }
        self.session.tokens.push(token);
        self.pending = Some(token);

        let s = &mut *self.session;
        s.piece.clear();
        self.detokenizer.push(token, &mut s.piece)?;
        if let Some(i) = s.stop.push(&s.piece, &mut s.out) {
            let stop = s.stop.stops()[i].clone();
            self.finish(FinishReason::Stop(stop));
        }
        Ok(())
    }

    /// Decodes the uncached part of the prompt in chunks of `n_batch`,
    /// with logits for the last prompt token only.
    fn prefill(&mut self) -> Result<()> {
        let start = Instant::now();
        self.start = Some(start);
        let batch = &mut self.session.batch;
        let total = self.session.tokens.len();
        while self.session.n_cached < total {
            if self.abort.is_aborted() {
                self.finish(FinishReason::Cancelled);
                return Ok(());
            }
            let from = self.session.n_cached;
            let to = total.min(from + batch.capacity());
            batch.clear();
            batch.push_sequence(&self.session.tokens[from..to], from as Pos, self.seq, to == total)?;
            if let Err(e) = self.ctx.decode(batch) {
                self.resync();
                return Err(e);
            }
            self.session.n_cached = to;
        }
        self.ctx.synchronize();
        self.stats.prefill_time = start.elapsed();
        Ok(())
    }

    /// Decodes the last sampled token, making room first if the context
    /// is full.
    fn decode_pending(&mut self, token: Token) -> Result<()> {
        if self.session.n_cached >= self.n_ctx {
            match self.overflow {
                Overflow::Error => return Err(Error::ContextFull { n_ctx: self.n_ctx as u32 }),
                Overflow::Shift => self.shift()?,
            }
        }
        let batch = &mut self.session.batch;
        batch.clear();
        batch.push(token, self.session.n_cached as Pos, &[self.seq], true)?;
        if let Err(e) = self.ctx.decode(batch) {
            self.resync();
            return Err(e);
        }
        self.session.n_cached += 1;
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
        self.stats.context_shifts += 1;
        Ok(())
    }
}

impl Iterator for Generation<'_, '_, '_> {
    type Item = Result<String>;

    /// As [`Generation::next_piece`], copying the piece into a new `String`.
    fn next(&mut self) -> Option<Result<String>> {
        self.next_piece().map(|r| r.map(str::to_owned))
    }
}

impl std::iter::FusedIterator for Generation<'_, '_, '_> {}

impl Drop for Generation<'_, '_, '_> {
    fn drop(&mut self) {
        // Forget a sampled token that never reached the cache.
        self.session.tokens.truncate(self.session.n_cached);
    }
}
