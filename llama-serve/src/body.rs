//! Reading a request's JSON body: only JSON, under a size limit and a
//! timeout, so a slow or huge body costs the server neither memory nor a
//! connection for long.

use std::time::Duration;

use axum::extract::Request;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Whether a `Content-Type` value names JSON: `application/json`, with or
/// without parameters (`; charset=utf-8`), any case.
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// Reads a JSON request body of at most `limit` bytes within `timeout`:
/// 415 unless the request says it is JSON (a web page can send a "simple"
/// cross-site request, `text/plain` or a form, to a server on the user's
/// loopback address without a CORS preflight; JSON needs one), 413 as soon
/// as its `Content-Length` announces more than the limit (before reading
/// any of it) or once more arrives, 408 when the whole body has not
/// arrived in time, 400 for bad JSON or a field of the wrong type.
pub async fn read_json<T: DeserializeOwned>(request: Request, limit: usize, timeout: Duration) -> Result<T, ApiError> {
    let headers = request.headers();
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    if !content_type.is_some_and(is_json) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("the request body must be JSON (Content-Type: application/json), not {content_type:?}"),
        )
        .code("unsupported_media_type"));
    }
    let announced = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit));
    }
    let body = tokio::time::timeout(timeout, axum::body::to_bytes(request.into_body(), limit));
    let bytes = body.await.map_err(|_| too_slow(timeout))?.map_err(|e| {
        // axum wraps http-body-util's LengthLimitError ("length limit exceeded").
        let too_large = format!("{e} {:?}", std::error::Error::source(&e)).contains("length limit");
        if too_large {
            self::too_large(limit)
        } else {
            ApiError::bad_request(format!("cannot read the request body: {e}"))
        }
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

fn too_slow(timeout: Duration) -> ApiError {
    ApiError::new(StatusCode::REQUEST_TIMEOUT, format!("the request body did not arrive within {timeout:?}"))
        .code("request_timeout")
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("the request body is over {limit} bytes"))
        .code("request_too_large")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_content_types_are_json() {
        for json in ["application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"] {
            assert!(is_json(json), "{json}");
        }
        for other in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""] {
            assert!(!is_json(other), "{other}");
        }
    }
}
