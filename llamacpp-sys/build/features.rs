//! The pure mapping from cargo features and target to CMake defines and to
//! the libraries to link. Kept free of I/O so that every feature, including
//! the GPU ones that cannot be compiled here, has a unit test
//! (`src/features_tests.rs` includes this file).

/// The cargo features of llamacpp-sys that change the native build.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    pub openmp: bool,
    pub native: bool,
    pub cuda: bool,
    pub metal: bool,
    pub vulkan: bool,
    pub rpc: bool,
    pub blas: bool,
    /// libmtmd (tools/mtmd): multimodal projectors, images and audio.
    pub mtmd: bool,
}

impl Features {
    pub fn from_enabled(enabled: impl Fn(&str) -> bool) -> Features {
        Features {
            openmp: enabled("openmp"),
            native: enabled("native"),
            cuda: enabled("cuda"),
            metal: enabled("metal"),
            vulkan: enabled("vulkan"),
            rpc: enabled("rpc"),
            blas: enabled("blas"),
            mtmd: enabled("mtmd"),
        }
    }
}

/// What the build script knows about the target (from `CARGO_CFG_*`).
#[derive(Clone, Debug, Default)]
pub struct Target {
    /// `CARGO_CFG_TARGET_OS`: linux, macos, windows, …
    pub os: String,
    /// `CARGO_CFG_TARGET_ARCH`: x86_64, aarch64, …
    pub arch: String,
    /// `CARGO_CFG_TARGET_ENV`: gnu, musl, msvc, …
    pub env: String,
    /// `CARGO_CFG_TARGET_FEATURE`, split on commas.
    pub cpu_features: Vec<String>,
    /// The C compiler is clang, whose OpenMP runtime is libomp, not libgomp.
    pub clang: bool,
}

impl Target {
    fn apple(&self) -> bool {
        self.os == "macos" || self.os == "ios"
    }
    fn has(&self, feature: &str) -> bool {
        self.cpu_features.iter().any(|f| f == feature)
    }
}

/// Options that do not come from features.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `CMAKE_BUILD_TYPE`: Release unless the user asks for a debug llama.cpp.
    pub build_type: String,
    /// `CMAKE_CUDA_ARCHITECTURES` (`LLAMA_CUDA_ARCHITECTURES`); `None`
    /// leaves ggml's default: `native` with the `native` feature, else its
    /// portable list (CUDA 13: 75-virtual, 80-virtual, 86-real, 89-real,
    /// 90-virtual and the 100/120 families).
    pub cuda_architectures: Option<String>,
    /// `LLAMA_SYS_CUDA_NO_VMM`: ggml's CUDA backend without virtual memory
    /// management, which is the one part that calls NVIDIA's driver
    /// library (`libcuda`) directly: for a build machine without the
    /// driver (NVIDIA's PyPI packages have no `libcuda.so` stub).
    pub cuda_no_vmm: bool,
    /// `GGML_BLAS_VENDOR`; `None` means OpenBLAS (Apple: Accelerate).
    pub blas_vendor: Option<String>,
    /// Build number and commit baked into llama.cpp's build info.
    pub build_number: String,
    pub build_commit: String,
    /// `LLAMA_SYS_SANITIZE`: build llama.cpp (and the shim) with a sanitizer.
    pub sanitizer: Option<Sanitizer>,
    /// Runtime CPU dispatch (build/cpu_variants.rs): this build has no CPU
    /// backend of its own; the variants are built and linked beside it.
    pub cpu_dispatch: bool,
}

/// A sanitizer for the C/C++ side (`LLAMA_SYS_SANITIZE`). The Rust side
/// stays uninstrumented (stable rustc has no `-Zsanitizer`); the runtime is
/// linked into every binary that links llamacpp-sys, so plain `cargo test`
/// binaries run with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sanitizer {
    /// AddressSanitizer: out-of-bounds, use-after-free, double free, and
    /// (LeakSanitizer, on exit) leaks.
    Address,
}

impl Sanitizer {
    /// The value of `LLAMA_SYS_SANITIZE`.
    pub fn parse(value: &str) -> Result<Sanitizer, String> {
        match value.to_ascii_lowercase().as_str() {
            "address" | "asan" => Ok(Sanitizer::Address),
            _ => Err(format!("LLAMA_SYS_SANITIZE={value} is not supported; the one supported value is `address`")),
        }
    }

