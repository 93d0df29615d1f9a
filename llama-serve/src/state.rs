//! What the handlers share: the settings, and once the model has loaded,
//! the engine, the chat format and the embedder.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use llamacpp::engine::Engine;
use llamacpp::{ChatFormat, Model};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::embeddings::EmbeddingWorker;
use crate::rate::RateLimiter;

/// The API key: its `Debug` never shows it (settings and arguments are
/// printed in logs and panics).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(pub String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl std::str::FromStr for ApiKey {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(ApiKey(s.to_owned()))
    }
}

#[derive(Debug)]
pub struct Config {
    pub api_key: Option<ApiKey>,
    /// The `Host` names requests may use, lowercase, without ports
    /// (`None`: any).
    pub allowed_hosts: Option<Vec<String>>,
    pub rate_limit: Option<RateLimiter>,
    /// The name `/v1/models` lists and responses carry.
    pub model_name: String,
    /// `max_tokens` above this is clamped to it; the default of chat
    /// requests without `max_tokens`.
    pub max_tokens_cap: usize,
    pub body_limit: usize,
    /// A request body must arrive whole within this (408).
    pub body_timeout: std::time::Duration,
    /// Message content may hold control tokens (llama.cpp's behaviour), not
    /// only the template's markup (`--special-in-content`).
    pub special_in_content: bool,
    /// Most images and clips in one request (`--max-media`).
    pub max_media: usize,
    /// The most tokens of thought (`--reasoning-budget`; `None`: no limit).
    pub reasoning_budget: Option<usize>,
    /// Speculative decoding's settings for requests that ask for it (and
    /// every request with `--spec`).
    pub speculation: llamacpp::speculative::Speculation,
}

/// Set once the model has loaded and the engine runs.
#[derive(Debug)]
pub struct Ready {
    pub model: Arc<Model>,
    pub engine: Engine,
    /// The model's chat format: its template, the tool-call syntax and
    /// thought markers it teaches.
    pub chat: ChatFormat,
    pub embeddings: Option<EmbeddingWorker>,
}

/// Where the server is in its life, as handlers see it.
#[derive(Debug)]
pub enum Lifecycle<'a> {
    /// The model is loading: 503 with `Retry-After`.
    Loading,
    /// The model and its engine run.
    Ready(&'a Arc<Ready>),
    /// Loading failed: 500 (why is in the log, not told to clients).
    Failed,
}

pub struct AppState {
    pub config: Config,
    /// Set once, when loading ends: the model and engine, or why not.
    pub loaded: OnceLock<Result<Arc<Ready>, String>>,
    pub prometheus: PrometheusHandle,
    pub next_id: AtomicU64,
    pub started: u64,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("config", &self.config).field("lifecycle", &self.lifecycle()).finish()
    }
}

impl AppState {
    pub fn lifecycle(&self) -> Lifecycle<'_> {
        match self.loaded.get() {
            None => Lifecycle::Loading,
            Some(Ok(ready)) => Lifecycle::Ready(ready),
            Some(Err(_)) => Lifecycle::Failed,
        }
    }

    /// The model and engine once they run.
    pub fn ready(&self) -> Option<&Arc<Ready>> {
        match self.lifecycle() {
            Lifecycle::Ready(ready) => Some(ready),
            _ => None,
        }
    }

    /// `cmpl-…`/`chatcmpl-…` ids: unique in this process.
    pub fn id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.started)
    }
}

/// Seconds since the Unix epoch (`created`).
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
