//! One request inside the worker: where it is in the KV pool, its text,
//! its limits and its clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::Submission;
use super::cause::Cause;
use crate::error::Result;
use crate::llama::context::Context;
use crate::llama::model::Model;
use crate::llama::types::{SeqId, Token};
use crate::sampling::sampler::Sampler;
use crate::sampling::speculative::NgramDrafter;
use crate::serving::engine::kv::Cells;
use crate::serving::engine::media::{Spans, is_placeholder};
use crate::serving::engine::request::Request;
use crate::serving::engine::{Event, Finish, Piece, Timings, TokenLogprob, Usage};
use crate::text::generate::GenerateOptions;
use crate::text::generate::text_tail::TextTail;

/// A request the worker has accepted: waiting, prefilling or generating.
pub(super) struct Seq<'m> {
    pub id: u64,
    pub priority: i32,
    events: async_channel::Sender<Event>,
    cancel: Arc<AtomicBool>,
    /// The prompt, then every sampled token (the last one not yet decoded
    /// while generating).
    pub tokens: Vec<Token>,
    pub placement: Placement,
    /// `None` while the sampler is out on the helper thread (see
    /// `grammar_helpers`): the sequence then sits out the steps.
    sampler: Option<Sampler<'m>>,
    /// How long its last sample off the step took.
    pub last_sample: Option<Duration>,
    text: SeqText<'m>,
    limits: Limits,
    pub clock: Clock,
    pub usage: Usage,
    /// Speculative decoding, if the request has it.
    drafting: Option<Drafting>,
    /// The media runs among its prompt's tokens.
    pub media: Spans,
}

/// A sequence's drafter and the draft of the current step.
struct Drafting {
    drafter: NgramDrafter,
    /// Decoded after the pending token in this step, to be verified.
    draft: Vec<Token>,
}

/// Where a sequence is in the KV pool.
#[derive(Debug, Default)]
pub(super) struct Placement {
    /// Its sequence in the context, while admitted.
    pub slot: Option<SeqId>,
    /// `tokens[..n_cached]` are in the cells of `slot`.
    pub n_cached: usize,
    /// The sequence prefills until `n_cached` reaches this, then samples.
    pub prefill_to: usize,
    pub cells: Cells,
    /// The id of the run of cells this sequence decodes itself.
    pub own_run: u64,
    /// Admission order (for the preemption rule).
    pub admitted_order: u64,
    /// The cells of a preempted sequence, restored at readmission.
    pub saved: Option<Saved>,
    /// Waiting for a running sequence's prefill of the same prompt prefix
    /// instead of computing it twice.
    pub follow: Option<Follow>,
}

/// A preempted sequence's KV cells in host memory (llama.cpp's sequence
/// state) and how many positions they hold.
#[derive(Debug)]
pub(super) struct Saved {
    pub state: Vec<u8>,
    pub positions: usize,
}

/// A sequence whose prompt starts with positions `..to` of another
/// sequence's prompt, which that sequence (the leader) is still
/// prefilling: the follower plans no tokens until the leader holds them,
/// then shares those cells (`seq_cp`) and prefills only the rest. This is
/// what makes requests that arrive together with one system prompt compute
/// it once.
#[derive(Clone, Copy, Debug)]
pub(super) struct Follow {
    /// The leader's request id (its slot may change if it is preempted).
    pub leader: u64,
    pub to: usize,
}

/// The text side: the sampled tokens' text, and the piece it goes out in.
struct SeqText<'m> {
    tail: TextTail<'m>,
    /// The sampled token not yet handed out in a piece, and its
    /// log-probabilities if asked for.
    token: Option<Token>,
    logprob: Option<TokenLogprob>,
    /// How many alternatives to report with each token's log-probability.
    top_logprobs: Option<usize>,
}

/// What ends a request besides a stop string and the engine.
#[derive(Clone, Copy, Debug)]
struct Limits {
    max_tokens: Option<usize>,
    stop_at_eog: bool,
    /// The most cells the sequence may hold.
    max_context: usize,
}

