//! The endpoints: `/v1/chat/completions`, `/v1/completions`,
//! `/v1/embeddings`, `/v1/models`, `/health`, `/metrics`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use futures::{Stream, StreamExt};
use llama::chat::RenderOptions;
use llama::engine::{Prompt, Request, TokenLogprob};
use llama::{AddBos, Special, Token, Vocab};
use serde_json::{Value, json};

use crate::content::{self, ContentError};
use crate::generation::{self, Choice, Delta, MAX_CHOICES};
use crate::limits::{self, read_json};
use crate::openai::{
    ApiError, ChatRequest, CompletionRequest, EmbeddingInput, EmbeddingRequest, PromptInput, ResponseFormat, Usage,
};
use crate::state::{AppState, Ready, now};

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/embeddings", post(embeddings))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such endpoint").code("not_found") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed for this endpoint")
        })
        .layer(axum::middleware::from_fn_with_state(state.clone(), limits::guard))
        .with_state(state)
}

fn ready(state: &AppState) -> Result<&Ready, ApiError> {
    if let Some(r) = state.ready.get() {
        return Ok(r);
    }
    if let Some(why) = state.failed.get() {
        return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("the model failed to load: {why}")));
    }
    Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the model is loading").code("loading").retry_after(1))
}

async fn health(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    ready(&state)?;
    Ok(axum::Json(json!({"status": "ok"})).into_response())
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    if let Some(r) = state.ready.get() {
        // Gauges the engine does not publish between steps.
        let stats = r.engine.stats();
        ::metrics::gauge!("llama_server_engine_steps").set(stats.steps as f64);
    }
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.prometheus.render()).into_response()
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({"object": "list", "data": [{
        "id": state.config.model_name, "object": "model", "created": state.started, "owned_by": "llama-rs",
    }]}))
    .into_response()
}

fn count(endpoint: &'static str) {
    ::metrics::counter!("llama_server_requests_total", "endpoint" => endpoint).increment(1);
}

/// `n`, checked.
fn choices(n: Option<usize>) -> Result<usize, ApiError> {
    match n.unwrap_or(1) {
        0 => Err(ApiError::bad_request("n must be at least 1").param("n")),
        n if n > MAX_CHOICES => Err(ApiError::bad_request(format!("n must be at most {MAX_CHOICES}")).param("n")),
        n => Ok(n),
    }
}

/// `max_tokens` clamped to the server's cap (documented in `docs/server.md`).
fn max_tokens(state: &AppState, asked: Option<usize>, default: usize) -> Result<usize, ApiError> {
    match asked {
        Some(0) => Err(ApiError::bad_request("max_tokens must be at least 1").param("max_tokens")),
        Some(n) => Ok(n.min(state.config.max_tokens_cap)),
        None => Ok(default.min(state.config.max_tokens_cap)),
    }
}

/// Request preparation (template rendering, schema conversion,
/// tokenizing, detokenizing echoes, compiling grammars at submit) runs on
/// the blocking pool: its cost grows with the request body, and on the
/// async runtime it would hold one of the threads that serve every other
/// client, `/health` included.
async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("request preparation failed: {e}")))?
}

