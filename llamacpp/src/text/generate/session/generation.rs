//! One generation run over a [`Session`]'s sequence: the pieces of text
//! it hands out, its stop conditions, and its statistics.

use std::fmt;
use std::ops::ControlFlow;
use std::time::Instant;

use super::Session;
use crate::error::{Error, Result};
use crate::llama::context::{AbortHandle, Context, Output};
use crate::llama::types::{SeqId, Token};
use crate::sampling::sampler::Sampler;
use crate::sampling::speculative::NgramDrafter;
use crate::text::generate::text_tail::TextTail;
use crate::text::generate::{FinishReason, GenerationStats, Overflow};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
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
    pub(super) session: &'a mut Session,
    pub(super) ctx: &'a mut Context<'m>,
    pub(super) sampler: &'a mut Sampler<'s>,
    /// Detokenizer, stop strings, and the text [`Generation::next_piece`]
    /// hands out.
    pub(super) tail: TextTail<'a>,
    pub(super) abort: AbortHandle,
    pub(super) max_tokens: Option<usize>,
    pub(super) stop_at_eog: bool,
    pub(super) n_keep: usize,
    pub(super) overflow: Overflow,
    pub(super) seq: SeqId,
    pub(super) n_ctx: usize,
    /// Speculative decoding: the drafter, and the draft decoded after the
    /// pending token.
    pub(super) drafter: Option<NgramDrafter>,
    pub(super) draft: Vec<Token>,
    pub(super) phase: Phase,
    /// A sampled token that has not been decoded yet.
    pub(super) pending: Option<Token>,
    pub(super) start: Option<Instant>,
    pub(super) first_token: Option<Instant>,
    /// Prefill done before the run ([`Generation::add_prefill`]), counted
    /// in the time to the first token.
    pub(super) earlier: std::time::Duration,
    /// An error to yield after the held-back text.
    pub(super) error: Option<Error>,
    pub(super) stats: GenerationStats,
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

    /// Counts `evaluated` prompt positions decoded in `time` before this
    /// run's own prefill (a conversation's media: [`Session::prefill_runs`]).
    pub(crate) fn add_prefill(&mut self, evaluated: usize, time: std::time::Duration) {
        self.stats.prompt_evaluated += evaluated;
        self.stats.prefill_time += time;
        self.earlier += time;
    }

    /// Ends the run now, with [`FinishReason::Cancelled`] unless it has
    /// already ended. Text held back is dropped.
    pub fn cancel(&mut self) {
        if !self.is_finished() {
            self.finish(FinishReason::Cancelled);
        }
        self.phase = Phase::Done;
        self.tail.discard();
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
                    self.tail.clear_released();
                    self.flush_text();
                    if !self.tail.released().is_empty() {
                        return Some(Ok(self.tail.released()));
                    }
                }
                Phase::Prefill | Phase::Running => {
                    self.tail.clear_released();
                    if let Err(e) = self.step() {
                        self.fail(e);
                    } else if !self.tail.released().is_empty() {
                        return Some(Ok(self.tail.released()));
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
    pub(super) fn finish(&mut self, reason: FinishReason) {
        if self.stats.finish_reason.is_none() {
            self.stats.finish_reason = Some(reason);
        }
        self.phase = Phase::Flush;
        self.session.tokens.truncate(self.session.n_cached);
    }

    fn fail(&mut self, e: Error) {
        if matches!(e, Error::Aborted) {
            // The request that stopped the decode ends this run: consumed.
            self.abort.take();
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
        self.stats.incomplete_utf8_bytes = self.tail.incomplete_utf8();
        if !matches!(self.stats.finish_reason, Some(FinishReason::Stop(_))) {
            self.tail.flush();
        }
    }

    /// After a failed decode: the tokens of the sequence that did make it
    /// into the cache (an aborted decode keeps finished micro-batches).
    pub(super) fn resync(&mut self) {
        let end = self.ctx.seq_pos_max(self.seq).ok().flatten().map_or(0, |p| p as usize + 1);
        self.session.n_cached = end.min(self.session.tokens.len());
    }

    /// One step: the prefill (first call), then decode the pending token
    /// (and a draft after it) and sample the next one (and one after each
    /// draft token the model confirms), leaving the releasable text in
    /// the tail.
    fn step(&mut self) -> Result<()> {
        if self.abort.take() {
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
        let drafted = match self.pending.take() {
            Some(token) => self.decode_pending(token)?,
            None => 0,
        };
        if drafted == 0 {
            let token = self.sampler.sample(self.ctx, Output::Last)?;
            self.take(token)?;
            return Ok(());
        }
        // Batch index m + 1 holds draft[m]; the output of index m predicts
        // it. Sample in order while the samples confirm the draft.
        let mut accepted = 0;
        let verified = (|| -> Result<()> {
            for m in 0..=drafted {
                let token = self.sampler.sample(self.ctx, Output::Index(m))?;
                let confirmed = self.take(token)? && m < drafted && token == self.draft[m];
                if !confirmed {
                    break;
                }
                // The draft token at this position is the sampled one.
                self.pending = None;
                self.session.n_cached += 1;
                accepted += 1;
            }
            Ok(())
        })();
        self.stats.accepted_draft_tokens += accepted;
        if let Some(drafter) = &mut self.drafter {
            drafter.record(drafted, accepted);
        }
        let dropped = self.drop_rejected(drafted - accepted);
        verified.and(dropped)
    }

    /// Counts a sampled token and hands it to the tail; false when it
    /// ended the run. Otherwise it is pending: the next token to decode.
    fn take(&mut self, token: Token) -> Result<bool> {
        let now = Instant::now();
        self.stats.generated_tokens += 1;
        match self.first_token {
            None => {
                self.first_token = Some(now);
                self.stats.time_to_first_token = self.start.map(|s| now - s + self.earlier);
            }
            Some(first) => self.stats.decode_time = now - first,
        }
        let vocab = self.ctx.model().vocab();
        if self.stop_at_eog && vocab.is_eog(token) {
            self.finish(FinishReason::EndOfGeneration);
            return Ok(false);
        }
        self.session.tokens.push(token);
        self.pending = Some(token);
        if let Some(stop) = self.tail.push(token)? {
            self.finish(FinishReason::Stop(stop));
            return Ok(false);
        }
        Ok(true)
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
        self.session.text = self.tail.take_buffers();
    }
}
