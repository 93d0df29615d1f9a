//! Memory plans: what a model and its context would allocate, per
//! configuration and per device, computed by llama.cpp itself without
//! allocating (`no_alloc`), beside the analytic KV formula; with
//! `--budget`, the largest context that fits; with `--device-budget`, the
//! most layers that fit on the devices.
//!
//! ```text
//! cargo run --release --example plan -- [--model M] [--ctx 2048,8192,32768] [--seqs 1,4,16] \
//!     [--kv f16,q8_0] [--budget 2GiB] [--fa auto|on|off] [--unified] [--no-swa-full] [--live] [--json] \
//!     [--gpu-layers N] [--rpc HOST:PORT,...] [--device-budget CUDA0=6GiB,...]
//! ```
//!
//! `--live` also creates each context for real and prints what it
//! allocated (the model is then loaded once, fully). `--json` prints one
//! object per configuration. Bad arguments get a one-line error and exit
//! status 2; a model that cannot be read, exit status 1.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use llamacpp::plan::analytic::{ModelShape, WeightType};
use llamacpp::plan::{FitGoal, MemoryBreakdown, MemoryBudget, Planner};
use llamacpp::{ContextParams, FlashAttention, KvType, Model, ModelParams};

#[derive(Parser, Debug)]
#[command(about = "Plan the memory of a GGUF model's contexts without allocating it")]
struct Args {
    /// GGUF model file (default: $LLAMA_MODEL, else the cached default model).
    #[arg(long, short = 'm')]
    model: Option<PathBuf>,
    /// Context sizes (`n_ctx`, cells over all sequences), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2048,8192,32768")]
    ctx: Vec<u32>,
    /// Sequence counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    seqs: Vec<u32>,
    /// KV cache types (K and V), comma-separated: f32, f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0, iq4_nl.
    #[arg(long, value_delimiter = ',', default_value = "f16,q8_0", value_parser = parse_kv)]
    kv: Vec<KvType>,
    /// A memory budget (e.g. 2GiB, 512MiB, 1.5GB, bytes): prints the largest
    /// context that fits it for each sequence count (first KV type that fits).
    #[arg(long, value_parser = llamacpp::plan::parse_size)]
    budget: Option<u64>,
    /// Flash attention.
    #[arg(long, default_value = "auto", value_parser = parse_fa)]
    fa: FlashAttention,
    /// One KV buffer shared by all sequences (the engine's layout).
    #[arg(long)]
    unified: bool,
    /// Sliding-window layers keep only their window (not the full context).
    #[arg(long)]
    no_swa_full: bool,
    /// Micro-batch size (sizes the compute buffers).
    #[arg(long, default_value_t = 512)]
    ubatch: u32,
    /// Batch size.
    #[arg(long, default_value_t = 2048)]
    batch: u32,
    /// Also create each context for real and print what it allocated.
    #[arg(long)]
    live: bool,
    /// Print a JSON array, one object per configuration.
    #[arg(long)]
    json: bool,
    /// Layers to offload to the GPUs or RPC workers (-1: all). Default:
    /// as many as fit each device's free memory less 1 GiB beside the
    /// first configuration, as `Model::load` does (none in a CPU-only
    /// build).
    #[arg(long, allow_negative_numbers = true)]
    gpu_layers: Option<i32>,
    /// RPC workers (host:port, comma-separated) whose devices take layers.
    #[arg(long, value_delimiter = ',')]
    rpc: Vec<String>,
    /// Device budgets, NAME=SIZE (comma-separated; names as the plan
    /// prints them, Host for RAM): prints the most layers that fit, for
    /// the first configuration.
    #[arg(long)]
    device_budget: Option<MemoryBudget>,
}

fn parse_kv(s: &str) -> Result<KvType, String> {
    Ok(match s.trim().to_ascii_lowercase().as_str() {
        "f32" => KvType::F32,
        "f16" => KvType::F16,
        "bf16" => KvType::Bf16,
        "q8_0" => KvType::Q8_0,
        "q5_1" => KvType::Q5_1,
        "q5_0" => KvType::Q5_0,
        "q4_1" => KvType::Q4_1,
        "q4_0" => KvType::Q4_0,
        "iq4_nl" => KvType::Iq4Nl,
        other => return Err(format!("unknown KV type `{other}`")),
    })
}

