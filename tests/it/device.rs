//! The device tier (features `vulkan` and `cuda`): the default model on the
//! first GPU device, checked against the CPU. In CI that device is Mesa's
//! lavapipe (Vulkan on the CPU, `GGML_VK_VISIBLE_DEVICES=0`); on a GPU
//! machine it is the GPU. Without a GPU device these tests fail: a build
//! with a GPU feature asked for one.
//!
//! lavapipe is slow (a few tokens per second) and compiles every shader
//! pipeline on first use, so the tests share one loaded model per
//! placement and generate few tokens.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use llama_suite::teacher::rescore;
use llamacpp::embed::{EmbedParams, Embedder, cosine_similarity};
use llamacpp::engine::{Engine, EngineConfig, Request};
use llamacpp::plan::{FitGoal, HOST, MemoryBudget, Planner};
use llamacpp::{
    AddBos, ContextParams, Device, DeviceKind, Error, GpuLayers, LoadMode, Model, ModelParams, Pooling, Token,
};

use crate::engine::real::copy_task;

/// As the engine's real-model tests: the largest distance of a chosen
/// token's logit below the best one in the CPU's re-scoring.
const MARGIN: f32 = 1.0;

/// Gemma 3 270M has 18 layers: 9 is half.
const HALF: i32 = 9;

fn path() -> PathBuf {
    llama_suite::model_cache::model_path().unwrap_or_else(|e| panic!("the real model is needed: {e}"))
}

/// The first GPU device (discrete or integrated).
fn gpu() -> Device {
    let devices = llamacpp::devices();
    devices.iter().find(|d| matches!(d.kind, DeviceKind::Gpu | DeviceKind::IntegratedGpu)).cloned().unwrap_or_else(
        || {
            panic!(
                "no GPU device among {:?}: on a machine without a GPU, a `vulkan` build runs on Mesa's lavapipe \
                 with GGML_VK_VISIBLE_DEVICES=0 (docs/gpu.md)",
                devices.iter().map(|d| (&d.name, d.kind)).collect::<Vec<_>>()
            )
        },
    )
}

/// Read, not mapped: the host part of the weights is then exactly the
/// tensors' sizes, as the plan counts them.
fn on_gpu(layers: i32) -> ModelParams {
    ModelParams::default().n_gpu_layers(layers).load_mode(LoadMode::Read)
}

fn cpu_model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| Model::load(path(), &ModelParams::default().n_gpu_layers(0)).unwrap())
}

/// Every layer on the GPU.
fn gpu_model() -> Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    MODEL.get_or_init(|| Arc::new(Model::load(path(), &on_gpu(99)).unwrap())).clone()
}

fn tokens(text: &str) -> Vec<Token> {
    cpu_model().vocab().tokenize(text, AddBos::Yes).unwrap()
}

/// Greedy tokens after `prompt`, one decode per token.
fn greedy(model: &Model, prompt: &[Token], n: usize) -> Vec<Token> {
    llama_suite::teacher::greedy(model, &ContextParams::default().n_ctx(256).n_threads(2), prompt, n).unwrap()
}

/// Weights on `device` and on the host in a context of `model`.
fn weights(model: &Model, device: &str) -> (u64, u64) {
    let mut ctx = model.new_context(&ContextParams::default().n_ctx(256).n_threads(2)).unwrap();
    let devices = ctx.memory_breakdown().unwrap().devices();
    let on = |name: &str| devices.iter().filter(|d| d.device == name).map(|d| d.weights).sum::<u64>();
    (on(device), on(HOST))
}

#[test]
fn the_gpu_is_listed_with_its_memory_beside_the_dispatched_cpu() {
    let gpu = gpu();
    // A GPU build keeps runtime CPU dispatch (x86-64 Linux without
    // `native`): the CPU device is still listed, running a chosen variant.
    if cfg!(all(target_arch = "x86_64", target_os = "linux", not(feature = "native"))) {
        let variant = llamacpp::cpu_variant();
        assert!(variant.is_some() && llamacpp::cpu_variants().len() > 1, "{variant:?}");
    }
    assert!(llamacpp::devices().iter().any(|d| d.kind == DeviceKind::Cpu));
    let backend = if cfg!(feature = "cuda") { "CUDA" } else { "Vulkan" };
    assert!(gpu.name.starts_with(backend), "{gpu:?}");
    assert!(gpu.memory_total > 0 && gpu.memory_free > 0 && gpu.memory_free <= gpu.memory_total, "{gpu:?}");
    eprintln!(
        "{} ({}): {:.1} of {:.1} GiB free",
        gpu.name,
        gpu.description,
        gpu.memory_free as f64 / f64::from(1 << 30),
        gpu.memory_total as f64 / f64::from(1 << 30)
    );
}

