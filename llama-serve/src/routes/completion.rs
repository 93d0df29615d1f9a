//! `/v1/completions` and `/v1/chat/completions`: each endpoint turns its
//! request into engine requests (on the blocking pool, see
//! [`off_runtime`]), then answers through the one loop
//! ([`crate::respond`]) in its dialect ([`TextCompletions`],
//! [`ChatCompletions`]). [`submit_chat`] is every chat API's way in.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use llamacpp::chat::{ChatEvent, ChatParser, Reply, Tools};
use llamacpp::engine::{Completion, Request, TokenLogprob};
use llamacpp::{Model, Token, Vocab};
use serde::Serialize;
use serde_json::{Value, json};

use super::prompt::{chat_prompt, completion_prompts};
use super::{choice_count, max_tokens, off_runtime, open};
use crate::choices::{self, Choice};
use crate::error::ApiError;
use crate::openai::{
    AssistantMessage, ChatChoice, ChatChunk, ChatChunkChoice, ChatCompletion, ChatDelta, ChatLogprobs, ChatRequest,
    CompletionRequest, FunctionCall, FunctionDelta, Header, Logprob, LogprobEntry, TextChoice, TextCompletion,
    TextLogprobs, ToolCall, ToolCallDelta, Usage,
};
use crate::request::{Chat, Format};
use crate::respond::{Answer, Dialect, Ended, Frame, respond};
use crate::state::{AppState, Ready, now};

pub async fn completions(
    State(state): State<Arc<AppState>>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let (req, ready): (CompletionRequest, _) = open(&state, "completions", request).await?;
    let ready = ready?;
    let n = choice_count(req.sampling.n)?;
    let max_tokens = max_tokens(&state, req.max_tokens, 16)?;
    let (stream, include_usage, logprobs) = (req.sampling.stream, req.sampling.include_usage(), req.logprobs.is_some());
    let (completions, echoes) = {
        let (state, ready) = (state.clone(), ready.clone());
        off_runtime(move || {
            let vocab = ready.model.vocab();
            let (prompts, echoes) = completion_prompts(vocab, &req, n)?;
            let stops = req.sampling.stop_list();
            let mut requests = Vec::with_capacity(prompts.len() * n);
            for prompt in &prompts {
                for j in 0..n {
                    let sampling = choices::sampling_params(&req.sampling, vocab, req.logprobs, None, j)?;
                    let request = Request::new(prompt.clone())
                        .max_tokens(max_tokens)
                        .stop(stops.clone())
                        .stop_at_eog(!req.sampling.ignore_eos)
                        .sampling(sampling);
                    requests.push(choices::with_speculation(request, &req.sampling, state.config.speculation));
                }
            }
            Ok((choices::submit_all(&ready.engine, requests)?, echoes))
        })
        .await?
    };
    let common = Common::new(&state, &ready, "cmpl", n, include_usage);
    let dialect = TextCompletions { common, echoes, logprobs };
    respond(dialect, Answer { completions, parser: None, n, stream }).await
}

pub async fn chat(State(state): State<Arc<AppState>>, request: axum::extract::Request) -> Result<Response, ApiError> {
    let (req, ready): (ChatRequest, _) = open(&state, "chat", request).await?;
    let ready = ready?;
    let n = choice_count(req.sampling.n)?;
    let top = match (req.logprobs, req.top_logprobs) {
        (true, top) => Some(top.unwrap_or(0)),
        (false, Some(_)) => {
            return Err(ApiError::bad_request("top_logprobs needs logprobs: true").param("top_logprobs"));
        }
        (false, None) => None,
    };
    let chat = req.into_chat()?;
    let (stream, include_usage) = (chat.sampling.stream, chat.sampling.include_usage());
    let submitted = submit_chat(&state, &ready, chat, n, top).await?;
    let common = Common::new(&state, &ready, "chatcmpl", n, include_usage);
    let dialect = ChatCompletions { common, logprobs: top.is_some(), calls: vec![0; n] };
    let answer = Answer { completions: submitted.completions, parser: Some(submitted.parser), n, stream };
    respond(dialect, answer).await
}

