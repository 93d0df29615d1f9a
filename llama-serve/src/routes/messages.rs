//! `/v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages
//! API, read into the typed chat request every chat API makes
//! ([`MessagesRequest::to_chat`]) and run through the same path
//! ([`super::completion::submit_chat`], [`crate::respond`]); only the
//! answer's shape and its stream events are this API's own ([`Writer`]).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use llamacpp::chat::{ChatEvent, ReplyPart};
use llamacpp::engine::TokenLogprob;
use serde_json::{Value, json};

use super::completion::{count_chat_prompt, submit_chat};
use super::open;
use crate::anthropic::{
    AnthropicError, MessageResponse, MessageUsage, MessagesRequest, OutBlock, error_body, stop_reason,
};
use crate::choices::Choice;
use crate::error::ApiError;
use crate::openai::Usage;
use crate::respond::{Answer, Dialect, Ended, Frame, respond};
use crate::state::AppState;

/// `max_tokens`, which the Messages API requires.
fn required_max_tokens(asked: Option<i64>) -> Result<usize, ApiError> {
    match asked {
        None => Err(ApiError::bad_request("max_tokens: field required").param("max_tokens")),
        Some(n) if n < 1 => Err(ApiError::bad_request("max_tokens: must be at least 1").param("max_tokens")),
        Some(n) => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
    }
}

pub async fn messages(
    State(state): State<Arc<AppState>>,
    request: axum::extract::Request,
) -> Result<Response, AnthropicError> {
    let (req, ready): (MessagesRequest, _) = open(&state, "messages", request).await?;
    let max_tokens = required_max_tokens(req.max_tokens)?;
    let chat = req.to_chat(Some(max_tokens))?;
    let ready = ready?;
    let submitted = submit_chat(&state, &ready, chat, 1, None).await?;
    let writer = Writer {
        id: state.id("msg"),
        model: state.config.model_name.clone(),
        prompt_tokens: submitted.prompt_tokens,
        open: Open::None,
        index: 0,
    };
    let answer =
        Answer { completions: submitted.completions, parser: Some(submitted.parser), n: 1, stream: req.stream };
    Ok(respond(writer, answer).await?)
}

/// `/v1/messages/count_tokens`: the prompt's length in tokens, as
/// `/v1/messages` would render it.
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    request: axum::extract::Request,
) -> Result<Response, AnthropicError> {
    let (req, ready): (MessagesRequest, _) = open(&state, "count_tokens", request).await?;
    let chat = req.to_chat(None)?;
    let ready = ready?;
    let n = count_chat_prompt(&state, &ready, chat).await?;
    Ok(axum::Json(json!({"input_tokens": n})).into_response())
}

/// A call's arguments as a `tool_use` block's `input`: an object (a
/// string holding JSON is parsed).
fn tool_input(arguments: Value) -> Value {
    match arguments {
        Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
        v => v,
    }
}

/// Which block is open in a stream.
#[derive(Clone, Copy, PartialEq)]
enum Open {
    None,
    Text,
    Thinking,
}

/// The answer's shape: what `message_start` and the whole answer repeat,
/// and the stream's state (the open block and the next block's index).
struct Writer {
    id: String,
    model: String,
    prompt_tokens: usize,
    open: Open,
    index: usize,
}

fn event(name: &str, data: Value) -> Frame {
    Frame::named(name, data.to_string())
}

impl Writer {
    fn close(&mut self, out: &mut Vec<Frame>) {
        if self.open != Open::None {
            out.push(event("content_block_stop", json!({"type": "content_block_stop", "index": self.index})));
            self.index += 1;
            self.open = Open::None;
        }
    }

    fn open(&mut self, kind: Open, out: &mut Vec<Frame>) {
        if self.open == kind {
            return;
        }
        self.close(out);
        let block = match kind {
            Open::Text => json!({"type": "text", "text": ""}),
            _ => json!({"type": "thinking", "thinking": "", "signature": ""}),
        };
        out.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        ));
        self.open = kind;
    }

    /// The events for what the reader released.
    fn write(&mut self, events: Vec<ChatEvent>) -> Vec<Frame> {
        let mut out = Vec::new();
        for e in events {
            match e {
                ChatEvent::Text(text) => {
                    self.open(Open::Text, &mut out);
                    let delta = json!({"type": "text_delta", "text": text});
                    out.push(event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
                    ));
                }
                ChatEvent::Reasoning(thinking) => {
                    self.open(Open::Thinking, &mut out);
                    let delta = json!({"type": "thinking_delta", "thinking": thinking});
                    out.push(event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
                    ));
                }
                ChatEvent::ToolCall(call) => {
                    self.close(&mut out);
                    let block = json!({"type": "tool_use", "id": call.id, "name": call.function.name, "input": {}});
                    out.push(event(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": self.index, "content_block": block}),
                    ));
                    let delta = json!({"type": "input_json_delta",
                                       "partial_json": tool_input(call.function.arguments).to_string()});
                    out.push(event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
                    ));
                    out.push(event("content_block_stop", json!({"type": "content_block_stop", "index": self.index})));
                    self.index += 1;
                }
                _ => {}
            }
        }
        out
    }
}

