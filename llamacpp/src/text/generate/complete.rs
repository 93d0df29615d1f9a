//! One-call generation: [`Model::complete`] (and, in the chat module,
//! [`Model::chat`]), for
//! scripts and tests that want text, not a streaming loop.

use crate::error::{Error, Result};
use crate::llama::context::ContextParams;
use crate::llama::model::Model;
use crate::llama::types::Token;
use crate::llama::vocab::AddBos;
use crate::sampling::sampler::SamplingParams;
use crate::sampling::speculative::Speculation;

use super::{FinishReason, GenerateOptions, GenerationStats, Session};

/// The most tokens [`CompleteOptions`] generates unless told otherwise.
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// Options of [`Model::complete`] and [`Model::chat`], as a builder:
/// sampling, the generation's limits and stops, and the context.
///
/// Defaults: greedy sampling ([`SamplingParams::default`]), at most
/// [`DEFAULT_MAX_TOKENS`] tokens, stop at end-of-generation tokens, and a
/// context just large enough for the prompt and `max_tokens` (rounded up
/// to 256 tokens, at most the model's training length) with llama.cpp's
/// other defaults.
#[derive(Clone, Debug)]
pub struct CompleteOptions {
    sampling: SamplingParams,
    generate: GenerateOptions,
    context: Option<ContextParams>,
}

impl Default for CompleteOptions {
    fn default() -> Self {
        CompleteOptions {
            sampling: SamplingParams::default(),
            generate: GenerateOptions::default().max_tokens(DEFAULT_MAX_TOKENS),
            context: None,
        }
    }
}

impl CompleteOptions {
    /// How to pick each token (default: greedy).
    #[must_use]
    pub fn sampling(mut self, sampling: SamplingParams) -> Self {
        self.sampling = sampling;
        self
    }

    /// The most tokens to generate (default [`DEFAULT_MAX_TOKENS`]).
    #[must_use]
    pub fn max_tokens(mut self, n: usize) -> Self {
        self.generate = self.generate.max_tokens(n);
        self
    }

    /// Stop strings: generation ends before the first one, which is not
    /// part of the text.
    #[must_use]
    pub fn stop<I, S>(mut self, stops: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.generate = self.generate.stop(stops);
        self
    }

    /// Speculative decoding with drafts from the text itself (see
    /// [`crate::speculative`]): same output distribution, several tokens
    /// per decode where the text repeats.
    #[must_use]
    pub fn speculation(mut self, speculation: impl Into<Option<Speculation>>) -> Self {
        self.generate = self.generate.speculation(speculation);
        self
    }

    /// All of the generation's limits and output at once (the type
    /// [`Session::generate`] and the engine's requests take): stop strings,
    /// end-of-generation handling, context shift, special tokens,
    /// speculation, and most tokens when `options` sets it (otherwise the
    /// limit stays as it was: [`CompleteOptions::max_tokens`], or
    /// [`DEFAULT_MAX_TOKENS`]).
    #[must_use]
    pub fn generate(mut self, options: GenerateOptions) -> Self {
        let max_tokens = options.max_tokens.unwrap_or(self.limit());
        self.generate = options.max_tokens(max_tokens);
        self
    }

    /// The sampling settings.
    pub(crate) fn sampling_params(&self) -> &SamplingParams {
        &self.sampling
    }

    /// The generation's limits and output.
    pub(crate) fn generate_options(&self) -> &GenerateOptions {
        &self.generate
    }

    /// A context for a prompt of `prompt` tokens: the one asked for, else
    /// one just large enough for it and the answer.
    pub(crate) fn context_for(&self, model: &Model, prompt: usize) -> ContextParams {
        match &self.context {
            Some(params) => params.clone(),
            None => ContextParams::default().n_ctx(sized_context(model, prompt, self.limit())),
        }
    }

    /// The most tokens a run may generate.
    fn limit(&self) -> usize {
        self.generate.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)
    }

    /// The context to create (its `n_ctx` must hold the prompt and the
    /// generated tokens), instead of the sized default.
    #[must_use]
    pub fn context(mut self, params: ContextParams) -> Self {
        self.context = Some(params);
        self
    }
}

/// The result of [`Model::complete`] or [`Model::chat`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Completed {
    /// The generated text (stop strings excluded).
    pub text: String,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Counters and timings of the run.
    pub stats: GenerationStats,
}

impl Model {
    /// Generates a continuation of `prompt` in a context of its own: the
    /// one-call path over [`Session::generate`]. The prompt is tokenized
    /// as plain text with the model's BOS ([`AddBos::Yes`]).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), llamacpp::Error> {
    /// use llamacpp::generate::CompleteOptions;
    /// let model = llamacpp::Model::load("model.gguf", &llamacpp::ModelParams::default())?;
    /// let done = model.complete("The capital of France is", &CompleteOptions::default().max_tokens(16))?;
    /// println!("{}", done.text);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The errors of [`Vocab::tokenize`](crate::Vocab::tokenize),
    /// [`Context::new`](crate::Context::new),
    /// [`SamplingParams::sampler`] and [`Session::generate`], and the
    /// error a decode ends the run with. A full context is not an error:
    /// the text so far comes back with [`FinishReason::ContextFull`].
    pub fn complete(&self, prompt: &str, options: &CompleteOptions) -> Result<Completed> {
        let tokens = self.vocab().tokenize(prompt, AddBos::Yes)?;
        self.complete_tokens(&tokens, options)
    }

    /// [`Model::complete`] from tokens.
    ///
    /// # Errors
    /// As [`Model::complete`].
    pub fn complete_tokens(&self, prompt: &[Token], options: &CompleteOptions) -> Result<Completed> {
        let mut ctx = self.new_context(&options.context_for(self, prompt.len()))?;
        let mut sampler = options.sampling.sampler(self)?;
        let mut session = Session::new();
        let mut generation = session.generate(&mut ctx, &mut sampler, prompt, &options.generate)?;
        let mut text = String::new();
        while let Some(piece) = generation.next_piece() {
            match piece {
                Ok(piece) => text.push_str(piece),
                // The text so far is the answer; `finish_reason` says why
                // it ends there.
                Err(Error::ContextFull { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let stats = generation.stats().clone();
        // A generation that ended without an error has a reason.
        let finish_reason = stats.finish_reason.clone().unwrap_or(FinishReason::Length);
        Ok(Completed { text, finish_reason, stats })
    }
}

/// A context for `prompt + max_tokens` tokens, rounded up to 256, at most
/// the model's training length (when it has one).
fn sized_context(model: &Model, prompt: usize, max_tokens: usize) -> u32 {
    let wanted = prompt.saturating_add(max_tokens).max(1).div_ceil(256).saturating_mul(256);
    let train = model.n_ctx_train() as usize;
    let n = if train > 0 { wanted.min(train.max(prompt + 1)) } else { wanted };
    u32::try_from(n).unwrap_or(u32::MAX)
}
