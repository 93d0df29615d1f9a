//! Sampling as a plain value ([`SamplingParams`]), shared by
//! [`Model::complete`](crate::Model::complete) and the engine's requests.

use crate::error::{Error, Result};
use crate::llama::model::Model;
use crate::llama::types::Token;
use crate::llama::vocab::Vocab;
use crate::sampling::constraint::Constraint;

use super::{MAX_PENALTY_WINDOW, Sampler, SamplerChain};

/// Sampling as a plain value: [`SamplingParams::sampler`] builds the
/// usual chain from it, and the `Engine` builds
/// each request's own chain from it (logit bias → penalties → grammar → greedy,
/// or top-k → top-p → min-p → temperature → a seeded random pick).
///
/// The default is greedy decoding; the seed defaults to 0, so the same
/// request samples the same tokens every time unless a seed is set.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub(crate) temperature: f32,
    pub(crate) top_k: i32,
    pub(crate) top_p: f32,
    pub(crate) min_p: f32,
    pub(crate) penalty_last_n: i32,
    pub(crate) repeat_penalty: f32,
    pub(crate) frequency_penalty: f32,
    pub(crate) presence_penalty: f32,
    pub(crate) seed: u32,
    pub(crate) logit_bias: Vec<(Token, f32)>,
    pub(crate) grammar: Option<String>,
    pub(crate) constraint: Option<Constraint>,
    pub(crate) logprobs: Option<usize>,
    pub(crate) reasoning_budget: Option<super::ReasoningBudget>,
}

