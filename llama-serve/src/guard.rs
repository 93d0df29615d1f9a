//! What stands before the handlers: the `Host` check of a loopback
//! server, the API key (compared in constant time) and the rate limit,
//! each refused in the shape of the API asked (Anthropic's on its routes).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::anthropic::AnthropicError;
use crate::error::ApiError;
use crate::state::AppState;

/// Equal length and equal bytes, in time that depends only on the length.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_by_value() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
    }
}
