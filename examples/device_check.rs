//! What a GPU machine is asked to prove in one run (docs/gpu.md; run by
//! `scripts/device-check.sh`), with every layer on the first GPU device:
//!
//! - greedy tokens teacher-forced against the CPU (worst gap, and a
//!   shifted control that must fail);
//! - the memory plan against the live context, per device, byte for byte;
//! - the engine's aggregate decode throughput with 1 and 16 streams;
//! - offload by default: every layer on the GPU when it fits, and under
//!   a device budget of half the model the layers the fit chose, which
//!   load, stay within it and run.
//!
//! Prints one JSON object per check and exits non-zero when a check fails.
//! `--write-model PATH` first writes the model it runs on: a synthetic
//! llama-architecture model (8 layers, width 2048, random weights)
//! quantized to Q4_K_M, or with `--shape llama-3.2-1b|llama-3.1-8b` one of
//! that real model's shape and layout (`llamacpp::testing::ShapedSpec`),
//! since a GPU machine without network has no real model; throughput and
//! memory depend on the shape, not on the weights. `--checks` picks
//! checks (default: all).
//!
//! ```sh
//! cargo run --release --example device_check -- --write-model /tmp/m.gguf
//! ```

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use llama_suite::teacher::rescore;
use llamacpp::engine::{Engine, EngineConfig, Request};
use llamacpp::plan::{MemoryBudget, Planner};
use llamacpp::testing::{ShapedSpec, TinyModelSpec, write_shaped_llama, write_tiny_llama};
use llamacpp::{
    ContextParams, DeviceKind, FileType, GpuLayers, LoadMode, Model, ModelParams, QuantizeParams, Token, quantize,
};
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
    /// With --write-model: a real model's shape (llama-3.2-1b,
    /// llama-3.1-8b) in place of the 8-layer one.
    #[arg(long)]
    shape: Option<String>,
    /// The checks to run, comma-separated: teacher, plan, engine, fit
    /// (none: only write the model).
    #[arg(long, value_delimiter = ',', default_value = "teacher,plan,engine,fit")]
    checks: Vec<String>,
    /// CPU threads.
    #[arg(short = 't', long, default_value_t = 8)]
    threads: i32,
    /// Tokens per engine stream.
    #[arg(short = 'n', long, default_value_t = 256)]
    tokens: usize,
}

/// Largest allowed gap in the teacher-forced check (as the test suite's).
const MARGIN: f32 = 1.0;

pub(crate) fn main() -> ExitCode {
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

fn run(args: &Args) -> Result<bool, Box<dyn Error>> {
    let path = match (&args.write_model, &args.model) {
        (Some(path), _) => {
            match &args.shape {
                Some(name) => write_shaped(path, name)?,
                None => write_model(path, args.threads)?,
            }
            path.clone()
        }
        (None, Some(path)) => path.clone(),
        (None, None) => llama_suite::model_cache::model_path()?,
    };
    let wants = |check: &str| args.checks.iter().any(|c| c == check);
    if !["teacher", "plan", "engine", "fit"].iter().any(|c| wants(c)) {
        // `--checks none`: only the model was asked for.
        return Ok(true);
    }
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
    let ctx_params = ContextParams::default().n_threads(args.threads);
    let mut ok = true;
    if wants("fit") {
        ok &= fit_check(&path, gpu, &ctx_params)?;
    }
    if !(wants("teacher") || wants("plan") || wants("engine")) {
        return Ok(ok);
    }
    let gpu_params = ModelParams::default().n_gpu_layers(99).load_mode(LoadMode::Read);
    let gpu_model = Arc::new(Model::load(&path, &gpu_params)?);
    let cpu_model = Model::load(&path, &ModelParams::default().n_gpu_layers(0))?;

    if wants("teacher") {
        ok &= teacher_check(&gpu_model, &cpu_model, &ctx_params)?;
    }
    if wants("plan") {
        ok &= plan_check(&path, &gpu_model, &gpu_params, &ctx_params, &gpu.name)?;
    }
    if wants("engine") {
        engine_check(&gpu_model, &cpu_model, args)?;
    }
    Ok(ok)
}

/// Greedy on the GPU, re-scored on the CPU.
fn teacher_check(gpu_model: &Model, cpu_model: &Model, ctx_params: &ContextParams) -> Result<bool, Box<dyn Error>> {
    let prompt = prompt(cpu_model, 32, 1);
    let generated = greedy(gpu_model, ctx_params, &prompt, 64)?;
    let check = rescore(cpu_model, &prompt, &generated)?;
    let shifted = rescore(cpu_model, &prompt, &generated[1..])?;
    let teacher_ok = check.worst() <= MARGIN && shifted.worst() > check.worst();
    println!(
        "{}",
        json!({"check": "teacher_forced", "ok": teacher_ok, "tokens": generated.len(), "worst_gap": check.worst(),
               "shifted_control_worst_gap": shifted.worst(), "margin": MARGIN})
    );
    Ok(teacher_ok)
}

/// The plan against the live context, per device.
fn plan_check(
    path: &Path,
    gpu_model: &Model,
    gpu_params: &ModelParams,
    ctx_params: &ContextParams,
    gpu: &str,
) -> Result<bool, Box<dyn Error>> {
    let planner = Planner::new(path, gpu_params)?;
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
                   "planned_total": plan.memory.total(), "live_total": live.total(), "gpu": gpu})
        );
    }
    Ok(plan_ok)
}

