//! The memory plan (`llamacpp::plan`): llama.cpp's no_alloc plan against what
//! a live context really allocates, the analytic formulas against both,
//! budget fitting, and bad files. On the synthetic models and on the
//! default model (which these tests need: without it they fail).

use std::path::{Path, PathBuf};
use std::process::Command;

use llama_suite::synthetic::{TinyModelSpec, tiny_llama_path, tiny_mamba_path};
use llamacpp::engine::{Engine, EngineConfig};
use llamacpp::plan::analytic::{ModelShape, WeightType};
use llamacpp::plan::{FitGoal, HOST, MemoryBudget, MemoryPlan, Planner};
use llamacpp::{ContextParams, Error, FlashAttention, KvType, LoadMode, Model, ModelParams};

/// Loaded without mmap: then llama.cpp's weight buffers are exactly the
/// tensors' allocation sizes, which is what the plan counts. (A
/// memory-mapped model's CPU buffer is the mapped file range instead:
/// see `mapped_weights_count_the_file_range`.)
fn read_params() -> ModelParams {
    ModelParams::default().load_mode(LoadMode::Read)
}

/// The synthetic model with 32-wide heads, so that a q8_0 cache (blocks
/// of 32) fits its rows.
fn tiny() -> PathBuf {
    tiny_llama_path(&TinyModelSpec { n_embd: 128, ..TinyModelSpec::default() }).unwrap()
}

fn real() -> PathBuf {
    llama_suite::model_cache::model_path().unwrap_or_else(|e| panic!("the default model is needed: {e}"))
}

/// Six and more configurations: sizes, sequences (unified or not), KV
/// types, flash attention on/off, a windowed sliding-window cache.
fn configurations() -> Vec<(&'static str, ContextParams)> {
    let base = ContextParams::default().n_threads(1).n_batch(512).n_ubatch(512);
    vec![
        ("256 cells f16", base.clone().n_ctx(256)),
        ("1024 cells f16", base.clone().n_ctx(1024)),
        ("2048 cells q8_0", base.clone().n_ctx(2048).kv_type(KvType::Q8_0)),
        ("2048 cells, 4 streams", base.clone().n_ctx(2048).n_seq_max(4)),
        ("2048 cells, 4 unified", base.clone().n_ctx(2048).n_seq_max(4).kv_unified(true)),
        ("1024 cells, flash attention off", base.clone().n_ctx(1024).flash_attention(FlashAttention::Off)),
        ("1024 cells, flash attention on", base.clone().n_ctx(1024).flash_attention(FlashAttention::On)),
        ("2048 cells, sliding window not full", base.clone().n_ctx(2048).swa_full(false)),
        ("1024 cells, q8_0 K, f16 V, ubatch 128", base.clone().n_ctx(1024).type_k(KvType::Q8_0).n_ubatch(128)),
    ]
}

/// For each configuration: the plan equals the live context's breakdown
/// buffer by buffer, byte for byte, and the analytic KV equals both.
fn plan_equals_live(path: &Path) {
    let planner = Planner::new(path, &ModelParams::default()).unwrap();
    let model = Model::load(path, &read_params()).unwrap();
    let shape = ModelShape::read(path).unwrap();
    for (name, params) in configurations() {
        let plan = planner.plan(&params).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut ctx = model.new_context(&params).unwrap_or_else(|e| panic!("{name}: {e}"));
        let live = ctx.memory_breakdown().unwrap();
        assert_eq!(plan.memory, live, "{name}: plan vs live");
        assert_eq!(plan.n_ctx, ctx.n_ctx(), "{name}");
        assert!(plan.memory.weights() > 0 && plan.memory.kv() > 0 && plan.memory.compute() > 0, "{name}: {plan:?}");
        assert_eq!(shape.kv_bytes(&params), plan.memory.kv(), "{name}: analytic KV vs llama.cpp");
        assert_eq!(shape.cells(&params).n_ctx_seq, ctx.n_ctx_seq(), "{name}: analytic cells per sequence");
    }
}