/// The SSE answer: `message_start`, the blocks' start, delta and stop
/// events as the reader releases them, `message_delta` with the stop
/// reason and usage, `message_stop`. A failure after the 200 is an
/// `error` event. Whole: the message with its content blocks.
impl Dialect for Writer {
    fn head(&mut self) -> Vec<Frame> {
        let start = json!({"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0}}});
        vec![event("message_start", start)]
    }

    fn chat(&mut self, _: usize, events: Vec<ChatEvent>, _: Option<TokenLogprob>) -> Vec<Frame> {
        self.write(events)
    }

    fn end(&mut self, _: usize, ended: Ended<'_>) -> Vec<Frame> {
        let mut out = Vec::new();
        self.close(&mut out);
        let called = ended.reply.is_some_and(|r| !r.tool_calls().is_empty());
        let reason = stop_reason(ended.reason, ended.stop.as_deref(), called);
        let delta = json!({"type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": ended.stop.filter(|_| reason == "stop_sequence")},
            "usage": {"output_tokens": ended.usage.completion_tokens}});
        out.push(event("message_delta", delta));
        out.push(event("message_stop", json!({"type": "message_stop"})));
        out
    }

    fn error(&mut self, e: &ApiError) -> Frame {
        event("error", error_body(e))
    }

    fn whole(self, mut choices: Vec<Choice>, usage: Usage) -> Response {
        let Some(choice) = choices.pop() else {
            return AnthropicError(ApiError::internal("no choice was collected")).into_response();
        };
        let reply = choice.reply.unwrap_or_default();
        let content = reply
            .listed_parts()
            .filter_map(|part| match part {
                ReplyPart::Text(text) => Some(OutBlock::Text { text: text.clone() }),
                ReplyPart::Reasoning(thinking) => {
                    Some(OutBlock::Thinking { thinking: thinking.clone(), signature: String::new() })
                }
                ReplyPart::ToolCall(call) => Some(OutBlock::ToolUse {
                    id: call.id.clone().unwrap_or_default(),
                    name: call.function.name.clone(),
                    input: tool_input(call.function.arguments.clone()),
                }),
                _ => None,
            })
            .collect();
        let reason = stop_reason(choice.finish_reason, choice.stop.as_deref(), !reply.tool_calls().is_empty());
        axum::Json(MessageResponse {
            id: self.id,
            kind: "message",
            role: "assistant",
            model: self.model,
            content,
            stop_reason: Some(reason),
            stop_sequence: choice.stop.filter(|_| reason == "stop_sequence"),
            usage: MessageUsage { input_tokens: usage.prompt_tokens, output_tokens: usage.completion_tokens },
        })
        .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_tokens_is_required_and_positive() {
        assert!(required_max_tokens(None).unwrap_err().message.contains("required"));
        assert!(required_max_tokens(Some(0)).unwrap_err().message.contains("at least 1"));
        assert_eq!(required_max_tokens(Some(12)).unwrap(), 12);
    }

    /// The frames of a streamed answer with thoughts, text in two pieces
    /// and a tool call, as the loop calls the dialect.
    #[test]
    fn a_stream_opens_and_closes_each_block_in_order() {
        let call = llamacpp::chat::ToolCall {
            id: Some("toolu_1".into()),
            kind: "function".into(),
            function: llamacpp::chat::FunctionCall { name: "f".into(), arguments: json!({"a": 1}) },
        };
        let mut reply = llamacpp::chat::Reply::default();
        reply.parts.push(ReplyPart::ToolCall(call.clone()));
        let mut w = Writer { id: "msg-1".into(), model: "m".into(), prompt_tokens: 5, open: Open::None, index: 0 };
        let mut frames = w.head();
        let events = vec![
            ChatEvent::Reasoning("hmm".into()),
            ChatEvent::Text("Hi".into()),
            ChatEvent::Text("!".into()),
            ChatEvent::ToolCall(call),
        ];
        frames.extend(w.chat(0, events, None));
        let usage = Usage { completion_tokens: 3, ..Usage::default() };
        frames.extend(w.end(0, Ended { reason: "stop", stop: None, usage, reply: Some(&reply) }));
        let names: Vec<&str> = frames.iter().map(|f| f.name.as_deref().unwrap_or_default()).collect();
        let (start, delta, stop) = ("content_block_start", "content_block_delta", "content_block_stop");
        assert_eq!(
            names,
            [
                "message_start",
                start,
                delta,
                stop,
                start,
                delta,
                delta,
                stop,
                start,
                delta,
                stop,
                "message_delta",
                "message_stop"
            ]
        );
        let data: Vec<Value> = frames.iter().map(|f| serde_json::from_str(&f.data).unwrap()).collect();
        assert_eq!(data[0]["message"]["usage"]["input_tokens"], 5);
        assert_eq!(data[1]["content_block"]["type"], "thinking");
        assert_eq!(data[2]["delta"], json!({"type": "thinking_delta", "thinking": "hmm"}));
        assert_eq!((data[4]["index"].clone(), data[4]["content_block"]["type"].clone()), (json!(1), json!("text")));
        assert_eq!(data[6]["delta"]["text"], "!");
        assert_eq!(data[8]["content_block"], json!({"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}));
        assert_eq!(data[9]["delta"]["partial_json"], r#"{"a":1}"#);
        assert_eq!(data[10]["index"], 2);
        assert_eq!(data[11]["delta"]["stop_reason"], "tool_use");
        assert_eq!(data[11]["usage"]["output_tokens"], 3);
        let error = w.error(&ApiError::bad_request("no"));
        assert_eq!(error.name.as_deref(), Some("error"));
        assert_eq!(
            serde_json::from_str::<Value>(&error.data).unwrap(),
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "no"}})
        );
    }
}
