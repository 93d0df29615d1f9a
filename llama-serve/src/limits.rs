//! What stands before the handlers: the API key (compared in constant
//! time), a token-bucket rate limit per key or client address, and
//! reading a JSON body under a size limit and a timeout.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use crate::anthropic::AnthropicError;
use crate::openai::ApiError;
use crate::state::AppState;

/// Equal length and equal bytes, in time that depends only on the length.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A token bucket per client: `rate` requests per second sustained, bursts
/// up to `burst`.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimiter {
    pub fn new(per_second: f64) -> Self {
        RateLimiter { rate: per_second, burst: per_second.max(1.0), buckets: Mutex::new(HashMap::new()) }
    }

    /// Takes a token for `client`, or says how many seconds until one is
    /// available.
    fn take(&self, client: &str) -> Result<(), u64> {
        self.take_at(client, Instant::now())
    }

    /// [`take`](Self::take) at the time `now` (tests pass a later instant
    /// instead of sleeping).
    fn take_at(&self, client: &str, now: Instant) -> Result<(), u64> {
        let mut buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() > 10_000 {
            // Forget full buckets: they hold nothing a new one would not.
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, (tokens, at)| *tokens + rate * now.duration_since(*at).as_secs_f64() < burst);
        }
        let (tokens, at) = buckets.entry(client.to_owned()).or_insert((self.burst, now));
        *tokens = (*tokens + self.rate * now.duration_since(*at).as_secs_f64()).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - *tokens) / self.rate).ceil().max(1.0) as u64)
        }
    }
}

/// Checks the API key (when one is set) and the rate limit (when set).
/// `/health` is open.
pub async fn guard(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    // Anthropic's routes answer in Anthropic's error shape.
    let anthropic = request.uri().path().starts_with("/v1/messages");
    let refuse = |e: ApiError| if anthropic { AnthropicError(e).into_response() } else { e.into_response() };
    if let Some(allowed) = &state.config.allowed_hosts
        && let Some(host) = request.headers().get(header::HOST)
    {
        let name = host.to_str().map(host_name).unwrap_or_default().to_ascii_lowercase();
        if !allowed.iter().any(|a| a.eq_ignore_ascii_case(&name)) {
            let message = format!(
                "the Host {name:?} is not one this server answers to (--allowed-hosts; a loopback server \
                 answers to localhost, 127.0.0.1 and [::1])"
            );
            return refuse(ApiError::new(StatusCode::FORBIDDEN, message).code("host_not_allowed"));
        }
    }
    if request.uri().path() == "/health" {
        return next.run(request).await;
    }
    // OpenAI's header, or Anthropic's.
    let headers = request.headers();
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim);
    if let Some(key) = &state.config.api_key {
        let ok = presented.is_some_and(|p| constant_time_eq(p.as_bytes(), key.0.as_bytes()));
        if !ok {
            let message = if presented.is_some() {
                "incorrect API key"
            } else {
                "missing API key (Authorization: Bearer … or x-api-key: …)"
            };
            return refuse(ApiError::new(StatusCode::UNAUTHORIZED, message).code("invalid_api_key"));
        }
    }
    if let Some(limiter) = &state.config.rate_limit {
        let client = match (presented, request.extensions().get::<ConnectInfo<SocketAddr>>()) {
            (Some(key), _) if state.config.api_key.is_some() => format!("key:{key}"),
            (_, Some(ConnectInfo(addr))) => format!("ip:{}", addr.ip()),
            _ => "unknown".to_owned(),
        };
        if let Err(wait) = limiter.take(&client) {
            return refuse(
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate limit exceeded")
                    .code("rate_limit_exceeded")
                    .retry_after(wait),
            );
        }
    }
    next.run(request).await
}

/// The name in a `Host` value: without the port, the brackets of an
/// IPv6 literal, or a trailing dot.
pub fn host_name(host: &str) -> &str {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => {
            host.rsplit_once(':').filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit())).map_or(host, |(n, _)| n)
        }
    };
    name.strip_suffix('.').unwrap_or(name)
}

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
    fn the_bucket_refills_at_its_rate() {
        let limiter = RateLimiter::new(2.0);
        let start = Instant::now();
        assert!(limiter.take_at("a", start).is_ok());
        assert!(limiter.take_at("a", start).is_ok());
        assert_eq!(limiter.take_at("a", start), Err(1));
        assert!(limiter.take_at("b", start).is_ok(), "buckets are per client");
        // 2 per second: one token back after 0.5 s, not before (0.4 s).
        assert_eq!(limiter.take_at("a", start + Duration::from_millis(400)), Err(1));
        assert!(limiter.take_at("a", start + Duration::from_millis(510)).is_ok());
        assert_eq!(limiter.take_at("a", start + Duration::from_millis(510)), Err(1));
        // A long pause refills up to the burst (2), no more.
        let later = start + Duration::from_secs(60);
        assert!(limiter.take_at("a", later).is_ok());
        assert!(limiter.take_at("a", later).is_ok());
        assert_eq!(limiter.take_at("a", later), Err(1));
    }

    #[test]
    fn only_json_content_types_are_json() {
        for json in ["application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"] {
            assert!(is_json(json), "{json}");
        }
        for other in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""] {
            assert!(!is_json(other), "{other}");
        }
    }

    #[test]
    fn keys_compare_by_value() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
    }
}
