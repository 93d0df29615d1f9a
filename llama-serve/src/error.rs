//! Every API's error: a status, a message and what OpenAI's shape names
//! (`{"error": {"message", "type", "param", "code"}}`), which the server's
//! own endpoints and the OpenAI dialects answer with; Anthropic's
//! Messages wraps it in its own shape ([`crate::anthropic::AnthropicError`]).
//! The engine's errors map here ([`engine_error`]).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use llamacpp::Error;
use serde::Serialize;

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
    /// A 500 whose detail (a C++ exception's text, a path) goes to the
    /// server's log under a fresh id; the client gets the id and a generic
    /// message.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        eprintln!("server: internal error err-{pid:x}-{id}: {detail}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal server error (id err-{pid:x}-{id}; the server's log has the details)"),
        )
        .code("internal_error")
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
    /// The JSON body.
    pub fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        }
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

/// [`ApiError`]'s body.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    pub error: ErrorDetail<'a>,
}

#[derive(Debug, Serialize)]
pub struct ErrorDetail<'a> {
    pub message: &'a str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<&'a str>,
    pub code: Option<&'static str>,
}

/// The engine's error as an HTTP error.
pub fn engine_error(e: Error) -> ApiError {
    match e {
        Error::QueueFull { capacity } => {
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, format!("the server is busy ({capacity} requests waiting)"))
                .code("queue_full")
                .retry_after(1)
        }
        Error::EngineStopped(m) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("the engine has stopped: {m}"))
        }
        Error::InvalidToken { .. } => ApiError::bad_request(e.to_string()).param("prompt"),
        Error::Grammar(_) | Error::JsonSchema { .. } => ApiError::bad_request(e.to_string()).param("response_format"),
        Error::ChatTemplate(_) | Error::ChatTemplateRaised(_) | Error::ChatMarkup(_) => {
            ApiError::bad_request(e.to_string()).param("messages")
        }
        Error::InvalidParameter { name, .. } => ApiError::bad_request(e.to_string()).param(name),
        // A medium the projector refuses, an image that does not fit a
        // micro-batch, media where the server takes none.
        Error::Media(_) | Error::InvalidBatch(_) | Error::Unsupported(_) => {
            ApiError::bad_request(e.to_string()).param("messages")
        }
        Error::CannotSpeculate(_) => ApiError::bad_request(e.to_string()).param("speculative"),
        Error::InvalidArgument(_)
        | Error::EmptyPrompt
        | Error::PromptTooLong { .. }
        | Error::OutOfRange { .. }
        | Error::InputTooLarge { .. }
        | Error::Nul(_) => ApiError::bad_request(e.to_string()),
        e => ApiError::internal(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_that_cannot_speculate_is_a_bad_request_naming_the_field() {
        let e = engine_error(Error::CannotSpeculate("a recurrent or hybrid model's cache cannot drop its last tokens"));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("speculative"));
        assert!(e.message.contains("recurrent"), "{}", e.message);
    }
}