#[test]
fn synthetic_plan_equals_live_context_and_formula() {
    plan_equals_live(&tiny());
}

#[test]
fn default_model_plan_equals_live_context_and_formula() {
    plan_equals_live(&real());
}

#[test]
fn default_model_plan_matches_llama_cpp_own_log() {
    // llama-completion -v (n_ctx 8192, 1 sequence, f16, windowed SWA cache)
    // logs: KV 24.00 MiB (3 global layers × 8192 cells) + 15.00 MiB (15
    // sliding layers × 1024 cells), compute 514.50 MiB, CPU_REPACK 12.66 MiB.
    let planner = Planner::new(real(), &ModelParams::default()).unwrap();
    let plan = planner.plan(&ContextParams::default().n_ctx(8192).n_batch(2048).swa_full(false)).unwrap();
    let mib = 1024 * 1024;
    assert_eq!(plan.memory.kv(), 39 * mib);
    assert_eq!((plan.memory.compute() as f64 / mib as f64 * 100.0).round(), 51450.0);
    // The repacked weights need AVX2 kernels (the native build here, or
    // the variant runtime dispatch picks here); baseline x86-64 has none.
    let repack = plan.memory.buffer("CPU_REPACK");
    assert_eq!(repack.is_some(), repacks(), "a CPU_REPACK buffer exactly with AVX2 kernels: {plan:?}");
    if let Some(repack) = repack {
        assert_eq!(repack.device, HOST);
        assert_eq!((repack.weights as f64 / mib as f64 * 100.0).round(), 1266.0);
    }
    assert_eq!((plan.memory.weights() as f64 / mib as f64 * 100.0).round(), 23516.0);
    let shape = planner.shape().unwrap();
    let cells = shape.cells(&ContextParams::default().n_ctx(8192).n_batch(2048).swa_full(false));
    assert_eq!((cells.full, cells.sliding), (8192, 1024));
    assert_eq!(shape.layers.len(), 18);
    assert_eq!(shape.layers.iter().filter(|l| l.sliding_window).count(), 15);
}

#[test]
fn kv_grows_linearly_and_q8_0_is_34_64ths_of_f16() {
    for path in [tiny(), real()] {
        let planner = Planner::new(&path, &ModelParams::default()).unwrap();
        let shape = ModelShape::read(&path).unwrap();
        let base = ContextParams::default().n_threads(1).n_batch(512);
        let kv = |p: ContextParams| planner.plan(&p).unwrap().memory.kv();
        // Cells: twice the context, twice the KV.
        let k1 = kv(base.clone().n_ctx(1024));
        assert_eq!(kv(base.clone().n_ctx(2048)), 2 * k1);
        assert_eq!(kv(base.clone().n_ctx(4096)), 4 * k1);
        // Sequences of 1024 cells each: n sequences, n times the KV.
        for n in [2u32, 4, 8] {
            assert_eq!(kv(base.clone().n_ctx(1024 * n).n_seq_max(n)), u64::from(n) * k1, "{n} streams");
            assert_eq!(kv(base.clone().n_ctx(1024 * n).n_seq_max(n).kv_unified(true)), u64::from(n) * k1);
        }
        // q8_0 stores 32 elements in 34 bytes, f16 in 64.
        let f16 = base.clone().n_ctx(2048);
        let q8 = f16.clone().kv_type(KvType::Q8_0);
        assert_eq!(shape.kv_bytes(&q8) * 64, shape.kv_bytes(&f16) * 34, "{}", path.display());
        assert_eq!(kv(q8) * 64, kv(f16) * 34);
    }
}

