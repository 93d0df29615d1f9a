//! `/v1/responses` and `/v1/responses/input_tokens`: OpenAI's Responses
//! API, read into the typed chat request every chat API makes
//! ([`ResponsesRequest::to_chat`]) and run through the same path
//! ([`super::completion::submit_chat`], [`crate::respond`]); only the
//! answer's items and stream events are this API's own ([`Writer`]).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use llamacpp::chat::{ChatEvent, ReplyPart};
use llamacpp::engine::TokenLogprob;
use serde_json::{Value, json};

use super::completion::{count_chat_prompt, submit_chat};
use super::open;
use crate::choices::Choice;
use crate::error::ApiError;
use crate::openai::{ResponsesRequest, Usage};
use crate::request::arguments_text;
use crate::respond::{Answer, Dialect, Ended, Frame, respond};
use crate::state::{AppState, now};

/// What the answer echoes of its request.
#[derive(Clone)]
struct Echo {
    id: String,
    model: String,
    created_at: u64,
    tools: Vec<Value>,
    tool_choice: Value,
    parallel_tool_calls: bool,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    /// The request's `text.format` (`{"type": "text"}` unless it asked
    /// for JSON).
    text_format: Value,
}

impl Echo {
    /// The response object with `output` and `usage`; `finish` is the
    /// OpenAI finish reason (`None`: still in progress).
    fn response(&self, output: Vec<Value>, finish: Option<&str>, usage: Option<&Usage>) -> Value {
        let (status, incomplete) = match finish {
            None => ("in_progress", Value::Null),
            Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
            Some(_) => ("completed", Value::Null),
        };
        json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "incomplete_details": incomplete, "error": null, "model": self.model, "output": output,
            "tools": self.tools, "tool_choice": self.tool_choice, "parallel_tool_calls": self.parallel_tool_calls,
            "instructions": self.instructions, "max_output_tokens": self.max_output_tokens, "metadata": {},
            "text": {"format": self.text_format},
            "usage": usage.map(|u| json!({
                "input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.prompt_tokens_details.cached_tokens},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.prompt_tokens + u.completion_tokens,
            })),
        })
    }
}

pub async fn responses(
    State(state): State<Arc<AppState>>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let (req, ready): (ResponsesRequest, _) = open(&state, "responses", request).await?;
    let chat = req.to_chat()?;
    let ready = ready?;
    let echo = Echo {
        id: state.id("resp"),
        model: state.config.model_name.clone(),
        created_at: now(),
        tools: req.tools.clone(),
        tool_choice: req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        instructions: req.instructions.clone(),
        max_output_tokens: req.max_output_tokens,
        text_format: req.text.as_ref().and_then(|t| t.format.clone()).unwrap_or_else(|| json!({"type": "text"})),
    };
    let submitted = submit_chat(&state, &ready, chat, 1, None).await?;
    let writer = Writer { echo, state, sequence: 0, done: Vec::new(), open: None };
    let answer =
        Answer { completions: submitted.completions, parser: Some(submitted.parser), n: 1, stream: req.stream };
    respond(writer, answer).await
}

/// `/v1/responses/input_tokens`: the prompt's length in tokens, as
/// `/v1/responses` would render it.
pub async fn input_tokens(
    State(state): State<Arc<AppState>>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let (req, ready): (ResponsesRequest, _) = open(&state, "input_tokens", request).await?;
    let chat = req.to_chat()?;
    let ready = ready?;
    let n = count_chat_prompt(&state, &ready, chat).await?;
    Ok(axum::Json(json!({"object": "response.input_tokens", "input_tokens": n})).into_response())
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "role": "assistant", "status": status,
           "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": id, "status": status, "summary": [],
           "content": [{"type": "reasoning_text", "text": text}]})
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status})
}

