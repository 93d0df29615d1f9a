//! What a GPU machine is asked to prove in one run (docs/gpu.md; run by
//! `scripts/device-check.sh`), with every layer on the first GPU device:
//!
//! - greedy tokens teacher-forced against the CPU (worst gap, and a
//!   shifted control that must fail);
//! - the memory plan against the live context, per device, byte for byte;
//! - the engine's aggregate decode throughput with 1 and 16 streams.
//!
//! Prints one JSON object per check and exits non-zero when a check fails.
//! `--write-model PATH` first writes the model it runs on: a synthetic
//! llama-architecture model (8 layers, width 2048, random weights)
//! quantized to Q4_K_M, since a GPU machine without network has no real
//! model; throughput and memory depend on the shape, not on the weights.
//!
//! ```sh
//! cargo run --release --example device_check -- --write-model /tmp/m.gguf
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use llama_suite::teacher::rescore;
use llamacpp::engine::{Engine, EngineConfig, Request};
use llamacpp::plan::Planner;
use llamacpp::testing::{TinyModelSpec, write_tiny_llama};
use llamacpp::{ContextParams, DeviceKind, FileType, LoadMode, Model, ModelParams, QuantizeParams, Token, quantize};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "GPU checks: teacher-forced greedy, plan vs live per device, engine throughput")]
struct Args {
    /// The model to run on (default: LLAMA_MODEL or the cached default model).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Write the synthetic Q4_K_M model here first, and run on it.
    #[arg(long)]
    write_model: Option<PathBuf>,
    /// CPU threads.
    #[arg(short = 't', long, default_value_t = 8)]
    threads: i32,
    /// Tokens per engine stream.
    #[arg(short = 'n', long, default_value_t = 256)]
    tokens: usize,
}

/// Largest allowed gap in the teacher-forced check (as the test suite's).
const MARGIN: f32 = 1.0;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("device_check: a check failed");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("device_check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    let path = match (&args.write_model, &args.model) {
        (Some(path), _) => {
            write_model(path, args.threads)?;
            path.clone()
        }
        (None, Some(path)) => path.clone(),
        (None, None) => llama_suite::model_cache::model_path()?,
    };
    let devices = llamacpp::devices();
    for d in &devices {
        println!(
            "{}",
            json!({"check": "device", "name": d.name, "description": d.description, "kind": format!("{:?}", d.kind),
                   "memory_total": d.memory_total, "memory_free": d.memory_free})
        );
    }
    let Some(gpu) = devices.iter().find(|d| matches!(d.kind, DeviceKind::Gpu | DeviceKind::IntegratedGpu)) else {
        return Err("no GPU device".into());
    };
    let gpu_params = ModelParams::default().n_gpu_layers(99).load_mode(LoadMode::Read);
    let gpu_model = Arc::new(Model::load(&path, &gpu_params)?);
    let cpu_model = Model::load(&path, &ModelParams::default())?;
    let ctx_params = ContextParams::default().n_threads(args.threads);

    // Greedy on the GPU, re-scored on the CPU.
    let prompt = prompt(&cpu_model, 32, 1);
    let generated = greedy(&gpu_model, &ctx_params, &prompt, 64)?;
    let check = rescore(&cpu_model, &prompt, &generated)?;
    let shifted = rescore(&cpu_model, &prompt, &generated[1..])?;
    let teacher_ok = check.worst() <= MARGIN && shifted.worst() > check.worst();
    println!(
        "{}",
        json!({"check": "teacher_forced", "ok": teacher_ok, "tokens": generated.len(), "worst_gap": check.worst(),
               "shifted_control_worst_gap": shifted.worst(), "margin": MARGIN})
    );

    // The plan against the live context, per device.
    let planner = Planner::new(&path, &gpu_params)?;
    let mut plan_ok = true;
    for n_ctx in [4096, 32768] {
        let params = ctx_params.clone().n_ctx(n_ctx).n_batch(2048).n_ubatch(512);
        let plan = planner.plan(&params)?;
        let live = gpu_model.new_context(&params)?.memory_breakdown()?;
        let equal = plan.memory == live;
        plan_ok &= equal;
        let per_device: Vec<_> = live
            .devices()
            .iter()
            .map(|d| json!({"device": d.device, "weights": d.weights, "kv": d.kv, "compute": d.compute}))
            .collect();
        println!(
            "{}",
            json!({"check": "plan_equals_live", "ok": equal, "n_ctx": n_ctx, "live": per_device,
                   "planned_total": plan.memory.total(), "live_total": live.total(), "gpu": gpu.name})
        );
    }

    // The engine: aggregate decode throughput.
    for streams in [1usize, 16] {
        let n_ctx = (streams * (32 + args.tokens)).next_multiple_of(256) as u32;
        let config = EngineConfig::default().n_ctx(n_ctx.max(1024)).n_threads(args.threads).max_running(16);
        let engine = Engine::start(gpu_model.clone(), config)?;
        let start = Instant::now();
        let completions: Vec<_> = (0..streams)
            .map(|i| {
                let request = Request::tokens(prompt_for(&cpu_model, i)).max_tokens(args.tokens).stop_at_eog(false);
                engine.submit(request)
            })
            .collect::<Result<_, _>>()?;
        let generated: usize = completions.into_iter().map(|c| c.wait().tokens.len()).sum();
        let seconds = start.elapsed().as_secs_f64();
        println!(
            "{}",
            json!({"check": "engine", "streams": streams, "generated": generated, "seconds": seconds,
                   "tokens_per_second": generated as f64 / seconds, "ok": generated == streams * args.tokens})
        );
    }
    Ok(teacher_ok && plan_ok)
}

/// A prompt of `n` ordinary tokens (ids past the first 10), seeded.
fn prompt(model: &Model, n: usize, seed: u64) -> Vec<Token> {
    let vocab = model.vocab();
    let mut tokens = vec![vocab.bos().unwrap_or(Token(1))];
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let range = (vocab.n_tokens() - 10) as u64;
    tokens.extend((1..n).map(|_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        Token(10 + (state % range) as i32)
    }));
    tokens
}

fn prompt_for(model: &Model, stream: usize) -> Vec<Token> {
    prompt(model, 32, stream as u64 + 2)
}

/// Greedy tokens after `prompt`, one decode per token.
fn greedy(model: &Model, params: &ContextParams, prompt: &[Token], n: usize) -> llamacpp::Result<Vec<Token>> {
    llama_suite::teacher::greedy(model, &params.clone().n_ctx(1024), prompt, n)
}

/// The synthetic model: written in F32, quantized to Q4_K_M.
fn write_model(path: &Path, threads: i32) -> Result<(), Box<dyn std::error::Error>> {
    let spec =
        TinyModelSpec { n_layer: 8, n_embd: 2048, n_head: 16, n_head_kv: 4, n_ff: 5632, n_ctx_train: 32768, seed: 7 };
    let f32_path = path.with_extension("f32.gguf");
    let start = Instant::now();
    write_tiny_llama(&f32_path, &spec)?;
    quantize(&f32_path, path, &QuantizeParams::default().file_type(FileType::Q4_K_M).threads(threads))?;
    std::fs::remove_file(&f32_path)?;
    println!(
        "{}",
        json!({"check": "model", "path": path, "layers": spec.n_layer, "n_embd": spec.n_embd, "type": "Q4_K_M",
               "bytes": std::fs::metadata(path)?.len(), "seconds": start.elapsed().as_secs_f64()})
    );
    Ok(())
}