#[test]
fn greedy_on_the_gpu_and_split_in_half_passes_the_teacher_forced_check() {
    let device = gpu().name;
    let prompt = tokens("The Eiffel Tower is located in the city of");
    let half = Model::load(path(), &on_gpu(HALF)).unwrap();
    // The layers went where they were sent: more on the device with all of
    // them there, more on the host with half.
    let (all_device, all_host) = weights(&gpu_model(), &device);
    let (half_device, half_host) = weights(&half, &device);
    eprintln!("weights on {device} / host: all layers {all_device} / {all_host}, half {half_device} / {half_host}");
    assert!(half_device > 0 && all_device > half_device && half_host > all_host, "{device}");
    for (what, model) in [("all layers", &*gpu_model()), ("half the layers", &half)] {
        let generated = greedy(model, &prompt, 16);
        let check = rescore(cpu_model(), &prompt, &generated).unwrap();
        let text = cpu_model().vocab().decode(&generated).unwrap();
        eprintln!("{what} on {device}: {text:?}, worst gap {}", check.worst());
        assert!(check.worst() <= MARGIN, "{what}: {text:?} gaps {:?}", check.gaps);
        assert!(text.contains("Paris"), "{what}: {text:?}");
        // The check can fail: the same tokens one position early.
        let shifted = rescore(cpu_model(), &prompt, &generated[1..]).unwrap();
        assert!(shifted.worst() > 5.0 * MARGIN, "{what}: a shifted stream passes: {:?}", shifted.gaps);
    }
}

#[test]
fn the_plan_per_device_equals_the_live_context_and_fit_names_the_device() {
    let device = gpu().name;
    let planner = Planner::new(path(), &on_gpu(99)).unwrap();
    let base = ContextParams::default().n_threads(2).n_batch(512).n_ubatch(512);
    let model = gpu_model();
    for params in [base.clone().n_ctx(512), base.clone().n_ctx(2048).n_seq_max(2)] {
        let plan = planner.plan(&params).unwrap();
        let mut ctx = model.new_context(&params).unwrap();
        let live = ctx.memory_breakdown().unwrap();
        assert_eq!(plan.memory, live, "{params:?}: plan vs live");
        let on_device = live.devices().into_iter().find(|d| d.device == device).expect("buffers on the device");
        assert!(on_device.weights > 0 && on_device.kv > 0 && on_device.compute > 0, "{on_device:?}");
    }

    // A budget on the device: the largest context whose plan stays within
    // it, the next step up (256 cells more) over it.
    let device_bytes = |n_ctx: u32| {
        let plan = planner.plan(&base.clone().n_ctx(n_ctx)).unwrap();
        plan.memory.devices().into_iter().find(|d| d.device == device).unwrap().total()
    };
    let budget = device_bytes(1024);
    let fit =
        planner.fit(&base, &MemoryBudget::host(u64::MAX).device(&device, budget), FitGoal::MaxContext { n_seq: 1 });
    let fit = fit.unwrap();
    assert!(!fit.capped);
    assert!(fit.plan.n_ctx >= 1024, "{}", fit.plan.n_ctx);
    assert!(device_bytes(fit.plan.n_ctx) <= budget);
    assert!(device_bytes(fit.plan.n_ctx + 256) > budget, "the next step up fits too: {}", fit.plan.n_ctx);

    // Not even the weights fit: the error names the device.
    match planner.fit(&base, &MemoryBudget::host(u64::MAX).device(&device, 1 << 20), FitGoal::MaxContext { n_seq: 1 }) {
        Err(Error::DoesNotFit { device: named, budget, .. }) => assert_eq!((named, budget), (device, 1 << 20)),
        other => panic!("{other:?}"),
    }
}

/// Vulkan's first use from many threads at once (docs/gpu.md, "Vulkan's
/// first use"): each run is a fresh process of this binary (a device is
/// set up once per process) whose eight threads, released together, each
/// load the model onto the device, create a context and decode. ggml-vulkan
/// sets a device up without a lock; `llamacpp::init` sets every Vulkan
/// device up first, under its `Once`.
#[test]
fn first_use_of_the_device_from_eight_threads_at_once_is_safe() {
    if std::env::var_os(FIRST_USE_CHILD).is_some() {
        return first_use_from_eight_threads();
    }
    for run in 0..2 {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "device::first_use_of_the_device_from_eight_threads_at_once_is_safe", "--nocapture"])
            .env(FIRST_USE_CHILD, "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "run {run}: {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).lines().rev().take(20).collect::<Vec<_>>().join("\n")
        );
    }
}

