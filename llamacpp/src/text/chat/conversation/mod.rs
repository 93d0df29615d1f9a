//! A chat for applications: the history, the tools and the KV cache of
//! one conversation, each reply streamed as [`ChatEvent`]s.

mod media;

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use super::output::{ChatEvent, ChatParser};
use super::prompt::ChatOptions;
use super::reasoning::Reasoning;
use super::reply::{Reply, ReplyReader};
use super::tools::{Tool, Tools};
use super::{ChatFormat, ChatMessage, ToolCall};
use crate::error::{Error, Result};
use crate::llama::context::{Context, ContextParams};
use crate::llama::model::Model;
use crate::llama::types::Token;
use crate::sampling::constraint::Constraint;
use crate::sampling::sampler::{Sampler, SamplingParams};
use crate::text::generate::Usage;
use crate::text::generate::{FinishReason, GenerateOptions, Generation, GenerationStats, Session};

/// The context a [`Conversation::new`] creates: this many tokens, or the
/// model's training length if that is smaller.
pub const DEFAULT_CONTEXT: u32 = 4096;

/// The most tokens of one reply unless [`Conversation::generate_options`]
/// says otherwise.
pub const DEFAULT_REPLY_TOKENS: usize = 1024;

/// A multi-turn chat with one model: the messages so far, the tools and
/// reasoning settings, and a context whose KV cache keeps the
/// conversation between turns, so that each reply prefills only what was
/// added since the last one (the previous reply's closing markup and the
/// new messages).
///
/// Each prompt is made by [`ChatFormat::prompt`]: every text of the
/// messages and tools stays plain text. A reply streams as a [`Turn`] of
/// [`ChatEvent`]s (thoughts, text, tool calls, then
/// [`ChatEvent::Done`]); when it ends, it joins the history, tool calls
/// and thoughts included.
///
/// ```no_run
/// use llamacpp::chat::{ChatEvent, Conversation};
/// # fn main() -> Result<(), llamacpp::Error> {
/// let model = llamacpp::Model::load("model.gguf", &llamacpp::ModelParams::default())?;
/// let mut chat = Conversation::new(&model)?.system("Answer in one sentence.");
/// for event in chat.send("What is the capital of France?")? {
///     if let ChatEvent::Text(text) = event? {
///         print!("{text}");
///     }
/// }
/// # Ok(()) }
/// ```
pub struct Conversation<'m> {
    model: &'m Model,
    format: ChatFormat,
    ctx: Context<'m>,
    session: Session,
    sampler: Option<Sampler<'m>>,
    messages: Vec<ChatMessage>,
    options: ChatOptions,
    sampling: SamplingParams,
    generate: GenerateOptions,
    /// The projector and the media the messages refer to (feature `mtmd`).
    media: media::ConversationMedia<'m>,
}

impl std::fmt::Debug for Conversation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conversation")
            .field("messages", &self.messages.len())
            .field("cached_tokens", &self.session.tokens().len())
            .finish_non_exhaustive()
    }
}