async fn completions(
    State(state): State<Arc<AppState>>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    count("completions");
    let req: CompletionRequest = read_json(request, state.config.body_limit, state.config.body_timeout).await?;
    let ready = ready(&state)?;
    let vocab = ready.model.vocab();
    let n = choices(req.sampling.n)?;
    let max_tokens = max_tokens(&state, req.max_tokens, 16)?;
    let req = Arc::new(req);
    let (completions, echoes) = {
        let (ready, req) = (state.clone(), req.clone());
        off_runtime(move || {
            let ready = self::ready(&ready)?;
            let (prompts, echoes) = completion_prompts(ready.model.vocab(), &req, n)?;
            let stops = req.sampling.stop_list();
            let mut requests = Vec::with_capacity(prompts.len() * n);
            for prompt in &prompts {
                for j in 0..n {
                    let sampling =
                        generation::sampling_params(&req.sampling, ready.model.vocab(), req.logprobs, None, j)?;
                    requests.push(
                        Request::new(prompt.clone())
                            .max_tokens(max_tokens)
                            .stop(stops.clone())
                            .stop_at_eog(!req.sampling.ignore_eos)
                            .sampling(sampling),
                    );
                }
            }
            Ok((generation::submit_all(&ready.engine, requests)?, echoes))
        })
        .await?
    };
    let (id, created, model) = (state.id("cmpl"), now(), state.config.model_name.clone());
    if req.sampling.stream {
        let include_usage = req.sampling.stream_options.as_ref().is_some_and(|o| o.include_usage);
        let base = json!({"id": id, "object": "text_completion", "created": created, "model": model});
        let with = move |choices: Value| {
            let mut c = base.clone();
            c["choices"] = choices;
            c
        };
        // An echoed prompt is its choice's first chunk.
        let head: Vec<Value> = echoes
            .iter()
            .enumerate()
            .flat_map(|(p, echo)| (0..n).map(move |j| (p * n + j, echo)))
            .filter(|(_, e)| !e.is_empty())
            .map(|(i, echo)| with(json!([{"index": i, "text": echo, "logprobs": null, "finish_reason": null}])))
            .collect();
        let usage_head = with(json!([]));
        // The stream outlives this handler: it holds the model itself.
        let loaded = ready.model.clone();
        let chunks = generation::merged(completions).map(move |(i, delta)| {
            let vocab = loaded.vocab();
            match delta {
                Delta::Piece { text, logprob } => {
                    let logprobs = logprob.map(|lp| completion_logprobs(vocab, &[(lp.token, lp)], 0));
                    Chunk::Data(with(json!([{"index": i, "text": text, "logprobs": logprobs, "finish_reason": null}])))
                }
                Delta::Done(Ok(f)) => {
                    let reason = generation::finish_reason(&f.reason).unwrap_or("stop");
                    Chunk::Final(
                        i,
                        Usage::from(f.usage),
                        with(json!([{"index": i, "text": "", "logprobs": null, "finish_reason": reason}])),
                    )
                }
                Delta::Done(Err(e)) => Chunk::Error(e),
            }
        });
        return Ok(sse(head, chunks, include_usage.then_some(usage_head), n));
    }
    let choices = generation::collect(completions).await?;
    let usage = generation::combined_usage(choices.iter().map(|c| c.usage), n);
    let body = json!({
        "id": id, "object": "text_completion", "created": created, "model": model,
        "choices": choices.iter().enumerate().map(|(i, c)| {
            let echo = &echoes[i / n];
            json!({"index": i, "text": format!("{echo}{}", c.text), "finish_reason": c.finish_reason,
                   "logprobs": req.logprobs.map(|_| completion_logprobs(vocab, &c.logprobs, echo.len()))})
        }).collect::<Vec<_>>(),
        "usage": usage,
    });
    Ok(axum::Json(body).into_response())
}

/// A completion request's prompts, and each one's echo (empty without
/// `echo`).
fn completion_prompts(
    vocab: &Vocab,
    req: &CompletionRequest,
    n: usize,
) -> Result<(Vec<Prompt>, Vec<String>), ApiError> {
    let prompts: Vec<Prompt> = match &req.prompt {
        PromptInput::Text(t) => vec![text_prompt(t.clone())],
        PromptInput::Texts(ts) => ts.iter().cloned().map(text_prompt).collect(),
        PromptInput::Tokens(ids) => vec![Prompt::Tokens(ids.iter().copied().map(Token).collect())],
        PromptInput::TokenLists(lists) => {
            lists.iter().map(|ids| Prompt::Tokens(ids.iter().copied().map(Token).collect())).collect()
        }
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_request("prompt is empty").param("prompt"));
    }
    if prompts.len() * n > MAX_CHOICES {
        return Err(ApiError::bad_request(format!("prompts × n must be at most {MAX_CHOICES}")).param("n"));
    }
    let echoes: Vec<String> = if req.echo {
        prompts
            .iter()
            .map(|p| match p {
                Prompt::Text { text, .. } => Ok(text.clone()),
                Prompt::Tokens(t) => vocab.detokenize(t, AddBos::No, Special::Plain).map_err(generation::engine_error),
                _ => Ok(String::new()),
            })
            .collect::<Result<_, _>>()?
    } else {
        vec![String::new(); prompts.len()]
    };
    Ok((prompts, echoes))
}

