//! One streamed `POST /v1/completions`, timed chunk by chunk and checked
//! for completeness.
//!
//! The request is OpenAI's, plus `ignore_eos` (llama.cpp's server and ours
//! accept it) so that every request generates exactly `max_tokens` tokens
//! and two servers do the same work: token-id prompt, `temperature: 0`,
//! `stream: true`, `stream_options.include_usage`.
//!
//! A response is *complete* when it is HTTP 200, every `data:` line is a
//! JSON chunk without an `error`, exactly one chunk carries the choice's
//! `finish_reason` and no text comes after it, the stream ends with one
//! `data: [DONE]` and nothing after it, and the usage (where the server
//! reports it) counts `max_tokens` completion tokens and at least as many
//! tokens as text chunks arrived (a duplicated chunk would break that).

use std::io::{BufRead, BufReader, Read};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A client of one OpenAI-compatible server on 127.0.0.1.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
    api_key: Option<String>,
}

/// One request to send.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Names the request's group in the report (`req`, `long`, `short`).
    pub group: &'static str,
    pub prompt: Vec<i32>,
    pub max_tokens: usize,
}

/// What happened to one request.
#[derive(Debug, Clone)]
pub struct Record {
    pub group: &'static str,
    pub send: Instant,
    /// When each chunk with non-empty text arrived.
    pub chunks: Vec<Instant>,
    /// When the last byte arrived (or the request failed).
    pub end: Instant,
    /// Completion tokens as the usage reports them.
    pub completion_tokens: Option<usize>,
    /// Prompt tokens the server took from its cache (`usage.prompt_tokens_details.cached_tokens`,
    /// or llama.cpp's `timings.cache_n`).
    pub cached_tokens: Option<usize>,
    /// A transport, HTTP or server error.
    pub error: Option<String>,
    /// A broken completeness rule (see the module docs).
    pub incomplete: Option<String>,
}

impl Record {
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.incomplete.is_none()
    }
    pub fn ttft(&self) -> Option<Duration> {
        self.chunks.first().map(|t| t.saturating_duration_since(self.send))
    }
    /// The output tokens of a complete request (usage, else text chunks).
    pub fn tokens(&self) -> usize {
        if self.ok() { self.completion_tokens.unwrap_or(self.chunks.len()) } else { 0 }
    }
}

