//! A chat reply, read once for every consumer: the model's output, piece
//! by piece, into [`ChatEvent`]s (the [`ChatParser`]), each tool call
//! given its id, and the events folded into the finished [`Reply`].
//! Conversations, [`Model::chat`](crate::Model::chat), the engine's chat
//! completions and llama-serve's APIs all read replies through a
//! [`ReplyReader`].

use std::sync::atomic::{AtomicU64, Ordering};

use super::output::{ChatEvent, ChatParser};
use super::{ChatMessage, ToolCall};
use crate::llama::types::FinishReason;
use crate::text::generate::Usage;

/// One part of a reply, in the order the model wrote it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ReplyPart {
    /// Thoughts.
    Reasoning(String),
    /// Answer text.
    Text(String),
    /// A tool call, with its id.
    ToolCall(ToolCall),
}

/// What a finished reply said ([`ReplyReader`], [`Turn::finish`](super::Turn::finish)).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Reply {
    /// Thoughts, text and tool calls in the order the model wrote them;
    /// consecutive pieces of one kind are one part.
    pub parts: Vec<ReplyPart>,
    /// Why it ended (`None` while it runs).
    pub finish_reason: Option<FinishReason>,
    /// Its token counts.
    pub usage: Usage,
}

impl Reply {
    /// The answer's text: every text part, joined.
    pub fn text(&self) -> String {
        self.joined(|p| match p {
            ReplyPart::Text(t) => Some(t),
            _ => None,
        })
    }

    /// The thoughts: every reasoning part, joined.
    pub fn reasoning(&self) -> String {
        self.joined(|p| match p {
            ReplyPart::Reasoning(t) => Some(t),
            _ => None,
        })
    }

    /// The tool calls, in order.
    pub fn tool_calls(&self) -> Vec<&ToolCall> {
        self.parts
            .iter()
            .filter_map(|p| match p {
                ReplyPart::ToolCall(call) => Some(call),
                _ => None,
            })
            .collect()
    }

    /// The parts an API lists: every part but text that is blank beside
    /// tool calls (the spaces and newlines a model writes around a call
    /// are not an answer).
    pub fn listed_parts(&self) -> impl Iterator<Item = &ReplyPart> {
        let calls = self.parts.iter().any(|p| matches!(p, ReplyPart::ToolCall(_)));
        self.parts.iter().filter(move |p| !(calls && matches!(p, ReplyPart::Text(t) if t.trim().is_empty())))
    }

    /// The answer's text as an API's `content` gives it: `None` for a
    /// reply that calls tools and says nothing besides.
    pub fn content(&self) -> Option<String> {
        let text = self.text();
        (self.tool_calls().is_empty() || !text.trim().is_empty()).then_some(text)
    }

    /// Whether the reply ended by calling tools: it made calls and ended
    /// of itself (not at a limit).
    pub fn called_tools(&self) -> bool {
        let ended = matches!(self.finish_reason, None | Some(FinishReason::EndOfGeneration | FinishReason::Stop(_)));
        ended && !self.tool_calls().is_empty()
    }

    /// The assistant message that records the reply in a conversation's
    /// history: its text (empty rather than absent for a reply that only
    /// calls tools: templates test it as a string), thoughts and calls.
    pub fn message(&self) -> ChatMessage {
        let mut message = ChatMessage::assistant(self.text());
        message.tool_calls = self.tool_calls().into_iter().cloned().collect();
        let reasoning = self.reasoning();
        message.reasoning_content = (!reasoning.is_empty()).then_some(reasoning);
        message
    }

    fn joined<'a>(&'a self, pick: impl Fn(&'a ReplyPart) -> Option<&'a String>) -> String {
        self.parts.iter().filter_map(pick).map(String::as_str).collect()
    }

    /// Folds one event in.
    fn add(&mut self, event: &ChatEvent) {
        match (event, self.parts.last_mut()) {
            (ChatEvent::Text(t), Some(ReplyPart::Text(text))) => text.push_str(t),
            (ChatEvent::Text(t), _) => self.parts.push(ReplyPart::Text(t.clone())),
            (ChatEvent::Reasoning(t), Some(ReplyPart::Reasoning(text))) => text.push_str(t),
            (ChatEvent::Reasoning(t), _) => self.parts.push(ReplyPart::Reasoning(t.clone())),
            (ChatEvent::ToolCall(call), _) => self.parts.push(ReplyPart::ToolCall(call.clone())),
            (ChatEvent::Done { reason, usage }, _) => {
                self.finish_reason = Some(reason.clone());
                self.usage = *usage;
            }
        }
    }
}

/// Reads one reply as it streams: [`ReplyReader::push`] each piece of
/// output, [`ReplyReader::finish`] when it ends; each returns the events
/// to pass on (tool calls with their ids) and folds them into the
/// [`Reply`].
///
/// A tool call's id is nine letters and digits, unique in the process:
/// the one form every chat template takes back (Mistral's refuse ids of
/// another length).
///
/// ```
/// use llamacpp::chat::{ChatParser, ReasoningFormat, ReplyReader, ToolFormat};
/// use llamacpp::generate::{FinishReason, Usage};
/// let parser = ChatParser::new().reasoning(ReasoningFormat::Think, false).tools(ToolFormat::Hermes, true);
/// let mut reader = ReplyReader::new(parser);
/// reader.push("<think>Weather, so a call.</think>\n<tool_call>\n");
/// reader.push("{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
/// reader.finish(FinishReason::EndOfGeneration, Usage::default());
/// let reply = reader.into_reply();
/// assert_eq!(reply.reasoning(), "Weather, so a call.");
/// assert_eq!(reply.content(), None);
/// assert_eq!(reply.tool_calls()[0].id.as_ref().map(String::len), Some(9));
/// assert!(reply.called_tools());
/// ```
#[derive(Clone, Debug, Default)]
pub struct ReplyReader {
    parser: ChatParser,
    reply: Reply,
}

