//! llama.cpp's RPC backend through `llamacpp::rpc` (feature `rpc`, on by
//! default in this workspace, so `cargo test` runs these): workers are the `rpc_server`
//! example started as child processes on 127.0.0.1 and always stopped (by
//! `Drop`, also when a test fails, and by closing their stdin when the test
//! process ends). The model split across workers and the local CPU
//! generates what the all-local model generates: token for token on the
//! synthetic model, within the teacher-forced margin on the default model;
//! per-device memory adds up to the model; a dead or foreign endpoint is an
//! error, not an abort, and so is a worker that dies while a model loads
//! or decodes.
#![cfg(feature = "rpc")]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use llama_suite::synthetic::{TINY_BOS_ID, TinyModelSpec, tiny_llama_path};
use llama_suite::teacher;
use llamacpp::engine::{Engine, EngineConfig, Request};
use llamacpp::plan::{HOST, MemoryBudget, Planner};
use llamacpp::rpc;
use llamacpp::{
    AddBos, Batch, ContextParams, Error, GpuLayers, KvType, LoadMode, Model, ModelParams, Output, Sampler, Token,
};

#[cfg(target_os = "linux")]
unsafe extern "C" {
    /// glibc 2.34+ / Linux 5.9+.
    fn close_range(first: u32, last: u32, flags: i32) -> i32;
}

/// Makes the child close, at exec, every file descriptor it inherits beyond
/// stdio. ggml-rpc opens its sockets without close-on-exec, so a worker
/// started while another test's model holds a connection would inherit
/// that connection and keep it open after this process closes it; a worker
/// serves one client at a time, so the next client of that worker would
/// wait for good (seen here: a load stuck in ggml-rpc's handshake).
fn close_inherited_fds(command: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        const CLOSE_RANGE_CLOEXEC: i32 = 4;
        // SAFETY: the closure runs in the forked child before exec and makes
        // one async-signal-safe system call; marking descriptors
        // close-on-exec (not closing them) keeps the pipe std uses to report
        // a failed exec working.
        unsafe {
            command.pre_exec(|| {
                close_range(3, u32::MAX, CLOSE_RANGE_CLOEXEC);
                Ok(())
            });
        }
    }
}

/// An `rpc_server` child process, killed on drop.
struct Worker {
    child: Child,
    endpoint: String,
}