fn text_prompt(text: String) -> Prompt {
    Prompt::Text { text, add_bos: AddBos::Yes, special: Special::Markup }
}

/// The legacy completions `logprobs` object.
fn completion_logprobs(vocab: &Vocab, lps: &[(Token, TokenLogprob)], offset: usize) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top = Vec::new();
    let mut offsets = Vec::new();
    let mut at = offset;
    for (t, lp) in lps {
        let (text, _) = generation::token_text(vocab, *t);
        offsets.push(at);
        at += text.len();
        tokens.push(text);
        token_logprobs.push(lp.logprob);
        let alternatives: serde_json::Map<String, Value> =
            lp.top.iter().map(|&(t, l)| (generation::token_text(vocab, t).0, json!(l))).collect();
        top.push(alternatives);
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}

/// The chat `logprobs.content` entries.
fn chat_logprobs(vocab: &Vocab, lps: &[(Token, TokenLogprob)]) -> Value {
    let entry = |t: Token, l: f32| {
        let (text, bytes) = generation::token_text(vocab, t);
        json!({"token": text, "logprob": l, "bytes": bytes})
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|(t, lp)| {
            let mut e = entry(*t, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
            e
        })
        .collect();
    json!({"content": content})
}

/// The roles a chat message may have (OpenAI's; `developer` is its newer
/// name for `system`, which templates receive as it is).
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// Refuses a message whose role is not one of [`ROLES`], or whose content
/// is missing or of the wrong type for its role: text or a list of parts
/// for every role, except that an assistant message that calls tools may
/// have none. Templates render whatever they are given, so an unknown role
/// ("wizard", markup in a role) would otherwise reach the prompt.
fn check_message(i: usize, m: &Value) -> Result<(), ApiError> {
    let bad = |why: String| Err(ApiError::bad_request(format!("messages[{i}]: {why}")).param("messages"));
    let Some(role) = m.get("role").and_then(Value::as_str) else {
        return bad("no role".to_owned());
    };
    if !ROLES.contains(&role) {
        return bad(format!("role {role:?} is not one of {}", ROLES.join(", ")));
    }
    match m.get("content") {
        Some(Value::String(_) | Value::Array(_)) => Ok(()),
        None | Some(Value::Null) if role == "assistant" && m.get("tool_calls").is_some_and(Value::is_array) => Ok(()),
        None | Some(Value::Null) => bad(format!("a {role} message needs content")),
        Some(other) => bad(format!("content must be a string or a list of parts, not {other}")),
    }
}

/// The chat request's prompt, grammar and logprob count.
fn chat_prompt(
    ready: &Ready,
    req: &ChatRequest,
    special_in_content: bool,
) -> Result<(Prompt, Option<String>), ApiError> {
    for (i, m) in req.messages.iter().enumerate() {
        check_message(i, m)?;
    }
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("messages is empty").param("messages"));
    }
    let mut options = RenderOptions::default().add_generation_prompt(true);
    if let Some(tools) = &req.tools {
        options = options.tools(Value::Array(tools.clone()));
    }
    for (k, v) in req.chat_template_kwargs.iter().flatten() {
        options = options.var(k.clone(), v.clone());
    }
    let grammar = match &req.response_format {
        None | Some(ResponseFormat::Text) => None,
        Some(ResponseFormat::JsonObject) => Some(llama::json_schema::json_grammar().to_owned()),
        Some(ResponseFormat::JsonSchema { json_schema }) => {
            let schema = json_schema.schema.clone().unwrap_or(json!({}));
            Some(
                llama::json_schema::schema_to_grammar(&schema)
                    .map_err(|e| ApiError::bad_request(e.to_string()).param("response_format"))?,
            )
        }
    };
    let vocab = ready.model.vocab();
    let invalid = |e: String| ApiError::bad_request(format!("invalid messages: {e}")).param("messages");
    // Content as plain text (crate::content), unless the operator asked
    // for llama.cpp's behaviour.
    if !special_in_content {
        match content::plain_content_tokens(&ready.chat, vocab, &req.messages, &options) {
            Ok(Some(tokens)) => return Ok((Prompt::Tokens(tokens), grammar)),
            Ok(None) => {}
            Err(ContentError::Llama(e)) => return Err(generation::engine_error(e)),
            Err(ContentError::Messages(e)) => return Err(invalid(e)),
            Err(ContentError::Mangled) => {
                return Err(ApiError::bad_request(
                    "a message holds the text of the model's control tokens, and this chat template changes \
                     message content, so it cannot be kept as plain text",
                )
                .param("messages"));
            }
        }
    }
    let messages: Vec<llama::ChatMessage> =
        serde_json::from_value(Value::Array(req.messages.clone())).map_err(|e| invalid(e.to_string()))?;
    let text = ready.chat.render(&messages, &options).map_err(generation::engine_error)?;
    // The template writes BOS itself when the model wants one.
    let bos = vocab.bos().and_then(|b| vocab.text(b).ok()).filter(|b| !b.is_empty());
    let add_bos = if bos.is_some_and(|b| text.starts_with(b)) { AddBos::No } else { AddBos::Yes };
    Ok((Prompt::Text { text, add_bos, special: Special::Markup }, grammar))
}

