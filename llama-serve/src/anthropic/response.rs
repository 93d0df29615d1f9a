//! Anthropic's Messages response, its stream events, and its error shape.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};

use crate::error::ApiError;

/// A content block of an answer.
#[derive(Debug, Serialize, Clone, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutBlock {
    Thinking { thinking: String, signature: String },
    Text { text: String },
    ToolUse { id: String, name: String, input: Value },
}

#[derive(Debug, Serialize, Clone, Copy, Default, PartialEq)]
pub struct MessageUsage {
    pub input_tokens: usize,
    pub output_tokens: usize,
}

/// The answer of `/v1/messages`.
#[derive(Debug, Serialize)]
pub struct MessageResponse {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<OutBlock>,
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    pub usage: MessageUsage,
}

/// Anthropic's `stop_reason` for how a choice ended: `tool_use` when it
/// made calls, `stop_sequence` at a stop sequence, `max_tokens` at the
/// limit (or the context's end), else `end_turn`.
pub fn stop_reason(finish: &'static str, stop_sequence: Option<&str>, called: bool) -> &'static str {
    match (finish, stop_sequence, called) {
        ("length", _, _) => "max_tokens",
        (_, _, true) => "tool_use",
        (_, Some(_), _) => "stop_sequence",
        _ => "end_turn",
    }
}

/// An [`ApiError`] in Anthropic's shape:
/// `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

/// Anthropic's error type for an HTTP status.
pub fn error_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        s if s.is_server_error() => "api_error",
        _ => "invalid_request_error",
    }
}

/// `{"type": "error", "error": {"type", "message"}}`: an error in
/// Anthropic's shape (a response's body, a stream's `error` event).
pub fn error_body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

impl AnthropicError {
    /// The JSON body.
    pub fn body(&self) -> Value {
        error_body(&self.0)
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        ::metrics::counter!("llama_server_errors_total", "status" => self.0.status.as_u16().to_string()).increment(1);
        let mut response = (self.0.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.0.retry_after {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, s.into());
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_have_anthropics_shape() {
        let e = AnthropicError(ApiError::bad_request("max_tokens: must be at least 1"));
        assert_eq!(
            e.body(),
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: must be at least 1"}})
        );
        assert_eq!(error_type(StatusCode::UNAUTHORIZED), "authentication_error");
        assert_eq!(error_type(StatusCode::SERVICE_UNAVAILABLE), "overloaded_error");
        assert_eq!(error_type(StatusCode::INTERNAL_SERVER_ERROR), "api_error");
    }

    #[test]
    fn stop_reasons() {
        assert_eq!(stop_reason("stop", None, false), "end_turn");
        assert_eq!(stop_reason("stop", Some("END"), false), "stop_sequence");
        assert_eq!(stop_reason("stop", None, true), "tool_use");
        assert_eq!(stop_reason("length", None, true), "max_tokens");
    }
}