impl ReplyReader {
    /// A reader of output in `parser`'s formats.
    pub fn new(parser: ChatParser) -> ReplyReader {
        ReplyReader { parser, reply: Reply::default() }
    }

    /// Reads the next piece of output: the events it completes, tool
    /// calls with their ids.
    pub fn push(&mut self, piece: &str) -> Vec<ChatEvent> {
        let events = self.parser.push(piece);
        self.take(events)
    }

    /// The output has ended: what was held back (the events it
    /// completes), then [`ChatEvent::Done`].
    pub fn finish(&mut self, reason: FinishReason, usage: Usage) -> Vec<ChatEvent> {
        let mut events = self.parser.finish();
        events.push(ChatEvent::Done { reason, usage });
        self.take(events)
    }

    /// The reply so far.
    pub fn reply(&self) -> &Reply {
        &self.reply
    }

    /// The reply.
    pub fn into_reply(self) -> Reply {
        self.reply
    }

    /// Whether the output read so far ends inside the thoughts.
    pub fn thinking(&self) -> bool {
        self.parser.thinking()
    }

    fn take(&mut self, mut events: Vec<ChatEvent>) -> Vec<ChatEvent> {
        for event in &mut events {
            if let ChatEvent::ToolCall(call) = event {
                call.id = Some(call_id());
            }
            self.reply.add(event);
        }
        events
    }
}

/// A tool call's id: nine letters and digits, unique in this process.
fn call_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        (now.as_nanos() as u64) ^ u64::from(std::process::id()).rotate_left(32)
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // A bijection of the counter (odd multipliers), so no two ids in a
    // process are equal; 62^9 > 2^53 leaves the top bits out only.
    let mut x = (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ n).wrapping_mul(0xff51_afd7_ed55_8ccd);
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut id = String::with_capacity(9);
    for _ in 0..9 {
        id.push(char::from(DIGITS[(x % 62) as usize]));
        x /= 62;
    }
    id
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use serde_json::json;

    use super::*;
    use crate::text::chat::{FunctionCall, MessageContent, ReasoningFormat, ToolFormat};

    fn call(name: &str) -> ToolCall {
        ToolCall {
            id: None,
            kind: "function".into(),
            function: FunctionCall { name: name.into(), arguments: json!({}) },
        }
    }

    #[test]
    fn pieces_of_one_kind_join_and_the_order_is_kept() {
        let mut reply = Reply::default();
        for event in [
            ChatEvent::Reasoning("a".into()),
            ChatEvent::Reasoning("b".into()),
            ChatEvent::Text("Hello".into()),
            ChatEvent::Text(", you".into()),
            ChatEvent::ToolCall(call("f")),
            ChatEvent::Text(" ".into()),
            ChatEvent::ToolCall(call("g")),
        ] {
            reply.add(&event);
        }
        assert_eq!(reply.parts.len(), 5);
        assert_eq!((reply.reasoning(), reply.text()), ("ab".to_owned(), "Hello, you ".to_owned()));
        let names: Vec<&str> = reply.tool_calls().iter().map(|c| c.function.name.as_str()).collect();
        assert_eq!(names, ["f", "g"]);
        // The blank text between the calls is not listed; the answer is.
        let listed: Vec<&ReplyPart> = reply.listed_parts().collect();
        assert_eq!(listed.len(), 4);
        assert_eq!(reply.content().as_deref(), Some("Hello, you "));
    }

    #[test]
    fn a_reply_of_calls_alone_has_no_content_but_its_message_has_text() {
        let mut reply = Reply::default();
        reply.add(&ChatEvent::Text("\n".into()));
        reply.add(&ChatEvent::ToolCall(call("f")));
        reply.add(&ChatEvent::Done { reason: FinishReason::EndOfGeneration, usage: Usage::default() });
        assert_eq!(reply.content(), None);
        assert!(reply.called_tools());
        let message = reply.message();
        assert_eq!(message.content, Some(MessageContent::Text("\n".into())));
        assert_eq!(message.tool_calls.len(), 1);
        // Cut at the token limit, the calls do not end the reply.
        reply.add(&ChatEvent::Done { reason: FinishReason::Length, usage: Usage::default() });
        assert!(!reply.called_tools());
    }

    #[test]
    fn the_reader_gives_each_call_an_id_of_nine_letters_and_digits() {
        let parser = ChatParser::new().reasoning(ReasoningFormat::Think, false).tools(ToolFormat::Hermes, true);
        let mut reader = ReplyReader::new(parser);
        let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
        let mut events = reader.push(&format!("<think>x</think>{call}{call}"));
        events.extend(reader.finish(FinishReason::EndOfGeneration, Usage::default()));
        let ids: Vec<String> = events
            .iter()
            .filter_map(|e| match e {
                ChatEvent::ToolCall(c) => c.id.clone(),
                _ => None,
            })
            .collect();
        assert_eq!(ids.len(), 2);
        assert!(ids.iter().all(|id| id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric())), "{ids:?}");
        // The reply holds the same ids as the events passed on.
        let reply = reader.into_reply();
        let held: Vec<String> = reply.tool_calls().iter().filter_map(|c| c.id.clone()).collect();
        assert_eq!(held, ids);
        assert!(matches!(events.last(), Some(ChatEvent::Done { reason: FinishReason::EndOfGeneration, .. })));
    }

    #[test]
    fn call_ids_do_not_repeat() {
        let ids: HashSet<String> = (0..100_000).map(|_| call_id()).collect();
        assert_eq!(ids.len(), 100_000);
    }
}
