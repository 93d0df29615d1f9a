//! `/v1/completions` and `/v1/chat/completions`: each endpoint turns its
//! request into engine requests (on the blocking pool, see
//! [`off_runtime`]), then one core ([`respond`]) answers with the choices,
//! whole or streamed, in the endpoint's shape.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use llamacpp::chat::{ChatEvent, ChatParser, ReplyReader, Tools};
use llamacpp::engine::{Completion, Request, TokenLogprob};
use llamacpp::{Model, Token, Vocab};
use serde::Serialize;
use serde_json::{Value, json};

use super::prompt::{chat_prompt, completion_prompts};
use super::{choice_count, max_tokens, off_runtime, open, ready};
use crate::choices::{self, Choice, Delta};
use crate::error::{ApiError, engine_error};
use crate::openai::{
    AssistantMessage, ChatChoice, ChatChunk, ChatChunkChoice, ChatCompletion, ChatDelta, ChatLogprobs, ChatRequest,
    CompletionRequest, FunctionCall, FunctionDelta, Header, Logprob, LogprobEntry, TextChoice, TextCompletion,
    TextLogprobs, ToolCall, ToolCallDelta, Usage,
};
use crate::state::{AppState, Ready, now};

pub async fn completions(
    State(state): State<Arc<AppState>>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = open(&state, "completions", request).await?;
    let ready = ready(&state)?;
    let n = choice_count(req.sampling.n)?;
    let max_tokens = max_tokens(&state, req.max_tokens, 16)?;
    let answer = Answer::asked_by(&req.sampling, n);
    let logprobs = req.logprobs.is_some();
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
    respond(&state, &ready, completions, Kind::Text { echoes, logprobs }, answer).await
}

pub async fn chat(State(state): State<Arc<AppState>>, request: axum::extract::Request) -> Result<Response, ApiError> {
    let req: ChatRequest = open(&state, "chat", request).await?;
    let ready = ready(&state)?;
    let n = choice_count(req.sampling.n)?;
    let top = match (req.logprobs, req.top_logprobs) {
        (true, top) => Some(top.unwrap_or(0)),
        (false, Some(_)) => {
            return Err(ApiError::bad_request("top_logprobs needs logprobs: true").param("top_logprobs"));
        }
        (false, None) => None,
    };
    let answer = Answer::asked_by(&req.sampling, n);
    let chat = submit_chat(&state, &ready, req, n, top).await?;
    respond(&state, &ready, chat.completions, Kind::Chat { logprobs: top.is_some(), parser: chat.parser }, answer).await
}

/// The prompt's length in tokens of a chat request, as [`submit_chat`]
/// would render it (`count_tokens`, `input_tokens`).
pub(super) async fn count_chat_prompt(
    state: &Arc<AppState>,
    ready: &Arc<Ready>,
    req: ChatRequest,
) -> Result<usize, ApiError> {
    let tools = Tools::from_openai(req.tools.as_deref(), req.tool_choice.as_ref(), req.parallel_tool_calls)
        .map_err(engine_error)?;
    let (state, ready) = (state.clone(), ready.clone());
    off_runtime(move || Ok(chat_prompt(&ready, &state.config, &req, tools)?.prompt_tokens)).await
}

/// A chat request in the engine: its choices, the reader of each one's
/// output, and the prompt's length.
pub(super) struct SubmittedChat {
    pub completions: Vec<Completion>,
    pub parser: ChatParser,
    pub prompt_tokens: usize,
}