#[test]
fn recurrent_state_is_fixed_per_sequence() {
    let path = tiny_mamba_path(&TinyModelSpec::default()).unwrap();
    let planner = Planner::new(&path, &ModelParams::default()).unwrap();
    let shape = ModelShape::read(&path).unwrap();
    let r = shape.recurrent.expect("a recurrent shape");
    assert!(r.conv > 0 && r.ssm > 0);
    let model = Model::load(&path, &read_params()).unwrap();
    for (n_ctx, n_seq) in [(256u32, 1u32), (4096, 1), (1024, 4)] {
        let params = ContextParams::default().n_threads(1).n_ctx(n_ctx).n_seq_max(n_seq).n_batch(512);
        let plan = planner.plan(&params).unwrap();
        assert_eq!(shape.kv_bytes(&params), plan.memory.kv(), "n_ctx {n_ctx}, {n_seq} seqs");
        let live = model.new_context(&params).unwrap().memory_breakdown().unwrap();
        assert_eq!(plan.memory, live);
    }
    let state =
        |n_ctx, n_seq| planner.plan(&ContextParams::default().n_ctx(n_ctx).n_seq_max(n_seq)).unwrap().memory.kv();
    assert_eq!(state(256, 1), state(4096, 1), "the state does not grow with the context");
    assert_eq!(state(1024, 4), 4 * state(1024, 1), "one state per sequence");
}

#[test]
fn weights_by_type_add_up_and_quantization_saves() {
    let path = real();
    let shape = ModelShape::read(&path).unwrap();
    let planner = Planner::new(&path, &ModelParams::default()).unwrap();
    let plan = planner.plan(&ContextParams::default().n_ctx(256)).unwrap();
    // 268 M parameters; every tensor of the file is loaded, each padded to
    // 32 bytes at most.
    assert_eq!(shape.n_params() / 1_000_000, 268);
    let n_tensors: usize = shape.weights.iter().map(|w| w.tensors).sum();
    let file = shape.weights_bytes();
    assert!(plan.memory.weights() >= file && plan.memory.weights() - file <= 32 * n_tensors as u64, "{plan:?}");
    let model = Model::load(&path, &ModelParams::default().load_mode(LoadMode::Read)).unwrap();
    assert_eq!(model.size(), file, "llama_model_size counts the same tensor bytes");
    // F16 is 16 bits per parameter, Q8_0 8.5, Q4_K 4.5; this Q4_K_M file
    // (mostly Q8_0 and Q5_0 here: the 262k-token embedding is Q8_0) lies
    // between Q4_K and Q8_0.
    let (f16, q8, q4) =
        (shape.weights_as(WeightType::F16), shape.weights_as(WeightType::Q8_0), shape.weights_as(WeightType::Q4K));
    assert_eq!(f16, shape.n_params() * 2);
    // Within one block of rounding up.
    assert!((q8 * 64).abs_diff(f16 * 34) < 64 * 34, "{q8} {f16}");
    assert!((q4 * 512).abs_diff(f16 * 144) < 512 * 144, "{q4} {f16}");
    assert!(q4 < file && file < q8, "{q4} < {file} < {q8}");
}

/// Whether the CPU kernels in use repack Q4_K weights: ggml's x86 repack
/// needs AVX2, which the system info names for the kernels that run (the
/// native build's, or the variant runtime dispatch chose).
fn repacks() -> bool {
    llamacpp::system_info().split('|').any(|p| p.trim().ends_with("AVX2 = 1"))
}

#[test]
fn mapped_weights_count_the_file_range() {
    // With mmap the CPU weights buffer is the mapped range of the file,
    // which still holds the tensors that were repacked into CPU_REPACK:
    // those are counted twice, everything else is the same (within the
    // alignment gaps of the file).
    let path = real();
    let planner = Planner::new(&path, &ModelParams::default()).unwrap();
    let params = ContextParams::default().n_threads(1).n_ctx(1024);
    let plan = planner.plan(&params).unwrap().memory;
    let model = Model::load(&path, &ModelParams::default().load_mode(LoadMode::Mmap)).unwrap();
    let live = model.new_context(&params).unwrap().memory_breakdown().unwrap();
    // 0 with baseline kernels, which repack nothing.
    let repack = plan.buffer("CPU_REPACK").map_or(0, |b| b.weights);
    assert_eq!(repack > 0, repacks());
    assert_eq!((live.kv(), live.compute()), (plan.kv(), plan.compute()));
    let extra = live.weights() - plan.weights();
    assert!(extra >= repack && extra - repack < 64 * 1024, "mapped {extra} more bytes, {repack} repacked");
}