/// The most alternatives [`SamplingParams::logprobs`] reports per token
/// (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            penalty_last_n: 64,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
            logit_bias: Vec::new(),
            grammar: None,
            constraint: None,
            logprobs: None,
            reasoning_budget: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (the default).
    pub fn greedy() -> Self {
        SamplingParams::default()
    }

    /// Random sampling at temperature `t` (0: greedy), with llama.cpp's
    /// default top-k 40, top-p 0.95 and min-p 0.05.
    #[must_use]
    pub fn temperature(mut self, t: f32) -> Self {
        self.temperature = t;
        self
    }

    /// Keeps the `k` most likely tokens (0: all).
    #[must_use]
    pub fn top_k(mut self, k: i32) -> Self {
        self.top_k = k;
        self
    }

    /// Nucleus sampling: keeps the smallest set with probability ≥ `p`
    /// (1: all).
    #[must_use]
    pub fn top_p(mut self, p: f32) -> Self {
        self.top_p = p;
        self
    }

    /// Keeps tokens with probability ≥ `p` × the best one's (0: all).
    #[must_use]
    pub fn min_p(mut self, p: f32) -> Self {
        self.min_p = p;
        self
    }

    /// Repetition penalties over the last `last_n` sampled tokens
    /// (`-1`: all of them, up to the model's training context; 0: off):
    /// `repeat` divides the logits of repeated tokens
    /// (1: off), `frequency` and `presence` subtract per occurrence and
    /// once (0: off), as OpenAI's `frequency_penalty`/`presence_penalty`.
    #[must_use]
    pub fn penalties(mut self, last_n: i32, repeat: f32, frequency: f32, presence: f32) -> Self {
        self.penalty_last_n = last_n;
        self.repeat_penalty = repeat;
        self.frequency_penalty = frequency;
        self.presence_penalty = presence;
        self
    }

    /// Seed of the random pick (the same seed and prompt give the same
    /// tokens, whatever else runs in the engine, up to the rounding
    /// differences of batched decoding).
    #[must_use]
    pub fn seed(mut self, seed: u32) -> Self {
        self.seed = seed;
        self
    }

    /// Adds `bias` to the logits of the given tokens (`f32::NEG_INFINITY`
    /// bans a token).
    #[must_use]
    pub fn logit_bias(mut self, bias: impl Into<Vec<(Token, f32)>>) -> Self {
        self.logit_bias = bias.into();
        self
    }

    /// Reports each sampled token's log-probability under the model (the
    /// log-softmax of its logits, before any sampler filters them) with the
    /// `top` most likely tokens, in `Piece::logprob`;
    /// `top` at most [`MAX_TOP_LOGPROBS`] (0: only the sampled token's).
    #[must_use]
    pub fn logprobs(mut self, top: usize) -> Self {
        self.logprobs = Some(top);
        self
    }

    /// The `top` of [`logprobs`](Self::logprobs), if log-probabilities are on.
    pub fn top_logprobs(&self) -> Option<usize> {
        self.logprobs
    }

    /// Constrains the output to a GBNF grammar whose start rule is `root`.
    #[must_use]
    pub fn grammar(mut self, gbnf: impl Into<String>) -> Self {
        self.grammar = Some(gbnf.into());
        self
    }

    /// Constrains the output with llguidance (a JSON Schema, regex or
    /// Lark grammar; see [`crate::constraint`]): the chain samples from the
    /// exactly constrained distribution, at a cost of microseconds to a
    /// millisecond per token. Not together with [`SamplingParams::grammar`].
    #[must_use]
    pub fn constraint(mut self, constraint: Constraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Checks every value against what llama.cpp's samplers handle.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] naming the value out of range;
    /// [`Error::InvalidToken`] for a logit bias outside the vocabulary.
    pub fn validate(&self, vocab: &Vocab) -> Result<()> {
        let bad = |name: &'static str, v: &dyn std::fmt::Display, range: &str| {
            Err(Error::InvalidParameter { name, message: format!("must be {range}, got {v}") })
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", &self.temperature, "finite and >= 0");
        }
        if self.top_k < 0 {
            return bad("top_k", &self.top_k, ">= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", &self.top_p, "in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", &self.min_p, "in [0, 1]");
        }
        if self.penalty_last_n < -1 {
            return bad("penalty_last_n", &self.penalty_last_n, ">= -1");
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad("repeat_penalty", &self.repeat_penalty, "finite and > 0");
        }
        for (what, v) in [("frequency_penalty", self.frequency_penalty), ("presence_penalty", self.presence_penalty)] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(what, &v, "in [-2, 2]");
            }
        }
        if let Some(top) = self.logprobs.filter(|&top| top > MAX_TOP_LOGPROBS) {
            return bad("logprobs", &top, &format!("at most {MAX_TOP_LOGPROBS}"));
        }
        for &(token, bias) in &self.logit_bias {
            vocab.check(token)?;
            if bias.is_nan() || bias == f32::INFINITY {
                return bad("logit_bias", &bias, "a number or -inf");
            }
        }
        Ok(())
    }

    /// Holds the reply's thoughts to a budget: once it has written
    /// `budget.tokens` tokens of thought, the closing marker is forced
    /// (usually set by `ChatPrompt::sampling`).
    #[must_use]
    pub fn reasoning_budget(mut self, budget: super::ReasoningBudget) -> Self {
        self.reasoning_budget = Some(budget);
        self
    }

    /// The sampler chain of these values for `model` (after
    /// [`SamplingParams::validate`]).
    ///
    /// # Errors
    /// As [`SamplingParams::validate`]; [`Error::Grammar`] for a grammar
    /// that does not parse.
    pub fn sampler<'m>(&self, model: &'m Model) -> Result<Sampler<'m>> {
        self.sampler_with(model, None)
    }

    /// [`SamplingParams::sampler`], its constraint compiled already when
    /// `compiled` is given.
    pub(crate) fn sampler_with<'m>(
        &self,
        model: &'m Model,
        compiled: Option<crate::sampling::constraint::Guide>,
    ) -> Result<Sampler<'m>> {
        let vocab = model.vocab();
        self.validate(vocab)?;
        let mut chain = SamplerChain::new();
        // First: once the budget is spent, only the closing text is left.
        if let Some(budget) = &self.reasoning_budget {
            chain = chain.custom(super::BudgetSampler::new(vocab, budget)?);
        }
        if !self.logit_bias.is_empty() {
            chain = chain.logit_bias(vocab, &self.logit_bias);
        }
        if self.repeat_penalty != 1.0 || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0 {
            // `-1`, all tokens: as many as the model's context holds (the
            // window is allocated up front; 2^20 would be 4 MB per request).
            let last_n = match self.penalty_last_n {
                -1 => i32::try_from(model.n_ctx_train()).unwrap_or(i32::MAX).clamp(1, MAX_PENALTY_WINDOW),
                n => n,
            };
            chain = chain.penalties(last_n, self.repeat_penalty, self.frequency_penalty, self.presence_penalty);
        }
        if let Some(gbnf) = &self.grammar {
            chain = chain.grammar(vocab, gbnf, "root");
        }
        if let Some(constraint) = &self.constraint {
            chain = match compiled {
                Some(guide) => chain.compiled_constraint(model, guide),
                None => chain.constraint(model, constraint),
            };
        }
        chain = if self.temperature <= 0.0 {
            chain.greedy()
        } else {
            chain.top_k(self.top_k).top_p(self.top_p, 1).min_p(self.min_p, 1).temp(self.temperature).dist(self.seed)
        };
        chain.build()
    }
}
