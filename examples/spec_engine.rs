//! Speculative decoding through `llamacpp::engine` under load, side by side:
//! the same mixed workload without and with `Request::speculation`,
//! interleaved round by round on one engine.
//!
//! The workload: `--requests` requests submitted at once to an engine that
//! runs `--streams` of them at a time, alternating between text that
//! repeats its prompt (benches/prompts: a copy task or a code rewrite,
//! greedy) and text that does not (a story sampled at temperature 0.8);
//! `--tokens` new tokens each. A stream that finishes early gives its slot
//! to the next request, as under a server's steady load. Each row prints
//! the aggregate tokens/s from the first submit to the last token, the
//! engine's steps, and the drafted and accepted tokens; the last line, the
//! median ratio over rounds. A first unmeasured pass fills the prefix
//! cache, so every measured round decodes the same work.
//!
//! ```sh
//! cargo run --release --example spec_engine -- --rounds 3
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use llamacpp::engine::{Engine, EngineConfig, Request};
use llamacpp::speculative::Speculation;
use llamacpp::{AddBos, Model, ModelParams, SamplingParams, Token};

#[derive(Parser, Debug)]
#[command(about = "aggregate tokens/s of a mixed engine workload without and with speculative decoding")]
struct Args {
    /// GGUF model (default: LLAMA_MODEL or the cached default model).
    #[arg(short, long)]
    model: Option<std::path::PathBuf>,
    /// Interleaved rounds (each: without, then with speculation).
    #[arg(short, long, default_value_t = 3)]
    rounds: usize,
    /// Requests per round, submitted at once.
    #[arg(long, default_value_t = 16)]
    requests: usize,
    /// Streams the engine runs at a time (`EngineConfig::max_running`).
    #[arg(long, default_value_t = 8)]
    streams: u32,
    /// New tokens per request.
    #[arg(short = 'n', long, default_value_t = 96)]
    tokens: usize,
    /// Threads.
    #[arg(short, long, default_value_t = 2)]
    threads: i32,
    /// Longest draft (`Speculation::draft_max`).
    #[arg(long, default_value_t = Speculation::default().max_draft())]
    draft_max: usize,
    /// Drafts as long as the budget allows, not cut to what pays by the
    /// fitted step cost (`EngineConfig::draft_by_cost(false)`).
    #[arg(long)]
    uncut: bool,
}

/// One round's figures.
struct Round {
    tokens_per_second: f64,
    steps: u64,
    drafted: u64,
    accepted: u64,
}

struct Workload {
    repeating: [Vec<Token>; 2],
    free: Vec<Token>,
}

impl Workload {
    fn load(model: &Model) -> Result<Workload, Box<dyn std::error::Error>> {
        let prompt = |name: &str| -> Result<Vec<Token>, Box<dyn std::error::Error>> {
            let path = format!("{}/benches/prompts/{name}.txt", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
            Ok(model.vocab().tokenize(&text, AddBos::Yes)?)
        };
        Ok(Workload { repeating: [prompt("copy")?, prompt("code")?], free: prompt("story")? })
    }

    /// Request `i` of round `round`: even ones repeat their prompt, odd ones
    /// do not.
    fn request(&self, i: usize, round: usize, args: &Args) -> Request {
        let (prompt, sampling) = if i.is_multiple_of(2) {
            (&self.repeating[(i / 2) % 2], SamplingParams::greedy())
        } else {
            (&self.free, SamplingParams::default().temperature(0.8).seed((round * 1000 + i) as u32))
        };
        Request::tokens(prompt.clone()).sampling(sampling).max_tokens(args.tokens).stop_at_eog(false)
    }
}

fn round(engine: &Engine, workload: &Workload, args: &Args, index: usize, speculate: bool) -> llamacpp::Result<Round> {
    let before = engine.stats();
    let started = Instant::now();
    let completions = (0..args.requests)
        .map(|i| {
            let request = workload.request(i, index, args);
            let speculation = speculate.then(|| Speculation::default().draft_max(args.draft_max));
            engine.submit(request.speculation(speculation))
        })
        .collect::<llamacpp::Result<Vec<_>>>()?;
    let mut generated = 0;
    for completion in completions {
        generated += completion.wait().tokens.len();
    }
    let seconds = started.elapsed().as_secs_f64();
    let after = engine.stats();
    Ok(Round {
        tokens_per_second: generated as f64 / seconds,
        steps: after.steps - before.steps,
        drafted: after.draft_tokens - before.draft_tokens,
        accepted: after.draft_tokens_accepted - before.draft_tokens_accepted,
    })
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let path = match &args.model {
        Some(p) => p.clone(),
        None => llama_suite::model_cache::model_path()?,
    };
    let model = Arc::new(Model::load(&path, &ModelParams::default())?);
    let workload = Workload::load(&model)?;
    let config = EngineConfig::default()
        .n_ctx(8192)
        .max_running(args.streams)
        .n_threads(args.threads)
        .draft_by_cost(!args.uncut);
    let engine = Engine::start(model, config)?;
    round(&engine, &workload, args, 0, false)?;
    let mut ratios = Vec::new();
    println!("| round | speculation | tokens/s | steps | accepted/drafted |");
    println!("| ---: | --- | ---: | ---: | ---: |");
    for index in 1..=args.rounds {
        let off = round(&engine, &workload, args, index, false)?;
        let on = round(&engine, &workload, args, index, true)?;
        for (name, r) in [("off", &off), ("on", &on)] {
            println!("| {index} | {name} | {:.1} | {} | {}/{} |", r.tokens_per_second, r.steps, r.accepted, r.drafted);
        }
        ratios.push(on.tokens_per_second / off.tokens_per_second);
    }
    ratios.sort_by(f64::total_cmp);
    println!("median ratio (on/off): {:.2}x over {} rounds", ratios[ratios.len() / 2], ratios.len());
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