/// The prompt's length in tokens of a chat request, as [`submit_chat`]
/// would render it (`count_tokens`, `input_tokens`).
pub(super) async fn count_chat_prompt(
    state: &Arc<AppState>,
    ready: &Arc<Ready>,
    chat: Chat,
) -> Result<usize, ApiError> {
    let (state, ready) = (state.clone(), ready.clone());
    off_runtime(move || Ok(chat_prompt(&ready, &state.config, &chat)?.prompt_tokens)).await
}

/// A chat request in the engine: its choices, the reader of each one's
/// output, and the prompt's length.
pub(super) struct SubmittedChat {
    pub completions: Vec<Completion>,
    pub parser: ChatParser,
    pub prompt_tokens: usize,
}

/// The one path of every chat API: the prompt through the template with
/// its tools and constraints, `n` engine requests (`top` logprobs each).
pub(super) async fn submit_chat(
    state: &Arc<AppState>,
    ready: &Arc<Ready>,
    chat: Chat,
    n: usize,
    top: Option<usize>,
) -> Result<SubmittedChat, ApiError> {
    let max_tokens = max_tokens(state, chat.max_tokens, state.config.max_tokens_cap)?;
    if chat.tools.as_ref().is_some_and(Tools::forced) && chat.format != Format::Text {
        return Err(ApiError::bad_request("tool_choice that requires a call cannot be combined with response_format")
            .param("tool_choice"));
    }
    let (state, ready) = (state.clone(), ready.clone());
    off_runtime(move || {
        let setup = chat_prompt(&ready, &state.config, &chat)?;
        let stops = chat.sampling.stop_list();
        let requests = (0..n)
            .map(|j| {
                let sampling = choices::sampling_params(
                    &chat.sampling,
                    ready.model.vocab(),
                    top,
                    setup.response_constraint.as_ref(),
                    j,
                )?;
                let request = setup
                    .request
                    .clone()
                    .max_tokens(max_tokens)
                    .stop(stops.clone())
                    .stop_at_eog(!chat.sampling.ignore_eos)
                    .sampling(sampling);
                Ok(choices::with_speculation(request, &chat.sampling, state.config.speculation))
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok(SubmittedChat {
            completions: choices::submit_all(&ready.engine, requests)?,
            parser: setup.parser,
            prompt_tokens: setup.prompt_tokens,
        })
    })
    .await
}

/// What both OpenAI dialects share: the header each chunk repeats, the
/// usage chunk the client may ask for, `[DONE]`, the error object.
struct Common {
    header: Header,
    /// Choices per prompt.
    n: usize,
    include_usage: bool,
    /// The stream outlives the handler: it holds the model itself.
    model: Arc<Model>,
}

impl Common {
    fn new(state: &AppState, ready: &Ready, prefix: &str, n: usize, include_usage: bool) -> Common {
        let header =
            Header { id: state.id(prefix), object: "", created: now(), model: state.config.model_name.clone() };
        Common { header, n, include_usage, model: ready.model.clone() }
    }

    fn header(&self, object: &'static str) -> Header {
        Header { object, ..self.header.clone() }
    }

    /// `null` in every chunk when the client asked for a usage chunk.
    fn usage(&self) -> Option<Option<Usage>> {
        self.include_usage.then_some(None)
    }

    /// The usage chunk (when asked for; `usage_chunk` makes it), then
    /// `data: [DONE]`.
    fn tail(&self, usage_chunk: impl FnOnce() -> Frame) -> Vec<Frame> {
        let mut events = Vec::new();
        if self.include_usage {
            events.push(usage_chunk());
        }
        events.push(Frame::data("[DONE]"));
        events
    }
}

/// An SSE event whose data is `body`.
fn data(body: &impl Serialize) -> Frame {
    Frame::data(json_text(body))
}

/// `/v1/completions`: each prompt's echo (empty without `echo`), and
/// whether `logprobs` was asked for.
struct TextCompletions {
    common: Common,
    echoes: Vec<String>,
    logprobs: bool,
}

impl TextCompletions {
    fn chunk(&self, choices: Vec<TextChoice>) -> Frame {
        let header = self.common.header("text_completion");
        data(&TextCompletion { header, choices, usage: self.common.usage() })
    }
}

impl Dialect for TextCompletions {
    /// An echoed prompt is its choices' first chunk.
    fn head(&mut self) -> Vec<Frame> {
        let n = self.common.n;
        self.echoes
            .iter()
            .enumerate()
            .flat_map(|(p, echo)| (0..n).map(move |j| (p * n + j, echo)))
            .filter(|(_, echo)| !echo.is_empty())
            .map(|(index, echo)| {
                self.chunk(vec![TextChoice { index, text: echo.clone(), logprobs: None, finish_reason: None }])
            })
            .collect()
    }

    fn text(&mut self, index: usize, text: String, logprob: Option<TokenLogprob>) -> Vec<Frame> {
        let logprobs = logprob.map(|lp| text_logprobs(self.common.model.vocab(), &[(lp.token, lp)], 0));
        vec![self.chunk(vec![TextChoice { index, text, logprobs, finish_reason: None }])]
    }

    fn end(&mut self, index: usize, ended: Ended<'_>) -> Vec<Frame> {
        let choice = TextChoice { index, text: String::new(), logprobs: None, finish_reason: Some(ended.reason) };
        vec![self.chunk(vec![choice])]
    }

    fn tail(&mut self, usage: Usage) -> Vec<Frame> {
        let header = self.common.header("text_completion");
        self.common.tail(|| data(&TextCompletion { header, choices: Vec::new(), usage: Some(Some(usage)) }))
    }

    fn error(&mut self, error: &ApiError) -> Frame {
        data(&error.body())
    }

    fn whole(self, choices: Vec<Choice>, usage: Usage) -> Response {
        let vocab = self.common.model.vocab();
        let n = self.common.n;
        let choices = choices
            .iter()
            .enumerate()
            .map(|(index, c)| {
                let echo = &self.echoes[index / n];
                TextChoice {
                    index,
                    text: format!("{echo}{}", c.text),
                    logprobs: self.logprobs.then(|| text_logprobs(vocab, &c.logprobs, echo.len())),
                    finish_reason: Some(c.finish_reason),
                }
            })
            .collect();
        let header = self.common.header("text_completion");
        axum::Json(TextCompletion { header, choices, usage: Some(Some(usage)) }).into_response()
    }
}

/// `/v1/chat/completions`, with or without `logprobs`; the tool calls
/// each choice has streamed so far (their chunks are numbered).
struct ChatCompletions {
    common: Common,
    logprobs: bool,
    calls: Vec<usize>,
}

impl ChatCompletions {
    fn chunk(&self, choice: ChatChunkChoice) -> Frame {
        let header = self.common.header("chat.completion.chunk");
        data(&ChatChunk { header, choices: vec![choice], usage: self.common.usage() })
    }
}

impl Dialect for ChatCompletions {
    /// Each choice opens with the assistant role.
    fn head(&mut self) -> Vec<Frame> {
        (0..self.common.n)
            .map(|index| {
                let delta = ChatDelta { role: Some("assistant"), content: Some(String::new()), ..ChatDelta::default() };
                self.chunk(ChatChunkChoice { index, delta, logprobs: None, finish_reason: None })
            })
            .collect()
    }

    /// Thoughts as reasoning content, text as content, each call as its
    /// id and name, then its arguments. A token's logprob rides on the
    /// first chunk (or on an empty one).
    fn chat(&mut self, index: usize, events: Vec<ChatEvent>, logprob: Option<TokenLogprob>) -> Vec<Frame> {
        let mut logprobs = logprob.map(|lp| chat_logprobs(self.common.model.vocab(), &[(lp.token, lp)]));
        let with_logprob = logprobs.is_some();
        let mut deltas = Vec::new();
        for event in events {
            match event {
                ChatEvent::Text(text) => deltas.push(ChatDelta { content: Some(text), ..ChatDelta::default() }),
                ChatEvent::Reasoning(text) => {
                    deltas.push(ChatDelta { reasoning_content: Some(text), ..ChatDelta::default() });
                }
                ChatEvent::ToolCall(call) => {
                    let Some(calls) = self.calls.get_mut(index) else { continue };
                    let opening = ToolCallDelta {
                        index: *calls,
                        id: call.id,
                        kind: Some("function"),
                        function: FunctionDelta { name: Some(call.function.name), arguments: String::new() },
                    };
                    let arguments = ToolCallDelta {
                        index: *calls,
                        id: None,
                        kind: None,
                        function: FunctionDelta { name: None, arguments: call.function.arguments.to_string() },
                    };
                    *calls += 1;
                    for delta in [opening, arguments] {
                        deltas.push(ChatDelta { tool_calls: Some(vec![delta]), ..ChatDelta::default() });
                    }
                }
                // The end is the choice's last chunk (`end`).
                _ => {}
            }
        }
        if deltas.is_empty() && with_logprob {
            deltas.push(ChatDelta { content: Some(String::new()), ..ChatDelta::default() });
        }
        deltas
            .into_iter()
            .map(|delta| self.chunk(ChatChunkChoice { index, delta, logprobs: logprobs.take(), finish_reason: None }))
            .collect()
    }

    fn end(&mut self, index: usize, ended: Ended<'_>) -> Vec<Frame> {
        let reason = if ended.called() { "tool_calls" } else { ended.reason };
        vec![self.chunk(ChatChunkChoice {
            index,
            delta: ChatDelta::default(),
            logprobs: None,
            finish_reason: Some(reason),
        })]
    }

    fn tail(&mut self, usage: Usage) -> Vec<Frame> {
        let header = self.common.header("chat.completion.chunk");
        self.common.tail(|| data(&ChatChunk { header, choices: Vec::new(), usage: Some(Some(usage)) }))
    }

    fn error(&mut self, error: &ApiError) -> Frame {
        data(&error.body())
    }

    fn whole(self, choices: Vec<Choice>, usage: Usage) -> Response {
        let vocab = self.common.model.vocab();
        let empty = Reply::default();
        let choices = choices
            .iter()
            .enumerate()
            .map(|(index, c)| {
                let reply = c.reply.as_ref().unwrap_or(&empty);
                let tool_calls = reply
                    .tool_calls()
                    .into_iter()
                    .map(|call| ToolCall {
                        id: call.id.clone().unwrap_or_default(),
                        kind: "function",
                        function: FunctionCall {
                            name: call.function.name.clone(),
                            arguments: call.function.arguments.to_string(),
                        },
                    })
                    .collect();
                let reasoning = reply.reasoning();
                ChatChoice {
                    index,
                    message: AssistantMessage {
                        role: "assistant",
                        content: reply.content(),
                        reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                        tool_calls,
                    },
                    logprobs: self.logprobs.then(|| chat_logprobs(vocab, &c.logprobs)),
                    finish_reason: if reply.called_tools() { "tool_calls" } else { c.finish_reason },
                }
            })
            .collect();
        let header = self.common.header("chat.completion");
        axum::Json(ChatCompletion { header, choices, usage }).into_response()
    }
}

/// Serialized for an SSE `data:` line. These bodies have string keys only,
/// so serializing cannot fail; if it ever did, the client gets an error
/// object in the stream rather than a dropped connection.
fn json_text(body: &impl Serialize) -> String {
    serde_json::to_string(body).unwrap_or_else(|e| {
        json!({"error": {"message": format!("cannot serialize a chunk: {e}"), "type": "server_error",
                         "param": null, "code": null}})
        .to_string()
    })
}

/// The legacy completions `logprobs` object; text offsets start at
/// `offset` (after an echoed prompt).
fn text_logprobs(vocab: &Vocab, lps: &[(Token, TokenLogprob)], offset: usize) -> TextLogprobs {
    let mut out = TextLogprobs::default();
    let mut at = offset;
    for (t, lp) in lps {
        let (text, _) = choices::token_text(vocab, *t);
        out.text_offset.push(at);
        at += text.len();
        out.tokens.push(text);
        out.token_logprobs.push(lp.logprob);
        out.top_logprobs.push(lp.top.iter().map(|&(t, l)| (choices::token_text(vocab, t).0, Value::from(l))).collect());
    }
    out
}

/// The chat `logprobs` object.
fn chat_logprobs(vocab: &Vocab, lps: &[(Token, TokenLogprob)]) -> ChatLogprobs {
    let entry = |t: Token, logprob: f32| {
        let (token, bytes) = choices::token_text(vocab, t);
        Logprob { token, logprob, bytes }
    };
    let content = lps
        .iter()
        .map(|(t, lp)| LogprobEntry {
            token: entry(*t, lp.logprob),
            top_logprobs: lp.top.iter().map(|&(t, l)| entry(t, l)).collect(),
        })
        .collect();
    ChatLogprobs { content }
}
