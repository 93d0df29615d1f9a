//! Configuring and building llama.cpp with the `cmake` crate.
//!
//! llama.cpp is always built optimized (Release), whatever the cargo profile,
//! so the build does not depend on the profile: the dev and release profiles
//! share one build folder per configuration under the target dir, and a
//! `cargo test` after a `cargo build --release` does not compile llama.cpp a
//! second time.
//!
//! `LLAMA_SYS_SANITIZE=address` builds it with AddressSanitizer (and, unless
//! `LLAMA_SYS_BUILD_TYPE` says otherwise, with debug info) in a folder of
//! its own: the sanitizer's defines are part of the folder's key.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::env;
use crate::features::{self, Features, Options, Sanitizer, Target};
use crate::fetch::lock;
use crate::source::{self, Tree};

pub struct Install {
    /// The cmake install prefix: lib/, include/, lib/cmake/.
    pub prefix: PathBuf,
    /// Our CMake defines (without the user's), for the CPU variant build.
    pub defines: Vec<(&'static str, String)>,
    /// `CMAKE_BUILD_TYPE`.
    pub build_type: String,
    /// Built without CUDA's VMM, so without NVIDIA's driver library.
    pub cuda_no_vmm: bool,
}

pub fn build(
    src: &Tree,
    f: &Features,
    t: &Target,
    sanitizer: Option<Sanitizer>,
    cpu_dispatch: bool,
    cmake: &Path,
    build_root: &Path,
) -> Install {
    let options = Options {
        build_type: build_type(sanitizer),
        cuda_architectures: env::var("LLAMA_CUDA_ARCHITECTURES"),
        cuda_no_vmm: env::flag("LLAMA_SYS_CUDA_NO_VMM"),
        blas_vendor: env::var("LLAMA_BLAS_VENDOR"),
        build_number: "0".to_owned(),
        build_commit: src.commit().map_or_else(|| "unknown".to_owned(), |c| c.chars().take(7).collect()),
        sanitizer,
        cpu_dispatch,
    };
    let ours = features::cmake_defines(f, t, &options);
    let defines = with_user_defines(&ours);
    // With the CPU backend off, ggml's registry registers none by itself;
    // GGML_USE_CPU makes it call `ggml_backend_cpu_reg`, which the
    // dispatcher (build/dispatch.rs) defines.
    let dispatch_flags: &[&str] = if cpu_dispatch { &["-DGGML_USE_CPU"] } else { &[] };
    // For C and C++ alike (native builds without ggml's AMX kernels).
    let flags = features::compile_flags(f, t);
    let cxxflags: Vec<&str> = flags.iter().chain(dispatch_flags).copied().collect();
    let (prefix, _lock) = keyed_folder(src, cmake, build_root, "build", &defines, &cxxflags, &gpu_toolchains(f));
    let mut config = config(src, cmake, &prefix, &options.build_type, &defines);
    for flag in flags {
        config.cflag(flag);
    }
    for flag in &cxxflags {
        config.cxxflag(flag);
    }
    config.build();
    Install { prefix, defines: ours, build_type: options.build_type, cuda_no_vmm: options.cuda_no_vmm }
}

/// `LLAMA_SYS_BUILD_TYPE`, else Release (RelWithDebInfo under a sanitizer).
fn build_type(sanitizer: Option<Sanitizer>) -> String {
    match env::var("LLAMA_SYS_BUILD_TYPE") {
        Some(b) if ["Release", "Debug", "RelWithDebInfo", "MinSizeRel"].contains(&b.as_str()) => b,
        Some(b) => {
            source::fail(&format!("LLAMA_SYS_BUILD_TYPE={b} is not one of Release, Debug, RelWithDebInfo, MinSizeRel"))
        }
        // A sanitizer report needs file and line numbers.
        None if sanitizer.is_some() => "RelWithDebInfo".to_owned(),
        None => "Release".to_owned(),
    }
}

/// Our defines followed by the user's (`LLAMA_SYS_CMAKE_DEFINES`), which win.
pub fn with_user_defines(ours: &[(&'static str, String)]) -> Vec<(String, String)> {
    let mut defines: Vec<(String, String)> = ours.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    defines.extend(user_defines());
    defines
}

/// Where the enabled GPU backends' toolchains are: part of the main
/// build's key (when set), not of the CPU variants' build, which has no
/// GPU backend.
fn gpu_toolchains(f: &Features) -> Vec<&'static str> {
    let mut names = Vec::new();
    if f.vulkan {
        names.push("VULKAN_SDK");
    }
    if f.cuda {
        names.extend(["CUDA_PATH", "CUDAToolkit_ROOT"]);
    }
    names
}

/// `<build_root>/<name>-<key>`, locked for this build script: the key
/// hashes everything that changes the result (source, cmake, compilers and
/// their flags, the target, the defines, the environment variables
/// `toolchains` that are set), so each configuration has a folder of its
/// own that every profile shares.
pub fn keyed_folder(
    src: &Tree,
    cmake: &Path,
    build_root: &Path,
    name: &str,
    defines: &[(String, String)],
    cxxflags: &[&str],
    toolchains: &[&str],
) -> (PathBuf, std::fs::File) {
    let mut key = Sha256::new();
    key.update(src.root.to_string_lossy().as_bytes());
    key.update(cmake.to_string_lossy().as_bytes());
    for name in ["CC", "CXX", "CFLAGS", "CXXFLAGS", "CUDACXX", "TARGET"] {
        // Through the helper: a change reruns the build script (the cmake
        // crate reads them too, without rerun lines).
        let value = if name == "TARGET" { env::cargo(name) } else { env::var(name).unwrap_or_default() };
        key.update(format!("\0{name}={value}").as_bytes());
    }
    for name in toolchains {
        if let Some(value) = env::var(name) {
            key.update(format!("\0{name}={value}").as_bytes());
        }
    }
    for (k, v) in defines {
        key.update(format!("\0{k}={v}").as_bytes());
    }
    for flag in cxxflags {
        key.update(format!("\0cxxflag={flag}").as_bytes());
    }
    let key: String = key.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
    let prefix = build_root.join(format!("{name}-{key}"));
    std::fs::create_dir_all(&prefix).unwrap();
    let lock = lock(&build_root.join(format!("{name}-{key}.lock")));
    (prefix, lock)
}

/// A cmake crate configuration of `src` into `prefix` (its build folder is
/// `prefix/build`).
pub fn config(
    src: &Tree,
    cmake: &Path,
    prefix: &Path,
    build_type: &str,
    defines: &[(String, String)],
) -> cmake::Config {
    if cmake != Path::new("cmake") {
        // The cmake crate takes its executable from the CMAKE variable only.
        // SAFETY: a build script is single-threaded here; nothing else reads
        // or writes the environment concurrently.
        unsafe { std::env::set_var("CMAKE", cmake) };
    }
    let mut config = cmake::Config::new(&src.root);
    config.out_dir(prefix).profile(build_type).no_default_flags(true);
    for (k, v) in defines {
        config.define(k, v);
    }
    config
}

/// `LLAMA_SYS_CMAKE_DEFINES="GGML_AVX512=OFF;CMAKE_CUDA_COMPILER=/opt/cuda/bin/nvcc"`:
/// extra `CMAKE_*`, `GGML_*` and `LLAMA_*` defines, applied after ours.
fn user_defines() -> Vec<(String, String)> {
    let Some(raw) = env::var("LLAMA_SYS_CMAKE_DEFINES") else {
        return Vec::new();
    };
    raw.split([';', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let item = item.strip_prefix("-D").unwrap_or(item);
            let Some((k, v)) = item.split_once('=') else {
                source::fail(&format!("LLAMA_SYS_CMAKE_DEFINES: `{item}` is not KEY=VALUE"))
            };
            if !["CMAKE_", "GGML_", "LLAMA_"].iter().any(|p| k.starts_with(p)) {
                source::fail(&format!("LLAMA_SYS_CMAKE_DEFINES: `{k}` does not start with CMAKE_, GGML_ or LLAMA_"));
            }
            (k.to_owned(), v.to_owned())
        })
        .collect()
}