impl<'m> Conversation<'m> {
    /// A conversation in a context of its own, of [`DEFAULT_CONTEXT`]
    /// tokens (at most the model's training length), with the model's
    /// default chat format ([`Model::chat_format`]), greedy sampling and at
    /// most [`DEFAULT_REPLY_TOKENS`] tokens per reply.
    ///
    /// # Errors
    /// As [`Model::chat_format`] and [`Model::new_context`].
    pub fn new(model: &'m Model) -> Result<Conversation<'m>> {
        let train = model.n_ctx_train();
        let n_ctx = if train > 0 { DEFAULT_CONTEXT.min(train) } else { DEFAULT_CONTEXT };
        Conversation::with_context(model, &ContextParams::default().n_ctx(n_ctx))
    }

    /// A conversation in a context made with `params`.
    ///
    /// # Errors
    /// As [`Conversation::new`].
    pub fn with_context(model: &'m Model, params: &ContextParams) -> Result<Conversation<'m>> {
        Ok(Conversation {
            model,
            format: model.chat_format(None)?,
            ctx: model.new_context(params)?,
            session: Session::new(),
            sampler: None,
            messages: Vec::new(),
            options: ChatOptions::default(),
            sampling: SamplingParams::default(),
            generate: GenerateOptions::default().max_tokens(DEFAULT_REPLY_TOKENS),
            media: media::ConversationMedia::default(),
        })
    }

    /// The chat format to render with, instead of the model's default (a
    /// named variant such as [`Model::chat_format`]`(Some("tool_use"))`,
    /// or a template of your own).
    #[must_use]
    pub fn format(mut self, format: ChatFormat) -> Self {
        self.format = format;
        self
    }

    /// Adds a system message.
    #[must_use]
    pub fn system(mut self, text: impl Into<String>) -> Self {
        self.messages.push(ChatMessage::system(text));
        self
    }

    /// The tools the model may call ([`ToolChoice::Auto`](super::ToolChoice::Auto), parallel calls
    /// allowed; see [`Conversation::options`] for other choices).
    ///
    /// # Errors
    /// As [`Tools::new`].
    pub fn tools(mut self, tools: impl IntoIterator<Item = Tool>) -> Result<Self> {
        self.options.tools = Some(Tools::new(tools)?);
        Ok(self)
    }

    /// Tools, reasoning settings and template variables.
    #[must_use]
    pub fn options(mut self, options: ChatOptions) -> Self {
        self.options = options;
        self
    }

    /// How tokens are picked (default greedy).
    #[must_use]
    pub fn sampling(mut self, sampling: SamplingParams) -> Self {
        self.sampling = sampling;
        self
    }

    /// Limits of each reply: most tokens, stop strings, speculation, …
    /// (its `special` is set by each prompt: see [`ChatPrompt::special`](super::ChatPrompt::special)).
    #[must_use]
    pub fn generate_options(mut self, options: GenerateOptions) -> Self {
        self.generate = options;
        self
    }

    /// The messages so far.
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// The tokens in the KV cache: the last prompt and reply (a medium's
    /// embeddings as a run of negative placeholders, one per position).
    pub fn cached_tokens(&self) -> &[Token] {
        self.session.tokens()
    }

    /// Appends a message of any kind.
    pub fn push(&mut self, message: ChatMessage) {
        self.messages.push(message);
    }

    /// Appends a user message.
    pub fn user(&mut self, text: impl Into<String>) {
        self.messages.push(ChatMessage::user(text));
    }

    /// Appends the result of a tool call the model made.
    pub fn tool_result(&mut self, call: &ToolCall, content: impl Into<String>) {
        let mut message = ChatMessage::tool(call.id.clone().unwrap_or_default(), content);
        message.name = Some(call.function.name.clone());
        self.messages.push(message);
    }

    /// Appends a user message and starts the reply; when the reply cannot
    /// start, the message is not kept.
    ///
    /// # Errors
    /// As [`Conversation::reply`].
    pub fn send(&mut self, text: impl Into<String>) -> Result<Turn<'_, 'm>> {
        self.user(text);
        self.start(None, true)
    }

    /// Removes the last message and returns it (`None` when there is
    /// none): one that [`Conversation::reply`] refused, or a turn to take
    /// back. The KV cache keeps what the next prompt still shares.
    pub fn pop(&mut self) -> Option<ChatMessage> {
        self.messages.pop()
    }

    /// Starts the model's reply to the messages so far. The prompt reuses
    /// the longest prefix of the KV cache that it shares.
    ///
    /// # Errors
    /// As [`ChatFormat::prompt`], [`SamplingParams::sampler`] and
    /// [`Session::generate`]; with image or audio parts,
    /// [`Error::Unsupported`] without a projector (or the `mtmd`
    /// feature), [`Error::Media`] for a part that cannot be decoded or
    /// fetched (nothing is) and [`Error::InvalidBatch`] for an image the
    /// model attends to at once that does not fit `n_ubatch`.
    pub fn reply(&mut self) -> Result<Turn<'_, 'm>> {
        self.start(None, false)
    }

    /// A reply generated under `constraint` (a JSON turn: no tool calls,
    /// thoughts off).
    pub(crate) fn reply_constrained(&mut self, constraint: Constraint) -> Result<Turn<'_, 'm>> {
        self.start(Some(constraint), false)
    }

    /// Starts a reply; on an error, the last message goes again when
    /// `pushed` (a `send` keeps no message whose reply could not start).
    fn start(&mut self, constraint: Option<Constraint>, pushed: bool) -> Result<Turn<'_, 'm>> {
        let prepared = self.prepare(constraint);
        let (tokens, parser, options, media) = match prepared {
            Ok(p) => p,
            Err(e) => {
                if pushed {
                    self.messages.pop();
                }
                return Err(e);
            }
        };
        let Conversation { ctx, session, sampler, messages, .. } = self;
        let sampler = sampler.as_mut().ok_or_else(|| Error::InvalidArgument("no sampler".into()))?;
        let mut generation = match session.generate(ctx, sampler, &tokens, &options) {
            Ok(g) => g,
            Err(e) => {
                if pushed {
                    messages.pop();
                }
                return Err(e);
            }
        };
        if let Some((evaluated, time)) = media {
            generation.add_prefill(evaluated, time);
        }
        Ok(Turn {
            generation,
            reader: ReplyReader::new(parser),
            messages,
            queue: std::collections::VecDeque::new(),
            state: TurnState::Running,
        })
    }

    /// The prompt's tokens (with its media decoded into the cache), the
    /// reply's parser, the generation's options and the sampler, and the
    /// media's prefill (positions, time).
    #[allow(clippy::type_complexity)]
    fn prepare(
        &mut self,
        constraint: Option<Constraint>,
    ) -> Result<(Vec<Token>, ChatParser, GenerateOptions, Option<(usize, std::time::Duration)>)> {
        let messages = serde_json::to_value(&self.messages).map_err(|e| Error::ChatTemplate(e.to_string()))?;
        let mut prompt = match &constraint {
            None => self.format.prompt_json(self.model, &messages, &self.options)?,
            Some(_) => {
                let options =
                    ChatOptions { tools: None, reasoning: Reasoning::default().enabled(false), ..self.options.clone() };
                self.format.prompt_json(self.model, &messages, &options)?
            }
        };
        let seq = self.generate.seq;
        // Media go into the cache first, each as a run of placeholders in
        // the prompt's tokens; the generation then reuses them.
        let (tokens, media) = if prompt.media_at.is_empty() {
            (std::mem::take(&mut prompt.tokens), None)
        } else {
            let start = std::time::Instant::now();
            let done = self.media.prefill(&mut self.ctx, &mut self.session, &prompt, &messages, seq)?;
            (done.tokens, Some((done.evaluated, start.elapsed())))
        };
        let parser = prompt.parser();
        let mut sampling = prompt.sampling(self.sampling.clone());
        if let Some(c) = constraint {
            sampling = sampling.constraint(c);
        }
        self.sampler = Some(sampling.sampler(self.model)?);
        let options = self.generate.clone().special(prompt.special);
        Ok((tokens, parser, options, media))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TurnState {
    Running,
    /// The generation ended (its last events may wait in the queue).
    Done,
}

/// One reply of a [`Conversation`], as it is generated: a blocking
/// [`Iterator`] and a [`Stream`](futures_core::Stream) of [`ChatEvent`]s,
/// ending with one [`ChatEvent::Done`]. When it is done the reply joins
/// the conversation; a turn dropped before that leaves the history as it
/// was.
///
/// The stream form does the work inside `poll_next` (each poll decodes
/// until some text is ready): drive it from a blocking task, or serve many
/// users with the engine ([`Engine::chat`](crate::engine::Engine::chat)),
/// whose stream waits without blocking.
pub struct Turn<'c, 'm> {
    generation: Generation<'c, 'm, 'm>,
    reader: ReplyReader,
    messages: &'c mut Vec<ChatMessage>,
    queue: std::collections::VecDeque<ChatEvent>,
    state: TurnState,
}

impl std::fmt::Debug for Turn<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn").field("reply", self.reader.reply()).finish_non_exhaustive()
    }
}

impl Turn<'_, '_> {
    /// The generation's statistics so far.
    pub fn stats(&self) -> &GenerationStats {
        self.generation.stats()
    }

    /// The reply so far (whole once the turn has yielded
    /// [`ChatEvent::Done`]).
    pub fn reply(&self) -> &Reply {
        self.reader.reply()
    }

    /// Runs the reply to its end and returns it.
    ///
    /// # Errors
    /// As [`Iterator::next`].
    pub fn finish(mut self) -> Result<Reply> {
        for event in &mut self {
            event?;
        }
        Ok(self.reader.reply().clone())
    }

    /// The generation ended: the events that were held back, and `Done`.
    fn end(&mut self) -> Vec<ChatEvent> {
        let stats = self.generation.stats();
        let reason = stats.finish_reason.clone().unwrap_or(FinishReason::Length);
        let usage = Usage {
            prompt_tokens: stats.prompt_tokens,
            cached_tokens: stats.prompt_tokens.saturating_sub(stats.prompt_evaluated),
            completion_tokens: stats.generated_tokens,
            accepted_draft_tokens: stats.accepted_draft_tokens,
            rejected_draft_tokens: stats.drafted_tokens.saturating_sub(stats.accepted_draft_tokens),
        };
        self.reader.finish(reason, usage)
    }

    fn next_event(&mut self) -> Option<Result<ChatEvent>> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                // The reply joins the history as its end is yielded.
                if matches!(event, ChatEvent::Done { .. }) {
                    self.messages.push(self.reader.reply().message());
                }
                return Some(Ok(event));
            }
            if self.state == TurnState::Done {
                return None;
            }
            let events = match self.generation.next_piece() {
                Some(Ok(piece)) => self.reader.push(piece),
                Some(Err(Error::ContextFull { .. })) => continue,
                Some(Err(e)) => {
                    self.state = TurnState::Done;
                    return Some(Err(e));
                }
                None => {
                    self.state = TurnState::Done;
                    self.end()
                }
            };
            self.queue.extend(events);
        }
    }
}

impl Iterator for Turn<'_, '_> {
    type Item = Result<ChatEvent>;

    /// Generates until the next event.
    fn next(&mut self) -> Option<Result<ChatEvent>> {
        self.next_event()
    }
}

impl std::iter::FusedIterator for Turn<'_, '_> {}

impl futures_core::Stream for Turn<'_, '_> {
    type Item = Result<ChatEvent>;

    /// Generates until the next event, on the polling thread.
    fn poll_next(self: Pin<&mut Self>, _cx: &mut TaskContext<'_>) -> Poll<Option<Result<ChatEvent>>> {
        Poll::Ready(self.get_mut().next_event())
    }
}
