//! `/v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages
//! API, translated into the chat request of `/v1/chat/completions` and run
//! through the same path ([`super::completion::submit_chat`]); only the
//! answer's shape and its stream events are this API's own.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use llamacpp::chat::{ChatEvent, ChatParser, ReplyPart, ReplyReader};
use serde_json::{Value, json};

use super::completion::{count_chat_prompt, submit_chat};
use super::{open, ready};
use crate::anthropic::{AnthropicError, MessageResponse, MessageUsage, MessagesRequest, OutBlock, stop_reason};
use crate::choices::{self, Delta};
use crate::error::ApiError;
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
    let req: MessagesRequest = open(&state, "messages", request).await?;
    let max_tokens = required_max_tokens(req.max_tokens)?;
    let chat = req.to_chat(Some(max_tokens))?;
    let ready = ready(&state)?;
    let submitted = submit_chat(&state, &ready, chat, 1, None).await?;
    let id = state.id("msg");
    if req.stream {
        return Ok(stream(state, id, submitted.prompt_tokens, submitted.parser, submitted.completions));
    }
    let choice = choices::collect(submitted.completions)
        .await?
        .pop()
        .ok_or_else(|| ApiError::internal("no choice was collected"))?;
    let reply = choice.reply(submitted.parser);
    let called = !reply.tool_calls().is_empty();
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
    let reason = stop_reason(choice.finish_reason, choice.stop.as_deref(), called);
    Ok(axum::Json(MessageResponse {
        id,
        kind: "message",
        role: "assistant",
        model: state.config.model_name.clone(),
        content,
        stop_reason: Some(reason),
        stop_sequence: choice.stop.filter(|_| reason == "stop_sequence"),
        usage: MessageUsage { input_tokens: choice.usage.prompt_tokens, output_tokens: choice.usage.completion_tokens },
    })
    .into_response())
}

/// `/v1/messages/count_tokens`: the prompt's length in tokens, as
/// `/v1/messages` would render it.
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    request: axum::extract::Request,
) -> Result<Response, AnthropicError> {
    let req: MessagesRequest = open(&state, "count_tokens", request).await?;
    let chat = req.to_chat(None)?;
    let ready = ready(&state)?;
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

/// The stream's state: the open block and the next block's index.
struct Writer {
    open: Open,
    index: usize,
    called: bool,
}

fn event(name: &str, data: Value) -> SseEvent {
    SseEvent::default().event(name).data(data.to_string())
}

impl Writer {
    fn close(&mut self, out: &mut Vec<SseEvent>) {
        if self.open != Open::None {
            out.push(event("content_block_stop", json!({"type": "content_block_stop", "index": self.index})));
            self.index += 1;
            self.open = Open::None;
        }
    }

    fn open(&mut self, kind: Open, out: &mut Vec<SseEvent>) {
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
    fn write(&mut self, events: Vec<ChatEvent>) -> Vec<SseEvent> {
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
                    self.called = true;
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
/// `error` event.
fn stream(
    state: Arc<AppState>,
    id: String,
    prompt_tokens: usize,
    parser: ChatParser,
    completions: Vec<llamacpp::engine::Completion>,
) -> Response {
    let start = json!({"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": state.config.model_name, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}});
    let head = futures::stream::iter([Ok::<_, Infallible>(event("message_start", start))]);
    let mut reader = ReplyReader::new(parser);
    let mut writer = Writer { open: Open::None, index: 0, called: false };
    let body = choices::merged(completions).flat_map(move |(_, delta)| {
        let events = match delta {
            Delta::Piece { text, .. } => writer.write(reader.push(&text)),
            Delta::Done(Ok(finish)) => {
                let mut out = writer.write(reader.finish(finish.reason.clone(), finish.usage));
                writer.close(&mut out);
                let finish_reason = choices::finish_reason(&finish.reason).unwrap_or("stop");
                let stop = choices::stop_string(&finish.reason);
                let reason = stop_reason(finish_reason, stop.as_deref(), writer.called);
                let delta = json!({"type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": stop.filter(|_| reason == "stop_sequence")},
                    "usage": {"output_tokens": finish.usage.completion_tokens}});
                out.push(event("message_delta", delta));
                out.push(event("message_stop", json!({"type": "message_stop"})));
                out
            }
            Delta::Done(Err(e)) => vec![event("error", AnthropicError(e).body())],
        };
        futures::stream::iter(events.into_iter().map(Ok::<_, Infallible>).collect::<Vec<_>>())
    });
    Sse::new(head.chain(body)).keep_alive(KeepAlive::default()).into_response()
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
}