/// The stream's state: the open item (its index, id, kind and text so
/// far), the finished items, and the events' sequence number.
struct Writer {
    echo: Echo,
    state: Arc<AppState>,
    sequence: u64,
    done: Vec<Value>,
    open: Option<(String, &'static str, String)>,
}

impl Writer {
    fn event(&mut self, mut data: Value) -> Frame {
        data["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        let name = data["type"].as_str().unwrap_or_default().to_owned();
        Frame::named(name, data.to_string())
    }

    /// Ends the open message or reasoning item.
    fn close(&mut self, out: &mut Vec<Frame>) {
        let Some((id, kind, text)) = self.open.take() else { return };
        let index = self.done.len();
        let (part, item, done_type, done_field) = if kind == "message" {
            (
                json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []}),
                message_item(&id, &text, "completed"),
                "response.output_text.done",
                "text",
            )
        } else {
            (
                json!({"type": "reasoning_text", "text": text}),
                reasoning_item(&id, &text, "completed"),
                "response.reasoning_text.done",
                "text",
            )
        };
        let mut text_done = json!({"type": done_type, "item_id": id, "output_index": index, "content_index": 0});
        text_done[done_field] = text.clone().into();
        if kind == "message" {
            text_done["logprobs"] = json!([]);
        }
        out.push(self.event(text_done));
        out.push(self.event(json!({"type": "response.content_part.done", "item_id": id, "output_index": index,
                                   "content_index": 0, "part": part})));
        out.push(self.event(json!({"type": "response.output_item.done", "output_index": index, "item": item})));
        self.done.push(item_of(&id, kind, &text));
    }

    /// Adds `piece` to an open item of `kind`, opening one if needed.
    fn piece(&mut self, kind: &'static str, piece: &str, out: &mut Vec<Frame>) {
        if self.open.as_ref().is_some_and(|(_, k, _)| *k != kind) {
            self.close(out);
        }
        let index = self.done.len();
        if self.open.is_none() {
            let id = self.state.id(if kind == "message" { "msg" } else { "rs" });
            let (item, part) = if kind == "message" {
                (
                    json!({"type": "message", "id": id, "role": "assistant", "status": "in_progress", "content": []}),
                    json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
                )
            } else {
                (
                    json!({"type": "reasoning", "id": id, "status": "in_progress", "summary": [], "content": []}),
                    json!({"type": "reasoning_text", "text": ""}),
                )
            };
            out.push(self.event(json!({"type": "response.output_item.added", "output_index": index, "item": item})));
            out.push(self.event(json!({"type": "response.content_part.added", "item_id": id, "output_index": index,
                                       "content_index": 0, "part": part})));
            self.open = Some((id, kind, String::new()));
        }
        let Some((id, _, text)) = &mut self.open else { return };
        text.push_str(piece);
        let id = id.clone();
        let delta = if kind == "message" {
            json!({"type": "response.output_text.delta", "item_id": id, "output_index": index, "content_index": 0,
                   "delta": piece, "logprobs": []})
        } else {
            json!({"type": "response.reasoning_text.delta", "item_id": id, "output_index": index, "content_index": 0,
                   "delta": piece})
        };
        out.push(self.event(delta));
    }

    /// The events for what the reader released.
    fn write(&mut self, events: Vec<ChatEvent>) -> Vec<Frame> {
        let mut out = Vec::new();
        for e in events {
            match e {
                ChatEvent::Text(t) => self.piece("message", &t, &mut out),
                ChatEvent::Reasoning(t) => self.piece("reasoning", &t, &mut out),
                ChatEvent::ToolCall(call) => {
                    self.close(&mut out);
                    let index = self.done.len();
                    let (id, call_id) = (self.state.id("fc"), call.id.unwrap_or_default());
                    let arguments = arguments_text(&call.function.arguments);
                    let name = call.function.name;
                    let added = call_item(&id, &call_id, &name, "", "in_progress");
                    out.push(
                        self.event(json!({"type": "response.output_item.added", "output_index": index, "item": added})),
                    );
                    out.push(self.event(json!({"type": "response.function_call_arguments.delta", "item_id": id,
                                               "output_index": index, "delta": arguments})));
                    out.push(self.event(json!({"type": "response.function_call_arguments.done", "item_id": id,
                                               "output_index": index, "arguments": arguments})));
                    let item = call_item(&id, &call_id, &name, &arguments, "completed");
                    out.push(
                        self.event(json!({"type": "response.output_item.done", "output_index": index, "item": item})),
                    );
                    self.done.push(item);
                }
                _ => {}
            }
        }
        out
    }
}

fn item_of(id: &str, kind: &str, text: &str) -> Value {
    if kind == "message" { message_item(id, text, "completed") } else { reasoning_item(id, text, "completed") }
}

