//! `POST /v1/embeddings` (with `--embeddings`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;

use super::open;
use crate::error::{ApiError, engine_error};
use crate::openai::{EmbeddingData, EmbeddingInput, EmbeddingList, EmbeddingRequest, EmbeddingUsage, EmbeddingVector};
use crate::state::AppState;

/// Texts per embeddings request, as OpenAI allows: the body limit alone
/// would let one request queue hundreds of thousands of short texts.
const MAX_EMBEDDING_INPUTS: usize = 2048;

pub async fn embeddings(
    State(state): State<Arc<AppState>>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let (req, ready): (EmbeddingRequest, _) = open(&state, "embeddings", request).await?;
    let ready = ready?;
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
    let (vectors, tokens) = worker.embed(texts).await.map_err(engine_error)?;
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                EmbeddingVector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                EmbeddingVector::Float(v)
            };
            EmbeddingData { object: "embedding", index, embedding }
        })
        .collect();
    let usage = EmbeddingUsage { prompt_tokens: tokens, total_tokens: tokens };
    Ok(axum::Json(EmbeddingList { object: "list", data, model: state.config.model_name.clone(), usage })
        .into_response())
}
