//! The one loop every API answers through. The engine's choices are read
//! here (each chat choice by its [`ReplyReader`]), collected into a whole
//! answer or streamed as server-sent events with keep-alives; usage is
//! summed here, and a failure after the 200 becomes an error event. What
//! each API makes of it (its JSON, its event names, its error shape) is
//! its [`Dialect`]: adding an API is one dialect.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use llamacpp::chat::{ChatEvent, ChatParser, Reply, ReplyReader};
use llamacpp::engine::{Completion, TokenLogprob};

use crate::choices::{self, Choice, Delta};
use crate::error::ApiError;
use crate::openai::Usage;

/// One message of a streamed answer: a server-sent event, named where the
/// API names its events, whose data is `data`. Dialects make frames, the
/// loop writes them (so a dialect's output can be read in a test, and
/// another framing is the loop's business alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub name: Option<String>,
    pub data: String,
}

impl Frame {
    /// An unnamed event (OpenAI's chunks).
    pub fn data(data: impl Into<String>) -> Frame {
        Frame { name: None, data: data.into() }
    }

    /// A named event (`event: NAME`).
    pub fn named(name: impl Into<String>, data: impl Into<String>) -> Frame {
        Frame { name: Some(name.into()), data: data.into() }
    }

    fn into_sse(self) -> SseEvent {
        let event = SseEvent::default().data(self.data);
        match self.name {
            Some(name) => event.event(name),
            None => event,
        }
    }
}

/// How a choice ended.
pub struct Ended<'a> {
    /// OpenAI's finish reason: `stop`, `length` or `cancelled`.
    pub reason: &'static str,
    /// The stop string it ended at, if it did.
    pub stop: Option<String>,
    pub usage: Usage,
    /// The chat reply as its reader finished it (`None` for a completion).
    pub reply: Option<&'a Reply>,
}

impl Ended<'_> {
    /// Whether the reply called tools.
    pub fn called(&self) -> bool {
        self.reply.is_some_and(Reply::called_tools)
    }
}

/// One API's shape of an answer. The loop calls, for a stream: `head`
/// once; `text` (a completion) or `chat` (a chat reply) for each piece of
/// each choice, then `end` as that choice ends (or `error` if it failed);
/// `tail` once every choice ended.
pub trait Dialect: Send + 'static {
    /// The events before any output.
    fn head(&mut self) -> Vec<Frame> {
        Vec::new()
    }

    /// A completion's next piece of choice `index`, as generated;
    /// `logprob` is its token's, when asked for.
    fn text(&mut self, index: usize, text: String, logprob: Option<TokenLogprob>) -> Vec<Frame> {
        let _ = (index, text, logprob);
        Vec::new()
    }

    /// What the reader of chat choice `index` made of its next piece:
    /// thoughts, text, tool calls (possibly nothing yet); `logprob` as in
    /// [`Dialect::text`].
    fn chat(&mut self, index: usize, events: Vec<ChatEvent>, logprob: Option<TokenLogprob>) -> Vec<Frame> {
        let _ = (index, events, logprob);
        Vec::new()
    }

    /// Choice `index` ended.
    fn end(&mut self, index: usize, ended: Ended<'_>) -> Vec<Frame>;

    /// After every choice ended, with their usage summed (each prompt
    /// counted once).
    fn tail(&mut self, usage: Usage) -> Vec<Frame> {
        let _ = usage;
        Vec::new()
    }

    /// A failure after the 200, in this API's shape.
    fn error(&mut self, error: &ApiError) -> Frame;

    /// The whole answer (not streamed): the choices, in order, each chat
    /// choice with its reply, and their usage summed.
    fn whole(self, choices: Vec<Choice>, usage: Usage) -> Response;
}

/// The choices of one request and how to read them.
pub struct Answer {
    pub completions: Vec<Completion>,
    /// Each chat choice's reader (`None`: a completion, read as text).
    pub parser: Option<ChatParser>,
    /// Choices per prompt (usage counts each prompt once).
    pub n: usize,
    pub stream: bool,
}

/// Answers with `answer`'s choices in `dialect`'s shape: whole, or as a
/// stream whose events come as the engine makes the tokens. Dropping the
/// stream (a client that disconnects) drops the completions, which
/// cancels them.
pub async fn respond(dialect: impl Dialect, answer: Answer) -> Result<Response, ApiError> {
    if answer.stream {
        return Ok(stream(dialect, answer));
    }
    let mut choices = choices::collect(answer.completions).await?;
    if let Some(parser) = &answer.parser {
        for c in &mut choices {
            c.reply = Some(c.read(parser.clone()));
        }
    }
    let usages: Vec<Option<Usage>> = choices.iter().map(|c| Some(c.usage)).collect();
    let usage = choices::combined_usage(&usages, answer.n);
    Ok(dialect.whole(choices, usage))
}

/// A stream's state: the dialect, each chat choice's reader, each
/// choice's usage once it ended.
struct Run<D> {
    dialect: D,
    readers: Vec<Option<ReplyReader>>,
    usages: Vec<Option<Usage>>,
    n: usize,
}

impl<D: Dialect> Run<D> {
    fn step(&mut self, index: usize, delta: Delta) -> Vec<Frame> {
        let reader = self.readers.get_mut(index).and_then(Option::as_mut);
        let dialect = &mut self.dialect;
        match (delta, reader) {
            (Delta::Piece { text, logprob }, None) => dialect.text(index, text, logprob),
            (Delta::Piece { text, logprob }, Some(reader)) => dialect.chat(index, reader.push(&text), logprob),
            (Delta::Done(Ok(finish)), reader) => {
                let usage = Usage::from(finish.usage);
                if let Some(slot) = self.usages.get_mut(index) {
                    *slot = Some(usage);
                }
                let mut events = Vec::new();
                let reply = match reader {
                    Some(reader) => {
                        let last = reader.finish(finish.reason.clone(), finish.usage);
                        events = dialect.chat(index, last, None);
                        Some(reader.reply())
                    }
                    None => None,
                };
                let reason = choices::finish_reason(&finish.reason).unwrap_or("stop");
                let stop = choices::stop_string(&finish.reason);
                events.extend(dialect.end(index, Ended { reason, stop, usage, reply }));
                events
            }
            (Delta::Done(Err(e)), _) => vec![dialect.error(&e)],
        }
    }

    fn tail(&mut self) -> Vec<Frame> {
        let usage = choices::combined_usage(&self.usages, self.n);
        self.dialect.tail(usage)
    }
}

fn stream(mut dialect: impl Dialect, answer: Answer) -> Response {
    let head = dialect.head();
    let run = Run {
        readers: answer.completions.iter().map(|_| answer.parser.clone().map(ReplyReader::new)).collect(),
        usages: vec![None; answer.completions.len()],
        n: answer.n,
        dialect,
    };
    // The body's steps and the tail after them share the state; never at
    // once (the tail follows the body's end), so the lock never waits.
    let run = Arc::new(Mutex::new(run));
    let body = choices::merged(answer.completions).map({
        let run = run.clone();
        move |(index, delta)| run.lock().unwrap_or_else(PoisonError::into_inner).step(index, delta)
    });
    let tail = futures::stream::once(async move { run.lock().unwrap_or_else(PoisonError::into_inner).tail() });
    let events = futures::stream::iter([head])
        .chain(body)
        .chain(tail)
        .flat_map(|frames| futures::stream::iter(frames.into_iter().map(|f| Ok::<_, Infallible>(f.into_sse()))));
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}