/// When things happened to a request, for its [`Timings`] and the
/// engine's latency series.
#[derive(Debug)]
pub(super) struct Clock {
    submitted: Instant,
    /// The engine's step count at submit.
    submit_step: u64,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    inter_token_sum: Duration,
    inter_token_max: Duration,
    steps_to_first_token: Option<u64>,
    pub preemptions: u32,
}

/// The latencies one sampled token adds.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct TokenTimes {
    /// Time to first token, if this was the first.
    pub first: Option<Duration>,
    /// Gap since the previous token, if any.
    pub gap: Option<Duration>,
}

impl Clock {
    fn new(submitted: Instant, submit_step: u64) -> Self {
        Clock {
            submitted,
            submit_step,
            admitted: None,
            first_token: None,
            last_token: None,
            inter_token_sum: Duration::ZERO,
            inter_token_max: Duration::ZERO,
            steps_to_first_token: None,
            preemptions: 0,
        }
    }

    /// Whether the request was ever admitted (until then it counts against
    /// `max_queue`).
    pub fn ever_admitted(&self) -> bool {
        self.admitted.is_some()
    }

    /// Records the first admission; returns the time it waited for it.
    pub fn admit(&mut self, now: Instant) -> Duration {
        self.admitted = Some(now);
        now - self.submitted
    }

    fn token(&mut self, now: Instant, step: u64) -> TokenTimes {
        let mut times = TokenTimes::default();
        match self.last_token {
            None => {
                self.first_token = Some(now);
                self.steps_to_first_token = Some(step - self.submit_step);
                times.first = Some(now - self.submitted);
            }
            Some(last) => {
                let gap = now - last;
                self.inter_token_sum += gap;
                self.inter_token_max = self.inter_token_max.max(gap);
                times.gap = Some(gap);
            }
        }
        self.last_token = Some(now);
        times
    }

    fn timings(&self, now: Instant, tokens: usize) -> Timings {
        let total = now - self.submitted;
        let gaps = tokens.saturating_sub(1) as u32;
        Timings {
            queued: self.admitted.map_or(total, |a| a - self.submitted),
            time_to_first_token: self.first_token.map(|t| t - self.submitted),
            inter_token_mean: if gaps > 0 { self.inter_token_sum / gaps } else { Duration::ZERO },
            inter_token_max: self.inter_token_max,
            total,
            steps_to_first_token: self.steps_to_first_token,
            preemptions: self.preemptions,
        }
    }
}

/// What sampling one token did.
pub(super) struct Sampled {
    /// The request ends.
    pub end: Option<Cause>,
    pub times: TokenTimes,
}

impl<'m> Seq<'m> {
    /// The worker's state of a submitted request, with its sampler.
    pub fn new(model: &'m Model, submission: Submission, mut sampler: Sampler<'m>) -> Self {
        let Submission { id, checked, events, cancel, submitted, submit_step } = submission;
        let Request { sampling, generate, priority, .. } = checked.request;
        let GenerateOptions { max_tokens, stop, stop_at_eog, special, .. } = generate;
        // A JSON document steers toward closing before `max_tokens`, or
        // before the context cap ends the request.
        let room = checked.max_context.saturating_sub(checked.prompt.len());
        sampler.close_within(Some(max_tokens.map_or(room, |max| max.min(room))));
        let prompt = checked.prompt;
        let drafting = checked.speculation.map(|spec| Drafting { drafter: NgramDrafter::new(spec), draft: Vec::new() });
        Seq {
            id,
            priority,
            events,
            cancel,
            placement: Placement { prefill_to: prompt.len(), ..Placement::default() },
            usage: Usage { prompt_tokens: prompt.len(), ..Usage::default() },
            tokens: prompt,
            sampler: Some(sampler),
            last_sample: None,
            text: SeqText {
                tail: TextTail::new(model.vocab(), special, &stop),
                token: None,
                logprob: None,
                top_logprobs: sampling.top_logprobs(),
            },
            limits: Limits { max_tokens, stop_at_eog, max_context: checked.max_context },
            clock: Clock::new(submitted, submit_step),
            drafting,
            media: checked.media,
        }
    }

