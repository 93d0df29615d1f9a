//! What a caller submits: the prompt, per-request sampling as a plain value,
//! and limits; checked before the request reaches the worker.

use crate::error::{Error, Result};
use crate::llama::model::Model;
use crate::llama::types::Token;
use crate::llama::vocab::{AddBos, Special};
use crate::sampling::sampler::{SamplerChain, SamplingParams};
use crate::sampling::speculative::Speculation;
use crate::text::chat::ChatPrompt;
use crate::text::generate::{DEFAULT_MAX_TOKENS, GenerateOptions};

use super::media::{Attached, EngineMedia, Spans};

/// A prompt: token ids, or text the engine tokenizes at submit.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Prompt {
    /// Token ids, used as they are.
    Tokens(Vec<Token>),
    /// Text, tokenized as [`Vocab::tokenize_into`](crate::Vocab::tokenize_into) does.
    Text {
        /// The text.
        text: String,
        /// Add the BOS token (if the vocabulary adds one).
        add_bos: AddBos,
        /// Whether special-token text (`<eos>`) becomes those tokens
        /// ([`Special::Markup`]).
        special: Special,
    },
}

/// One request to the [`Engine`](super::Engine).
///
/// ```
/// use llamacpp::engine::{Request, SamplingParams};
/// let request = Request::text("The capital of France is")
///     .max_tokens(32)
///     .stop(["\n"])
///     .sampling(SamplingParams::default().temperature(0.7).seed(42))
///     .priority(1);
/// # let _ = request;
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub(crate) prompt: Prompt,
    pub(crate) sampling: SamplingParams,
    /// Most tokens, stops, control-token output, speculation (unless
    /// chosen: the engine's default, [`EngineConfig::speculation`](super::EngineConfig::speculation)).
    pub(crate) generate: GenerateOptions,
    pub(crate) max_context: Option<usize>,
    pub(crate) priority: i32,
    /// A chat request's prompt (its tokens moved to `prompt`): the
    /// constraint and budget its sampling gets at submit, and the parser
    /// of its reply.
    pub(crate) chat: Option<Box<ChatPrompt>>,
    /// Its media, in the order of their places in the prompt.
    pub(crate) media: Attached,
}

impl Request {
    /// A request for a prompt of token ids. Defaults: greedy, at most
    /// [`DEFAULT_MAX_TOKENS`] new tokens (256, as [`Model::complete`](crate::Model::complete)),
    /// stops at end-of-generation tokens, priority 0.
    pub fn tokens(prompt: impl Into<Vec<Token>>) -> Self {
        Request::new(Prompt::Tokens(prompt.into()))
    }

    /// A request for text, tokenized at submit with BOS (where the model
    /// adds one) and special-token parsing.
    pub fn text(prompt: impl Into<String>) -> Self {
        Request::new(Prompt::Text { text: prompt.into(), add_bos: AddBos::Yes, special: Special::Markup })
    }

    /// A request to answer a conversation made ready by
    /// [`ChatFormat::prompt`](crate::ChatFormat::prompt): its tokens as they
    /// are (BOS included where the model wants one, no control tokens from
    /// the conversation's text), control tokens rendered when the reply's
    /// markers need them, and at submit the prompt's tool-call constraint
    /// and reasoning budget added to the sampling. Submit it with
    /// [`Engine::chat`](super::Engine::chat) to read the reply as
    /// [`ChatEvent`](crate::chat::ChatEvent)s.
    pub fn chat(prompt: &ChatPrompt) -> Self {
        let mut chat = prompt.clone();
        let tokens = std::mem::take(&mut chat.tokens);
        let mut request = Request::tokens(tokens).special(prompt.special);
        request.chat = Some(Box::new(chat));
        request
    }

    /// A request for any [`Prompt`].
    pub fn new(prompt: Prompt) -> Self {
        Request {
            prompt,
            sampling: SamplingParams::default(),
            generate: GenerateOptions::default().max_tokens(DEFAULT_MAX_TOKENS),
            max_context: None,
            priority: 0,
            chat: None,
            media: Attached::default(),
        }
    }

