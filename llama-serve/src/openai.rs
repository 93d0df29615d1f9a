//! The OpenAI request and response bodies this server speaks, and its
//! error shape. Unknown request fields are ignored; a field of the wrong
//! type is a 400.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `{"error": {"message", "type", "param", "code"}}` with its HTTP status.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds, for 429 and 503 (`Retry-After`).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        let kind = match status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        ApiError { status, message: message.into(), kind, param: None, code: None, retry_after: None }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn param(mut self, param: &str) -> Self {
        self.param = Some(param.to_owned());
        self
    }
    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }
    pub fn body(&self) -> Value {
        serde_json::json!({"error": {
            "message": self.message, "type": self.kind, "param": self.param, "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        ::metrics::counter!("llama_server_errors_total", "status" => self.status.as_u16().to_string()).increment(1);
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, s.into());
        }
        response
    }
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize, Default)]
#[serde(untagged)]
pub enum Stop {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling fields both endpoints share, OpenAI's and the extras
/// llama.cpp's server accepts (`top_k`, `min_p`, `repeat_penalty`,
/// `grammar`, `ignore_eos`).
#[derive(Debug, Deserialize, Default)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub seed: Option<u32>,
    /// Token id (as a string key) → bias in [-100, 100].
    pub logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    pub grammar: Option<String>,
    /// Keep generating past end-of-generation tokens (to `max_tokens`):
    /// load tests use it to get the same output length from every server.
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub stop: Stop,
    pub n: Option<usize>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
}

impl Sampling {
    /// `stop`, as a list (taken out of the request).
    pub fn stop_list(&self) -> Vec<String> {
        match &self.stop {
            Stop::None => Vec::new(),
            Stop::One(s) => vec![s.clone()],
            Stop::Many(v) => v.clone(),
        }
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptInput,
    pub max_tokens: Option<usize>,
    /// The number of top alternatives per token (0–20).
    pub logprobs: Option<usize>,
    #[serde(default)]
    pub echo: bool,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// A completion prompt: text, texts, token ids, or lists of token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i32>),
    TokenLists(Vec<Vec<i32>>),
}

/// `response_format`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Debug, Deserialize)]
pub struct JsonSchemaFormat {
    #[serde(default)]
    pub schema: Option<Value>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// Passed to the chat template as written (after a shape check).
    pub messages: Vec<Value>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<usize>,
    pub response_format: Option<ResponseFormat>,
    pub tools: Option<Vec<Value>>,
    /// Extra template variables (llama.cpp's server extension), e.g.
    /// `{"enable_thinking": false}`.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// `POST /v1/embeddings`.
#[derive(Debug, Deserialize)]
pub struct EmbeddingRequest {
    pub input: EmbeddingInput,
    #[serde(default)]
    pub encoding_format: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Serialize, Clone, Copy, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Serialize, Clone, Copy, Default)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, o: Usage) {
        self.prompt_tokens += o.prompt_tokens;
        self.completion_tokens += o.completion_tokens;
        self.total_tokens += o.total_tokens;
        self.prompt_tokens_details.cached_tokens += o.prompt_tokens_details.cached_tokens;
    }
}

impl From<llama::engine::Usage> for Usage {
    fn from(u: llama::engine::Usage) -> Self {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: u.cached_tokens },
        }
    }
}
