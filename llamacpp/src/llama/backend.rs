//! Process-wide setup: backend initialisation, log routing, system facts.

use std::cell::RefCell;
use std::ffi::{c_char, c_void};
use std::sync::{Mutex, Once};

use crate::sys;

static INIT: Once = Once::new();

/// Initialises llama.cpp once per process. Every constructor in this crate
/// calls it, so users never have to; calling it again does nothing.
///
/// Routes llama.cpp's and ggml's log into the [`log`] crate under the target
/// `llama.cpp` (quiet unless the application installs a logger).
#[doc(alias = "llama_backend_init")]
pub fn init() {
    INIT.call_once(|| {
        // SAFETY: `call_once` runs this exactly once and before any other
        // llama.cpp call made through this crate, which is what both
        // functions require; the log callback is a `'static` function that
        // never unwinds and needs no user data.
        unsafe {
            sys::llama_log_set(Some(log_trampoline), std::ptr::null_mut());
            #[cfg(feature = "mtmd")]
            sys::mtmd::mtmd_helper_log_set(Some(log_trampoline), std::ptr::null_mut());
            sys::llama_backend_init();
        }
        load_backend_modules();
        initialize_lazy_devices();
        if let Some(variant) = sys::cpu_variant() {
            log::info!(
                target: "llamacpp",
                "CPU kernels: the {variant} variant (ggml's score {}; {} variants built: {})",
                sys::cpu_variant_score(),
                sys::CPU_VARIANTS.len(),
                sys::CPU_VARIANTS.join(", ")
            );
        }
        if sys::cpu_variant_forced() == Some(false) {
            log::warn!(
                target: "llamacpp",
                "LLAMA_CPU_VARIANT={} is ignored: it is not one of the variants built ({}) or this CPU cannot run \
                 it; using {}",
                std::env::var("LLAMA_CPU_VARIANT").unwrap_or_default(),
                sys::CPU_VARIANTS.join(", "),
                sys::cpu_variant().unwrap_or("none")
            );
        }
        // With runtime dispatch the best variant for this CPU runs already.
        let unused = if sys::CPU_VARIANTS.is_empty() { unused_cpu_features_of(&raw_system_info()) } else { Vec::new() };
        if !unused.is_empty() {
            log::warn!(
                target: "llamacpp",
                "llama.cpp was compiled without {}, which this CPU has: prompt processing can be many times \
                 slower (baseline x86-64 here: 26x). Build the final binary with the `native` feature of \
                 llamacpp, or with RUSTFLAGS=\"-C target-cpu=native\" (x86-64-v3 for any CPU since 2013)",
                unused.join(", ")
            );
        }
    });
}

/// ggml-vulkan sets a device up on its first use (`ggml_vk_get_device`,
/// reached by a buffer type, a backend or an op check) without a lock,
/// and publishes the device before it is set up; its instance
/// (`ggml_vk_instance_init`) likewise checks a plain flag. Two threads
/// that first use a device at once (loading models, creating contexts)
/// can each see the other's half-made device: a crash. So every Vulkan
/// device is set up here, once, under `init`'s `Once`, before any thread
/// can reach it (docs/gpu.md, "Vulkan's first use").
fn initialize_lazy_devices() {
    // SAFETY: the registry is initialised (`llama_backend_init`,
    // `load_backend_modules`); indexes below the count are valid.
    let count = unsafe { sys::ggml_backend_dev_count() };
    for i in 0..count {
        // SAFETY: `i < count`; the registry's handles and names are static.
        let (dev, reg_name) = unsafe {
            let dev = sys::ggml_backend_dev_get(i);
            let reg = sys::ggml_backend_dev_backend_reg(dev);
            (dev, crate::llama::ffi::owned_lossy(sys::ggml_backend_reg_name(reg)))
        };
        if reg_name != "Vulkan" {
            continue;
        }
        let mut buft: sys::ggml_backend_buffer_type_t = std::ptr::null_mut();
        // SAFETY: a valid device handle; the out-pointer is valid for a
        // write; the shim catches what the device's set-up throws.
        let code = unsafe { sys::shim::llama_rs_dev_buffer_type(dev, &mut buft) };
        if let Err(e) = crate::llama::ffi::check_shim(code, "ggml_backend_dev_buffer_type") {
            // The load that uses it will fail with the same error.
            log::warn!(target: "llamacpp", "a Vulkan device could not be set up: {e}");
        }
    }
}

