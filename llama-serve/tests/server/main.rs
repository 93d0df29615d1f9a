//! The `llama-serve` binary, started on an ephemeral loopback port with
//! the default model and driven over HTTP:
//! every endpoint, streamed and not, every error status, cancellation on
//! disconnect, graceful shutdown, and greedy outputs equal to the engine's.
//! One module per subject; the server and its helpers are here.

mod endpoints;
mod hostile;
mod loadgen;
#[cfg(feature = "mtmd")]
mod media;
mod messages;
mod model;
mod responses;
mod tools;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use llamacpp::engine::{Engine, EngineConfig, Request};
use llamacpp::{AddBos, Model, ModelParams};
use serde_json::{Value, json};

struct Server {
    child: Child,
    base: String,
    agent: ureq::Agent,
    _stdout: BufReader<ChildStdout>,
}

fn example(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join("examples").join(name);
    assert!(path.exists(), "{} is built by `cargo test`", path.display());
    path
}

/// Compute threads of every server (and in-process engine) a test starts.
/// libtest runs as many tests at once as there are cores, each with its own
/// server: with two threads each the cores are oversubscribed, and every
/// graph op's OpenMP barrier then waits on a descheduled thread. Measured on
/// 2 cores: the binary took 110 s with two threads per server, 74 s with the
/// tests one at a time; a CI machine ran one request past its 120 s timeout.
/// One thread per server has no barriers and never more threads than cores.
const THREADS: i32 = 1;

fn exe() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_llama-serve"))
}

fn model_path() -> std::path::PathBuf {
    llama_suite::model_cache::model_path().expect("the default model")
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .proxy(None)
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        // Well under the server's idle keep-alive limit (--header-timeout,
        // 1 s in some tests): a pooled connection the server is closing
        // would fail a POST, which is not retried.
        .max_idle_age(Duration::from_millis(500))
        .build()
        .into()
}

impl Server {
    /// Starts the server and waits for its `listening on` line (not for the model).
    fn spawn(args: &[&str]) -> Server {
        let mut command = Command::new(exe());
        command.args(["--port", "0", "--threads", &THREADS.to_string(), "--ctx", "4096", "--parallel", "4", "--model"]);
        command.arg(model_path()).args(args);
        Server::spawn_command(command)
    }

    /// Runs `command` (the binary with its arguments) and waits for its
    /// `listening on` line.
    fn spawn_command(mut command: Command) -> Server {
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let base =
            line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("first line {line:?}")).to_owned();
        assert!(base.starts_with("http://127.0.0.1:"), "{base}");
        Server { child, base, agent: agent(), _stdout: stdout }
    }

    /// Starts the server and waits until `/health` says ready.
    fn start(args: &[&str]) -> Server {
        Server::spawn(args).ready()
    }

    /// Waits until `/health` says ready.
    fn ready(self) -> Server {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.get("/health").0 != 200 {
            assert!(Instant::now() < deadline, "the server never became ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        self
    }

    fn get(&self, path: &str) -> (u16, Value) {
        let resp = self.agent.get(format!("{}{path}", self.base)).call().unwrap();
        read(resp)
    }

    fn post_with(&self, path: &str, body: String, key: Option<&str>) -> ureq::http::Response<ureq::Body> {
        let mut req = self.agent.post(format!("{}{path}", self.base)).header("Content-Type", "application/json");
        if let Some(key) = key {
            req = req.header("Authorization", format!("Bearer {key}"));
        }
        req.send(body).unwrap()
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        read(self.post_with(path, body.to_string(), None))
    }

    /// A streamed request's `data:` payloads, up to and including `[DONE]`.
    fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let resp = self.post_with(path, body.to_string(), None);
        assert_eq!(resp.status(), 200);
        let ct = resp.headers().get("content-type").unwrap().to_str().unwrap().to_owned();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        let reader = BufReader::new(resp.into_body().into_reader());
        let mut out = Vec::new();
        for line in reader.lines() {
            let line = line.unwrap();
            if let Some(data) = line.strip_prefix("data: ") {
                out.push(data.to_owned());
                if data == "[DONE]" {
                    break;
                }
            }
        }
        out
    }

    fn metrics(&self) -> String {
        let resp = self.agent.get(format!("{}/metrics", self.base)).call().unwrap();
        resp.into_body().read_to_string().unwrap()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read(resp: ureq::http::Response<ureq::Body>) -> (u16, Value) {
    let status = resp.status().as_u16();
    let text = resp.into_body().read_to_string().unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")))
}

/// A metric's value in Prometheus text (the first series of that name
/// whose labels contain `labels`).
fn metric(text: &str, name: &str, labels: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']) && l.contains(labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn assert_error(status: u16, body: &Value, want: u16) {
    assert_eq!(status, want, "{body}");
    let e = &body["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(e["type"].is_string(), "{body}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{body}");
}

/// A prompt over two 16-token blocks, so that a repeat shares cached cells.
const QUESTION: &str = "Name three colours that appear in a rainbow, and say which one of them has the longest wavelength of visible light.";