async fn chat(State(state): State<Arc<AppState>>, request: axum::extract::Request) -> Result<Response, ApiError> {
    count("chat");
    let req: ChatRequest = read_json(request, state.config.body_limit, state.config.body_timeout).await?;
    let ready = ready(&state)?;
    let n = choices(req.sampling.n)?;
    let max_tokens = max_tokens(&state, req.max_completion_tokens.or(req.max_tokens), state.config.max_tokens_cap)?;
    let top = match (req.logprobs, req.top_logprobs) {
        (true, top) => Some(top.unwrap_or(0)),
        (false, Some(_)) => {
            return Err(ApiError::bad_request("top_logprobs needs logprobs: true").param("top_logprobs"));
        }
        (false, None) => None,
    };
    let req = Arc::new(req);
    let completions = {
        let (ready, req) = (state.clone(), req.clone());
        off_runtime(move || {
            let special_in_content = ready.config.special_in_content;
            let ready = self::ready(&ready)?;
            let (prompt, grammar) = chat_prompt(ready, &req, special_in_content)?;
            let stops = req.sampling.stop_list();
            let requests = (0..n)
                .map(|j| {
                    let sampling =
                        generation::sampling_params(&req.sampling, ready.model.vocab(), top, grammar.as_deref(), j)?;
                    Ok(Request::new(prompt.clone())
                        .max_tokens(max_tokens)
                        .stop(stops.clone())
                        .stop_at_eog(!req.sampling.ignore_eos)
                        .sampling(sampling))
                })
                .collect::<Result<Vec<_>, ApiError>>()?;
            generation::submit_all(&ready.engine, requests)
        })
        .await?
    };
    let vocab = ready.model.vocab();
    let (id, created, model) = (state.id("chatcmpl"), now(), state.config.model_name.clone());
    if req.sampling.stream {
        let include_usage = req.sampling.stream_options.as_ref().is_some_and(|o| o.include_usage);
        let base = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model});
        let with = move |choices: Value| {
            let mut c = base.clone();
            c["choices"] = choices;
            if include_usage {
                c["usage"] = Value::Null;
            }
            c
        };
        let head: Vec<Value> = (0..n)
            .map(|i| with(json!([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}])))
            .collect();
        let loaded = ready.model.clone();
        let with2 = with.clone();
        let chunks = generation::merged(completions).map(move |(i, delta)| {
            let vocab = loaded.vocab();
            match delta {
                Delta::Piece { text, logprob } => {
                    let logprobs = logprob.map(|lp| chat_logprobs(vocab, &[(lp.token, lp)]));
                    Chunk::Data(with2(
                        json!([{"index": i, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": null}]),
                    ))
                }
                Delta::Done(Ok(f)) => {
                    let reason = generation::finish_reason(&f.reason).unwrap_or("stop");
                    Chunk::Final(
                        i,
                        Usage::from(f.usage),
                        with2(json!([{"index": i, "delta": {}, "logprobs": null, "finish_reason": reason}])),
                    )
                }
                Delta::Done(Err(e)) => Chunk::Error(e),
            }
        });
        let usage_head =
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": []});
        return Ok(sse(head, chunks, include_usage.then_some(usage_head), n));
    }
    let choices: Vec<Choice> = generation::collect(completions).await?;
    let usage = generation::combined_usage(choices.iter().map(|c| c.usage), n);
    let body = json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": choices.iter().enumerate().map(|(i, c)| json!({
            "index": i,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": top.map(|_| chat_logprobs(vocab, &c.logprobs)),
            "finish_reason": c.finish_reason,
        })).collect::<Vec<_>>(),
        "usage": usage,
    });
    Ok(axum::Json(body).into_response())
}