/// An installed llama.cpp built with `GGML_BACKEND_DL` registers no
/// backend by itself: its backends (the CPU one too) are modules that its
/// tools load at start-up. Load them the same way (`ggml_backend_load_all`:
/// the install's `GGML_BACKEND_DIR`, the executable's folder, the current
/// one), then from the install's own bin/ and lib/ folders. A llama.cpp
/// built by this crate has its backends registered already.
fn load_backend_modules() {
    // SAFETY: the registry functions take no arguments (or a NUL-terminated
    // path that lives across the call) and are called from `init` only,
    // which `Once` serialises.
    unsafe {
        if sys::ggml_backend_reg_count() > 0 {
            return;
        }
        sys::ggml_backend_load_all();
        for dir in sys::INSTALLED_BACKEND_DIRS {
            if sys::ggml_backend_reg_count() > 0 {
                break;
            }
            if let Ok(dir) = std::ffi::CString::new(*dir) {
                sys::ggml_backend_load_all_from_path(dir.as_ptr());
            }
        }
        if sys::ggml_backend_reg_count() == 0 {
            log::warn!(
                target: "llamacpp",
                "llama.cpp has no backend: it was built with GGML_BACKEND_DL and no backend module was found \
                 (searched its GGML_BACKEND_DIR, the executable's folder, the current folder and {:?}); set \
                 GGML_BACKEND_PATH to a module, or install llama.cpp's backends",
                sys::INSTALLED_BACKEND_DIRS
            );
        }
    }
}

thread_local! {
    /// The level of the last log message on this thread, for `CONT` pieces.
    static LAST_LEVEL: RefCell<log::Level> = const { RefCell::new(log::Level::Debug) };
    /// The last error-level message on this thread: the best explanation of
    /// a failure that llama.cpp reports only as NULL.
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

unsafe extern "C" fn log_trampoline(level: sys::ggml_log_level::Type, text: *const c_char, _user: *mut c_void) {
    // A panic must not cross into C, and there is nobody to resume it in:
    // the log can fire on ggml worker threads. Drop it.
    let _ = crate::llama::ffi::catch(|| {
        if text.is_null() {
            return;
        }
        // SAFETY: llama.cpp passes a NUL-terminated string valid for the
        // duration of the call.
        let message = unsafe { crate::llama::ffi::owned_lossy(text) };
        let message = message.trim_end_matches('\n');
        let level = match level {
            sys::ggml_log_level::GGML_LOG_LEVEL_ERROR => log::Level::Error,
            sys::ggml_log_level::GGML_LOG_LEVEL_WARN => log::Level::Warn,
            sys::ggml_log_level::GGML_LOG_LEVEL_INFO => log::Level::Info,
            sys::ggml_log_level::GGML_LOG_LEVEL_CONT => LAST_LEVEL.with(|l| *l.borrow()),
            _ => log::Level::Debug,
        };
        LAST_LEVEL.with(|l| *l.borrow_mut() = level);
        if level == log::Level::Error {
            LAST_ERROR.with(|e| {
                let mut e = e.borrow_mut();
                e.clear();
                e.push_str(message);
            });
        }
        if !message.is_empty() {
            log::log!(target: "llama.cpp", level, "{message}");
        }
    });
}

/// Clears the remembered error message of this thread.
pub(crate) fn clear_last_error() {
    LAST_ERROR.with(|e| e.borrow_mut().clear());
}

/// The last error llama.cpp logged on this thread, or `fallback`.
pub(crate) fn last_error_or(fallback: &str) -> String {
    LAST_ERROR.with(|e| {
        let e = e.borrow();
        if e.is_empty() { fallback.to_owned() } else { e.trim().to_owned() }
    })
}

/// The variant of ggml's CPU backend running on this CPU, with runtime
/// CPU dispatch (the default build on x86-64 Linux): `x64`, `sse42`,
/// `sandybridge`, …, `haswell`, `skylakex`, `icelake`, `zen4`, … as ggml
/// names them, chosen once per process as the best this CPU supports by
/// ggml's own score (or by the environment variable `LLAMA_CPU_VARIANT`,
/// if that names a variant built in that this CPU can run). `None` in a
/// build without dispatch: `native`, `LLAMA_SYS_CPU_VARIANTS=none`, other
/// targets, an installed llama.cpp.
pub fn cpu_variant() -> Option<&'static str> {
    init();
    sys::cpu_variant()
}

