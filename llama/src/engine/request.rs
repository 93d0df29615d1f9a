//! What a caller submits: the prompt, per-request sampling as a plain value,
//! and limits; checked before the request reaches the worker.

use crate::error::{Error, Result};
use crate::model::Model;
use crate::sampler::{Sampler, SamplerChain};
use crate::vocab::{Token, Vocab};

/// A prompt: token ids, or text the engine tokenizes at submit.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Prompt {
    /// Token ids, used as they are.
    Tokens(Vec<Token>),
    /// Text; `add_bos` adds the model's BOS token where its vocabulary
    /// asks for one, `parse_special` turns special-token text (`<eos>`)
    /// into those tokens.
    Text {
        /// The text.
        text: String,
        /// Add the BOS token (if the vocabulary adds one).
        add_bos: bool,
        /// Parse special-token text.
        parse_special: bool,
    },
}

/// Per-request sampling, as a value: the worker builds each sequence's
/// own sampler chain from it (logit bias → penalties → grammar → greedy,
/// or top-k → top-p → min-p → temperature → a seeded random pick).
///
/// The default is greedy decoding; the seed defaults to 0, so the same
/// request samples the same tokens every time unless a seed is set.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    temperature: f32,
    top_k: i32,
    top_p: f32,
    min_p: f32,
    penalty_last_n: i32,
    repeat_penalty: f32,
    frequency_penalty: f32,
    presence_penalty: f32,
    seed: u32,
    logit_bias: Vec<(Token, f32)>,
    grammar: Option<String>,
    logprobs: Option<usize>,
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
            logprobs: None,
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
    /// (`-1`: all of them): `repeat` divides the logits of repeated tokens
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
    /// `top` most likely tokens, in [`Piece::logprob`](super::Piece::logprob);
    /// `top` at most [`MAX_TOP_LOGPROBS`] (0: only the sampled token's).
    #[must_use]
    pub fn logprobs(mut self, top: usize) -> Self {
        self.logprobs = Some(top);
        self
    }

    /// The `top` of [`logprobs`](Self::logprobs), if log-probabilities are on.
    pub(crate) fn top_logprobs(&self) -> Option<usize> {
        self.logprobs
    }

    /// Constrains the output to a GBNF grammar whose start rule is `root`.
    #[must_use]
    pub fn grammar(mut self, gbnf: impl Into<String>) -> Self {
        self.grammar = Some(gbnf.into());
        self
    }

    /// Checks every value against what llama.cpp's samplers handle.
    pub(crate) fn validate(&self, vocab: &Vocab) -> Result<()> {
        let bad = |what: &str, v: &dyn std::fmt::Display, range: &str| {
            Err(Error::InvalidArgument(format!("{what} must be {range}, got {v}")))
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
            return bad("logprobs' top", &top, &format!("at most {MAX_TOP_LOGPROBS}"));
        }
        for &(token, bias) in &self.logit_bias {
            vocab.check(token)?;
            if bias.is_nan() || bias == f32::INFINITY {
                return bad("a logit bias", &bias, "a number or -inf");
            }
        }
        Ok(())
    }

    /// The sampler chain for one sequence.
    pub(crate) fn build<'m>(&self, model: &'m Model) -> Result<Sampler<'m>> {
        let vocab = model.vocab();
        let mut chain = SamplerChain::new();
        if !self.logit_bias.is_empty() {
            chain = chain.logit_bias(vocab, &self.logit_bias)?;
        }
        if self.repeat_penalty != 1.0 || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0 {
            chain = chain.penalties(
                self.penalty_last_n,
                self.repeat_penalty,
                self.frequency_penalty,
                self.presence_penalty,
            );
        }
        if let Some(gbnf) = &self.grammar {
            chain = chain.grammar(vocab, gbnf, "root")?;
        }
        chain = if self.temperature <= 0.0 {
            chain.greedy()
        } else {
            chain.top_k(self.top_k).top_p(self.top_p, 1).min_p(self.min_p, 1).temp(self.temperature).dist(self.seed)
        };
        chain.build()
    }
}

/// One request to the [`Engine`](super::Engine).
///
/// ```
/// use llama::engine::{Request, SamplingParams};
/// let request = Request::text("The capital of France is")
///     .max_tokens(32)
///     .stop(["\n"])
///     .sampling(SamplingParams::greedy().temperature(0.7).seed(42))
///     .priority(1);
/// # let _ = request;
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub(crate) prompt: Prompt,
    pub(crate) sampling: SamplingParams,
    pub(crate) max_tokens: Option<usize>,
    pub(crate) stop: Vec<String>,
    pub(crate) stop_at_eog: bool,
    pub(crate) max_context: Option<usize>,
    pub(crate) priority: i32,
    pub(crate) special: bool,
}

