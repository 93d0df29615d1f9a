//! A load generator for OpenAI-compatible servers: this repository's
//! `src/bin/server` or llama.cpp's `llama-server`, on 127.0.0.1.
//!
//! Every request is a streamed `POST /v1/completions` with a token-id
//! prompt, `temperature: 0` and `ignore_eos`, so each generates exactly
//! `--max-tokens` tokens on any server (see `client.rs` for the request and
//! for what counts as a complete response). Prompts are BOS and token ids
//! for Gemma 3, deterministic in `--seed` (`llama_suite::token_prompts`).
//!
//! ```sh
//! cargo run --release --bin server -- --port 8080 &
//! L=target/release/examples/loadgen
//! # N concurrent clients, each sending M requests one after the other
//! $L --url http://127.0.0.1:8080 --clients 1,4,8,16 --requests 4 --prompt-tokens 128 --max-tokens 128
//! # a shared 1,000-token system prompt before each request's own 32 tokens
//! $L --url http://127.0.0.1:8080 --scenario shared-prefix --clients 8 --requests 4 --shared-tokens 1000 --prompt-tokens 32 --max-tokens 32
//! # one 4,000-token prompt, then 7 short requests 50 ms apart
//! $L --url http://127.0.0.1:8080 --scenario long-short --shorts 7 --gap-ms 50
//! # a 10-minute soak at 8 clients, sampling the server's RSS
//! $L --url http://127.0.0.1:8080 --clients 8 --duration-s 600 --pid "$(pgrep -f src/bin/server)"
//! ```
//!
//! Each row reports requests, errors, incomplete responses, requests/s,
//! output tokens/s (every complete request's tokens over the time from the
//! first send to the last byte), TTFT p50/p99 (send to the first chunk with
//! text) and inter-token gaps p50/p99 (between consecutive text chunks);
//! `--json` prints each row as one JSON object instead, with end-to-end
//! latency (send to last byte) p50/p99 besides. The exit status is
//! 1 when any request failed or came back incomplete.

mod client;
mod report;
mod scenario;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use serde_json::{Value, json};

use client::Client;
use report::Summary;
use scenario::{Closed, Length, LongShort};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// `--clients` closed-loop clients, each prompt its own.
    Clients,
    /// The same, every prompt led by one shared `--shared-tokens` system prompt.
    SharedPrefix,
    /// One `--long-tokens` prompt, then `--shorts` short requests `--gap-ms` apart.
    LongShort,
}