/// A streamed item: a chunk, a choice's last chunk with its usage, or a
/// failure (sent as an error event; the status is already 200).
enum Chunk {
    Data(Value),
    Final(usize, Usage, Value),
    Error(ApiError),
}

/// The SSE response: `head` chunks, the merged chunks, the usage chunk
/// (when asked for) once every choice ended, then `data: [DONE]`;
/// keep-alive comments while the stream is idle.
fn sse(
    head: Vec<Value>,
    chunks: impl Stream<Item = Chunk> + Send + 'static,
    usage_head: Option<Value>,
    n: usize,
) -> Response {
    let data = |v: &Value| Ok::<_, Infallible>(SseEvent::default().data(v.to_string()));
    let head = futures::stream::iter(head.iter().map(data).collect::<Vec<_>>());
    let usages = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(usize, Usage)>::new()));
    let collected = usages.clone();
    let body = chunks.map(move |chunk| match chunk {
        Chunk::Data(v) => data(&v),
        Chunk::Final(i, usage, v) => {
            collected.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((i, usage));
            data(&v)
        }
        Chunk::Error(e) => data(&e.body()),
    });
    let tail = futures::stream::once(async move {
        let mut all = usages.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        all.sort_by_key(|&(i, _)| i);
        usage_head.map(|mut u| {
            u["usage"] = serde_json::to_value(generation::combined_usage(all.into_iter().map(|(_, u)| u), n))
                .unwrap_or(Value::Null);
            data(&u)
        })
    })
    .filter_map(|x| async move { x });
    let done = futures::stream::once(async { Ok::<_, Infallible>(SseEvent::default().data("[DONE]")) });
    Sse::new(head.chain(body).chain(tail).chain(done)).keep_alive(KeepAlive::default()).into_response()
}

/// Texts per embeddings request, as OpenAI allows: the body limit alone
/// would let one request queue hundreds of thousands of short texts.
const MAX_EMBEDDING_INPUTS: usize = 2048;

async fn embeddings(State(state): State<Arc<AppState>>, request: axum::extract::Request) -> Result<Response, ApiError> {
    count("embeddings");
    let req: EmbeddingRequest = read_json(request, state.config.body_limit, state.config.body_timeout).await?;
    let ready = ready(&state)?;
    let Some(worker) = &ready.embeddings else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, "embeddings are off: start the server with --embeddings")
            .code("not_found"));
    };
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!("encoding_format {other:?}: expected float or base64"))
                .param("encoding_format"));
        }
    };
    let texts = match req.input {
        EmbeddingInput::One(t) => vec![t],
        EmbeddingInput::Many(v) => v,
    };
    if texts.is_empty() {
        return Err(ApiError::bad_request("input is empty").param("input"));
    }
    if texts.len() > MAX_EMBEDDING_INPUTS {
        return Err(ApiError::bad_request(format!(
            "input has {} texts; at most {MAX_EMBEDDING_INPUTS} per request",
            texts.len()
        ))
        .param("input"));
    }
    let (vectors, tokens) = worker.embed(texts).await.map_err(generation::engine_error)?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(axum::Json(json!({"object": "list", "data": data, "model": state.config.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}))
    .into_response())
}