/// The variants of ggml's CPU backend built into this binary for
/// [`cpu_variant`] to choose from, from the least to the most demanding;
/// empty without runtime dispatch.
pub fn cpu_variants() -> &'static [&'static str] {
    sys::CPU_VARIANTS
}

/// The CPU features and backends llama.cpp was built with, e.g.
/// `CPU : SSE3 = 1 | AVX2 = 1 | …`.
#[doc(alias = "llama_print_system_info")]
pub fn system_info() -> String {
    init();
    raw_system_info()
}

/// [`system_info`] without [`init`] (which calls it).
fn raw_system_info() -> String {
    // llama_print_system_info rebuilds a function-static string: serialise
    // callers and copy the result out before releasing the lock.
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the returned pointer is a NUL-terminated static buffer that
    // only another call rewrites, and the lock keeps other callers out until
    // the copy is made.
    unsafe { crate::llama::ffi::owned_lossy(sys::llama_print_system_info()) }
}

/// The x86-64 CPU features that matter most to llama.cpp's CPU kernels
/// which this processor has and the llama.cpp in use was compiled without
/// (`AVX`, `AVX2`, `FMA`, `F16C`, `AVX512`, as [`system_info`] names them);
/// empty off x86-64 and when the build uses them all.
///
/// llama.cpp's kernels are compiled for one CPU level: by default the Rust
/// target's (`-C target-cpu`, baseline x86-64 unless set), with the
/// `native` feature the build machine's. A baseline build on a CPU with
/// AVX2 leaves most of its speed unused (measured here: prompt processing
/// 26x slower, generation 3.8x; the repository's `docs/building.md`), so
/// [`init`] logs a warning naming these features.
pub fn unused_cpu_features() -> Vec<&'static str> {
    init();
    unused_cpu_features_of(&raw_system_info())
}

fn unused_cpu_features_of(system_info: &str) -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        let compiled = |name: &str| {
            // `CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | …`
            let item = format!("{name} = 1");
            system_info.split('|').any(|part| part.rsplit(':').next().is_some_and(|p| p.trim() == item))
        };
        let features = [
            ("AVX", std::arch::is_x86_feature_detected!("avx")),
            ("AVX2", std::arch::is_x86_feature_detected!("avx2")),
            ("FMA", std::arch::is_x86_feature_detected!("fma")),
            ("F16C", std::arch::is_x86_feature_detected!("f16c")),
            ("AVX512", std::arch::is_x86_feature_detected!("avx512f")),
        ];
        features.into_iter().filter(|&(name, present)| present && !compiled(name)).map(|(name, _)| name).collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = system_info;
        Vec::new()
    }
}

/// Whether models can be memory-mapped.
#[doc(alias = "llama_supports_mmap")]
pub fn supports_mmap() -> bool {
    init();
    // SAFETY: a pure query with no preconditions.
    unsafe { sys::llama_supports_mmap() }
}

/// Whether model memory can be locked in RAM.
#[doc(alias = "llama_supports_mlock")]
pub fn supports_mlock() -> bool {
    init();
    // SAFETY: a pure query with no preconditions.
    unsafe { sys::llama_supports_mlock() }
}

/// Whether a GPU backend is compiled in and found.
#[doc(alias = "llama_supports_gpu_offload")]
pub fn supports_gpu_offload() -> bool {
    init();
    // SAFETY: a query; backends are loaded by `init`.
    unsafe { sys::llama_supports_gpu_offload() }
}