    /// Flags for the C/C++ compiler (the shim; llama.cpp's CMake adds the
    /// same ones through the defines below).
    pub fn compile_flags(self) -> &'static [&'static str] {
        match self {
            Sanitizer::Address => &["-fsanitize=address", "-fno-omit-frame-pointer"],
        }
    }

    /// llama.cpp's own options: LLAMA_* for src/, GGML_* for ggml/.
    fn cmake_defines(self) -> [(&'static str, String); 2] {
        match self {
            Sanitizer::Address => [("LLAMA_SANITIZE_ADDRESS", on(true)), ("GGML_SANITIZE_ADDRESS", on(true))],
        }
    }

    /// The runtime library to link, or why this target cannot have it.
    /// Only GCC's (libasan) is handled: with clang the runtime's name and
    /// folder depend on the clang version, and MSVC's CMake path in
    /// llama.cpp ignores the option.
    pub fn runtime(self, t: &Target) -> Result<Lib, String> {
        if t.env == "msvc" || t.clang {
            return Err(
                "LLAMA_SYS_SANITIZE=address needs GCC (it links GCC's libasan); set CC=gcc and CXX=g++".to_owned()
            );
        }
        Ok(Lib::Dylib("asan"))
    }
}

/// x86 rustc target features and the ggml option each one switches on when
/// the build is not native.
const X86_CPU_OPTIONS: &[(&str, &str)] = &[
    ("sse4.2", "GGML_SSE42"),
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("bmi2", "GGML_BMI2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("avxvnni", "GGML_AVX_VNNI"),
    ("avx512f", "GGML_AVX512"),
    ("avx512vbmi", "GGML_AVX512_VBMI"),
    ("avx512vnni", "GGML_AVX512_VNNI"),
    ("avx512bf16", "GGML_AVX512_BF16"),
];

/// ggml's AMX kernels (Sapphire Rapids and later) are left out of every
/// build: at the pinned commit its AMX matrix multiplication crashes
/// (SIGSEGV in `ggml_backend_amx_mul_mat`) on the first decode of the
/// default model (Q4_K_M), seen here on an Intel Xeon with AMX on
/// 2026-12-03, and upstream (llama.cpp issue 20824: Q4_K_M, "works on
/// another machine"). These options stay off whatever the target's
/// features say.
const X86_AMX_OPTIONS: &[&str] = &["GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"];

/// Compiler flags that keep a native (`-march=native`) x86-64 build from
/// compiling ggml's AMX kernels on a CPU that has AMX (see
/// [`X86_AMX_OPTIONS`]): an explicit `-mno-*` wins over what `-march`
/// implies, wherever it stands on the command line (GCC and clang).
pub fn compile_flags(f: &Features, t: &Target) -> &'static [&'static str] {
    if f.native && t.arch == "x86_64" && t.env != "msvc" {
        &["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"]
    } else {
        &[]
    }
}

fn on(b: bool) -> String {
    if b { "ON" } else { "OFF" }.to_owned()
}

/// Every CMake define for one build of llama.cpp, library only, static, PIC.
pub fn cmake_defines(f: &Features, t: &Target, o: &Options) -> Vec<(&'static str, String)> {
    let mut d: Vec<(&'static str, String)> = vec![
        ("CMAKE_BUILD_TYPE", o.build_type.clone()),
        ("BUILD_SHARED_LIBS", on(false)),
        ("CMAKE_POSITION_INDEPENDENT_CODE", on(true)),
        ("CMAKE_INSTALL_LIBDIR", "lib".to_owned()),
        ("LLAMA_BUILD_COMMON", on(false)),
        ("LLAMA_BUILD_TESTS", on(false)),
        ("LLAMA_BUILD_EXAMPLES", on(false)),
        ("LLAMA_BUILD_TOOLS", on(false)),
        ("LLAMA_BUILD_SERVER", on(false)),
        ("LLAMA_BUILD_APP", on(false)),
        ("LLAMA_OPENSSL", on(false)),
        ("LLAMA_BUILD_NUMBER", o.build_number.clone()),
        ("LLAMA_BUILD_COMMIT", o.build_commit.clone()),
        ("GGML_CCACHE", on(false)),
        ("GGML_BACKEND_DL", on(false)),
        // Apple clang ships no OpenMP runtime; ggml's own thread pool is used there.
        ("GGML_OPENMP", on(f.openmp && !t.apple())),
        ("GGML_NATIVE", on(f.native)),
        ("GGML_CPU", on(!o.cpu_dispatch)),
        ("GGML_CUDA", on(f.cuda)),
        ("GGML_METAL", on(f.metal)),
        ("GGML_VULKAN", on(f.vulkan)),
        ("GGML_RPC", on(f.rpc)),
        ("GGML_BLAS", on(f.blas)),
        // libmtmd alone, without the rest of tools/ (which needs llama-common).
        ("LLAMA_BUILD_MTMD", on(f.mtmd)),
    ];
    if let Some(sanitizer) = o.sanitizer {
        d.extend(sanitizer.cmake_defines());
    }
    if !f.native && !o.cpu_dispatch && t.arch == "x86_64" {
        for (feature, option) in X86_CPU_OPTIONS {
            d.push((option, on(t.has(feature))));
        }
        for option in X86_AMX_OPTIONS {
            d.push((option, on(false)));
        }
    }
    if f.cuda {
        if let Some(archs) = &o.cuda_architectures {
            d.push(("CMAKE_CUDA_ARCHITECTURES", archs.clone()));
        }
        d.push(("GGML_CUDA_NO_VMM", on(o.cuda_no_vmm)));
        // NCCL is linked only "if found", which makes the link line depend
        // on the machine: keep it off.
        d.push(("GGML_CUDA_NCCL", on(false)));
    }
    if f.metal {
        d.push(("GGML_METAL_EMBED_LIBRARY", on(true)));
    }
    if f.mtmd {
        // Video input runs an ffmpeg found on PATH in a subprocess: not
        // something a library should do behind its user's back.
        d.push(("MTMD_VIDEO", on(false)));
    }
    if f.rpc {
        // RDMA is switched on when libibverbs happens to be installed; keep
        // the link line independent of the machine.
        d.push(("GGML_RPC_RDMA", on(false)));
    }
    if f.blas {
        let default = if t.apple() { "Apple" } else { "OpenBLAS" };
        d.push(("GGML_BLAS_VENDOR", o.blas_vendor.clone().unwrap_or_else(|| default.to_owned())));
    }
    d
}