/// The SSE answer: `response.created` and `response.in_progress`, each
/// item's added, delta and done events as the reader releases them, then
/// `response.completed` (or `response.incomplete` at `max_output_tokens`)
/// with every item and the usage. A failure after the 200 is an `error`
/// event. Whole: the response object with its items.
impl Dialect for Writer {
    fn head(&mut self) -> Vec<Frame> {
        let created = self.echo.response(Vec::new(), None, None);
        vec![
            self.event(json!({"type": "response.created", "response": created.clone()})),
            self.event(json!({"type": "response.in_progress", "response": created})),
        ]
    }

    fn chat(&mut self, _: usize, events: Vec<ChatEvent>, _: Option<TokenLogprob>) -> Vec<Frame> {
        self.write(events)
    }

    fn end(&mut self, _: usize, ended: Ended<'_>) -> Vec<Frame> {
        let mut out = Vec::new();
        self.close(&mut out);
        let response = self.echo.response(self.done.clone(), Some(ended.reason), Some(&ended.usage));
        let kind = if ended.reason == "length" { "response.incomplete" } else { "response.completed" };
        out.push(self.event(json!({"type": kind, "response": response})));
        out
    }

    fn error(&mut self, e: &ApiError) -> Frame {
        self.event(json!({"type": "error", "code": e.code, "message": e.message, "param": e.param}))
    }

    fn whole(self, mut choices: Vec<Choice>, usage: Usage) -> Response {
        let Some(choice) = choices.pop() else {
            return ApiError::internal("no choice was collected").into_response();
        };
        let output = choice
            .reply
            .iter()
            .flat_map(|reply| reply.listed_parts())
            .filter_map(|part| match part {
                ReplyPart::Text(t) => Some(message_item(&self.state.id("msg"), t, "completed")),
                ReplyPart::Reasoning(t) => Some(reasoning_item(&self.state.id("rs"), t, "completed")),
                ReplyPart::ToolCall(call) => Some(call_item(
                    &self.state.id("fc"),
                    call.id.as_deref().unwrap_or_default(),
                    &call.function.name,
                    &arguments_text(&call.function.arguments),
                    "completed",
                )),
                _ => None,
            })
            .collect();
        axum::Json(self.echo.response(output, Some(choice.finish_reason), Some(&usage))).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events of a streamed answer with thoughts, text and a call:
    /// each item added, its deltas, done; numbered in order; then the
    /// response with every item.
    #[test]
    fn a_stream_adds_and_finishes_each_item_in_order() {
        let state = crate::test_state();
        let echo = Echo {
            id: "resp-1".into(),
            model: "m".into(),
            created_at: 0,
            tools: Vec::new(),
            tool_choice: json!("auto"),
            parallel_tool_calls: true,
            instructions: None,
            max_output_tokens: Some(8),
            text_format: json!({"type": "text"}),
        };
        let mut w = Writer { echo, state, sequence: 0, done: Vec::new(), open: None };
        let call = llamacpp::chat::ToolCall {
            id: Some("call_1".into()),
            kind: "function".into(),
            function: llamacpp::chat::FunctionCall { name: "f".into(), arguments: json!({"a": 1}) },
        };
        let mut frames = w.head();
        let events = vec![ChatEvent::Reasoning("hmm".into()), ChatEvent::Text("Hi".into()), ChatEvent::ToolCall(call)];
        frames.extend(w.chat(0, events, None));
        let usage = Usage { prompt_tokens: 4, completion_tokens: 8, ..Usage::default() };
        frames.extend(w.end(0, Ended { reason: "length", stop: None, usage, reply: None }));
        let data: Vec<Value> = frames.iter().map(|f| serde_json::from_str(&f.data).unwrap()).collect();
        let types: Vec<&str> = data.iter().map(|d| d["type"].as_str().unwrap()).collect();
        let names: Vec<&str> = frames.iter().map(|f| f.name.as_deref().unwrap_or_default()).collect();
        assert_eq!(names, types, "each event is named by its type");
        assert_eq!(
            types,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.incomplete",
            ]
        );
        let numbers: Vec<u64> = data.iter().map(|d| d["sequence_number"].as_u64().unwrap()).collect();
        assert_eq!(numbers, (0..19).collect::<Vec<_>>());
        let response = &data[18]["response"];
        assert_eq!(response["status"], "incomplete");
        assert_eq!(response["incomplete_details"]["reason"], "max_output_tokens");
        let kinds: Vec<&str> =
            response["output"].as_array().unwrap().iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(response["output"][2]["arguments"], r#"{"a":1}"#);
        assert_eq!(response["usage"]["total_tokens"], 12);
    }
}
