//! The endpoints: `/v1/chat/completions` and `/v1/completions`
//! ([`completion`]), OpenAI's `/v1/responses` and
//! `/v1/responses/input_tokens` ([`responses`]), Anthropic's
//! `/v1/messages` and `/v1/messages/count_tokens` ([`messages`]),
//! `/v1/embeddings` ([`embeddings`]), `/v1/models`, `/health`, `/metrics`.
//! Each model endpoint starts the same way ([`open`]), reads its request
//! into the server's typed form ([`crate::request`]) and answers through
//! one loop in its API's dialect ([`crate::respond`]).

mod completion;
mod embeddings;
mod messages;
mod prompt;
mod responses;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::choices::MAX_CHOICES;
use crate::error::ApiError;
use crate::openai::{Health, ModelCard, ModelList};
use crate::state::{AppState, Lifecycle, Ready};
use crate::{body, guard};

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completion::completions))
        .route("/v1/chat/completions", post(completion::chat))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/responses/input_tokens", post(responses::input_tokens))
        .route("/v1/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such endpoint").code("not_found") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed for this endpoint")
        })
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard::guard))
        .with_state(state)
}

/// The model and engine, or the error a request gets while there are none.
/// A handler asks once and hands the result on (to the blocking pool's
/// preparation too), so one request sees one model.
fn ready(state: &AppState) -> Result<Arc<Ready>, ApiError> {
    match state.lifecycle() {
        Lifecycle::Ready(ready) => Ok(ready.clone()),
        Lifecycle::Loading => {
            Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the model is loading").code("loading").retry_after(1))
        }
        Lifecycle::Failed => {
            // The reason (a path, llama.cpp's message) is in the log: a
            // client, keyless on /health, learns only that it failed.
            Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the model failed to load (see the server's log)")
                .code("load_failed"))
        }
    }
}

async fn health(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    ready(&state)?;
    Ok(axum::Json(Health { status: "ok" }).into_response())
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    if let Some(r) = state.ready() {
        // Gauges the engine does not publish between steps.
        let stats = r.engine.stats();
        ::metrics::gauge!("llama_server_engine_steps").set(stats.steps as f64);
    }
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.prometheus.render()).into_response()
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    let card = ModelCard {
        id: state.config.model_name.clone(),
        object: "model",
        created: state.started,
        owned_by: "llama-rs",
    };
    axum::Json(ModelList { object: "list", data: vec![card] }).into_response()
}

/// What every model endpoint does first (the key and the rate were
/// checked by [`guard::guard`]): counts the request, reads its JSON body
/// within the size and time limits (`--body-limit`, `--body-timeout`),
/// and asks for the model once ([`ready`]). The handler takes the model
/// after its API's own checks of the body, so that a bad request is a 400
/// even while the model loads (a 503).
async fn open<T: serde::de::DeserializeOwned>(
    state: &AppState,
    endpoint: &'static str,
    request: axum::extract::Request,
) -> Result<(T, Result<Arc<Ready>, ApiError>), ApiError> {
    count(endpoint);
    let body = body::read_json(request, state.config.body_limit, state.config.body_timeout).await?;
    Ok((body, ready(state)))
}

fn count(endpoint: &'static str) {
    ::metrics::counter!("llama_server_requests_total", "endpoint" => endpoint).increment(1);
}

/// `n`, checked.
fn choice_count(n: Option<usize>) -> Result<usize, ApiError> {
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
        .map_err(|e| ApiError::internal(format!("request preparation failed: {e}")))?
}