fn assert_fits(planner: &Planner, base: &ContextParams, budget: u64, goal: FitGoal) -> MemoryPlan {
    let fit = planner.fit(base, &MemoryBudget::total(budget), goal).unwrap();
    assert!(!fit.capped, "{goal:?}: capped");
    assert!(fit.plan.memory.total() <= budget, "{goal:?}: {} > {budget}", fit.plan.memory.total());
    let up = match goal {
        FitGoal::MaxContext { n_seq } => base.clone().n_ctx(fit.plan.n_ctx + 256).n_seq_max(n_seq),
        FitGoal::MaxSequences { n_ctx_seq } => {
            let n = fit.plan.n_seq_max + 1;
            base.clone().n_ctx(n_ctx_seq * n).n_seq_max(n)
        }
    };
    let next = planner.plan(&up).unwrap();
    assert!(next.memory.total() > budget, "{goal:?}: the next step up ({up:?}) also fits");
    fit.plan
}

#[test]
fn fit_finds_the_largest_configuration_within_the_budget() {
    let planner = Planner::new(real(), &ModelParams::default()).unwrap();
    let base = ContextParams::default().n_batch(512).kv_unified(true);
    let mib = 1024 * 1024;
    let one = assert_fits(&planner, &base, 1024 * mib, FitGoal::MaxContext { n_seq: 1 });
    // 235 MiB weights + 514.5 compute leave ~274 MiB: 18 layers × 1 KiB
    // per cell (f16) → 15,360 cells (a multiple of 256).
    assert_eq!(one.n_ctx, 15_360);
    let four = assert_fits(&planner, &base, 1024 * mib, FitGoal::MaxContext { n_seq: 4 });
    assert!(four.n_ctx <= one.n_ctx);
    let q8 = assert_fits(&planner, &base.clone().kv_type(KvType::Q8_0), 1024 * mib, FitGoal::MaxContext { n_seq: 1 });
    assert!(q8.n_ctx > one.n_ctx * 18 / 10, "q8_0 holds ~1.88× the cells: {} vs {}", q8.n_ctx, one.n_ctx);
    let seqs = assert_fits(&planner, &base, 1024 * mib, FitGoal::MaxSequences { n_ctx_seq: 2048 });
    assert_eq!(seqs.n_seq_max, 7);
    // A host budget on a CPU-only run is the same as a total one.
    let host = planner.fit(&base, &MemoryBudget::host(1024 * mib), FitGoal::MaxContext { n_seq: 1 }).unwrap();
    assert_eq!(host.plan.n_ctx, one.n_ctx);
}

