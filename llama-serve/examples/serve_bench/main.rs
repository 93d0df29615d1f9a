//! A load driver for side-by-side serving benchmarks: the same token-id
//! workloads sent to llama.cpp's own `llama-server` (built from the same
//! pinned llama.cpp source as llamacpp-sys) and, later, to our in-process
//! continuous-batching engine (`--backend engine`, not built yet).
//!
//! Build llama-server and llama-bench (once; into target/llama-tools/, from
//! the pinned sdist, with llamacpp-sys's CMake defines plus tools and server):
//!
//! ```sh
//! nice -n 19 scripts/build-llama-server.sh
//! target/llama-tools/build/bin/llama-server --version
//! ```
//!
//! Build the driver:
//!
//! ```sh
//! cargo build --release --example serve_bench
//! ```
//!
//! Run each scenario against a llama-server that the driver starts itself
//! (`--spawn`: `llama-server -m MODEL -t 2 -c 8192 -np N -kvu -b 512 -ub 512
//! --port 8089 --host 127.0.0.1`, killed on exit; its log goes to
//! target/llama-tools/llama-server-8089.log):
//!
//! ```sh
//! B=target/release/examples/serve_bench
//! # (a) throughput: N concurrent streams, 128-token prompts, 128 new tokens each
//! $B --spawn --scenario throughput --levels 1,2,4,8,16
//! # (b) long-short: a running stream; a 4,000-token prompt at its first
//! #     token; a 16-token request at the same instant
//! $B --spawn --scenario long-short
//! #     … and six short requests 50 ms apart after the long prompt
//! $B --spawn --scenario long-short --shorts 6 --gap-ms 50
//! # (c) prefix: A = 1,000-token prefix + 16, then B = same prefix + other 16, then cold C
//! $B --spawn --scenario prefix
//! # everything in one run, as JSON lines, with every request's token times
//! $B --spawn --scenario throughput,long-short,prefix --json --records target/serve_bench.jsonl
//! ```
//!
//! Or against a llama-server already running on 127.0.0.1 (`--url`, default
//! `http://127.0.0.1:8089`); it needs `-np` at least the concurrency of the
//! scenario. Prompts are deterministic in `--seed`, so a second run against
//! the same server finds them in its prompt cache: restart it, or change
//! `--seed`.
//!
//! The model is `--model`, else `LLAMA_MODEL`, else the cached default
//! model (Gemma 3 270M Q4_K_M, fetched on first use). The prompts are token
//! ids for Gemma 3 (BOS = 2, ids in 1000..100000).
//!
//! Rows: aggregate generated tokens/s (all tokens over the time from the
//! first send to the last token), TTFT p50/p99 and inter-token gap (ITL)
//! p50/p99 in ms, then the scenario's own numbers: long-short reports the
//! short requests' TTFT (median and max), the long prompt's TTFT, and the
//! running stream's median and worst inter-token gap over its whole life;
//! prefix reports the TTFT of A, B and C and the prompt tokens the backend
//! took from its cache for B and C.

mod backend;
mod driver;
mod engine;
mod llama_server;
mod report;
mod workload;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use backend::Backend;
use driver::ScenarioRun;
use llama_server::{LlamaServer, ServerProcess, SpawnOptions};
use report::Row;
use workload::LongShortSizes;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// llama.cpp's llama-server over loopback HTTP.
    LlamaServer,
    /// The in-process continuous-batching engine (`llamacpp::engine`).
    Engine,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum KvKind {
    F16,
    #[value(name = "q8_0")]
    Q8_0,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Throughput,
    LongShort,
    Prefix,
}

#[derive(Parser, Debug)]
#[command(about = "Side-by-side serving benchmark: llama-server vs the in-process engine")]
struct Args {
    /// Which backend to drive.
    #[arg(long, value_enum, default_value = "llama-server")]
    backend: BackendKind,
    /// Scenarios to run, comma-separated, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "throughput")]
    scenario: Vec<Scenario>,
    /// throughput: the numbers of concurrent streams, one row each.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    levels: Vec<usize>,
    /// throughput: prompt length of each stream (BOS included).
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// throughput: new tokens per stream.
    #[arg(long, default_value_t = 128)]
    n_predict: usize,
    /// long-short: length of the long prompt.
    #[arg(long, default_value_t = 4000)]
    long_tokens: usize,
    /// long-short: number of short requests sent after the long prompt.
    #[arg(long, default_value_t = 1)]
    shorts: usize,
    /// long-short: the i-th short request (from 0) is sent (i + 1) * gap
    /// after the long prompt; 0 sends them all with it.
    #[arg(long, default_value_t = 0)]
    gap_ms: u64,
    /// prefix: length of the shared prefix (BOS included).
    #[arg(long, default_value_t = 1000)]
    prefix_tokens: usize,
    /// Seed of the prompts (same seed, same tokens, whatever the backend).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Skip the unmeasured warm-up request.
    #[arg(long)]
    no_warmup: bool,
    /// Print rows as JSON lines instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write every request (send, first-token and token times) as JSON lines here.
    #[arg(long)]
    records: Option<PathBuf>,
    /// Bound on each request, and on the wait for a first token.
    #[arg(long, default_value_t = 300)]
    request_timeout_s: u64,