#[derive(Parser, Debug)]
#[command(
    about = "Streams OpenAI /v1/completions requests at a server on 127.0.0.1 and reports throughput and latency"
)]
struct Args {
    /// The server (`http://127.0.0.1:PORT`; a trailing `/v1` is accepted).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long)]
    api_key: Option<String>,
    #[arg(long, value_enum, default_value = "clients")]
    scenario: Scenario,
    /// Concurrency levels, one row each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "8")]
    clients: Vec<usize>,
    /// Requests per client.
    #[arg(long, default_value_t = 4)]
    requests: usize,
    /// Instead of `--requests`: keep sending for this many seconds (a soak).
    #[arg(long)]
    duration_s: Option<u64>,
    /// Tokens of each request's own prompt (after BOS or the shared prompt).
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// shared-prefix: tokens of the shared system prompt (BOS included).
    #[arg(long, default_value_t = 1000)]
    shared_tokens: usize,
    /// long-short: tokens of the long prompt (BOS included).
    #[arg(long, default_value_t = 4000)]
    long_tokens: usize,
    #[arg(long, default_value_t = 16)]
    long_max_tokens: usize,
    #[arg(long, default_value_t = 7)]
    shorts: usize,
    #[arg(long, default_value_t = 16)]
    short_tokens: usize,
    #[arg(long, default_value_t = 16)]
    short_max_tokens: usize,
    #[arg(long, default_value_t = 50)]
    gap_ms: u64,
    /// Prompts are deterministic in the seed; change it to miss a server's prompt cache.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Each request's limit, from connect to the last byte.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// Skip the unmeasured warm-up request.
    #[arg(long)]
    no_warmup: bool,
    /// The server's process id: its resident set is sampled during each row.
    #[arg(long)]
    pid: Option<u32>,
    /// Print each row as one JSON object.
    #[arg(long)]
    json: bool,
    /// A name for the rows (`--json` adds it as `"label"`).
    #[arg(long, default_value = "")]
    label: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(failed) => {
            eprintln!("loadgen: {failed} requests failed or came back incomplete");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("loadgen: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs every row; returns the number of failed requests.
fn run(args: &Args) -> Result<usize, String> {
    if args.clients.contains(&0) {
        return Err("--clients: a level must be at least 1".into());
    }
    if args.max_tokens == 0 || args.short_max_tokens == 0 || args.long_max_tokens == 0 {
        return Err("max tokens must be at least 1".into());
    }
    let client = Client::new(&args.url, args.api_key.clone(), Duration::from_secs(args.timeout_s))?;
    client.wait_ready(Duration::from_secs(120))?;
    if !args.no_warmup {
        scenario::warmup(&client, args.seed)?;
    }
    let mut failed = 0;
    let levels: Vec<Option<usize>> = match args.scenario {
        Scenario::LongShort => vec![None],
        _ => args.clients.iter().copied().map(Some).collect(),
    };
    for level in levels {
        let ((name, records), rss) = measured(args.pid, || match (args.scenario, level) {
            (Scenario::LongShort, _) => {
                let l = LongShort {
                    long_tokens: args.long_tokens,
                    long_max_tokens: args.long_max_tokens,
                    shorts: args.shorts,
                    short_tokens: args.short_tokens,
                    short_max_tokens: args.short_max_tokens,
                    gap: Duration::from_millis(args.gap_ms),
                };
                ("long-short".to_owned(), scenario::long_short(&client, args.seed, l))
            }
            (s, level) => {
                let clients = level.unwrap_or(1);
                let c = Closed {
                    clients,
                    length: args
                        .duration_s
                        .map_or(Length::Requests(args.requests), |s| Length::For(Duration::from_secs(s))),
                    shared_tokens: if s == Scenario::SharedPrefix { args.shared_tokens } else { 0 },
                    prompt_tokens: args.prompt_tokens,
                    max_tokens: args.max_tokens,
                };
                let name = if s == Scenario::SharedPrefix { "shared-prefix" } else { "clients" };
                (format!("{name}/{clients}"), scenario::closed(&client, args.seed, c))
            }
        });
        let all = Summary::new(&records);
        failed += all.failed();
        for e in &all.examples {
            eprintln!("loadgen: {name}: {e}");
        }
        let mut groups = Vec::new();
        if args.scenario == Scenario::LongShort {
            for group in ["long", "short"] {
                groups.push((group, Summary::new(records.iter().filter(|r| r.group == group))));
            }
        }
        if args.json {
            let mut row = json!({"label": args.label, "url": client.url(), "row": name});
            merge(&mut row, all.json());
            for (group, s) in &groups {
                row[*group] = s.json();
            }
            if let Some(rss) = rss {
                row["rss_mib"] = rss;
            }
            println!("{row}");
        } else {
            println!("{:<20} {}", name, all.line());
            for (group, s) in &groups {
                println!("{:<20} {}", format!("  {group}"), s.line());
            }
            if let Some(rss) = rss {
                println!("{:<20} RSS MiB {rss}", "");
            }
        }
    }
    Ok(failed)
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(into), Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

/// Runs `f`, sampling `pid`'s RSS every 10 s meanwhile: `{start, end, max,
/// samples}` in MiB.
fn measured<T>(pid: Option<u32>, f: impl FnOnce() -> T) -> (T, Option<Value>) {
    let Some(pid) = pid else { return (f(), None) };
    let stop = AtomicBool::new(false);
    let mut samples = vec![report::rss_mib(pid)];
    let (out, mid) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut v = Vec::new();
            let mut slept = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                slept += Duration::from_millis(100);
                if slept >= Duration::from_secs(10) {
                    v.push(report::rss_mib(pid));
                    slept = Duration::ZERO;
                }
            }
            v
        });
        let out = f();
        stop.store(true, Ordering::Relaxed);
        (out, sampler.join().unwrap_or_default())
    });
    samples.extend(mid);
    samples.push(report::rss_mib(pid));
    let known: Vec<f64> = samples.iter().flatten().copied().collect();
    let max = known.iter().copied().fold(f64::NAN, f64::max);
    let r1 = |v: Option<f64>| v.map(|v| (v * 10.0).round() / 10.0);
    let rss = json!({
        "start": r1(samples.first().copied().flatten()),
        "end": r1(samples.last().copied().flatten()),
        "max": r1((!max.is_nan()).then_some(max)),
        "samples": samples.iter().map(|v| r1(*v)).collect::<Vec<_>>(),
    });
    (out, Some(rss))
}