const FIRST_USE_CHILD: &str = "LLAMA_TEST_FIRST_USE_CHILD";

fn first_use_from_eight_threads() {
    let barrier = std::sync::Barrier::new(8);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                barrier.wait();
                let model = Model::load(path(), &ModelParams::default().n_gpu_layers(99)).unwrap();
                let mut ctx = model.new_context(&ContextParams::default().n_ctx(256).n_threads(1)).unwrap();
                let prompt = model.vocab().tokenize("The capital of France is", AddBos::Yes).unwrap();
                ctx.decode(&llamacpp::Batch::from_tokens(&prompt, 0)).unwrap();
                assert!(ctx.logits(llamacpp::Output::Last).unwrap().iter().all(|l| l.is_finite()));
            });
        }
    });
}

/// Offload by default: a `vulkan` build's default parameters put every
/// layer on the device when they fit (lavapipe's memory is the host's,
/// gigabytes for this 250 MB model), and a device budget smaller than the
/// model loads the layers the fit chose, whose weights are then on the
/// device, and runs.
#[test]
fn the_default_offloads_every_layer_that_fits_and_a_budget_fewer() {
    let device = gpu().name;
    let ctx = ContextParams::default().n_ctx(512).n_threads(2);
    let default = ModelParams::default().load_mode(LoadMode::Read).fit_context(ctx.clone());
    let all = Model::load(path(), &default).unwrap();
    assert_eq!(all.n_gpu_layers(), all.n_layer() + 1, "every layer and the output layer");
    drop(all);

    // Half the layers' plan on the device as its budget: the fit loads
    // that many, which the live context puts there.
    let plan_of = |layers: i32| Planner::new(path(), &on_gpu(layers)).unwrap().plan(&ctx).unwrap();
    let on_device = |plan: &llamacpp::plan::MemoryPlan| {
        plan.memory.devices().into_iter().find(|d| d.device == device).map_or(0, |d| d.total())
    };
    let budget = on_device(&plan_of(HALF));
    let within = default.clone().gpu_layers(GpuLayers::Within(MemoryBudget::default().device(&device, budget)));
    let half = Model::load(path(), &within).unwrap();
    assert_eq!(half.n_gpu_layers(), HALF as usize);
    let mut live = half.new_context(&ctx).unwrap();
    assert_eq!(live.memory_breakdown().unwrap(), plan_of(HALF).memory, "the plan of the fitted count");
    drop(live);
    assert_eq!(greedy(&half, &tokens("The capital of France is"), 2).len(), 2);
}

#[test]
fn eight_copy_tasks_at_once_on_the_gpu_are_all_right() {
    let engine = Engine::start(gpu_model(), EngineConfig::default().n_ctx(2048).n_threads(2)).unwrap();
    let tasks: Vec<_> = (0..8).map(|i| copy_task(i + 1, 6)).collect();
    let completions: Vec<_> = tasks
        .iter()
        .map(|(prompt, _)| engine.submit(Request::text(prompt.clone()).max_tokens(16).stop(["\n"])).unwrap())
        .collect();
    for (i, (completion, (_, words))) in completions.into_iter().zip(&tasks).enumerate() {
        let out = completion.wait();
        assert_eq!(out.text.trim(), words.join(" "), "copy task {i}");
    }
    let stats = engine.stats();
    assert!(stats.steps < 8 * 16, "the streams ran batched: {stats:?}");
}

#[test]
fn embeddings_on_the_gpu_equal_the_cpus() {
    let texts = ["The cat sat on the mat.", "Paris is the capital of France.", "1 2 3 4 5 6 7 8 9 10"];
    let params = EmbedParams::default().pooling(Pooling::Mean).n_threads(2).n_threads_batch(2);
    let on_cpu = Embedder::new(cpu_model(), &params).unwrap().embed(&texts).unwrap();
    let gpu = gpu_model();
    let on_gpu = Embedder::new(&gpu, &params).unwrap().embed(&texts).unwrap();
    for (i, (a, b)) in on_cpu.iter().zip(&on_gpu).enumerate() {
        let c = cosine_similarity(a, b);
        eprintln!("text {i}: cosine CPU vs GPU {c:.7}");
        assert!(c >= 0.9999, "text {i}: cosine {c}");
    }
    // Different texts stay apart on the GPU (the check can fail).
    assert!(cosine_similarity(&on_gpu[0], &on_gpu[1]) < 0.999);
}
