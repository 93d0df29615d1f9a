//! The llama-server backend: llama.cpp's own server, over loopback HTTP.
//!
//! Each request is a `POST /completion` with the prompt as token ids and
//! `"stream": true`; the answer is a server-sent-event stream of
//! `data: {json}` lines. In this llama.cpp (0c1e570) every generated token
//! gets a chunk of its own, `{"index","content","tokens":[id],"stop":false,
//! "id_slot","tokens_predicted","tokens_evaluated"}`, whether or not
//! `return_tokens` is set; the last chunk has `"stop": true`, empty
//! `content` and `tokens`, and the totals (`tokens_predicted`,
//! `tokens_cached`, `timings.cache_n`, `timings.prompt_n`, …). Errors come
//! as an HTTP status with a JSON body, or, once streaming, as
//! `data: {"error": {...}}`. Tokens are counted from the `tokens` arrays
//! (exact, one per token); a chunk without the field counts as one token if
//! it has content.
//!
//! [`ServerProcess`] starts llama-server itself (`--spawn`) and kills it
//! when dropped, on every path out of the driver; `main` also kills it on
//! Ctrl-C.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::backend::{Backend, Completion};

/// The pid of the llama-server this process started (0: none), for the
/// Ctrl-C handler.
pub static SPAWNED_PID: AtomicU32 = AtomicU32::new(0);

/// A client of one llama-server on 127.0.0.1.
#[derive(Debug)]
pub struct LlamaServer {
    base: String,
    agent: ureq::Agent,
    quick: ureq::Agent,
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        // Loopback only: never go through an HTTP_PROXY from the environment.
        .proxy(None)
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(5)))
        .timeout_global(Some(timeout))
        .build()
        .into()
}

impl LlamaServer {
    /// `url` must be `http://127.0.0.1:PORT`; `request_timeout` bounds each
    /// request from connect to the last byte of its stream.
    pub fn new(url: &str, request_timeout: Duration) -> Result<LlamaServer, String> {
        let base = url.trim_end_matches('/').to_owned();
        let port = base
            .strip_prefix("http://127.0.0.1:")
            .ok_or_else(|| format!("--url {url}: only http://127.0.0.1:PORT is supported"))?;
        port.parse::<u16>().map_err(|_| format!("--url {url}: `{port}` is not a port number"))?;
        Ok(LlamaServer { base, agent: agent(request_timeout), quick: agent(Duration::from_secs(3)) })
    }

    pub fn url(&self) -> &str {
        &self.base
    }

    /// `GET /health`: the HTTP status (200 once the model is loaded, 503
    /// while loading), or why there was none.
    pub fn health(&self) -> Result<u16, String> {
        let resp = self.quick.get(format!("{}/health", self.base)).call().map_err(|e| e.to_string())?;
        Ok(resp.status().as_u16())
    }

    /// `GET /props`, for the run's header (slot count, context size).
    pub fn props(&self) -> Option<Value> {
        let resp = self.quick.get(format!("{}/props", self.base)).call().ok()?;
        if resp.status() != 200 {
            return None;
        }
        let text = resp.into_body().read_to_string().ok()?;
        serde_json::from_str(&text).ok()
    }
}

impl Backend for LlamaServer {
    fn name(&self) -> &str {
        "llama-server"
    }

    fn run(&self, prompt: &[i32], n_predict: usize, on_token: &mut dyn FnMut(Instant)) -> Result<Completion, String> {
        let body = json!({
            "prompt": prompt,
            "n_predict": n_predict,
            "stream": true,
            "ignore_eos": true,
            "cache_prompt": true,
            // Greedy: top-k 1, then llama.cpp's final `dist` has one candidate.
            "samplers": ["top_k"],
            "top_k": 1,
            "temperature": 0.0,
            "return_tokens": true,
            // No SSE ping comments while a long prompt is evaluated.
            "sse_ping_interval": -1,
        });
        let resp = self
            .agent
            .post(format!("{}/completion", self.base))
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .map_err(|e| format!("POST {}/completion: {e}", self.base))?;
        let status = resp.status();
        if status != 200 {
            let mut text = String::new();
            let _ = resp.into_body().into_reader().take(4096).read_to_string(&mut text);
            return Err(format!("POST {}/completion: HTTP {status}: {}", self.base, text.trim()));
        }
        let reader = BufReader::new(resp.into_body().into_reader());
        let mut counted = 0usize;
        let mut completion = Completion::default();
        let mut stopped = false;
        for line in reader.lines() {
            let line = line.map_err(|e| format!("reading the stream after {counted} tokens: {e}"))?;
            let now = Instant::now();
            let Some(data) = line.strip_prefix("data:") else {
                continue; // blank separators, `: ping` comments, `event:` lines
            };
            let data = data.trim();
            if data == "[DONE]" {
                break;
            }
            let chunk: Value =
                serde_json::from_str(data).map_err(|e| format!("bad stream chunk ({e}): {}", clip(data)))?;
            if let Some(err) = chunk.get("error") {
                return Err(format!("llama-server error after {counted} tokens: {err}"));
            }
            let n = match chunk.get("tokens").and_then(Value::as_array) {
                Some(tokens) => tokens.len(),
                None => usize::from(chunk.get("content").and_then(Value::as_str).is_some_and(|c| !c.is_empty())),
            };
            for _ in 0..n {
                on_token(now);
            }
            counted += n;
            if chunk.get("stop").and_then(Value::as_bool) == Some(true) {
                completion.reported_tokens = chunk.get("tokens_predicted").and_then(Value::as_u64).map(|n| n as usize);
                completion.cached_prompt_tokens =
                    chunk.pointer("/timings/cache_n").and_then(Value::as_u64).map(|n| n as usize);
                stopped = true;
                break;
            }
        }
        if !stopped {
            return Err(format!("the stream ended after {counted} tokens without a final chunk"));
        }
        Ok(completion)
    }
}