impl Worker {
    fn start() -> Worker {
        let exe = std::env::current_exe().unwrap();
        let path = exe.parent().unwrap().parent().unwrap().join("examples").join("rpc_server");
        assert!(path.exists(), "{} is built by `cargo build --example rpc_server` (and `cargo test`)", path.display());
        let mut command = Command::new(path);
        close_inherited_fds(&mut command);
        let mut child = command
            // --stop-on-eof: the worker goes with this process, even if
            // it aborts before `Drop` can kill it.
            .args(["--host", "127.0.0.1", "--port", "0", "--threads", "1", "--stop-on-eof"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut worker = Worker { child, endpoint: String::new() };
        // llama.cpp's server prints its banner first.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut line = String::new();
        while worker.endpoint.is_empty() {
            assert!(Instant::now() < deadline, "the worker never said it was listening");
            line.clear();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "the worker exited before listening");
            if let Some(endpoint) = line.trim().strip_prefix("listening on ") {
                worker.endpoint = endpoint.to_owned();
            }
        }
        // Keep draining its output so that it never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        worker
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Greedy tokens after `prompt`, one decode per token.
fn greedy(model: &Model, kv: KvType, prompt: &[Token], n: usize) -> Vec<Token> {
    let params = ContextParams::default().n_ctx(512).n_batch(512).n_threads(2).kv_type(kv);
    llama_suite::teacher::greedy(model, &params, prompt, n).unwrap()
}

/// Weights per RPC worker device of `model` (by `memory_breakdown()`; a
/// worker that holds nothing may be missing), to show that the layers
/// really went where the parameters sent them: were `rpc_servers`,
/// `n_gpu_layers` or `tensor_split` ignored, everything would be local and
/// the equality checks would still hold.
fn worker_weights(model: &Model) -> Vec<u64> {
    let mut ctx = model.new_context(&ContextParams::default().n_ctx(256).n_threads(2)).unwrap();
    let devices = ctx.memory_breakdown().unwrap().devices();
    devices.iter().filter(|d| d.device.starts_with("RPC")).map(|d| d.weights).collect()
}

fn synthetic_prompt() -> Vec<Token> {
    let mut prompt = vec![Token(TINY_BOS_ID)];
    prompt.extend((0..24).map(|i| Token(100 + (i * 37) % 400)));
    prompt
}

#[test]
fn a_synthetic_model_across_two_workers_generates_what_it_generates_locally() {
    let spec = TinyModelSpec { n_layer: 4, ..TinyModelSpec::default() };
    let path = tiny_llama_path(&spec).unwrap();
    let prompt = synthetic_prompt();
    let local = Model::load(&path, &ModelParams::default()).unwrap();
    let expected = greedy(&local, KvType::F32, &prompt, 64);
    drop(local);

    let (a, b) = (Worker::start(), Worker::start());
    // All layers on the two workers; the input embedding stays on the CPU.
    let both = ModelParams::default().rpc_servers([a.endpoint.clone(), b.endpoint.clone()]).n_gpu_layers(99);
    let model = Model::load(&path, &both).unwrap();
    let weights = worker_weights(&model);
    assert!(weights.len() == 2 && weights.iter().all(|&w| w > 0), "both workers hold layers: {weights:?}");
    assert_eq!(greedy(&model, KvType::F32, &prompt, 64), expected, "two workers");
    drop(model);

    // Half the layers local, half on one worker, chosen by tensor_split.
    let mixed = ModelParams::default()
        .rpc_servers([a.endpoint.clone(), b.endpoint.clone()])
        .n_gpu_layers(2)
        .tensor_split([0.0, 1.0]);
    let model = Model::load(&path, &mixed).unwrap();
    let weights = worker_weights(&model);
    assert_eq!(weights.iter().filter(|&&w| w > 0).count(), 1, "one worker holds the 2 offloaded layers: {weights:?}");
    assert!(weights.iter().sum::<u64>() < model.size() / 2, "the other layers stay local: {weights:?}");
    assert_eq!(greedy(&model, KvType::F32, &prompt, 64), expected, "local CPU + one worker");
}

#[test]
fn the_default_model_across_workers_passes_the_teacher_forced_check() {
    let path = llama_suite::model_cache::model_path().unwrap();
    let (a, b) = (Worker::start(), Worker::start());
    // 9 of the 18 layers split over the two workers, the rest on the CPU.
    let params = ModelParams::default().rpc_servers([a.endpoint.clone(), b.endpoint.clone()]).n_gpu_layers(9);
    let model = Arc::new(Model::load(&path, &params).unwrap());
    let weights = worker_weights(&model);
    assert!(weights.len() == 2 && weights.iter().all(|&w| w > 0), "both workers hold layers: {weights:?}");
    assert!(weights.iter().sum::<u64>() < model.size(), "half the layers stay local: {weights:?}");
    let prompt = model.vocab().tokenize("The Eiffel Tower is located in Paris. It was built in", AddBos::Yes).unwrap();
    let generated = greedy(&model, KvType::F16, &prompt, 64);
    // The engine on the same split model: four greedy streams at once.
    let subjects = ["The river Nile flows through", "Rust is a programming language that", "Honey bees", "In 1969,"];
    let prompts: Vec<Vec<Token>> = subjects.iter().map(|s| model.vocab().tokenize(s, AddBos::Yes).unwrap()).collect();
    let streams: Vec<Vec<Token>> = {
        let engine = Engine::start(model.clone(), EngineConfig::default().n_ctx(2048).n_threads(2)).unwrap();
        let requests: Vec<_> = prompts
            .iter()
            .map(|p| engine.submit(Request::tokens(p.clone()).max_tokens(32).stop_at_eog(false)).unwrap())
            .collect();
        requests.into_iter().map(|c| c.wait().tokens).collect()
    };
    drop(model);

    // Re-scored by the all-local model: every chosen token within 0.5 of
    // the best logit at its position.
    let local = Model::load(&path, &ModelParams::default()).unwrap();
    let check = teacher::rescore(&local, &prompt, &generated).unwrap();
    assert!(check.worst() <= 0.5, "worst gap {} in {:?}", check.worst(), check.gaps);
    // Not a vacuous check: the continuation is not one token repeated.
    let distinct: std::collections::HashSet<_> = generated.iter().collect();
    assert!(distinct.len() > 10, "{generated:?}");
    let mut worst = vec![check.worst()];
    for ((subject, prompt), stream) in subjects.iter().zip(&prompts).zip(&streams) {
        assert_eq!(stream.len(), 32, "{subject}");
        let check = teacher::rescore(&local, prompt, stream).unwrap();
        assert!(check.worst() <= 0.5, "{subject}: worst gap {} in {:?}", check.worst(), check.gaps);
        worst.push(check.worst());
    }
    eprintln!("worst gaps (greedy, then the four engine streams): {worst:?}");
    // The check can fail: a stream re-scored after another stream's
    // prompt, or shifted by one position, is far from the best choices.
    let mixed = teacher::rescore(&local, &prompts[1], &streams[0]).unwrap();
    let shifted = teacher::rescore(&local, &prompts[0], &streams[0][1..]).unwrap();
    eprintln!("controls: another prompt {}, shifted by one {}", mixed.worst(), shifted.worst());
    assert!(mixed.worst() > 5.0 * 0.5, "a mixed-up stream passes: {:?}", mixed.gaps);
    assert!(shifted.worst() > 5.0 * 0.5, "a shifted stream passes: {:?}", shifted.gaps);
}

/// The per-device memory of a context of `model` (read, not mapped: a
/// mapped host buffer spans the whole file) with `n_gpu_layers` over two
/// workers; each worker's device holds weights and KV cells.
/// `workers` must outlive the model: llama.cpp frees a model's remote
/// buffers through the connection, and aborts if the worker has gone.
fn split_memory(
    path: &std::path::Path,
    n_gpu_layers: i32,
    (a, b): &(Worker, Worker),
) -> (Model, Vec<llamacpp::plan::BufferMemory>) {
    let params = ModelParams::default()
        .rpc_servers([a.endpoint.clone(), b.endpoint.clone()])
        .n_gpu_layers(n_gpu_layers)
        .load_mode(LoadMode::Read);
    let model = Model::load(path, &params).unwrap();
    let devices = {
        let mut ctx = model.new_context(&ContextParams::default().n_ctx(1024).n_threads(2)).unwrap();
        ctx.memory_breakdown().unwrap().devices()
    };
    let rpc: Vec<_> = devices.iter().filter(|d| d.device.starts_with("RPC")).collect();
    assert_eq!(rpc.len(), 2, "two workers among {devices:?}");
    for device in &rpc {
        assert!(device.weights > 0 && device.kv > 0, "{device:?}");
    }
    assert!(devices.iter().any(|d| d.device == HOST && d.weights > 0), "the embedding stays on the host: {devices:?}");
    (model, devices)
}

#[test]
fn memory_per_device_is_reported_and_adds_up_to_the_model() {
    // The synthetic model: every tensor once, somewhere; the per-device
    // weights add up to the tensors' bytes (plus at most 32 bytes of
    // alignment per tensor).
    let workers = (Worker::start(), Worker::start());
    let spec = TinyModelSpec { n_layer: 4, ..TinyModelSpec::default() };
    let (model, devices) = split_memory(&tiny_llama_path(&spec).unwrap(), 99, &workers);
    let weights: u64 = devices.iter().map(|d| d.weights).sum();
    let size = model.size();
    assert!(weights >= size && weights - size <= 32 * 64, "weights {weights}, model {size}: {devices:?}");
    drop(model);

    // The default model: Gemma's output layer shares the embedding matrix,
    // which llama.cpp copies to the output's device (the last worker) while
    // the input embedding stays on the host; its token_embd is q8_0.
    let path = llama_suite::model_cache::model_path().unwrap();
    let (model, devices) = split_memory(&path, 99, &workers);
    let weights: u64 = devices.iter().map(|d| d.weights).sum();
    let size = model.size();
    // SAFETY: a pure size computation.
    let row = unsafe { llamacpp::sys::ggml_row_size(llamacpp::sys::ggml_type::GGML_TYPE_Q8_0, model.n_embd() as i64) };
    let embedding = (row * model.vocab().n_tokens()) as u64;
    assert!(
        weights >= size + embedding && weights - size - embedding <= 32 * 400,
        "weights {weights}, model {size} + copied embedding {embedding}: {devices:?}"
    );
    drop(model);
    drop(workers);
}

/// The layer fit on a device budget (an RPC worker stands in for a GPU):
/// the most layers whose plan keeps the device within its limit, one more
/// over it; no limit offloads every layer; the model loads with the
/// chosen count and its live context allocates what the plan said.
#[test]
fn the_layer_fit_offloads_what_the_device_budget_holds() {
    let worker = Worker::start();
    let path = tiny_llama_path(&TinyModelSpec { n_layer: 8, ..TinyModelSpec::default() }).unwrap();
    let model = ModelParams::default().rpc_servers([worker.endpoint.clone()]).load_mode(LoadMode::Read);
    let ctx = ContextParams::default().n_ctx(512).n_threads(2);
    let plan_of = |layers: i32| Planner::new(&path, &model.clone().n_gpu_layers(layers)).unwrap().plan(&ctx).unwrap();
    let device = plan_of(99).memory.devices().into_iter().find(|d| d.device.starts_with("RPC")).unwrap().device;
    let on_device = |layers: i32| {
        plan_of(layers).memory.devices().into_iter().find(|d| d.device == device).map_or(0, |d| d.total())
    };
    assert!(on_device(5) > on_device(4), "a layer more takes more of the device");

    let budget = MemoryBudget::default().device(&device, on_device(4));
    let fit = Planner::fit_layers(&path, &model, &ctx, &budget).unwrap();
    assert_eq!(fit.n_gpu_layers, 4, "{fit:?}");
    assert!(!fit.capped);
    assert_eq!(fit.plan.memory, plan_of(4).memory);

    let all = Planner::fit_layers(&path, &model, &ctx, &MemoryBudget::default()).unwrap();
    assert_eq!((all.n_gpu_layers, all.capped), (9, true), "8 layers and the output layer");

    // A host limit the fit cannot meet (it moves layers to devices only):
    // an error naming the host.
    match Planner::fit_layers(&path, &model, &ctx, &budget.clone().device(HOST, 1)) {
        Err(Error::DoesNotFit { device, .. }) => assert_eq!(device, HOST),
        other => panic!("{other:?}"),
    }

    // A budget for a device the model does not use is refused, not ignored.
    match Planner::fit_layers(&path, &model, &ctx, &MemoryBudget::default().device("CUDA7", 1 << 30)) {
        Err(Error::InvalidArgument(message)) => {
            assert!(message.contains("CUDA7") && message.contains(&device), "{message}")
        }
        other => panic!("{other:?}"),
    }

    let loaded = Model::load(&path, &model.clone().n_gpu_layers(fit.n_gpu_layers)).unwrap();
    let live = loaded.new_context(&ctx).unwrap().memory_breakdown().unwrap();
    assert_eq!(live, fit.plan.memory, "the plan is what the live context allocates");
    drop(loaded);

    // The plan example: the same fit from the command line, and the plan
    // of the layers it was given per device.
    let out = Command::new(super::plan::example("plan"))
        .arg("--model")
        .arg(&path)
        .args(["--ctx", "512", "--seqs", "1", "--kv", "f16", "--json", "--gpu-layers", "4", "--rpc", &worker.endpoint])
        // Its one worker is its process's first RPC device (this process
        // has numbered every worker its tests started).
        .arg("--device-budget")
        .arg(format!("RPC0={}", on_device(4)))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let fitted = rows.iter().find(|r| r["fit_layers"] == true).unwrap();
    assert_eq!(fitted["n_gpu_layers"], 4, "{fitted}");
    let planned = rows[0]["devices"].as_array().unwrap().iter().find(|d| d["device"] == "RPC0").unwrap();
    let total =
        ["weights_bytes", "kv_bytes", "compute_bytes"].iter().map(|k| planned[*k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(total, on_device(4), "{planned}");

    // The generate example says where the layers went.
    let out = Command::new(super::plan::example("generate"))
        .arg("--model")
        .arg(&path)
        .args(["--prompt", "a b", "-n", "2", "--greedy", "--gpu-layers", "4", "--rpc", &worker.endpoint])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let said = stderr.lines().find(|l| l.starts_with("layers: ")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(said.starts_with("layers: 4 of 9 offloaded") && said.contains("RPC0 ") && said.contains("Host "), "{said}");
}

/// Offload by default (an RPC worker stands in for a GPU): the default
/// parameters put every layer on the worker when its free memory less
/// the 1 GiB margin holds them (gigabytes of this host's RAM for a tiny
/// model); a margin nothing fits within offloads none and still loads; a
/// fixed budget loads the count its fit chose; a loaded model's planner
/// plans that count, not a second fit; without a device nothing moves.
#[test]
fn offload_by_default_puts_what_fits_on_the_devices() {
    let worker = Worker::start();
    let path = tiny_llama_path(&TinyModelSpec { n_layer: 8, ..TinyModelSpec::default() }).unwrap();
    let ctx = ContextParams::default().n_ctx(512).n_threads(2);
    // Read, not mapped: the host part of the weights is then what the plan counts.
    let default = ModelParams::default()
        .rpc_servers([worker.endpoint.clone()])
        .load_mode(LoadMode::Read)
        .fit_context(ctx.clone());

    let all = Model::load(&path, &default).unwrap();
    assert_eq!(all.n_gpu_layers(), 9, "8 layers and the output layer");
    let planner = Planner::for_model(&all).unwrap();
    assert_eq!(planner.n_gpu_layers(), 9);
    let device = planner.plan(&ctx).unwrap().memory.devices().into_iter().find(|d| d.device.starts_with("RPC"));
    let device = device.expect("buffers on the worker").device;
    drop((planner, all));

    let none = Model::load(&path, &default.clone().fit_margin(u64::MAX)).unwrap();
    assert_eq!(none.n_gpu_layers(), 0, "nothing fits: the host takes every layer");
    let mut c = none.new_context(&ctx).unwrap();
    let weights = c.memory_breakdown().unwrap().devices();
    assert!(weights.iter().all(|d| d.device == HOST || d.weights == 0), "{weights:?}");
    drop(c);
    drop(none);

    let four = Planner::new(&path, &default.clone().n_gpu_layers(4)).unwrap().plan(&ctx).unwrap();
    let on_device = four.memory.devices().into_iter().find(|d| d.device == device).unwrap().total();
    let within = default.clone().gpu_layers(GpuLayers::Within(MemoryBudget::default().device(&device, on_device)));
    let model = Model::load(&path, &within).unwrap();
    assert_eq!(model.n_gpu_layers(), 4);
    assert_eq!(model.new_context(&ctx).unwrap().memory_breakdown().unwrap(), four.memory);
    drop(model);
    let elsewhere = default.clone().gpu_layers(GpuLayers::Within(MemoryBudget::default().device("CUDA7", 1 << 30)));
    match Model::load(&path, &elsewhere) {
        Err(Error::InvalidArgument(message)) => assert!(message.contains("CUDA7"), "{message}"),
        other => panic!("{other:?}"),
    }

    // This build's devices are the CPU's: the default moves nothing.
    let local = Model::load(&path, &ModelParams::default()).unwrap();
    assert_eq!(local.n_gpu_layers(), 0);
}

/// The engine's pool from a budget per device: half the layers on a
/// worker, a limit on the worker alone sizes the pool by what lands there
/// (the host, unlimited, holds more than the limit).
#[test]
fn an_engine_sizes_its_pool_from_a_device_budget() {
    let worker = Worker::start();
    let path = tiny_llama_path(&TinyModelSpec { n_layer: 8, ..TinyModelSpec::default() }).unwrap();
    let params =
        ModelParams::default().rpc_servers([worker.endpoint.clone()]).n_gpu_layers(4).load_mode(LoadMode::Read);
    let model = Arc::new(Model::load(&path, &params).unwrap());
    let config = EngineConfig::default().n_threads(1).max_running(2).max_cached_prefixes(2);
    let planner = Planner::for_model(&model).unwrap();
    let pool = |cells: u32| {
        let params = ContextParams::default().n_ctx(cells).n_batch(512).n_ubatch(512).n_seq_max(4);
        planner.plan(&params.kv_unified(true).swa_full(true)).unwrap().memory
    };
    let device = pool(4096).devices().into_iter().find(|d| d.device.starts_with("RPC")).unwrap();
    let budget = MemoryBudget::default().device(&device.device, device.total() + 100);
    let engine = Engine::start(model.clone(), config.clone().device_budget(budget)).unwrap();
    assert_eq!(engine.pool_cells(), 4096);
    engine.shutdown();
    // The same number of bytes over every device together: the host's
    // share counts too, and the pool is smaller.
    let engine = Engine::start(model, config.memory_budget(device.total() + 100)).unwrap();
    assert!(engine.pool_cells() < 4096, "a total budget of one device's share: {} cells", engine.pool_cells());
}

#[test]
fn unusable_endpoints_are_errors_not_aborts() {
    let path = tiny_llama_path(&TinyModelSpec::default()).unwrap();
    // Nothing listens on a port that was just free.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let refused = ModelParams::default().rpc_servers([format!("127.0.0.1:{port}")]).n_gpu_layers(99);
    let err = Model::load(&path, &refused).unwrap_err();
    assert!(matches!(&err, Error::Rpc { message, .. } if message.contains("cannot connect")), "{err}");

    // Not host:port.
    let bad = ModelParams::default().rpc_servers(["localhost"]);
    assert!(matches!(Model::load(&path, &bad), Err(Error::Rpc { .. })));

    // A server that accepts and never answers (a local listener nobody
    // reads from): no handshake within the timeout, an error, not a hang.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = silent.local_addr().unwrap().to_string();
    let start = Instant::now();
    let err = rpc::add_server(&endpoint, Duration::from_millis(500)).unwrap_err();
    let elapsed = start.elapsed();
    assert!(matches!(&err, Error::Rpc { message, .. } if message.contains("no handshake within")), "{err}");
    // It waited for the timeout (the connection succeeded), and no longer.
    assert!(elapsed >= Duration::from_millis(450) && elapsed < Duration::from_secs(10), "{elapsed:?}");
    drop(silent);

    // A worker that has gone since it was added: checked again before the
    // next model uses it.
    let worker = Worker::start();
    let on_worker = ModelParams::default().rpc_servers([worker.endpoint.clone()]).n_gpu_layers(99);
    let model = Model::load(&path, &on_worker).unwrap();
    // While a model holds the worker, it serves nobody else...
    let err = rpc::probe(&worker.endpoint, Duration::from_millis(300)).unwrap_err();
    assert!(err.to_string().contains("no handshake within"), "{err}");
    // ...but a second model of this process shares the connection.
    let second = Model::load(&path, &on_worker).unwrap();
    drop((model, second));
    let endpoint = worker.endpoint.clone();
    drop(worker);
    let err = Model::load(&path, &on_worker.rpc_servers([endpoint])).unwrap_err();
    assert!(matches!(&err, Error::Rpc { message, .. } if message.contains("cannot connect")), "{err}");
}

#[test]
fn rpc_devices_are_named_by_endpoint_and_kept_out_of_the_global_list() {
    let worker = Worker::start();
    let added = rpc::add_server(&worker.endpoint, rpc::DEFAULT_TIMEOUT).unwrap();
    assert_eq!(added.len(), 1, "the worker serves its CPU");
    let device = &added[0];
    assert!(device.name.starts_with("RPC") && device.description == worker.endpoint, "{device:?}");
    assert_eq!(device.kind, llamacpp::DeviceKind::Gpu);
    // It reports the worker machine's memory.
    assert!(device.memory_total > 1 << 30, "{device:?}");
    // llamacpp::devices() reads every listed device's memory, which for an RPC
    // device means connecting: a dead worker there would abort the process.
    assert!(llamacpp::devices().iter().all(|d| d.description != worker.endpoint));
    // Adding it again does not connect: the same devices.
    drop(worker);
    let again = rpc::add_server(&added[0].description, rpc::DEFAULT_TIMEOUT).unwrap();
    assert_eq!(again[0].name, device.name);
}

/// Kills `worker` `after` from now, on a thread of its own.
fn kill_later(worker: Worker, after: Duration) -> std::thread::JoinHandle<Instant> {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        drop(worker);
        Instant::now()
    })
}

#[test]
fn a_worker_dying_mid_decode_is_an_error_and_the_process_lives_on() {
    let path = llama_suite::model_cache::model_path().unwrap();
    let worker = Worker::start();
    let params = ModelParams::default().rpc_servers([worker.endpoint.clone()]).n_gpu_layers(99);
    let model = Model::load(&path, &params).unwrap();
    let mut ctx = model.new_context(&ContextParams::default().n_ctx(4096).n_threads(2)).unwrap();
    let prompt = model.vocab().tokenize("Once upon a time", AddBos::Yes).unwrap();
    ctx.decode(&Batch::from_tokens(&prompt, 0)).unwrap();
    let mut sampler = Sampler::greedy();
    let killer = kill_later(worker, Duration::from_millis(500));
    let mut decoded = 0;
    let err = loop {
        let token = sampler.sample(&mut ctx, Output::Last).unwrap();
        match ctx.decode(&Batch::from_tokens(&[token], (prompt.len() + decoded) as i32)) {
            Ok(()) => decoded += 1,
            Err(e) => break e,
        }
        assert!(decoded < 4000, "the worker's death went unnoticed");
    };
    let killed = killer.join().unwrap();
    let noticed = killed.elapsed();
    assert!(
        matches!(&err, Error::Rpc { message, .. } if message.contains("stopped answering during decoding")),
        "{err}"
    );
    assert!(decoded > 0, "it decoded before the worker died");
    assert!(noticed < Duration::from_secs(10), "noticed {noticed:?} after the kill");
    eprintln!("decoded {decoded} tokens; the decode failed {noticed:?} after the worker was killed");
    // The context and the model are unusable, and say so.
    let again = ctx.decode(&Batch::from_tokens(&prompt, 0)).unwrap_err();
    assert!(matches!(again, Error::Rpc { .. }), "{again}");
    assert!(matches!(ctx.seq_rm(None, None, None), Err(Error::Rpc { .. })));
    // Nothing reads the last good pass's rows through the dead connection
    // (llama.cpp would wait for it for good): logits, sampling, settings.
    assert!(matches!(ctx.logits(Output::Last), Err(Error::Rpc { .. })));
    assert!(matches!(sampler.sample(&mut ctx, Output::Last), Err(Error::Rpc { .. })));
    assert!(matches!(ctx.set_n_threads(1, 1), Err(Error::Rpc { .. })));
    assert!(matches!(ctx.memory_breakdown(), Err(Error::Rpc { .. })));
    ctx.synchronize();
    assert_eq!(ctx.perf().eval_tokens, 0);
    ctx.clear_kv_zeroed();
    assert!(matches!(model.new_context(&ContextParams::default().n_ctx(512)), Err(Error::Rpc { .. })));
    // Dropping them leaks instead of reaching the dead connection.
    drop(ctx);
    drop(model);
    // The process goes on: a new worker serves a new model.
    let worker = Worker::start();
    let params = ModelParams::default().rpc_servers([worker.endpoint.clone()]).n_gpu_layers(99);
    let model = Model::load(&path, &params).unwrap();
    let generated = greedy(&model, KvType::F16, &prompt, 4);
    assert_eq!(generated.len(), 4);
    // LoRA adapters would reach the workers unguarded: refused.
    assert!(matches!(model.load_lora("/nonexistent.gguf"), Err(Error::Unsupported(_))));
    drop(model);
}

#[test]
fn a_worker_dying_mid_load_is_an_error() {
    // Wide enough that sending its weights takes a while: 8 layers of
    // n_embd 1024 in f32 (about 0.5 GB).
    let spec = TinyModelSpec { n_layer: 8, n_embd: 1024, n_head: 8, n_head_kv: 4, n_ff: 4096, ..Default::default() };
    let path = tiny_llama_path(&spec).unwrap();
    let worker = Worker::start();
    let params = ModelParams::default().rpc_servers([worker.endpoint.clone()]).n_gpu_layers(99);
    let killer = kill_later(worker, Duration::from_millis(150));
    let started = Instant::now();
    let result = Model::load(&path, &params);
    let killed = killer.join().unwrap();
    let err = match result {
        Err(e) => e,
        Ok(_) => panic!("the load finished in {:?}, before the worker died: make the model bigger", started.elapsed()),
    };
    assert!(matches!(&err, Error::Rpc { message, .. } if message.contains("during loading the model")), "{err}");
    assert!(killed.elapsed() < Duration::from_secs(10), "{:?}", killed.elapsed());
}