/// The engine: aggregate decode throughput.
fn engine_check(gpu_model: &Arc<Model>, cpu_model: &Model, args: &Args) -> Result<(), Box<dyn Error>> {
    for streams in [1usize, 16] {
        let n_ctx = (streams * (32 + args.tokens)).next_multiple_of(256) as u32;
        let config = EngineConfig::default().n_ctx(n_ctx.max(1024)).n_threads(args.threads).max_running(16);
        let engine = Engine::start(gpu_model.clone(), config)?;
        let start = Instant::now();
        let completions: Vec<_> = (0..streams)
            .map(|i| {
                let request = Request::tokens(prompt_for(cpu_model, i)).max_tokens(args.tokens).stop_at_eog(false);
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
    Ok(())
}

/// Offload by default: the default parameters' fit (every layer, on a
/// card with room), then a budget of half the model's size on the GPU:
/// the fit's count loads, the live context stays within the budget there,
/// and the model generates.
fn fit_check(path: &Path, gpu: &llamacpp::Device, ctx_params: &ContextParams) -> Result<bool, Box<dyn Error>> {
    let ctx = ctx_params.clone().n_ctx(4096);
    let base = ModelParams::default().load_mode(LoadMode::Read).fit_context(ctx.clone());
    let start = Instant::now();
    let default = Model::load(path, &base)?;
    let (all, n_layer) = (default.n_gpu_layers(), default.n_layer() + 1);
    let size = default.size();
    drop(default);
    println!(
        "{}",
        json!({"check": "fit_default", "n_gpu_layers": all, "of": n_layer, "free": gpu.memory_free,
               "model_bytes": size, "seconds": start.elapsed().as_secs_f64(),
               "ok": all == n_layer || size + (1 << 30) > gpu.memory_free as u64})
    );
    let budget = size / 2;
    let within = base.gpu_layers(GpuLayers::Within(MemoryBudget::default().device(&gpu.name, budget)));
    let start = Instant::now();
    let model = Model::load(path, &within)?;
    let load_s = start.elapsed().as_secs_f64();
    let chosen = model.n_gpu_layers();
    let live = model.new_context(&ctx)?.memory_breakdown()?;
    let on_gpu = live.devices().iter().filter(|d| d.device == gpu.name).map(|d| d.total()).sum::<u64>();
    let prompt = prompt(&model, 32, 3);
    let start = Instant::now();
    let generated = greedy(&model, &ctx, &prompt, 32)?;
    let seconds = start.elapsed().as_secs_f64();
    let ok = chosen > 0 && chosen < n_layer && on_gpu <= budget && generated.len() == 32;
    println!(
        "{}",
        json!({"check": "fit_budget", "budget": budget, "n_gpu_layers": chosen, "of": n_layer, "on_gpu": on_gpu,
               "load_seconds": load_s, "tokens_per_second": generated.len() as f64 / seconds, "ok": ok})
    );
    Ok(ok && (all == n_layer || size + (1 << 30) > gpu.memory_free as u64))
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

/// A real model's shape, written directly in Q4_K_M's layout.
fn write_shaped(path: &Path, name: &str) -> Result<(), Box<dyn Error>> {
    let spec =
        ShapedSpec::named(name).ok_or_else(|| format!("unknown --shape {name}: llama-3.2-1b or llama-3.1-8b"))?;
    let start = Instant::now();
    write_shaped_llama(path, &spec)?;
    println!(
        "{}",
        json!({"check": "model", "path": path, "shape": spec.name, "layers": spec.n_layer, "n_embd": spec.n_embd,
               "params": spec.n_params(), "type": "Q4_K_M", "bytes": std::fs::metadata(path)?.len(),
               "seconds": start.elapsed().as_secs_f64()})
    );
    Ok(())
}

/// The synthetic model: written in F32, quantized to Q4_K_M.
fn write_model(path: &Path, threads: i32) -> Result<(), Box<dyn Error>> {
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