fn kv_name(t: KvType) -> &'static str {
    match t {
        KvType::F32 => "f32",
        KvType::F16 => "f16",
        KvType::Bf16 => "bf16",
        KvType::Q8_0 => "q8_0",
        KvType::Q5_1 => "q5_1",
        KvType::Q5_0 => "q5_0",
        KvType::Q4_1 => "q4_1",
        KvType::Q4_0 => "q4_0",
        KvType::Iq4Nl => "iq4_nl",
        _ => "other",
    }
}

fn parse_fa(s: &str) -> Result<FlashAttention, String> {
    match s {
        "auto" => Ok(FlashAttention::Auto),
        "on" => Ok(FlashAttention::On),
        "off" => Ok(FlashAttention::Off),
        other => Err(format!("`{other}` is not auto, on or off")),
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// This process's resident set (VmRSS) and its peak (VmHWM), in KiB.
fn rss_kib() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field =
        |name: &str| status.lines().find(|l| l.starts_with(name))?.split_whitespace().nth(1)?.parse::<u64>().ok();
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let text = e.to_string();
            eprintln!("plan: {}", text.lines().next().unwrap_or("bad arguments").trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    if let Some(bad) = args.ctx.iter().chain(&args.seqs).find(|&&n| n == 0) {
        eprintln!("plan: --ctx and --seqs values must be at least 1, got {bad}");
        return ExitCode::from(2);
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plan: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Row {
    n_ctx: u32,
    n_seq: u32,
    kv: KvType,
    memory: Result<MemoryBreakdown, llamacpp::Error>,
    analytic_kv: Option<u64>,
    live: Option<Result<MemoryBreakdown, llamacpp::Error>>,
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let path = match &args.model {
        Some(p) => p.clone(),
        None => llama_suite::model_cache::model_path()?,
    };
    let before = rss_kib();
    let started = Instant::now();
    let base = ContextParams::default()
        .n_batch(args.batch)
        .n_ubatch(args.ubatch)
        .flash_attention(args.fa)
        .kv_unified(args.unified)
        .swa_full(!args.no_swa_full);
    let first = base.clone().n_ctx(args.ctx[0]).n_seq_max(args.seqs[0]).kv_type(args.kv[0]);
    let mut model_params = ModelParams::default().rpc_servers(args.rpc.clone()).fit_context(first.clone());
    if let Some(n) = args.gpu_layers {
        model_params = model_params.n_gpu_layers(n);
    }
    let planner = Planner::new(&path, &model_params)?;
    let load_ms = started.elapsed().as_secs_f64() * 1e3;
    let shape = ModelShape::read(&path);
    // The count the planner chose, not a second fit (the free memory moves).
    let live_params = model_params.clone().n_gpu_layers(planner.n_gpu_layers() as i32);
    let live_model = if args.live { Some(Model::load(&path, &live_params)?) } else { None };

    let mut rows = Vec::new();
    let mut plan_ms = Vec::new();
    for &n_seq in &args.seqs {
        for &n_ctx in &args.ctx {
            for &kv in &args.kv {
                let params = base.clone().n_ctx(n_ctx).n_seq_max(n_seq).kv_type(kv);
                let t = Instant::now();
                let memory = planner.plan(&params).map(|p| p.memory);
                plan_ms.push(t.elapsed().as_secs_f64() * 1e3);
                let analytic_kv = shape.as_ref().ok().map(|s| s.kv_bytes(&params));
                let live = live_model.as_ref().map(|m| m.new_context(&params).and_then(|mut c| c.memory_breakdown()));
                rows.push(Row { n_ctx, n_seq, kv, memory, analytic_kv, live });
            }
        }
    }
    let after = rss_kib();

    let fits: Vec<(u32, Result<llamacpp::plan::Fit, llamacpp::Error>)> = match args.budget {
        Some(bytes) => args
            .seqs
            .iter()
            .map(|&n_seq| {
                (n_seq, planner.fit_kv(&base, &MemoryBudget::total(bytes), FitGoal::MaxContext { n_seq }, &args.kv))
            })
            .collect(),
        None => Vec::new(),
    };

    let layer_fit = args.device_budget.as_ref().map(|budget| Planner::fit_layers(&path, &model_params, &first, budget));

    if args.json {
        let mut objects: Vec<serde_json::Value> = rows.iter().map(row_json).collect();
        if let Some(f) = &layer_fit {
            objects.push(match f {
                Ok(f) => serde_json::json!({"fit_layers": true, "n_gpu_layers": f.n_gpu_layers, "capped": f.capped,
                    "devices": devices_json(&f.plan.memory)}),
                Err(e) => serde_json::json!({"fit_layers": true, "error": e.to_string()}),
            });
        }
        for (n_seq, f) in &fits {
            objects.push(match f {
                Ok(f) => {
                    let m = &f.plan.memory;
                    serde_json::json!({
                        "fit": true, "budget_bytes": args.budget, "capped": f.capped,
                        "n_ctx": f.plan.n_ctx, "n_seq": n_seq, "kv_type": kv_name(f.kv_type),
                        "weights_bytes": m.weights(), "kv_bytes": m.kv(), "compute_bytes": m.compute(),
                        "total_bytes": m.total(),
                    })
                }
                Err(e) => serde_json::json!({"fit": true, "budget_bytes": args.budget, "n_seq": n_seq, "error": e.to_string()}),
            });
        }
        println!("{}", serde_json::to_string_pretty(&objects)?);
    } else {
        println!("model: {}", path.display());
        if let Ok(s) = &shape {
            let kinds: Vec<String> = s
                .weights
                .iter()
                .map(|w| format!("{} {:.2} MiB ({} tensors)", w.ggml_type, mib(w.bytes), w.tensors))
                .collect();
            println!(
                "weights in the file: {:.2} MiB, {:.1} M parameters: {}",
                mib(s.weights_bytes()),
                s.n_params() as f64 / 1e6,
                kinds.join(", ")
            );
            println!(
                "the same parameters as F16 {:.2} MiB, Q8_0 {:.2} MiB, Q4_K {:.2} MiB",
                mib(s.weights_as(WeightType::F16)),
                mib(s.weights_as(WeightType::Q8_0)),
                mib(s.weights_as(WeightType::Q4K))
            );
        }
        let mut sorted = plan_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
        match (before, after) {
            (Some((rss0, _)), Some((rss1, peak))) => println!(
                "planner: metadata loaded in {load_ms:.0} ms, {} plans (median {median:.1} ms); RSS {:.1} MiB before, \
                 {:.1} MiB after, peak {:.1} MiB",
                plan_ms.len(),
                rss0 as f64 / 1024.0,
                rss1 as f64 / 1024.0,
                peak as f64 / 1024.0
            ),
            _ => {
                println!("planner: metadata loaded in {load_ms:.0} ms, {} plans (median {median:.1} ms)", plan_ms.len())
            }
        }
        println!();
        let live_cols = if args.live { "   live MiB  live-plan B" } else { "" };
        println!(
            "{:>7} {:>5} {:>6} {:>12} {:>10} {:>12} {:>11} {:>14}{live_cols}",
            "n_ctx", "seqs", "kv", "weights MiB", "KV MiB", "compute MiB", "total MiB", "analytic KV B"
        );
        for r in &rows {
            match &r.memory {
                Ok(m) => {
                    let analytic = r.analytic_kv.map_or("-".to_owned(), |a| {
                        if a == m.kv() { "= plan".to_owned() } else { format!("{:+}", a as i128 - m.kv() as i128) }
                    });
                    let live = match &r.live {
                        Some(Ok(l)) => {
                            format!(" {:>10.2} {:>12}", mib(l.total()), l.total() as i128 - m.total() as i128)
                        }
                        Some(Err(e)) => format!("  live: {e}"),
                        None => String::new(),
                    };
                    println!(
                        "{:>7} {:>5} {:>6} {:>12.2} {:>10.2} {:>12.2} {:>11.2} {:>14}{live}",
                        r.n_ctx,
                        r.n_seq,
                        kv_name(r.kv),
                        mib(m.weights()),
                        mib(m.kv()),
                        mib(m.compute()),
                        mib(m.total()),
                        analytic
                    );
                }
                Err(e) => println!("{:>7} {:>5} {:>6}  {e}", r.n_ctx, r.n_seq, kv_name(r.kv)),
            }
        }
        if let Some(Ok(first)) = rows.first().map(|r| &r.memory) {
            println!();
            println!("per device (first row, {} layers offloaded):", planner.n_gpu_layers());
            for d in first.devices() {
                println!(
                    "  {:<24} weights {:>9.2} MiB  KV {:>9.2} MiB  compute {:>9.2} MiB  total {:>9.2} MiB",
                    d.device,
                    mib(d.weights),
                    mib(d.kv),
                    mib(d.compute),
                    mib(d.total())
                );
            }
            println!("per buffer (first row):");
            for b in &first.buffers {
                println!(
                    "  {:<12} on {:<6} weights {:>9.2} MiB  KV {:>9.2} MiB  compute {:>9.2} MiB",
                    b.buffer,
                    b.device,
                    mib(b.weights),
                    mib(b.kv),
                    mib(b.compute)
                );
            }
        }
    }

    if let (Some(f), false) = (&layer_fit, args.json) {
        println!();
        match f {
            Ok(f) => {
                println!(
                    "layers that fit the device budgets (first configuration): {}{}",
                    f.n_gpu_layers,
                    if f.capped { " (all of them)" } else { "" }
                );
                for d in f.plan.memory.devices() {
                    println!("  {:<24} total {:>9.2} MiB", d.device, mib(d.total()));
                }
            }
            Err(e) => println!("layers that fit the device budgets: {e}"),
        }
    }

    if let (Some(bytes), false) = (args.budget, args.json) {
        {
            println!();
            println!("fit within {:.2} MiB:", mib(bytes));
            for (n_seq, f) in &fits {
                match f {
                    Ok(f) => println!(
                        "  {n_seq:>3} sequence(s): n_ctx {} ({} per sequence), KV {}, total {:.2} MiB{}",
                        f.plan.n_ctx,
                        f.plan.n_ctx / f.plan.n_seq_max.max(1),
                        kv_name(f.kv_type),
                        mib(f.plan.memory.total()),
                        if f.capped { " (capped at the training length)" } else { "" }
                    ),
                    Err(e) => println!("  {n_seq:>3} sequence(s): {e}"),
                }
            }
        }
    }
    Ok(())
}

fn row_json(r: &Row) -> serde_json::Value {
    let mut o = serde_json::json!({"n_ctx": r.n_ctx, "n_seq": r.n_seq, "kv_type": kv_name(r.kv)});
    match &r.memory {
        Ok(m) => {
            o["weights_bytes"] = m.weights().into();
            o["kv_bytes"] = m.kv().into();
            o["compute_bytes"] = m.compute().into();
            o["total_bytes"] = m.total().into();
            o["devices"] = devices_json(m);
            if let Some(a) = r.analytic_kv {
                o["analytic_kv_bytes"] = a.into();
            }
            if let Some(Ok(l)) = &r.live {
                o["live_total_bytes"] = l.total().into();
            }
        }
        Err(e) => o["error"] = e.to_string().into(),
    }
    o
}

fn devices_json(memory: &MemoryBreakdown) -> serde_json::Value {
    memory
        .devices()
        .iter()
        .map(|d| {
            serde_json::json!({"device": d.device, "buffers": d.buffer, "weights_bytes": d.weights,
                "kv_bytes": d.kv, "compute_bytes": d.compute})
        })
        .collect()
}
