//! Unit tests of the feature → CMake mapping in build/features.rs. CUDA,
//! Metal and Vulkan cannot be compiled on the CI machines, so these tests are
//! what proves their flags and link lines.

use crate::features::{Features, Lib, Options, Target, cmake_defines, compile_flags, link_libs};

fn linux() -> Target {
    Target { os: "linux".into(), arch: "x86_64".into(), env: "gnu".into(), ..Target::default() }
}

fn macos() -> Target {
    Target { os: "macos".into(), arch: "aarch64".into(), clang: true, ..Target::default() }
}

fn options() -> Options {
    Options {
        build_type: "Release".into(),
        build_number: "0".into(),
        build_commit: "0c1e570".into(),
        ..Options::default()
    }
}

fn define(defines: &[(&'static str, String)], key: &str) -> Option<String> {
    // The last definition wins, as on a cmake command line.
    defines.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| v.clone())
}

/// The crate's default features: OpenMP, portable (no `native`).
fn defaults() -> Features {
    Features { openmp: true, ..Features::default() }
}

#[test]
fn from_enabled_reads_every_feature() {
    let all = Features::from_enabled(|_| true);
    assert_eq!(
        all,
        Features {
            openmp: true,
            native: true,
            cuda: true,
            metal: true,
            vulkan: true,
            rpc: true,
            blas: true,
            mtmd: true
        }
    );
    assert_eq!(Features::from_enabled(|f| f == "rpc"), Features { rpc: true, ..Features::default() });
}

#[test]
fn default_build_is_a_static_pic_release_library_only() {
    let d = cmake_defines(&defaults(), &linux(), &options());
    for (key, value) in [
        ("CMAKE_BUILD_TYPE", "Release"),
        ("BUILD_SHARED_LIBS", "OFF"),
        ("CMAKE_POSITION_INDEPENDENT_CODE", "ON"),
        ("LLAMA_BUILD_COMMON", "OFF"),
        ("LLAMA_BUILD_TESTS", "OFF"),
        ("LLAMA_BUILD_EXAMPLES", "OFF"),
        ("LLAMA_BUILD_TOOLS", "OFF"),
        ("LLAMA_BUILD_SERVER", "OFF"),
        ("LLAMA_BUILD_APP", "OFF"),
        ("LLAMA_OPENSSL", "OFF"),
        ("GGML_CCACHE", "OFF"),
        ("LLAMA_BUILD_NUMBER", "0"),
        ("LLAMA_BUILD_COMMIT", "0c1e570"),
        ("GGML_OPENMP", "ON"),
        ("GGML_NATIVE", "OFF"),
        ("GGML_CUDA", "OFF"),
        ("GGML_METAL", "OFF"),
        ("GGML_VULKAN", "OFF"),
        ("GGML_RPC", "OFF"),
        ("GGML_BLAS", "OFF"),
    ] {
        assert_eq!(define(&d, key).as_deref(), Some(value), "{key}");
    }
    // Portable by default: rustc's plain x86-64 target is the baseline.
    assert_eq!(define(&d, "GGML_AVX2").as_deref(), Some("OFF"));
    assert_eq!(define(&d, "GGML_SSE42").as_deref(), Some("OFF"));
}

#[test]
fn native_leaves_the_cpu_options_to_march_native() {
    let d = cmake_defines(&Features { native: true, ..defaults() }, &linux(), &options());
    assert_eq!(define(&d, "GGML_NATIVE").as_deref(), Some("ON"));
    for option in ["GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_AVX512"] {
        assert_eq!(define(&d, option), None, "{option}");
    }
}

#[test]
fn default_link_line_is_in_dependency_order() {
    assert_eq!(
        link_libs(&defaults(), &linux(), false, true),
        vec![
            Lib::Static("llama"),
            Lib::Static("ggml"),
            Lib::Static("ggml-cpu"),
            Lib::Static("ggml-base"),
            Lib::Dylib("stdc++"),
            Lib::Dylib("gomp"),
            Lib::Dylib("pthread"),
            Lib::Dylib("m"),
            Lib::Dylib("dl"),
        ]
    );
}

#[test]
fn openmp_off_drops_gomp() {
    let f = Features { openmp: false, ..defaults() };
    assert_eq!(define(&cmake_defines(&f, &linux(), &options()), "GGML_OPENMP").as_deref(), Some("OFF"));
    assert!(!link_libs(&f, &linux(), false, true).contains(&Lib::Dylib("gomp")));
}

#[test]
fn openmp_with_clang_links_libomp() {
    let t = Target { clang: true, ..linux() };
    let libs = link_libs(&defaults(), &t, false, true);
    assert!(libs.contains(&Lib::Dylib("omp")));
    assert!(!libs.contains(&Lib::Dylib("gomp")));
}

#[test]
fn portable_build_takes_cpu_features_from_the_target() {
    let f = defaults();
    let t =
        Target { cpu_features: ["sse4.2", "avx", "avx2", "fma", "f16c", "bmi2"].map(String::from).to_vec(), ..linux() };
    let d = cmake_defines(&f, &t, &options());
    assert_eq!(define(&d, "GGML_NATIVE").as_deref(), Some("OFF"));
    for on in ["GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"] {
        assert_eq!(define(&d, on).as_deref(), Some("ON"), "{on}");
    }
    for off in ["GGML_AVX512", "GGML_AVX_VNNI", "GGML_AVX512_VNNI", "GGML_AMX_TILE"] {
        assert_eq!(define(&d, off).as_deref(), Some("OFF"), "{off}");
    }
    // Plain x86-64 (rustc's default target) gets the baseline build.
    let baseline = cmake_defines(&f, &linux(), &options());
    assert_eq!(define(&baseline, "GGML_AVX2").as_deref(), Some("OFF"));
    assert_eq!(define(&baseline, "GGML_AVX").as_deref(), Some("OFF"));
}

#[test]
fn amx_stays_off_whatever_the_target_says() {
    // A target with every AMX feature (-C target-cpu=sapphirerapids).
    let t = Target {
        cpu_features: ["avx2", "avx512f", "amx-tile", "amx-int8", "amx-bf16"].map(String::from).to_vec(),
        ..linux()
    };
    let d = cmake_defines(&defaults(), &t, &options());
    assert_eq!(define(&d, "GGML_AVX512").as_deref(), Some("ON"));
    for off in ["GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"] {
        assert_eq!(define(&d, off).as_deref(), Some("OFF"), "{off}");
    }
    assert!(compile_flags(&defaults(), &t).is_empty());
    // Native: -march=native would switch them on; the explicit -mno-* wins.
    let native = Features { native: true, ..defaults() };
    assert_eq!(compile_flags(&native, &linux()), ["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"]);
    assert!(compile_flags(&native, &macos()).is_empty());
    assert!(compile_flags(&native, &Target { env: "msvc".into(), ..linux() }).is_empty());
}

#[test]
fn cuda_sets_architectures_disables_nccl_and_links_the_runtime() {
    let f = Features { cuda: true, ..defaults() };
    let d = cmake_defines(&f, &linux(), &options());
    assert_eq!(define(&d, "GGML_CUDA").as_deref(), Some("ON"));
    assert_eq!(define(&d, "GGML_CUDA_NCCL").as_deref(), Some("OFF"));
    // Unset: ggml's own default (native with `native`, else its list).
    assert_eq!(define(&d, "CMAKE_CUDA_ARCHITECTURES"), None);
    assert_eq!(define(&d, "GGML_CUDA_NO_VMM").as_deref(), Some("OFF"));
    let o = Options { cuda_architectures: Some("86;89".into()), ..options() };
    assert_eq!(define(&cmake_defines(&f, &linux(), &o), "CMAKE_CUDA_ARCHITECTURES").as_deref(), Some("86;89"));
    // Without NVIDIA's driver on the build machine: no VMM, no libcuda.
    let no_vmm = Options { cuda_no_vmm: true, ..options() };
    assert_eq!(define(&cmake_defines(&f, &linux(), &no_vmm), "GGML_CUDA_NO_VMM").as_deref(), Some("ON"));
    assert!(!link_libs(&f, &linux(), false, false).contains(&Lib::Dylib("cuda")));
    let libs = link_libs(&f, &linux(), false, true);
    let pos = |l: Lib| libs.iter().position(|x| *x == l).unwrap();
    assert!(pos(Lib::Static("ggml")) < pos(Lib::Static("ggml-cuda")));
    assert!(pos(Lib::Static("ggml-cuda")) < pos(Lib::Static("ggml-cpu")));
    for lib in ["cudart", "cublas", "cublasLt", "cuda"] {
        assert!(libs.contains(&Lib::Dylib(lib)), "{lib}");
    }
}

#[test]
fn metal_embeds_its_shaders_and_links_the_frameworks() {
    let f = Features { metal: true, ..defaults() };
    let d = cmake_defines(&f, &macos(), &options());
    assert_eq!(define(&d, "GGML_METAL").as_deref(), Some("ON"));
    assert_eq!(define(&d, "GGML_METAL_EMBED_LIBRARY").as_deref(), Some("ON"));
    // No OpenMP runtime on Apple clang.
    assert_eq!(define(&d, "GGML_OPENMP").as_deref(), Some("OFF"));
    let libs = link_libs(&f, &macos(), false, true);
    for fw in ["Metal", "MetalKit", "Foundation", "Accelerate"] {
        assert!(libs.contains(&Lib::Framework(fw)), "{fw}");
    }
    assert!(libs.contains(&Lib::Static("ggml-metal")));
    assert!(libs.contains(&Lib::Dylib("c++")));
    assert!(!libs.contains(&Lib::Dylib("stdc++")));
    assert!(!libs.iter().any(|l| matches!(l, Lib::Dylib("omp" | "gomp"))));
}

#[test]
fn vulkan_links_the_loader() {
    let f = Features { vulkan: true, ..defaults() };
    assert_eq!(define(&cmake_defines(&f, &linux(), &options()), "GGML_VULKAN").as_deref(), Some("ON"));
    let libs = link_libs(&f, &linux(), false, true);
    assert!(libs.contains(&Lib::Static("ggml-vulkan")));
    assert!(libs.contains(&Lib::Dylib("vulkan")));
    let windows = Target { os: "windows".into(), env: "msvc".into(), ..linux() };
    assert!(link_libs(&f, &windows, false, true).contains(&Lib::Dylib("vulkan-1")));
}

#[test]
fn rpc_builds_the_backend_without_machine_dependent_rdma() {
    let f = Features { rpc: true, ..defaults() };
    let d = cmake_defines(&f, &linux(), &options());
    assert_eq!(define(&d, "GGML_RPC").as_deref(), Some("ON"));
    assert_eq!(define(&d, "GGML_RPC_RDMA").as_deref(), Some("OFF"));
    assert!(link_libs(&f, &linux(), false, true).contains(&Lib::Static("ggml-rpc")));
}

#[test]
fn blas_defaults_to_openblas_or_accelerate() {
    let f = Features { blas: true, ..defaults() };
    let d = cmake_defines(&f, &linux(), &options());
    assert_eq!(define(&d, "GGML_BLAS").as_deref(), Some("ON"));
    assert_eq!(define(&d, "GGML_BLAS_VENDOR").as_deref(), Some("OpenBLAS"));
    assert!(link_libs(&f, &linux(), false, true).contains(&Lib::Dylib("openblas")));
    assert_eq!(define(&cmake_defines(&f, &macos(), &options()), "GGML_BLAS_VENDOR").as_deref(), Some("Apple"));
    let o = Options { blas_vendor: Some("Intel10_64lp".into()), ..options() };
    assert_eq!(define(&cmake_defines(&f, &linux(), &o), "GGML_BLAS_VENDOR").as_deref(), Some("Intel10_64lp"));
}

#[test]
fn all_backends_link_before_the_cpu_backend() {
    let f = Features { cuda: true, metal: true, vulkan: true, rpc: true, blas: true, ..defaults() };
    let libs = link_libs(&f, &linux(), false, true);
    let statics: Vec<_> = libs.iter().filter_map(|l| if let Lib::Static(n) = l { Some(*n) } else { None }).collect();
    assert_eq!(
        statics,
        ["llama", "ggml", "ggml-cuda", "ggml-metal", "ggml-vulkan", "ggml-blas", "ggml-rpc", "ggml-cpu", "ggml-base"]
    );
}

#[test]
fn debug_build_type_is_passed_through() {
    let o = Options { build_type: "Debug".into(), ..options() };
    assert_eq!(define(&cmake_defines(&defaults(), &linux(), &o), "CMAKE_BUILD_TYPE").as_deref(), Some("Debug"));
}

#[test]
fn mtmd_builds_the_library_alone_without_video_and_links_it_first() {
    let d = cmake_defines(&defaults(), &linux(), &options());
    assert_eq!(define(&d, "LLAMA_BUILD_MTMD").as_deref(), Some("OFF"));
    assert_eq!(define(&d, "MTMD_VIDEO"), None);
    assert!(!link_libs(&defaults(), &linux(), false, true).contains(&Lib::Static("mtmd")));

    let f = Features { mtmd: true, ..defaults() };
    let d = cmake_defines(&f, &linux(), &options());
    assert_eq!(define(&d, "LLAMA_BUILD_MTMD").as_deref(), Some("ON"));
    assert_eq!(define(&d, "MTMD_VIDEO").as_deref(), Some("OFF"));
    // The rest of tools/ stays off: it needs llama-common.
    assert_eq!(define(&d, "LLAMA_BUILD_TOOLS").as_deref(), Some("OFF"));
    assert_eq!(
        link_libs(&f, &linux(), false, true)[..3],
        [Lib::Static("mtmd"), Lib::Static("vendor-hash"), Lib::Static("llama")]
    );
}
