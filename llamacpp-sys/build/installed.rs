//! An installed llama.cpp, as its own CMake install describes it: the
//! backends, OpenMP and shared-or-static from `lib/cmake/ggml/ggml-config.cmake`,
//! the version and commit from `lib/cmake/llama/llama-config.cmake`, and the
//! libraries to link that follow from them. (`llama.pc` says
//! `-lggml -lggml-base -lllama`, which is enough for shared libraries, whose
//! own dependencies come with them, and wrong for static ones: no ggml-cpu,
//! no backends, no system libraries.)
//!
//! Pure, so that `src/installed_tests.rs` can test it without an install.

use crate::features::{Features, Lib, Target, link_libs};

/// How the installed libraries are linked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Linkage {
    Static,
    Dynamic,
}

/// What the install's CMake package files say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Installed {
    /// `GGML_AVAILABLE_BACKENDS`: `ggml-cpu`, `ggml-cuda`, …
    pub backends: Vec<String>,
    /// `GGML_OPENMP_ENABLED`: ggml-cpu uses OpenMP (a static link needs its runtime).
    pub openmp: bool,
    /// `GGML_SHARED_LIB`: the install holds shared libraries.
    pub shared: bool,
    /// `GGML_BACKEND_DL`: backends are modules loaded at run time, not libraries to link.
    pub backend_dl: bool,
    /// `LLAMA_VERSION`, e.g. `0.5.0-dev`.
    pub version: Option<String>,
    /// `LLAMA_BUILD_COMMIT`, unless `unknown` (a build outside git that was not told).
    pub commit: Option<String>,
}

/// The `set(NAME VALUE)` and `set(NAME "VALUE")` lines of a CMake file, in order.
pub fn cmake_sets(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let inner = line.trim().strip_prefix("set(")?.strip_suffix(')')?.trim();
            let (name, value) = inner.split_once(char::is_whitespace)?;
            let value = value.trim();
            let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
            let plain = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            plain(name).then(|| (name.to_owned(), value.to_owned()))
        })
        .collect()
}

impl Installed {
    /// Reads `ggml-config.cmake` (required) and `llama-config.cmake`.
    pub fn read(ggml_config: &str, llama_config: Option<&str>) -> Installed {
        let mut sets = cmake_sets(ggml_config);
        sets.extend(llama_config.map(cmake_sets).unwrap_or_default());
        let get = |name: &str| sets.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.clone());
        let on = |name: &str| {
            get(name).is_some_and(|v| matches!(v.to_ascii_uppercase().as_str(), "ON" | "1" | "TRUE" | "YES"))
        };
        Installed {
            // A CMake list; written with its `;` escaped (`\;`) by some
            // llama.cpp versions.
            backends: get("GGML_AVAILABLE_BACKENDS")
                .map(|v| v.replace("\\;", ";"))
                .map(|v| v.split(';').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect())
                .unwrap_or_default(),
            openmp: on("GGML_OPENMP_ENABLED"),
            shared: on("GGML_SHARED_LIB"),
            backend_dl: on("GGML_BACKEND_DL"),
            version: get("LLAMA_VERSION").filter(|v| !v.is_empty()),
            commit: get("LLAMA_BUILD_COMMIT").filter(|c| !c.is_empty() && c != "unknown"),
        }
    }

    fn has(&self, backend: &str) -> bool {
        self.backends.iter().any(|b| b == backend)
    }
}

/// The cargo features that select a backend, with the backend's library.
const BACKEND_FEATURES: &[(&str, &str)] = &[
    ("cuda", "ggml-cuda"),
    ("metal", "ggml-metal"),
    ("vulkan", "ggml-vulkan"),
    ("rpc", "ggml-rpc"),
    ("blas", "ggml-blas"),
];

fn requested(features: &Features, feature: &str) -> bool {
    match feature {
        "cuda" => features.cuda,
        "metal" => features.metal,
        "vulkan" => features.vulkan,
        "rpc" => features.rpc,
        "blas" => features.blas,
        _ => false,
    }
}