/// Whether the RPC backend is compiled in.
#[doc(alias = "llama_supports_rpc")]
pub fn supports_rpc() -> bool {
    init();
    // SAFETY: a query; backends are loaded by `init`.
    unsafe { sys::llama_supports_rpc() }
}

/// What kind of compute device a [`Device`] is.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// The CPU.
    Cpu,
    /// A discrete GPU.
    Gpu,
    /// An integrated GPU sharing host memory.
    IntegratedGpu,
    /// An accelerator used together with the CPU (e.g. BLAS, AMX).
    Accelerator,
    /// Something newer than this crate.
    Other(u32),
}

/// One compute device known to ggml's backend registry.
#[derive(Clone, Debug)]
pub struct Device {
    /// Short name, e.g. `CPU` or `CUDA0`.
    pub name: String,
    /// Human description, e.g. the CPU or GPU model.
    pub description: String,
    /// The device kind.
    pub kind: DeviceKind,
    /// Free memory in bytes, as the backend reports it.
    pub memory_free: usize,
    /// Total memory in bytes.
    pub memory_total: usize,
    pub(crate) raw: sys::ggml_backend_dev_t,
}

// SAFETY: device handles are static singletons of ggml's backend registry
// (llama-cpp-c-api.md §1.1: "registry singletons with static lifetime"); the
// handle is only passed back to llama.cpp, never dereferenced in Rust.
unsafe impl Send for Device {}
// SAFETY: as above; `Device` exposes no interior mutability.
unsafe impl Sync for Device {}

/// The devices ggml can run on, in registry order.
#[doc(alias = "ggml_backend_dev_count")]
#[doc(alias = "ggml_backend_dev_get")]
pub fn devices() -> Vec<Device> {
    init();
    // SAFETY: the registry is initialised by `init`; indexes below the count
    // are valid and the returned handles are static.
    let count = unsafe { sys::ggml_backend_dev_count() };
    (0..count)
        .filter_map(|i| {
            // SAFETY: `i < count`.
            let raw = unsafe { sys::ggml_backend_dev_get(i) };
            (!raw.is_null()).then(|| Device::from_raw(raw))
        })
        .collect()
}

impl Device {
    /// A device from its registry handle (non-null, process lifetime).
    pub(crate) fn from_raw(raw: sys::ggml_backend_dev_t) -> Device {
        // SAFETY: the registry's strings are NULL or NUL-terminated and
        // static.
        let cstr = |p: *const c_char| unsafe { crate::llama::ffi::owned_lossy(p) };
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: `raw` is a valid device handle; the out-pointers are valid
        // for writes.
        let (name, description, kind) = unsafe {
            sys::ggml_backend_dev_memory(raw, &mut free, &mut total);
            (
                cstr(sys::ggml_backend_dev_name(raw)),
                cstr(sys::ggml_backend_dev_description(raw)),
                sys::ggml_backend_dev_type(raw),
            )
        };
        use sys::ggml_backend_dev_type as t;
        let kind = match kind {
            t::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
            t::GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
            t::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IntegratedGpu,
            t::GGML_BACKEND_DEVICE_TYPE_ACCEL => DeviceKind::Accelerator,
            other => DeviceKind::Other(other),
        };
        Device { name, description, kind, memory_free: free, memory_total: total, raw }
    }
}

/// The version of the linked llama.cpp, e.g. `0.5.0`.
#[doc(alias = "llama_version")]
pub fn version() -> &'static str {
    // SAFETY: returns a pointer to a static NUL-terminated string.
    let ptr = unsafe { sys::llama_version() };
    // SAFETY: NULL or static and NUL-terminated.
    unsafe { crate::llama::ffi::borrowed_str(ptr) }.unwrap_or("")
}

/// Microseconds since the backend was initialised.
#[doc(alias = "llama_time_us")]
pub fn time_us() -> i64 {
    init();
    // SAFETY: a clock read, valid after init.
    unsafe { sys::llama_time_us() }
}