impl Request {
    /// A request for a prompt of token ids. Defaults: greedy, at most 256
    /// new tokens, stops at end-of-generation tokens, priority 0.
    pub fn tokens(prompt: impl Into<Vec<Token>>) -> Self {
        Request::new(Prompt::Tokens(prompt.into()))
    }

    /// A request for text, tokenized at submit with BOS (where the model
    /// adds one) and special-token parsing.
    pub fn text(prompt: impl Into<String>) -> Self {
        Request::new(Prompt::Text { text: prompt.into(), add_bos: true, parse_special: true })
    }

    /// A request for any [`Prompt`].
    pub fn new(prompt: Prompt) -> Self {
        Request {
            prompt,
            sampling: SamplingParams::default(),
            max_tokens: Some(256),
            stop: Vec::new(),
            stop_at_eog: true,
            max_context: None,
            priority: 0,
            special: false,
        }
    }

    /// Most new tokens (`None`: until another limit ends the request).
    #[must_use]
    pub fn max_tokens(mut self, n: impl Into<Option<usize>>) -> Self {
        self.max_tokens = n.into();
        self
    }

    /// Sampling settings.
    #[must_use]
    pub fn sampling(mut self, sampling: SamplingParams) -> Self {
        self.sampling = sampling;
        self
    }

    /// Stop strings: generation ends before the first one, which is never
    /// part of the text.
    #[must_use]
    pub fn stop<I, S>(mut self, stops: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.stop = stops.into_iter().map(Into::into).filter(|s: &String| !s.is_empty()).collect();
        self
    }

    /// Whether end-of-generation tokens end the request (default `true`);
    /// with `false` they are sampled and decoded like any token.
    #[must_use]
    pub fn stop_at_eog(mut self, on: bool) -> Self {
        self.stop_at_eog = on;
        self
    }

    /// Most tokens (prompt and generated) this request may hold in the KV
    /// pool; reaching it ends the request with
    /// [`FinishReason::ContextFull`](crate::generate::FinishReason::ContextFull).
    /// Default: the pool, or the model's training context if smaller.
    #[must_use]
    pub fn max_context(mut self, n: usize) -> Self {
        self.max_context = Some(n);
        self
    }

    /// Higher-priority requests are admitted first and preempted last
    /// (default 0).
    #[must_use]
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Render special tokens (`<eos>`, control tokens) as text in pieces.
    #[must_use]
    pub fn special(mut self, on: bool) -> Self {
        self.special = on;
        self
    }
}

/// A request that passed every check, with its prompt as tokens.
#[derive(Debug)]
pub(crate) struct Checked {
    pub prompt: Vec<Token>,
    pub sampling: SamplingParams,
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stop_at_eog: bool,
    /// The most cells the sequence may hold.
    pub max_context: usize,
    pub priority: i32,
    pub special: bool,
}

/// Tokenizes and checks `request` for an engine whose pool has `pool`
/// cells: everything the worker could fail on later is refused here.
pub(crate) fn check(model: &Model, pool: usize, request: Request) -> Result<Checked> {
    let vocab = model.vocab();
    let prompt = match request.prompt {
        Prompt::Tokens(tokens) => tokens,
        Prompt::Text { text, add_bos, parse_special } => {
            let mut tokens = Vec::new();
            vocab.tokenize_into(&text, add_bos, parse_special, &mut tokens)?;
            tokens
        }
    };
    if prompt.is_empty() {
        return Err(Error::InvalidArgument("the prompt has no tokens".into()));
    }
    for &token in &prompt {
        vocab.check(token)?;
    }
    if request.max_tokens == Some(0) {
        return Err(Error::InvalidArgument("max_tokens must be at least 1".into()));
    }
    let train = model.n_ctx_train() as usize;
    let limit = if train > 0 { pool.min(train) } else { pool };
    let max_context = request.max_context.unwrap_or(limit);
    if max_context > limit {
        return Err(Error::InvalidArgument(format!(
            "max_context {max_context} exceeds the {limit} tokens a sequence can hold (KV pool {pool}, training context {train})"
        )));
    }
    // One more cell for the first generated token's successor is not
    // needed: the last sampled token is never decoded. The prompt itself
    // must fit, and leave room to sample at least one token.
    if prompt.len() > max_context {
        return Err(Error::InvalidArgument(format!(
            "the prompt has {} tokens but a sequence may hold {max_context} (max_context or the KV pool)",
            prompt.len()
        )));
    }
    request.sampling.validate(vocab)?;
    if let Some(gbnf) = &request.sampling.grammar {
        // Parse it now, so a bad grammar is the caller's error, not a
        // failed request later.
        SamplerChain::new().grammar(vocab, gbnf, "root")?.greedy().build()?;
    }
    Ok(Checked {
        prompt,
        sampling: request.sampling,
        max_tokens: request.max_tokens,
        stop: request.stop,
        stop_at_eog: request.stop_at_eog,
        max_context,
        priority: request.priority,
        special: request.special,
    })
}