/// An installed llama.cpp decides its own backends: a backend feature that
/// is on must name a backend it has. (`native` and `openmp` are how the
/// install was compiled, not ours to choose; they are ignored.)
pub fn check_features(features: &Features, installed: &Installed, lib_dir: &str) -> Result<(), String> {
    let missing: Vec<&str> = BACKEND_FEATURES
        .iter()
        .filter(|(feature, lib)| requested(features, feature) && !installed.has(lib))
        .map(|(feature, _)| *feature)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the llamacpp-sys feature(s) {} are on, but the llama.cpp installed in {lib_dir} was built without that \
         backend (its backends: {}). Install a llama.cpp built with it (e.g. -DGGML_CUDA=ON), or turn the \
         feature off.",
        missing.join(", "),
        if installed.backends.is_empty() { "none listed".to_owned() } else { installed.backends.join(", ") }
    ))
}

/// The libraries to link, dependents first.
///
/// Static: the same list a bundled build links (build/features.rs
/// `link_libs`), from the backends and OpenMP the install was built with;
/// a backend whose system libraries this crate does not know cannot be
/// linked statically. Dynamic: llama, ggml and ggml-base, whose own
/// dependencies (ggml-cpu, the backends, OpenMP, the C++ runtime) come with
/// them, plus the library of each backend feature that is on, since the
/// bindings call into those directly.
pub fn libs(installed: &Installed, linkage: Linkage, features: &Features, target: &Target) -> Result<Vec<Lib>, String> {
    match linkage {
        Linkage::Static => {
            if installed.shared || installed.backend_dl {
                return Err("this install holds shared libraries (GGML_SHARED_LIB or GGML_BACKEND_DL is ON): \
                            link it dynamically (unset LLAMA_SYS_STATIC)"
                    .to_owned());
            }
            let known = |b: &str| b == "ggml-cpu" || BACKEND_FEATURES.iter().any(|(_, lib)| *lib == b);
            if let Some(unknown) = installed.backends.iter().find(|b| !known(b)) {
                return Err(format!(
                    "the install has the backend {unknown}, whose system libraries llamacpp-sys does not know: \
                     install llama.cpp as shared libraries (BUILD_SHARED_LIBS=ON) and link it dynamically"
                ));
            }
            let built = Features {
                openmp: installed.openmp,
                native: false,
                cuda: installed.has("ggml-cuda"),
                metal: installed.has("ggml-metal"),
                vulkan: installed.has("ggml-vulkan"),
                rpc: installed.has("ggml-rpc"),
                blas: installed.has("ggml-blas"),
                // libmtmd with an installed llama.cpp is refused before this (build.rs).
                mtmd: false,
            };
            Ok(link_libs(&built, target, false, true))
        }
        Linkage::Dynamic => {
            let mut libs = vec![Lib::Dylib("llama"), Lib::Dylib("ggml")];
            for (feature, lib) in BACKEND_FEATURES {
                if requested(features, feature) {
                    libs.push(Lib::Dylib(lib));
                }
            }
            libs.push(Lib::Dylib("ggml-base"));
            Ok(libs)
        }
    }
}

/// The file names a library has on `target` with `linkage` (any one will do).
pub fn file_names(name: &str, linkage: Linkage, target: &Target) -> Vec<String> {
    let msvc = target.env == "msvc";
    match linkage {
        Linkage::Static if msvc => vec![format!("{name}.lib")],
        Linkage::Static => vec![format!("lib{name}.a")],
        Linkage::Dynamic if msvc => vec![format!("{name}.lib")],
        Linkage::Dynamic if target.os == "macos" || target.os == "ios" => vec![format!("lib{name}.dylib")],
        Linkage::Dynamic if target.os == "windows" => vec![format!("lib{name}.dll.a"), format!("{name}.dll")],
        Linkage::Dynamic => vec![format!("lib{name}.so")],
    }
}