#[test]
fn fit_on_the_synthetic_model_and_kv_type_choice() {
    let planner = Planner::new(tiny(), &ModelParams::default()).unwrap();
    let base = ContextParams::default().n_batch(256).n_ubatch(256);
    let smallest = planner.plan(&base.clone().n_ctx(256)).unwrap().memory.total();
    // Below the training length (2048): the budget, not the cap, stops it.
    let budget = planner.plan(&base.clone().n_ctx(1024)).unwrap().memory.total() + 1;
    let fit = assert_fits(&planner, &base, budget, FitGoal::MaxContext { n_seq: 1 });
    assert_eq!(fit.n_ctx, 1024);
    assert_fits(&planner, &base, budget, FitGoal::MaxSequences { n_ctx_seq: 256 });
    // A budget that only the q8_0 cache fits at the smallest size.
    let q8 = planner.plan(&base.clone().n_ctx(256).kv_type(KvType::Q8_0)).unwrap().memory.total();
    assert!(q8 < smallest);
    let fit = planner
        .fit_kv(&base, &MemoryBudget::total(q8), FitGoal::MaxContext { n_seq: 1 }, &[KvType::F16, KvType::Q8_0])
        .unwrap();
    assert_eq!((fit.kv_type, fit.plan.n_ctx), (KvType::Q8_0, 256));
    match planner.fit_kv(
        &base,
        &MemoryBudget::total(q8 - 1),
        FitGoal::MaxContext { n_seq: 1 },
        &[KvType::F16, KvType::Q8_0],
    ) {
        Err(Error::DoesNotFit { needed, budget, detail, .. }) => {
            assert_eq!((needed, budget), (q8, q8 - 1));
            assert!(detail.contains("smallest configuration"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn nothing_fits_says_which_part() {
    let planner = Planner::new(real(), &ModelParams::default()).unwrap();
    let base = ContextParams::default();
    let weights = planner.plan(&base.clone().n_ctx(256)).unwrap().memory.weights();
    match planner.fit(&base, &MemoryBudget::total(100 * 1024 * 1024), FitGoal::MaxContext { n_seq: 1 }) {
        Err(e @ Error::DoesNotFit { .. }) => assert!(e.to_string().contains("the weights alone need 235.1"), "{e}"),
        other => panic!("{other:?}"),
    }
    match planner.fit(&base, &MemoryBudget::host(weights + 1), FitGoal::MaxContext { n_seq: 1 }) {
        Err(e @ Error::DoesNotFit { .. }) => {
            let text = e.to_string();
            assert!(text.starts_with("does not fit on Host: at the smallest configuration (n_ctx 256"), "{text}");
            // 256 cells clamp the micro-batch to 256 tokens: half the
            // compute buffer of 512.
            assert!(text.contains("compute 257.25 MiB"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        planner.fit(&base, &MemoryBudget::total(1 << 40), FitGoal::MaxContext { n_seq: 0 }),
        Err(Error::InvalidArgument(_))
    ));
    // A budget beyond the training length: capped, not a failure.
    let capped = planner.fit(&base, &MemoryBudget::total(1 << 40), FitGoal::MaxContext { n_seq: 1 }).unwrap();
    assert!(capped.capped);
    assert_eq!(capped.plan.n_ctx, planner.n_ctx_train());
}

#[test]
fn planner_for_a_loaded_model_plans_the_same() {
    let path = tiny();
    let model = Model::load(&path, &ModelParams::default()).unwrap();
    let a = Planner::for_model(&model).unwrap();
    let b = Planner::new(&path, &ModelParams::default()).unwrap();
    let params = ContextParams::default().n_ctx(1024).n_seq_max(2);
    assert_eq!(a.plan(&params).unwrap(), b.plan(&params).unwrap());
    assert_eq!(a.path(), path.as_path());
}

#[test]
fn engine_sizes_its_pool_from_a_memory_budget() {
    let path = tiny();
    let model = std::sync::Arc::new(Model::load(&path, &ModelParams::default()).unwrap());
    let config = EngineConfig::default().n_threads(1).max_running(4).max_cached_prefixes(4);
    let planner = Planner::for_model(&model).unwrap();
    let pool_params = |cells: u32| {
        ContextParams::default().n_ctx(cells).n_batch(512).n_ubatch(512).n_seq_max(8).kv_unified(true).swa_full(true)
    };
    let budget = planner.plan(&pool_params(4096)).unwrap().memory.total() + 1000;
    let engine = Engine::start(model.clone(), config.clone().memory_budget(budget)).unwrap();
    assert_eq!(engine.pool_cells(), 4096);
    engine.shutdown();
    // The admission reserve is checked against the pool the budget gives,
    // not the default n_ctx (4096).
    let budget = planner.plan(&pool_params(8192)).unwrap().memory.total() + 1000;
    let engine = Engine::start(model.clone(), config.clone().admission_reserve(5000).memory_budget(budget)).unwrap();
    assert_eq!(engine.pool_cells(), 8192);
    engine.shutdown();
    match Engine::start(model.clone(), config.clone().admission_reserve(9000).memory_budget(budget)) {
        Err(Error::InvalidParameter { name: "admission_reserve", message }) => {
            assert!(message.contains("9000 exceeds the pool of 8192"), "{message}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a reserve above the pool was accepted"),
    }
    let small = planner.plan(&pool_params(256)).unwrap().memory.total();
    match Engine::start(model, config.memory_budget(small - 1)) {
        Err(Error::DoesNotFit { .. }) => {}
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a budget below 256 cells started an engine"),
    }
}

#[test]
fn bad_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    assert!(matches!(Planner::new(&missing, &ModelParams::default()), Err(Error::Io { .. })));
    assert!(matches!(ModelShape::read(&missing), Err(Error::Io { .. })));
    let text = dir.path().join("notes.gguf");
    std::fs::write(&text, "this is not a model, only some text that is long enough").unwrap();
    for r in [Planner::new(&text, &ModelParams::default()).map(|_| ()), ModelShape::read(&text).map(|_| ())] {
        assert!(matches!(r, Err(Error::ModelLoad { .. })), "{r:?}");
    }
    // A real model cut in the middle of its tensor data and in its header.
    let bytes = std::fs::read(tiny()).unwrap();
    for cut in [bytes.len() / 2, 200] {
        let truncated = dir.path().join(format!("cut-{cut}.gguf"));
        std::fs::write(&truncated, &bytes[..cut]).unwrap();
        let r = Planner::new(&truncated, &ModelParams::default());
        assert!(matches!(r, Err(Error::ModelLoad { .. })), "cut at {cut}: {r:?}");
    }
    assert!(matches!(Planner::new(dir.path(), &ModelParams::default()), Err(Error::ModelLoad { .. })));
}

#[test]
fn a_simulated_model_is_never_decoded() {
    // The planner's model has no tensor data; only plans come out of it.
    // Parameters a context refuses are refused by the plan the same way.
    let planner = Planner::new(tiny(), &ModelParams::default()).unwrap();
    for bad in [ContextParams::default().n_seq_max(0), ContextParams::default().n_seq_max(300)] {
        assert!(matches!(planner.plan(&bad), Err(Error::InvalidParameter { name: "n_seq_max", .. })));
    }
    let quantized_v = ContextParams::default().kv_type(KvType::Q8_0).flash_attention(FlashAttention::Off);
    assert!(matches!(planner.plan(&quantized_v), Err(Error::ContextCreate(_))));
}

/// The path of an example `cargo test` built beside this binary.
pub(crate) fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join("examples").join(name);
    assert!(path.exists(), "{} is built by `cargo test`", path.display());
    path
}

#[test]
fn plan_example_prints_json_and_refuses_bad_arguments() {
    let out = Command::new(example("plan"))
        .args(["--model"])
        .arg(tiny())
        .args(["--ctx", "512,1024", "--seqs", "1,2", "--kv", "f16,q8_0", "--json", "--budget", "64MiB"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let plans: Vec<&serde_json::Value> = rows.iter().filter(|r| r.get("fit").is_none()).collect();
    assert_eq!(plans.len(), 8);
    for r in &plans {
        let get = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
        assert_eq!(get("weights_bytes") + get("kv_bytes") + get("compute_bytes"), get("total_bytes"));
        assert_eq!(get("kv_bytes"), get("analytic_kv_bytes"));
        assert!(["f16", "q8_0"].contains(&r["kv_type"].as_str().unwrap()));
    }
    assert_eq!(rows.len(), 10, "two fit answers follow the plans");
    for bad in [vec!["--ctx", "abc"], vec!["--kv", "q9"], vec!["--budget", "2TiB"], vec!["--seqs", "0"], vec!["--nope"]]
    {
        let out = Command::new(example("plan")).args(&bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{bad:?}: {err}");
        assert!(err.starts_with("plan: "), "{err}");
    }
    let out = Command::new(example("plan")).args(["--model", "/nonexistent.gguf"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.gguf"));
}