fn clip(s: &str) -> String {
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// How to start llama-server.
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    pub bin: PathBuf,
    pub model: PathBuf,
    pub port: u16,
    pub threads: usize,
    pub ctx: usize,
    pub parallel: usize,
    pub batch: usize,
    pub ubatch: usize,
    /// Appended to the command line as they are.
    pub extra_args: Vec<String>,
    /// llama-server's stdout and stderr go here.
    pub log: PathBuf,
    pub startup_timeout: Duration,
}

/// A llama-server started by this process; killed (and reaped) on drop.
#[derive(Debug)]
pub struct ServerProcess {
    child: Option<Child>,
    log: PathBuf,
}

impl ServerProcess {
    /// Starts llama-server and waits (at most `startup_timeout`) until
    /// `GET /health` answers 200.
    pub fn spawn(o: &SpawnOptions, client: &LlamaServer) -> Result<ServerProcess, String> {
        if !o.bin.is_file() {
            return Err(format!(
                "{} does not exist; build it first with scripts/build-llama-server.sh (or pass --server-bin)",
                o.bin.display()
            ));
        }
        // Refuse a port that something already listens on: the driver
        // would otherwise measure that other server.
        TcpListener::bind(("127.0.0.1", o.port))
            .map_err(|e| format!("127.0.0.1:{} is not free ({e}); pick another --port", o.port))?;
        if let Some(dir) = o.log.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let log = File::create(&o.log).map_err(|e| format!("cannot create {}: {e}", o.log.display()))?;
        let log_err = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&o.bin);
        cmd.arg("-m").arg(&o.model);
        cmd.args(["-t", &o.threads.to_string()]);
        cmd.args(["-c", &o.ctx.to_string()]);
        cmd.args(["-np", &o.parallel.to_string()]);
        cmd.arg("-kvu");
        cmd.args(["-b", &o.batch.to_string(), "-ub", &o.ubatch.to_string()]);
        cmd.args(["--port", &o.port.to_string(), "--host", "127.0.0.1"]);
        cmd.args(&o.extra_args);
        cmd.stdin(Stdio::null()).stdout(log).stderr(log_err);
        eprintln!("serve_bench: starting {:?} (log: {})", cmd, o.log.display());
        let child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", o.bin.display()))?;
        SPAWNED_PID.store(child.id(), Ordering::SeqCst);
        let mut server = ServerProcess { child: Some(child), log: o.log.clone() };
        server.wait_healthy(client, o.startup_timeout)?;
        Ok(server)
    }

    fn wait_healthy(&mut self, client: &LlamaServer, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        let mut last = String::from("no answer yet");
        while start.elapsed() < timeout {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                SPAWNED_PID.store(0, Ordering::SeqCst);
                return Err(format!("llama-server exited ({status}) before it was ready; {}", log_tail(&self.log)));
            }
            match client.health() {
                Ok(200) => {
                    eprintln!("serve_bench: llama-server ready after {:.1} s", start.elapsed().as_secs_f64());
                    return Ok(());
                }
                Ok(code) => last = format!("GET /health answered {code}"),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(format!("llama-server was not ready within {} s ({last}); {}", timeout.as_secs(), log_tail(&self.log)))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            SPAWNED_PID.store(0, Ordering::SeqCst);
        }
    }
}

/// The last lines of llama-server's log, for error messages.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(8)..].join("\n  ");
    format!("the end of {}:\n  {tail}", path.display())
}