    /// The generation's limits and output, all at once (the same type as
    /// [`Session::generate`](crate::generate::Session::generate)'s; its
    /// `n_keep`, overflow and sequence do not apply to the engine). A chat
    /// request keeps the control-token output its prompt needs.
    #[must_use]
    pub fn generate(mut self, options: GenerateOptions) -> Self {
        self.generate = options;
        self
    }

    /// Most new tokens (`None`: until another limit ends the request).
    #[must_use]
    pub fn max_tokens(mut self, n: impl Into<Option<usize>>) -> Self {
        self.generate.max_tokens = n.into();
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
        self.generate = self.generate.stop(stops);
        self
    }

    /// Whether end-of-generation tokens end the request (default `true`);
    /// with `false` they are sampled and decoded like any token.
    #[must_use]
    pub fn stop_at_eog(mut self, on: bool) -> Self {
        self.generate.stop_at_eog = on;
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

    /// Render special tokens (`<eos>`, control tokens) as text in pieces
    /// ([`Special::Markup`]; default [`Special::Plain`]).
    #[must_use]
    pub fn special(mut self, special: Special) -> Self {
        self.generate.special = special;
        self
    }

    /// Speculative decoding for this request (`Some`) or not (`None`),
    /// whatever the engine's default
    /// ([`EngineConfig::speculation`](super::EngineConfig::speculation)).
    /// The output is the same either way; see [`crate::speculative`].
    #[must_use]
    pub fn speculation(mut self, speculation: impl Into<Option<Speculation>>) -> Self {
        self.generate = self.generate.speculation(speculation);
        self
    }
}

/// A request that passed every check, with its prompt as tokens.
#[derive(Debug)]
pub(crate) struct Checked {
    /// The prompt's tokens, each medium a run of placeholders.
    pub prompt: Vec<Token>,
    /// The media runs of the prompt.
    pub media: Spans,
    /// The most cells the sequence may hold.
    pub max_context: usize,
    /// Speculative decoding, the engine's default resolved.
    pub speculation: Option<Speculation>,
    /// The rest of the request as submitted (its `prompt` is now `prompt`
    /// above, and left empty here).
    pub request: Request,
    /// Its constraint, compiled at submit on the caller's thread: the
    /// worker builds the sampler around it instead of compiling it on the
    /// engine's thread, where a large schema's compile (seconds) would
    /// stall every request's step.
    pub compiled: Option<crate::sampling::constraint::Guide>,
}

/// What [`check`] needs of the engine.
pub(crate) struct EngineSetup<'a> {
    /// KV cells in the pool.
    pub pool: usize,
    /// The default speculation.
    pub speculation: Option<Speculation>,
    /// The projector, if the engine takes media.
    pub media: Option<&'a EngineMedia>,
    /// The context's micro-batch (an image attended to at once must fit).
    pub n_ubatch: usize,
}