impl Client {
    /// `url` must be `http://127.0.0.1:PORT` (this tool never leaves the machine).
    pub fn new(url: &str, api_key: Option<String>, timeout: Duration) -> Result<Client, String> {
        let base = url.trim_end_matches('/').trim_end_matches("/v1").to_owned();
        let port = base
            .strip_prefix("http://127.0.0.1:")
            .ok_or_else(|| format!("--url {url}: only http://127.0.0.1:PORT is supported"))?;
        port.parse::<u16>().map_err(|_| format!("--url {url}: `{port}` is not a port number"))?;
        let agent = ureq::Agent::config_builder()
            // Loopback only: never through an HTTP_PROXY from the environment.
            .proxy(None)
            // A fresh connection per request: reusing a kept-alive one races
            // with a server that closes idle connections (llama-server does),
            // which would count as an error of the server under test.
            .max_idle_connections(0)
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(5)))
            .timeout_global(Some(timeout))
            .build()
            .into();
        Ok(Client { base, agent, api_key })
    }

    pub fn url(&self) -> &str {
        &self.base
    }

    /// Waits (at most `timeout`) until `GET /health` answers 200.
    pub fn wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        let mut last = String::from("no answer");
        while start.elapsed() < timeout {
            match self.agent.get(format!("{}/health", self.base)).call() {
                Ok(r) if r.status() == 200 => return Ok(()),
                Ok(r) => last = format!("HTTP {}", r.status()),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(format!("{}/health was not ready within {} s ({last})", self.base, timeout.as_secs()))
    }

    /// Sends `spec` and reads its stream to the end.
    pub fn run(&self, spec: &Spec) -> Record {
        let send = Instant::now();
        let mut record = Record {
            group: spec.group,
            send,
            chunks: Vec::with_capacity(spec.max_tokens),
            end: send,
            completion_tokens: None,
            cached_tokens: None,
            error: None,
            incomplete: None,
        };
        if let Err(e) = self.stream(spec, &mut record) {
            record.error = Some(e);
        } else if record.incomplete.is_none() {
            record.incomplete = check_usage(&record, spec.max_tokens);
        }
        record.end = Instant::now();
        record
    }

    fn stream(&self, spec: &Spec, record: &mut Record) -> Result<(), String> {
        let body = json!({
            "model": "loadgen",
            "prompt": spec.prompt,
            "max_tokens": spec.max_tokens,
            "temperature": 0.0,
            "ignore_eos": true,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let mut req =
            self.agent.post(format!("{}/v1/completions", self.base)).header("Content-Type", "application/json");
        if let Some(key) = &self.api_key {
            req = req.header("Authorization", format!("Bearer {key}"));
        }
        let resp = req.send(body.to_string()).map_err(|e| format!("POST /v1/completions: {e}"))?;
        let status = resp.status();
        if status != 200 {
            let mut text = String::new();
            let _ = resp.into_body().into_reader().take(2048).read_to_string(&mut text);
            return Err(format!("HTTP {status}: {}", text.trim()));
        }
        let mut finished = false;
        let mut done = false;
        for line in BufReader::new(resp.into_body().into_reader()).lines() {
            let line = line.map_err(|e| format!("reading the stream after {} chunks: {e}", record.chunks.len()))?;
            let now = Instant::now();
            let Some(data) = line.strip_prefix("data:") else {
                continue; // blank separators and `:` keep-alive comments
            };
            let data = data.trim();
            if done {
                record.incomplete = Some(format!("data after [DONE]: {}", clip(data)));
                return Ok(());
            }
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let chunk: Value = serde_json::from_str(data).map_err(|e| format!("bad chunk ({e}): {}", clip(data)))?;
            if let Some(err) = chunk.get("error") {
                return Err(format!("error event after {} chunks: {err}", record.chunks.len()));
            }
            for choice in chunk.get("choices").and_then(Value::as_array).into_iter().flatten() {
                if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                    record.incomplete = Some(format!("a choice index other than 0: {}", clip(data)));
                }
                if choice.get("text").and_then(Value::as_str).is_some_and(|t| !t.is_empty()) {
                    if finished {
                        record.incomplete = Some("text after the finish_reason".into());
                    }
                    record.chunks.push(now);
                }
                if choice.get("finish_reason").is_some_and(|f| !f.is_null()) {
                    if finished {
                        record.incomplete = Some("two chunks with a finish_reason".into());
                    }
                    finished = true;
                }
            }
            if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
                record.completion_tokens = usage.get("completion_tokens").and_then(Value::as_u64).map(|n| n as usize);
                record.cached_tokens =
                    usage.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).map(|n| n as usize);
            }
            if let Some(n) = chunk.pointer("/timings/cache_n").and_then(Value::as_u64) {
                record.cached_tokens.get_or_insert(n as usize);
            }
        }
        if record.incomplete.is_none() {
            if !finished {
                record.incomplete = Some("no chunk with a finish_reason".into());
            } else if !done {
                record.incomplete = Some("the stream ended without data: [DONE]".into());
            }
        }
        Ok(())
    }
}

/// The usage rules of a complete response, or why it breaks one.
fn check_usage(record: &Record, max_tokens: usize) -> Option<String> {
    let n = record.completion_tokens?;
    if n != max_tokens {
        return Some(format!("usage says {n} completion tokens, asked for {max_tokens} with ignore_eos"));
    }
    if record.chunks.len() > n {
        return Some(format!("{} text chunks for {n} tokens (duplicated chunks?)", record.chunks.len()));
    }
    None
}

fn clip(s: &str) -> String {
    match s.char_indices().nth(160) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}