    /// Whether it can draft in this step: speculating, generating (its one
    /// token to decode is the pending one), sampled on the step.
    pub fn can_draft(&self) -> bool {
        self.drafting.is_some()
            && self.decoding()
            && self.remaining() == 1
            && self.sampler.is_some()
            && !self.has_grammar()
    }

    /// Drafts at most `max` tokens to follow its tokens, within its limits
    /// (a step samples one token more than it drafts, and every draft
    /// token takes a cell): the draft's length.
    pub fn make_draft(&mut self, max: usize) -> usize {
        let to_sample = self.limits.max_tokens.map_or(usize::MAX, |m| m.saturating_sub(self.usage.completion_tokens));
        let cells = self.limits.max_context.saturating_sub(self.placement.n_cached + 1);
        let max = max.min(to_sample.saturating_sub(1)).min(cells);
        let Some(d) = &mut self.drafting else { return 0 };
        d.drafter.draft(&self.tokens, max, &mut d.draft);
        // A medium's placeholders are no tokens to decode.
        if let Some(cut) = d.draft.iter().position(|&t| is_placeholder(t)) {
            d.draft.truncate(cut);
        }
        d.draft.len()
    }

    /// The estimated chance that the tokens of its draft are accepted (one
    /// after another): see `NgramDrafter::confidence`.
    pub fn draft_confidence(&self) -> f64 {
        self.drafting.as_ref().map_or(0.0, |d| d.drafter.confidence())
    }

    /// Cuts this step's draft to at most `n` tokens: its new length.
    pub fn cut_draft(&mut self, n: usize) -> usize {
        let Some(d) = &mut self.drafting else { return 0 };
        d.draft.truncate(n);
        d.draft.len()
    }

    /// The draft of this step.
    pub fn draft(&self) -> &[Token] {
        self.drafting.as_ref().map_or(&[], |d| &d.draft)
    }

    /// Records how much of this step's draft was accepted.
    pub fn verified(&mut self, accepted: usize) {
        let Some(d) = &mut self.drafting else { return };
        let drafted = d.draft.len();
        d.drafter.record(drafted, accepted);
        d.draft.clear();
        self.usage.accepted_draft_tokens += accepted;
        self.usage.rejected_draft_tokens += drafted - accepted;
    }

    pub fn decoding(&self) -> bool {
        self.placement.n_cached >= self.placement.prefill_to
    }

    /// Tokens this sequence still has to put through the model before it
    /// samples: its prefill, less what it will share from a leader.
    pub fn pending(&self) -> usize {
        let shared = self.placement.follow.map_or(0, |f| f.to);
        self.placement.prefill_to.saturating_sub(self.placement.n_cached.max(shared))
    }

    /// Tokens to plan in the next step (none while it follows a leader).
    pub fn remaining(&self) -> usize {
        if self.placement.follow.is_some() { 0 } else { self.tokens.len() - self.placement.n_cached }
    }

    /// The tokens in its cells.
    pub fn held(&self) -> &[Token] {
        &self.tokens[..self.placement.n_cached]
    }