/// The one path of every chat endpoint (Chat Completions, and Messages
/// through its translation): tools, the prompt through the template with
/// its constraints, `n` engine requests (`top` logprobs each).
pub(super) async fn submit_chat(
    state: &Arc<AppState>,
    ready: &Arc<Ready>,
    req: ChatRequest,
    n: usize,
    top: Option<usize>,
) -> Result<SubmittedChat, ApiError> {
    let max_tokens = max_tokens(state, req.max_completion_tokens.or(req.max_tokens), state.config.max_tokens_cap)?;
    let tools = Tools::from_openai(req.tools.as_deref(), req.tool_choice.as_ref(), req.parallel_tool_calls)
        .map_err(engine_error)?;
    if tools.as_ref().is_some_and(Tools::forced) && req.response_format.is_some() {
        return Err(ApiError::bad_request("tool_choice that requires a call cannot be combined with response_format")
            .param("tool_choice"));
    }
    let (state, ready) = (state.clone(), ready.clone());
    off_runtime(move || {
        let setup = chat_prompt(&ready, &state.config, &req, tools)?;
        let stops = req.sampling.stop_list();
        let requests = (0..n)
            .map(|j| {
                let sampling = choices::sampling_params(
                    &req.sampling,
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
                    .stop_at_eog(!req.sampling.ignore_eos)
                    .sampling(sampling);
                Ok(choices::with_speculation(request, &req.sampling, state.config.speculation))
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

/// Which endpoint answers, and what its answer needs besides the
/// engine's output.
enum Kind {
    /// `/v1/completions`: each prompt's echo (empty without `echo`), and
    /// whether `logprobs` was asked for.
    Text { echoes: Vec<String>, logprobs: bool },
    /// `/v1/chat/completions`, with or without `logprobs`, and the reader
    /// of each choice's output (thoughts, text, tool calls).
    Chat { logprobs: bool, parser: ChatParser },
}

/// How the client wants its choices.
#[derive(Clone, Copy)]
struct Answer {
    /// Choices per prompt.
    n: usize,
    stream: bool,
    include_usage: bool,
}

impl Answer {
    fn asked_by(sampling: &crate::openai::Sampling, n: usize) -> Answer {
        let include_usage = sampling.stream_options.as_ref().is_some_and(|o| o.include_usage);
        Answer { n, stream: sampling.stream, include_usage }
    }
}

/// The core both endpoints share: the submitted choices as one response,
/// or as a stream of chunks.
async fn respond(
    state: &Arc<AppState>,
    ready: &Ready,
    completions: Vec<Completion>,
    kind: Kind,
    answer: Answer,
) -> Result<Response, ApiError> {
    let prefix = match kind {
        Kind::Text { .. } => "cmpl",
        Kind::Chat { .. } => "chatcmpl",
    };
    let header = Header { id: state.id(prefix), object: "", created: now(), model: state.config.model_name.clone() };
    if answer.stream {
        let frames = Frames { header, kind, answer, model: ready.model.clone() };
        return Ok(sse(frames, completions));
    }
    let choices: Vec<Choice> = choices::collect(completions).await?;
    let usage = choices::combined_usage(choices.iter().map(|c| c.usage), answer.n);
    let vocab = ready.model.vocab();
    Ok(match kind {
        Kind::Text { echoes, logprobs } => {
            let choices = choices
                .iter()
                .enumerate()
                .map(|(index, c)| {
                    let echo = &echoes[index / answer.n];
                    TextChoice {
                        index,
                        text: format!("{echo}{}", c.text),
                        logprobs: logprobs.then(|| text_logprobs(vocab, &c.logprobs, echo.len())),
                        finish_reason: Some(c.finish_reason),
                    }
                })
                .collect();
            let header = Header { object: "text_completion", ..header };
            axum::Json(TextCompletion { header, choices, usage: Some(Some(usage)) }).into_response()
        }
        Kind::Chat { logprobs, parser } => {
            let choices = choices
                .iter()
                .enumerate()
                .map(|(index, c)| {
                    let reply = c.reply(parser.clone());
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
                        logprobs: logprobs.then(|| chat_logprobs(vocab, &c.logprobs)),
                        finish_reason: if reply.called_tools() { "tool_calls" } else { c.finish_reason },
                    }
                })
                .collect();
            let header = Header { object: "chat.completion", ..header };
            axum::Json(ChatCompletion { header, choices, usage }).into_response()
        }
    })
}

/// A stream's chunks in the endpoint's shape.
struct Frames {
    header: Header,
    kind: Kind,
    answer: Answer,
    /// The stream outlives the handler: it holds the model itself.
    model: Arc<Model>,
}

impl Frames {
    /// `null` in every chunk when the client asked for a usage chunk.
    fn usage(&self) -> Option<Option<Usage>> {
        self.answer.include_usage.then_some(None)
    }

    fn text(&self, choices: Vec<TextChoice>, usage: Option<Option<Usage>>) -> String {
        json_text(&TextCompletion {
            header: Header { object: "text_completion", ..self.header.clone() },
            choices,
            usage,
        })
    }

    fn chat(&self, choices: Vec<ChatChunkChoice>, usage: Option<Option<Usage>>) -> String {
        json_text(&ChatChunk {
            header: Header { object: "chat.completion.chunk", ..self.header.clone() },
            choices,
            usage,
        })
    }

    /// What comes before the engine's output: an echoed prompt is its
    /// choices' first chunk; a chat choice opens with the assistant role.
    fn head(&self) -> Vec<String> {
        let n = self.answer.n;
        match &self.kind {
            Kind::Text { echoes, .. } => echoes
                .iter()
                .enumerate()
                .flat_map(|(p, echo)| (0..n).map(move |j| (p * n + j, echo)))
                .filter(|(_, echo)| !echo.is_empty())
                .map(|(index, echo)| {
                    let choice = TextChoice { index, text: echo.clone(), logprobs: None, finish_reason: None };
                    self.text(vec![choice], self.usage())
                })
                .collect(),
            Kind::Chat { .. } => (0..n)
                .map(|index| {
                    let delta = ChatDelta {
                        role: Some("assistant"),
                        content: Some(String::new()),
                        reasoning_content: None,
                        tool_calls: None,
                    };
                    self.chat(vec![ChatChunkChoice { index, delta, logprobs: None, finish_reason: None }], self.usage())
                })
                .collect(),
        }
    }

    /// Choice `index`'s next piece of text.
    fn piece(&self, index: usize, text: String, logprob: Option<TokenLogprob>) -> String {
        let vocab = self.model.vocab();
        match &self.kind {
            Kind::Text { .. } => {
                let logprobs = logprob.map(|lp| text_logprobs(vocab, &[(lp.token, lp)], 0));
                self.text(vec![TextChoice { index, text, logprobs, finish_reason: None }], self.usage())
            }
            Kind::Chat { .. } => {
                let logprobs = logprob.map(|lp| chat_logprobs(vocab, &[(lp.token, lp)]));
                let delta = ChatDelta { role: None, content: Some(text), reasoning_content: None, tool_calls: None };
                self.chat(vec![ChatChunkChoice { index, delta, logprobs, finish_reason: None }], self.usage())
            }
        }
    }

    /// Chunks for what choice `index`'s reader released: thoughts as
    /// reasoning content, text as content, each call as its id and name,
    /// then its arguments (calls numbered from `calls`, the count before
    /// these events). A token's logprob rides on the first chunk (or on an
    /// empty one).
    fn read(
        &self,
        index: usize,
        events: Vec<ChatEvent>,
        mut calls: usize,
        logprob: Option<TokenLogprob>,
    ) -> Vec<String> {
        let vocab = self.model.vocab();
        let mut logprobs = logprob.map(|lp| chat_logprobs(vocab, &[(lp.token, lp)]));
        let with_logprob = logprobs.is_some();
        let mut chunk = |delta: ChatDelta| {
            let choice = ChatChunkChoice { index, delta, logprobs: logprobs.take(), finish_reason: None };
            self.chat(vec![choice], self.usage())
        };
        let mut chunks = Vec::new();
        for event in events {
            match event {
                ChatEvent::Text(text) => chunks.push(chunk(ChatDelta { content: Some(text), ..ChatDelta::default() })),
                ChatEvent::Reasoning(text) => {
                    chunks.push(chunk(ChatDelta { reasoning_content: Some(text), ..ChatDelta::default() }));
                }
                ChatEvent::ToolCall(call) => {
                    let opening = ToolCallDelta {
                        index: calls,
                        id: call.id,
                        kind: Some("function"),
                        function: FunctionDelta { name: Some(call.function.name), arguments: String::new() },
                    };
                    let arguments = ToolCallDelta {
                        index: calls,
                        id: None,
                        kind: None,
                        function: FunctionDelta { name: None, arguments: call.function.arguments.to_string() },
                    };
                    calls += 1;
                    for delta in [opening, arguments] {
                        chunks.push(chunk(ChatDelta { tool_calls: Some(vec![delta]), ..ChatDelta::default() }));
                    }
                }
                // The end is the choice's last chunk (`done`).
                _ => {}
            }
        }
        if chunks.is_empty() && with_logprob {
            chunks.push(chunk(ChatDelta { content: Some(String::new()), ..ChatDelta::default() }));
        }
        chunks
    }

    /// Choice `index`'s last chunk.
    fn done(&self, index: usize, reason: &'static str) -> String {
        match &self.kind {
            Kind::Text { .. } => {
                let choice = TextChoice { index, text: String::new(), logprobs: None, finish_reason: Some(reason) };
                self.text(vec![choice], self.usage())
            }
            Kind::Chat { .. } => {
                let choice =
                    ChatChunkChoice { index, delta: ChatDelta::default(), logprobs: None, finish_reason: Some(reason) };
                self.chat(vec![choice], self.usage())
            }
        }
    }

    /// The usage chunk (no choices) after every choice ended.
    fn total(&self, usage: Usage) -> String {
        match &self.kind {
            Kind::Text { .. } => self.text(Vec::new(), Some(Some(usage))),
            Kind::Chat { .. } => self.chat(Vec::new(), Some(Some(usage))),
        }
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

/// The SSE response: the head chunks, a chunk per piece and a last one
/// per choice as they arrive, the usage chunk (when asked for) once every
/// choice ended, then `data: [DONE]`; keep-alive comments while idle. A
/// failure after the 200 is an error object in the stream.
fn sse(frames: Frames, completions: Vec<Completion>) -> Response {
    let data = |text: String| Ok::<_, Infallible>(SseEvent::default().data(text));
    let frames = Arc::new(frames);
    let head = futures::stream::iter(frames.head().into_iter().map(data).collect::<Vec<_>>());
    let usages = Arc::new(Mutex::new(Vec::<(usize, Usage)>::new()));
    // Each choice's reader.
    let mut readers: Vec<Option<ReplyReader>> = (0..completions.len())
        .map(|_| match &frames.kind {
            Kind::Chat { parser, .. } => Some(ReplyReader::new(parser.clone())),
            Kind::Text { .. } => None,
        })
        .collect();
    let body = choices::merged(completions).flat_map({
        let (frames, usages) = (frames.clone(), usages.clone());
        move |(index, delta)| {
            let reader = readers.get_mut(index).and_then(Option::as_mut);
            let chunks = match (delta, reader) {
                (Delta::Piece { text, logprob }, None) => vec![frames.piece(index, text, logprob)],
                (Delta::Piece { text, logprob }, Some(reader)) => {
                    let calls = reader.reply().tool_calls().len();
                    frames.read(index, reader.push(&text), calls, logprob)
                }
                (Delta::Done(Ok(finish)), reader) => {
                    usages.lock().unwrap_or_else(PoisonError::into_inner).push((index, Usage::from(finish.usage)));
                    let reason = choices::finish_reason(&finish.reason).unwrap_or("stop");
                    let mut chunks = Vec::new();
                    let mut called = false;
                    if let Some(reader) = reader {
                        let calls = reader.reply().tool_calls().len();
                        chunks = frames.read(index, reader.finish(finish.reason.clone(), finish.usage), calls, None);
                        called = reader.reply().called_tools();
                    }
                    chunks.push(frames.done(index, if called { "tool_calls" } else { reason }));
                    chunks
                }
                (Delta::Done(Err(e)), _) => vec![json_text(&e.body())],
            };
            futures::stream::iter(chunks.into_iter().map(data).collect::<Vec<_>>())
        }
    });
    let tail = futures::stream::once(async move {
        frames.answer.include_usage.then(|| {
            let mut all = usages.lock().unwrap_or_else(PoisonError::into_inner).clone();
            all.sort_by_key(|&(index, _)| index);
            data(frames.total(choices::combined_usage(all.into_iter().map(|(_, u)| u), frames.answer.n)))
        })
    })
    .filter_map(|chunk| async move { chunk });
    let done = futures::stream::once(async move { data("[DONE]".to_owned()) });
    Sse::new(head.chain(body).chain(tail).chain(done)).keep_alive(KeepAlive::default()).into_response()
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
