//! The prompt cache of one sequence and the generation loop over it.

use crate::error::{Error, Result};
use crate::llama::batch::{Batch, Logits};
use crate::llama::context::Context;
use crate::llama::types::{Pos, SeqId, Token};
use crate::sampling::sampler::Sampler;
use crate::sampling::speculative::NgramDrafter;
use crate::text::placeholder::{is_placeholder, media_boundary};

mod decode;
mod generation;

pub use generation::Generation;
use generation::Phase;

use super::text_tail::{TailBuffers, TextTail};
use super::{GenerateOptions, GenerationStats, Overflow};

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
    /// The text buffers of the last run, for the next one.
    text: TailBuffers,
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
            text: TailBuffers::default(),
        }
    }
}

impl Session {
    /// An empty session: nothing is known to be cached yet.
    pub fn new() -> Session {
        Session::default()
    }

    /// The tokens currently in the KV cache of [`Session::seq`], in order.
    /// A conversation's media are runs of negative placeholders here (one
    /// per embedding), which are no vocabulary tokens.
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
    /// [`Error::EmptyPrompt`]; [`Error::PromptTooLong`] for a prompt longer
    /// than the context of a sequence ([`Context::n_ctx_seq`]);
    /// [`Error::InvalidToken`] for a token outside the vocabulary;
    /// [`Error::InvalidSeqId`] for a sequence outside the context;
    /// [`Error::InvalidParameter`] `stop` for more than
    /// [`MAX_STOPS`](super::MAX_STOPS) stop strings or one longer than
    /// [`MAX_STOP_BYTES`](super::MAX_STOP_BYTES);
    /// with [`GenerateOptions::speculation`], [`Error::InvalidParameter`]
    /// for its settings and [`Error::CannotSpeculate`] for a context whose
    /// cache cannot drop a rejected draft.
    pub fn generate<'a, 'm, 's>(
        &'a mut self,
        ctx: &'a mut Context<'m>,
        sampler: &'a mut Sampler<'s>,
        prompt: &[Token],
        options: &GenerateOptions,
    ) -> Result<Generation<'a, 'm, 's>> {
        let seq = options.seq;
        ctx.check_seq(seq)?;
        super::check_stops(&options.stop)?;
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let n_ctx = ctx.n_ctx_seq() as usize;
        if prompt.len() > n_ctx {
            return Err(Error::PromptTooLong { tokens: prompt.len(), limit: n_ctx });
        }
        let drafter = match options.speculation {
            Some(spec) => {
                spec.validate()?;
                ctx.check_can_speculate()?;
                Some(NgramDrafter::new(spec))
            }
            None => None,
        };

        let n_match = self.reusable(ctx, seq, prompt)?;
        // What the cache holds was checked when it was decoded (and may
        // hold a medium's placeholders: `prefill_runs`).
        for &token in &prompt[n_match..] {
            ctx.model().vocab().check(token)?;
        }
        let kept = self.keep(ctx, seq, prompt, n_match)?;
        // A recurrent cache kept nothing: the prefix is decoded again.
        for &token in &prompt[kept..n_match] {
            ctx.model().vocab().check(token)?;
        }
        let n_match = kept;

        let n_batch = ctx.n_batch() as usize;
        if self.batch.capacity() != n_batch {
            self.batch = Batch::new(n_batch, 1);
        }

        let stats = GenerationStats {
            prompt_tokens: prompt.len(),
            prompt_evaluated: prompt.len() - n_match,
            ..GenerationStats::default()
        };
        let abort = ctx.abort_handle();
        let (ctx, model) = ctx.model_for();
        // A JSON document steers toward closing before `max_tokens`, or
        // before the context is full where that ends the generation.
        let room = (options.overflow == Overflow::Error).then(|| n_ctx - prompt.len());
        sampler.close_within(match (options.max_tokens, room) {
            (Some(max), Some(room)) => Some(max.min(room)),
            (max, room) => max.or(room),
        });
        Ok(Generation {
            abort,
            tail: TextTail::reusing(std::mem::take(&mut self.text), model.vocab(), options.special, &options.stop),
            session: self,
            ctx,
            sampler,
            max_tokens: options.max_tokens,
            stop_at_eog: options.stop_at_eog,
            n_keep: options.n_keep,
            overflow: options.overflow,
            seq,
            n_ctx,
            draft: Vec::with_capacity(drafter.as_ref().map_or(0, |_| n_batch)),
            drafter,
            phase: Phase::Prefill,
            pending: None,
            start: None,
            first_token: None,
            earlier: std::time::Duration::ZERO,
            error: None,
            stats,
        })
    }

    /// How much of `prompt` the cache of `seq` holds for this run to keep:
    /// the common prefix with the record of the last run, if the cache
    /// still ends where that record says; never all of the prompt (the
    /// cache holds no logits: its last token is decoded again), never
    /// ending inside a medium, and nothing when a sliding window has
    /// dropped positions the rest would attend to. Changes nothing in `ctx`.
    fn reusable(&mut self, ctx: &mut Context<'_>, seq: SeqId, prompt: &[Token]) -> Result<usize> {
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
            n_match -= 1;
        }
        n_match = media_boundary(prompt, n_match);
        if n_match > 0 && !swa_window_present(ctx, seq, n_match)? {
            n_match = 0;
        }
        Ok(n_match)
    }

    /// Keeps the first `n_match` tokens of `prompt` in the cache of `seq`,
    /// removes the rest of the sequence, and records `prompt` as this
    /// run's. Returns how many were kept: none where a recurrent cache
    /// cannot drop a tail (the whole sequence is dropped instead).
    fn keep(&mut self, ctx: &mut Context<'_>, seq: SeqId, prompt: &[Token], mut n_match: usize) -> Result<usize> {
        if !ctx.seq_rm(Some(seq), Some(n_match as Pos), None)? {
            ctx.seq_rm(Some(seq), None, None)?;
            n_match = 0;
        }
        self.epoch = ctx.seq_epoch(seq)?;
        self.tokens.clear();
        self.tokens.extend_from_slice(prompt);
        self.n_cached = n_match;
        Ok(n_match)
    }

    /// Decodes `prompt[..upto]` into `seq` of `ctx` ahead of a
    /// [`Session::generate`] of the same prompt, which then reuses it:
    /// what the cache holds is kept as `generate` keeps it, text is
    /// decoded in batches without logits, and each run `start..start + len`
    /// of `runs` (a medium's placeholders, in order) by `decode_run(ctx,
    /// start)`. Returns how many positions were decoded.
    ///
    /// # Errors
    /// As [`Session::generate`]; what `decode_run` returns. After an error
    /// the cache ends with the last text batch or run that was decoded
    /// whole (a recurrent model's holds nothing).
    /// Removes what a failed decode left after the cached tokens; where
    /// the cache cannot drop a tail (a recurrent model's), the whole
    /// sequence.
    fn drop_after_cached(&mut self, ctx: &mut Context<'_>, seq: SeqId) {
        if !matches!(ctx.seq_rm(Some(seq), Some(self.n_cached as Pos), None), Ok(true)) {
            // Never fails on a sequence the run checked.
            let _ = ctx.seq_rm(Some(seq), None, None);
            self.n_cached = 0;
        }
        self.tokens.truncate(self.n_cached);
        if let Ok(epoch) = ctx.seq_epoch(seq) {
            self.epoch = epoch;
        }
    }

    #[cfg_attr(not(feature = "mtmd"), allow(dead_code))]
    pub(crate) fn prefill_runs(
        &mut self,
        ctx: &mut Context<'_>,
        seq: SeqId,
        prompt: &[Token],
        upto: usize,
        runs: &[(usize, usize)],
        mut decode_run: impl FnMut(&mut Context<'_>, usize) -> Result<()>,
    ) -> Result<usize> {
        ctx.check_seq(seq)?;
        let n_ctx = ctx.n_ctx_seq() as usize;
        if prompt.len() > n_ctx {
            return Err(Error::PromptTooLong { tokens: prompt.len(), limit: n_ctx });
        }
        let upto = upto.min(prompt.len());
        let n_match = self.reusable(ctx, seq, prompt)?;
        for &token in &prompt[n_match..] {
            if !is_placeholder(token) {
                ctx.model().vocab().check(token)?;
            }
        }
        let start = self.keep(ctx, seq, prompt, n_match)?;
        let n_batch = ctx.n_batch() as usize;
        if self.batch.capacity() != n_batch {
            self.batch = Batch::new(n_batch, 1);
        }
        while self.n_cached < upto {
            let from = self.n_cached;
            let result = match runs.iter().find(|&&(s, _)| s == from) {
                Some(&(_, len)) => decode_run(ctx, from).map(|()| from + len),
                None => {
                    let next = runs.iter().map(|&(s, _)| s).find(|&s| s > from).unwrap_or(upto);
                    let to = next.min(upto).min(from + n_batch);
                    self.batch.clear();
                    self.batch
                        .push_sequence(&prompt[from..to], from as Pos, seq, Logits::No)
                        .and_then(|()| ctx.decode(&self.batch).map(|()| to))
                }
            };
            match result {
                Ok(to) => self.n_cached = to,
                Err(e) => {
                    self.drop_after_cached(ctx, seq);
                    return Err(e);
                }
            }
        }
        Ok(self.n_cached - start)
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