    // Model and sizes, for a spawned llama-server (and for the engine).
    /// GGUF model (default: LLAMA_MODEL, else the cached default model).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Layers on the GPUs, both sides (the engine's `n_gpu_layers`,
    /// llama-server's `-ngl`; -1: all). Default: each side's own default
    /// (what fits).
    #[arg(long, allow_negative_numbers = true)]
    gpu_layers: Option<i32>,
    /// Threads.
    #[arg(short, long, default_value_t = 2)]
    threads: usize,
    /// Context size (all sequences together; the KV cache is unified).
    #[arg(short, long, default_value_t = 8192)]
    ctx: usize,
    /// Parallel sequences (llama-server slots); default: what the chosen
    /// scenarios need at most.
    #[arg(long)]
    parallel: Option<usize>,
    /// Logical batch size.
    #[arg(short, long, default_value_t = 512)]
    batch: usize,
    /// Physical batch size.
    #[arg(long, default_value_t = 512)]
    ubatch: usize,
    /// KV cache element type (both sides: the engine's `kv_type`,
    /// llama-server's `--cache-type-k/-v`).
    #[arg(long, value_enum, default_value = "f16")]
    kv_type: KvKind,
    /// engine: most prompt tokens per step while any stream decodes
    /// (default: the engine's, a quarter of the batch; the batch size turns it off).
    #[arg(long)]
    prefill_cap: Option<usize>,

    // llama-server.
    /// Start llama-server (on 127.0.0.1:--port) and stop it on exit.
    #[arg(long)]
    spawn: bool,
    /// A running llama-server (without --spawn); only 127.0.0.1.
    #[arg(long, default_value = "http://127.0.0.1:8089")]
    url: String,
    /// Port of the spawned llama-server.
    #[arg(long, default_value_t = 8089)]
    port: u16,
    /// The llama-server binary to spawn.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/target/llama-tools/build/bin/llama-server"))]
    server_bin: PathBuf,
    /// An extra argument for the spawned llama-server (repeatable), e.g.
    /// `--server-arg=--cache-ram --server-arg=0`.
    #[arg(long, allow_hyphen_values = true)]
    server_arg: Vec<String>,
    /// Where the spawned llama-server's output goes (default:
    /// target/llama-tools/llama-server-PORT.log).
    #[arg(long)]
    server_log: Option<PathBuf>,
    /// Bound on the spawned llama-server's start (model load).
    #[arg(long, default_value_t = 180)]
    startup_timeout_s: u64,
}

impl Args {
    fn long_short_sizes(&self) -> LongShortSizes {
        LongShortSizes {
            long_prompt: self.long_tokens,
            shorts: self.shorts,
            gap: Duration::from_millis(self.gap_ms),
            ..LongShortSizes::default()
        }
    }

    /// The most requests the chosen scenarios have in flight at once.
    fn max_concurrency(&self) -> usize {
        self.scenario
            .iter()
            .map(|s| match s {
                Scenario::Throughput => self.levels.iter().copied().max().unwrap_or(1),
                Scenario::LongShort => 2 + self.shorts,
                Scenario::Prefix => 1,
            })
            .max()
            .unwrap_or(1)
    }

    fn model_path(&self) -> Result<PathBuf, String> {
        match &self.model {
            Some(m) => Ok(m.clone()),
            None => llama_suite::model_cache::model_path().map_err(|e| e.to_string()),
        }
    }
}

