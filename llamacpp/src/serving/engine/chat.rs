//! Chat requests: a [`Completion`] read into [`ChatEvent`]s.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use super::{Completion, Engine, Event, Request};
use crate::error::Result;
use crate::text::chat::{ChatEvent, Reply, ReplyReader};

impl Engine {
    /// Submits a chat request ([`Request::chat`]) and reads its reply as
    /// thoughts, text and tool calls. A request made otherwise is read as
    /// text.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), llamacpp::Error> {
    /// use std::sync::Arc;
    /// use llamacpp::chat::{ChatEvent, ChatMessage, ChatOptions};
    /// use llamacpp::engine::{Engine, EngineConfig, Request};
    /// let model = Arc::new(llamacpp::Model::load("model.gguf", &llamacpp::ModelParams::default())?);
    /// let engine = Engine::start(model.clone(), EngineConfig::default())?;
    /// let prompt = model.chat_format(None)?.prompt(&model, &[ChatMessage::user("Hi!")], &ChatOptions::default())?;
    /// for event in engine.chat(Request::chat(&prompt).max_tokens(64))? {
    ///     if let ChatEvent::Text(text) = event {
    ///         print!("{text}");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Engine::submit`].
    pub fn chat(&self, request: Request) -> Result<ChatCompletion> {
        let parser = request.chat.as_ref().map(|p| p.parser()).unwrap_or_default();
        Ok(ChatCompletion {
            completion: self.submit(request)?,
            reader: ReplyReader::new(parser),
            queue: VecDeque::new(),
        })
    }
}

/// A chat request's reply ([`Engine::chat`]): a blocking [`Iterator`] and
/// an async [`Stream`](futures_core::Stream) of [`ChatEvent`]s, ending
/// with one [`ChatEvent::Done`], read by a [`ReplyReader`] (tool calls
/// get its ids); dropping it cancels the request.
#[derive(Debug)]
pub struct ChatCompletion {
    completion: Completion,
    reader: ReplyReader,
    queue: VecDeque<ChatEvent>,
}

impl ChatCompletion {
    /// The request's id.
    pub fn id(&self) -> u64 {
        self.completion.id()
    }

    /// Ends the request at the engine's next step ([`Completion::cancel`]).
    pub fn cancel(&self) {
        self.completion.cancel();
    }

    /// The reply so far (whole once [`ChatEvent::Done`] was yielded).
    pub fn reply(&self) -> &Reply {
        self.reader.reply()
    }

    /// Reads one engine event; the chat events it makes wait in the queue.
    fn read(&mut self, event: Option<Event>) {
        let events = match event {
            Some(Event::Piece(piece)) => self.reader.push(&piece.text),
            Some(Event::Done(finish)) => self.reader.finish(finish.reason, finish.usage),
            None => return,
        };
        self.queue.extend(events);
    }
}

impl Iterator for ChatCompletion {
    type Item = ChatEvent;

    /// Blocks until the next event.
    fn next(&mut self) -> Option<ChatEvent> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                return Some(event);
            }
            let event = self.completion.next()?;
            self.read(Some(event));
        }
    }
}

impl futures_core::Stream for ChatCompletion {
    type Item = ChatEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<ChatEvent>> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                return Poll::Ready(Some(event));
            }
            match Pin::new(&mut self.completion).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(event) => self.read(event),
            }
        }
    }
}