/// One `cargo:rustc-link-lib` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lib {
    Static(&'static str),
    Dylib(&'static str),
    Framework(&'static str),
}

/// The archive of the dispatching CPU backend: every variant and the
/// dispatcher (build/dispatch.rs).
pub const CPU_DISPATCH_LIB: &str = "ggml-cpu-dispatch";

/// The libraries to link, dependents before their dependencies:
/// mtmd (with `mtmd`), llama, ggml, the enabled backends, ggml-cpu (or, with `cpu_dispatch`,
/// the variants and their dispatcher), ggml-base, then the system
/// libraries they need (NVIDIA's driver library only with `cuda_driver`:
/// see [`Options::cuda_no_vmm`]).
pub fn link_libs(f: &Features, t: &Target, cpu_dispatch: bool, cuda_driver: bool) -> Vec<Lib> {
    // libmtmd calls into libllama and ggml, so it comes first, with the
    // hashing library of llama.cpp's vendor/ it needs (not installed: its
    // folder is in the CMake build tree, build.rs adds it).
    let mut libs = if f.mtmd { vec![Lib::Static("mtmd"), Lib::Static("vendor-hash")] } else { Vec::new() };
    libs.extend([Lib::Static("llama"), Lib::Static("ggml")]);
    if f.cuda {
        libs.push(Lib::Static("ggml-cuda"));
    }
    if f.metal {
        libs.push(Lib::Static("ggml-metal"));
    }
    if f.vulkan {
        libs.push(Lib::Static("ggml-vulkan"));
    }
    if f.blas {
        libs.push(Lib::Static("ggml-blas"));
    }
    if f.rpc {
        libs.push(Lib::Static("ggml-rpc"));
    }
    libs.push(Lib::Static(if cpu_dispatch { CPU_DISPATCH_LIB } else { "ggml-cpu" }));
    libs.push(Lib::Static("ggml-base"));

    if f.cuda {
        for lib in ["cudart", "cublas", "cublasLt"] {
            libs.push(Lib::Dylib(lib));
        }
        if cuda_driver {
            libs.push(Lib::Dylib("cuda"));
        }
    }
    if f.vulkan {
        libs.push(Lib::Dylib(if t.os == "windows" { "vulkan-1" } else { "vulkan" }));
    }
    if f.blas && !t.apple() {
        libs.push(Lib::Dylib("openblas"));
    }
    if t.apple() {
        // ggml-cpu uses Accelerate on Apple (GGML_ACCELERATE is on by default).
        libs.push(Lib::Framework("Accelerate"));
        libs.push(Lib::Framework("Foundation"));
        if f.metal {
            libs.push(Lib::Framework("Metal"));
            libs.push(Lib::Framework("MetalKit"));
        }
        libs.push(Lib::Dylib("c++"));
    } else if t.env != "msvc" {
        libs.push(Lib::Dylib("stdc++"));
    }
    if f.openmp && !t.apple() && t.env != "msvc" {
        libs.push(Lib::Dylib(if t.clang { "omp" } else { "gomp" }));
    }
    if t.os == "linux" {
        libs.push(Lib::Dylib("pthread"));
        libs.push(Lib::Dylib("m"));
        libs.push(Lib::Dylib("dl"));
    }
    libs
}