pub(crate) fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("serve_bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    if args.levels.contains(&0) {
        return Err("--levels: 0 streams".to_owned());
    }
    // Ctrl-C must not leave a spawned llama-server behind (drop does not
    // run on a signal).
    ctrlc::set_handler(|| {
        let pid = llama_server::SPAWNED_PID.load(Ordering::SeqCst);
        if pid != 0 {
            let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
        std::process::exit(130);
    })
    .map_err(|e| format!("cannot install the Ctrl-C handler: {e}"))?;

    let timeout = Duration::from_secs(args.request_timeout_s);
    let parallel = args.parallel.unwrap_or_else(|| args.max_concurrency());

    // Declared before the backend, so dropped (llama-server killed) after it.
    let mut _server: Option<ServerProcess> = None;
    let backend: Box<dyn Backend> = match args.backend {
        BackendKind::LlamaServer => {
            let url = if args.spawn { format!("http://127.0.0.1:{}", args.port) } else { args.url.clone() };
            let client = LlamaServer::new(&url, timeout)?;
            if args.spawn {
                let log = args.server_log.clone().unwrap_or_else(|| {
                    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                        .join("target/llama-tools")
                        .join(format!("llama-server-{}.log", args.port))
                });
                let opts = SpawnOptions {
                    bin: args.server_bin.clone(),
                    model: args.model_path()?,
                    port: args.port,
                    threads: args.threads,
                    ctx: args.ctx,
                    parallel,
                    batch: args.batch,
                    ubatch: args.ubatch,
                    extra_args: {
                        let mut extra = args.server_arg.clone();
                        if let Some(n) = args.gpu_layers {
                            extra.extend(["-ngl".to_owned(), n.to_string()]);
                        }
                        if args.kv_type == KvKind::Q8_0 {
                            extra.extend(["--cache-type-k", "q8_0", "--cache-type-v", "q8_0"].map(String::from));
                        }
                        extra
                    },
                    log,
                    startup_timeout: Duration::from_secs(args.startup_timeout_s),
                };
                _server = Some(ServerProcess::spawn(&opts, &client)?);
            } else {
                match client.health() {
                    Ok(200) => {}
                    Ok(code) => return Err(format!("{url}/health answered {code}; is the model still loading?")),
                    Err(e) => return Err(format!("no llama-server at {url} ({e}); start one, or pass --spawn")),
                }
            }
            if let Some(props) = client.props() {
                let slots = props.get("total_slots").and_then(|v| v.as_u64());
                let n_ctx = props.pointer("/default_generation_settings/n_ctx").and_then(|v| v.as_u64());
                eprintln!(
                    "serve_bench: llama-server at {}: {} slots, n_ctx per slot {}",
                    client.url(),
                    slots.map_or("?".into(), |s| s.to_string()),
                    n_ctx.map_or("?".into(), |s| s.to_string())
                );
                if let Some(slots) = slots
                    && (slots as usize) < args.max_concurrency()
                {
                    eprintln!(
                        "serve_bench: warning: {slots} slots < {} concurrent requests; some will queue",
                        args.max_concurrency()
                    );
                }
            }
            Box::new(client)
        }
        BackendKind::Engine => Box::new(engine::EngineBackend::new(&engine::EngineOptions {
            model: args.model_path()?,
            threads: args.threads,
            ctx: args.ctx,
            parallel,
            batch: args.batch,
            ubatch: args.ubatch,
            prefill_cap: args.prefill_cap,
            gpu_layers: args.gpu_layers,
            kv_type: match args.kv_type {
                KvKind::F16 => llamacpp::KvType::F16,
                KvKind::Q8_0 => llamacpp::KvType::Q8_0,
            },
        })?),
    };
    let backend: &dyn Backend = backend.as_ref();

    if !args.no_warmup {
        driver::run_one(backend, &workload::warmup(args.seed), None)?;
    }

    let mut records_out = match &args.records {
        Some(path) => {
            Some(BufWriter::new(File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?))
        }
        None => None,
    };
    if !args.json {
        println!("{}", Row::table_header());
    }
    for scenario in &args.scenario {
        match scenario {
            Scenario::Throughput => {
                for &n in &args.levels {
                    eprintln!("serve_bench: throughput, {n} streams");
                    let streams = workload::throughput(args.seed, n, args.prompt_tokens, args.n_predict);
                    let run = driver::throughput(backend, &streams)?;
                    emit(args, backend, &run, &mut records_out)?;
                }
            }
            Scenario::LongShort => {
                let sizes = args.long_short_sizes();
                eprintln!("serve_bench: long-short, {} shorts, gap {} ms", sizes.shorts, args.gap_ms);
                let w = workload::long_short(args.seed, &sizes);
                let run = driver::long_short(backend, &w, timeout)?;
                emit(args, backend, &run, &mut records_out)?;
            }
            Scenario::Prefix => {
                eprintln!("serve_bench: prefix, {} tokens", args.prefix_tokens);
                let w = workload::prefix(args.seed, args.prefix_tokens, 16, 16);
                let run = driver::prefix(backend, &w, args.prefix_tokens)?;
                emit(args, backend, &run, &mut records_out)?;
            }
        }
    }
    if let Some(mut out) = records_out {
        out.flush().map_err(|e| format!("writing the records: {e}"))?;
    }
    Ok(())
}

fn emit(
    args: &Args,
    backend: &dyn Backend,
    run: &ScenarioRun,
    records_out: &mut Option<BufWriter<File>>,
) -> Result<(), String> {
    let row = Row::new(backend.name(), run);
    if args.json {
        println!("{}", row.to_json());
    } else {
        println!("{}", row.table_line());
    }
    if let Some(out) = records_out {
        for r in report::records_json(backend.name(), run) {
            writeln!(out, "{r}").map_err(|e| format!("writing the records: {e}"))?;
        }
    }
    Ok(())
}