/// Tokenizes and checks `request` for an engine set up as `engine`:
/// everything the worker could fail on later is refused here.
pub(crate) fn check(model: &Model, engine: &EngineSetup<'_>, mut request: Request) -> Result<Checked> {
    let (pool, speculation) = (engine.pool, engine.speculation);
    let vocab = model.vocab();
    let media = std::mem::take(&mut request.media);
    let projector = match (media.is_empty(), engine.media) {
        (true, _) => None,
        (false, Some(projector)) => Some(projector),
        (false, None) => {
            return Err(Error::Unsupported("this engine has no projector for media (EngineConfig::projector)".into()));
        }
    };
    let (prompt, at) = match std::mem::replace(&mut request.prompt, Prompt::Tokens(Vec::new())) {
        Prompt::Tokens(tokens) => {
            let at = request.chat.as_ref().map(|c| c.media_at.clone()).unwrap_or_default();
            (tokens, at)
        }
        Prompt::Text { text, add_bos, special } => match projector {
            Some(projector) => projector.split_text(vocab, &text, media.len(), add_bos, special)?,
            None => {
                let mut tokens = Vec::new();
                vocab.tokenize_into(&text, add_bos, special, &mut tokens)?;
                (tokens, Vec::new())
            }
        },
    };
    if prompt.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    for &token in &prompt {
        vocab.check(token)?;
    }
    let (prompt, spans) = match projector {
        Some(projector) => projector.splice(prompt, &at, &media, engine.n_ubatch)?,
        None if !at.is_empty() => {
            return Err(Error::Media(format!("the prompt has places for {} media, and none came", at.len())));
        }
        None => (prompt, Spans::default()),
    };
    if let Some(chat) = &request.chat {
        // The markers the reply's parser reads must reach it.
        request.generate.special = chat.special;
    }
    crate::text::generate::check_stops(&request.generate.stop)?;
    if request.generate.max_tokens == Some(0) {
        return Err(Error::InvalidParameter { name: "max_tokens", message: "must be at least 1".into() });
    }
    let train = model.n_ctx_train() as usize;
    let limit = if train > 0 { pool.min(train) } else { pool };
    let max_context = request.max_context.unwrap_or(limit);
    if max_context > limit {
        return Err(Error::InvalidParameter {
            name: "max_context",
            message: format!(
                "{max_context} exceeds the {limit} tokens a sequence can hold (KV pool {pool}, training context {train})"
            ),
        });
    }
    // One more cell for the first generated token's successor is not
    // needed: the last sampled token is never decoded. The prompt itself
    // must fit, and leave room to sample at least one token.
    if prompt.len() > max_context {
        return Err(Error::PromptTooLong { tokens: prompt.len(), limit: max_context });
    }
    if let Some(chat) = &request.chat {
        request.sampling = chat.sampling(std::mem::take(&mut request.sampling));
    }
    request.sampling.validate(vocab)?;
    if let Some(gbnf) = &request.sampling.grammar {
        // Parse it now, so a bad grammar is the caller's error, not a
        // failed request later.
        SamplerChain::new().grammar(vocab, gbnf, "root").greedy().build()?;
    }
    // Compiled now for the same reason, and kept: the engine's thread only
    // builds the sampler around it (the model's token table is built here
    // too rather than there).
    let compiled = match &request.sampling.constraint {
        Some(constraint) => Some(compile_niced(model, constraint)?),
        None => None,
    };
    let speculation = if request.generate.speculation_chosen { request.generate.speculation } else { speculation };
    if let Some(spec) = &speculation {
        spec.validate()?;
        check_can_speculate(model)?;
    }
    Ok(Checked { prompt, media: spans, max_context, speculation, request, compiled })
}

/// Compiles `constraint` on a thread of the lowest priority: a large
/// schema's compile takes seconds of CPU, which the engine's decode threads
/// (every running request's step) win whenever both want a core.
fn compile_niced(
    model: &Model,
    constraint: &crate::sampling::constraint::Constraint,
) -> Result<crate::sampling::constraint::Guide> {
    let table = crate::sampling::constraint::TokenTable::of(model)?;
    std::thread::scope(|scope| {
        let compiling = std::thread::Builder::new().name("llama-constraint".into()).spawn_scoped(scope, || {
            super::worker::lower_priority();
            crate::sampling::constraint::Guide::new(table, constraint)
        });
        match compiling {
            Ok(handle) => handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // No thread to be had: compile here.
            Err(_) => {
                crate::sampling::constraint::Guide::new(crate::sampling::constraint::TokenTable::of(model)?, constraint)
            }
        }
    })
}

/// Whether the engine's cache (unified, `swa_full`) can drop a rejected
/// draft of `model`: not for recurrent and hybrid models.
pub(crate) fn check_can_speculate(model: &Model) -> Result<()> {
    if model.is_recurrent() || model.is_hybrid() {
        return Err(Error::CannotSpeculate("a recurrent or hybrid model's cache cannot drop its last tokens"));
    }
    Ok(())
}