    /// Its cancel flag, for work done elsewhere on its behalf.
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.cancel)
    }

    pub fn wants_out(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.events.is_closed()
    }

    /// Where its events go.
    pub fn events(&self) -> &async_channel::Sender<Event> {
        &self.events
    }

    /// Whether its sampler is out, sampling its next token off the step.
    pub fn awaiting(&self) -> bool {
        self.sampler.is_none()
    }

    /// Whether its sampler holds a grammar (and so is sampled off the
    /// step).
    pub fn has_grammar(&self) -> bool {
        self.sampler.as_ref().is_some_and(Sampler::has_grammar)
    }

    /// Its sampler, to sample off the step; `None` if it is out already.
    pub fn lend_sampler(&mut self) -> Option<Sampler<'m>> {
        self.sampler.take()
    }

    /// Its sampler back from off the step.
    pub fn return_sampler(&mut self, sampler: Sampler<'m>) {
        self.sampler = Some(sampler);
    }

    /// The top log-probabilities it reports per token, if any.
    pub fn top_logprobs(&self) -> Option<usize> {
        self.text.top_logprobs
    }

    /// Samples the next token from batch row `row` of `step`, releases its
    /// text, and says whether the request ends.
    pub fn sample(&mut self, ctx: &mut Context<'_>, row: usize, step: u64) -> Result<Sampled> {
        let Some(sampler) = self.sampler.as_mut() else {
            return Err(crate::Error::InvalidArgument("sampled while its sampler is out".into()));
        };
        let token = sampler.sample(ctx, row)?;
        let logprob = match self.text.top_logprobs {
            Some(top) => Some(token_logprob(ctx.logits(row)?, token, top)),
            None => None,
        };
        self.take_token(ctx.model().vocab(), token, logprob, step)
    }

    /// Takes `token` (sampled on the step or off it, with its logprob when
    /// asked for) as the next one of `step`: releases its text and says
    /// whether the request ends.
    pub fn take_token(
        &mut self,
        vocab: &crate::llama::vocab::Vocab,
        token: Token,
        logprob: Option<TokenLogprob>,
        step: u64,
    ) -> Result<Sampled> {
        self.text.logprob = logprob;
        self.usage.completion_tokens += 1;
        let times = self.clock.token(Instant::now(), step);
        let sampled = |end| Ok(Sampled { end, times });
        if self.limits.stop_at_eog && vocab.is_eog(token) {
            return sampled(Some(Cause::EndOfGeneration));
        }
        self.tokens.push(token);
        self.text.token = Some(token);
        if let Some(stop) = self.text.tail.push(token)? {
            return sampled(Some(Cause::Stop(stop)));
        }
        if self.limits.max_tokens.is_some_and(|max| self.usage.completion_tokens >= max) {
            return sampled(Some(Cause::Length));
        }
        if self.tokens.len() > self.limits.max_context {
            // The token just sampled would need a cell beyond the cap.
            return sampled(Some(Cause::ContextFull));
        }
        sampled(None)
    }

    /// The released text, the token and its log-probabilities, as a piece.
    pub fn take_piece(&mut self) -> Piece {
        Piece { text: self.text.tail.take_released(), token: self.text.token.take(), logprob: self.text.logprob.take() }
    }

    /// Ends the request: its last piece (the text held back, unless a stop
    /// string ended it; `None` when there is nothing left) and its finish.
    pub fn end(&mut self, cause: &Cause) -> (Option<Piece>, Finish) {
        if !matches!(cause, Cause::Stop(_)) {
            self.text.tail.flush();
        }
        let last = (!self.text.tail.released().is_empty() || self.text.token.is_some()).then(|| self.take_piece());
        let timings = self.clock.timings(Instant::now(), self.usage.completion_tokens);
        (last, Finish { reason: cause.reason(), usage: self.usage, timings })
    }

    /// Counts a preemption (the pool has vacated its place).
    pub fn preempted(&mut self) {
        self.clock.preemptions += 1;
    }
}

/// `token`'s log-probability in the log-softmax of `logits`, with the `top`
/// most likely tokens, in one pass over the vocabulary (no sort of it).
pub(super) fn token_logprob(logits: &[f32], token: Token, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // Summed in f64: 262,144 terms lose precision in f32.
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let log_z = max + sum.ln() as f32;
    // The best `top` (id, logit) pairs, best first; ties keep the lower id.
    let mut best: Vec<(usize, f32)> = Vec::with_capacity(top + 1);
    for (id, &l) in logits.iter().enumerate() {
        if best.len() == top && best.last().is_none_or(|&(_, worst)| l <= worst) {
            continue;
        }
        let at = best.partition_point(|&(_, b)| b >= l);
        best.insert(at, (id, l));
        best.truncate(top);
    }
    let logprob = logits.get(token.0 as usize).map_or(f32::NEG_INFINITY, |&l| l - log_z);
    let top = best.into_iter().map(|(id, l)| (Token(id as i32), l - log_z)).collect();
    TokenLogprob { token, logprob, top }
}
