//! Linking an installed llama.cpp instead of building one, for
//! distributions and for sharing one ggml with other crates:
//!
//! - `LLAMA_SYS_LIB_DIR`: the folder with libllama (and `cmake/ggml/`, which
//!   llama.cpp's install writes there); headers in `LLAMA_SYS_INCLUDE_DIR`,
//!   by default `<lib dir>/../include`;
//! - or `LLAMA_SYS_USE_PKG_CONFIG=1`: pkg-config's `llama` (the `llama.pc`
//!   that llama.cpp's CMake installs) gives both folders.
//!
//! `LLAMA_SYS_STATIC=1` links the static archives, `0` the shared libraries;
//! unset, the install decides (`GGML_SHARED_LIB`). The headers must be the
//! ones the bindings came from (build/abi.rs), unless `bindgen` generates
//! bindings from them.

use std::path::{Path, PathBuf};

use crate::env;
use crate::features::{Features, Target};
use crate::installed::{self, Installed, Linkage};
use crate::source::fail;

/// Which installed llama.cpp the environment asks for.
#[derive(Debug)]
pub enum Request {
    Dirs { lib_dir: PathBuf, include_dir: Option<PathBuf> },
    PkgConfig,
}

impl Request {
    pub fn from_env() -> Option<Request> {
        if let Some(lib_dir) = env::var("LLAMA_SYS_LIB_DIR") {
            let include_dir = env::var("LLAMA_SYS_INCLUDE_DIR").map(PathBuf::from);
            return Some(Request::Dirs { lib_dir: PathBuf::from(lib_dir), include_dir });
        }
        env::flag("LLAMA_SYS_USE_PKG_CONFIG").then_some(Request::PkgConfig)
    }
}

/// An installed llama.cpp, found and checked.
#[derive(Debug)]
pub struct System {
    pub lib_dir: PathBuf,
    pub include_dir: PathBuf,
    pub linkage: Linkage,
    pub installed: Installed,
}

pub fn find(request: Request, target: &Target) -> System {
    let (lib_dir, include_dir) = match request {
        Request::Dirs { lib_dir, include_dir } => {
            let include_dir = include_dir.unwrap_or_else(|| lib_dir.join("..").join("include"));
            (lib_dir, include_dir)
        }
        Request::PkgConfig => pkg_config_dirs(),
    };
    if !include_dir.join("llama.h").is_file() {
        fail(&format!(
            "no llama.h in {}: set LLAMA_SYS_INCLUDE_DIR to the folder of the installed llama.cpp headers",
            include_dir.display()
        ));
    }
    // A reinstall (other backends, shared for static) changes the link line.
    let read = |path: PathBuf| {
        println!("cargo:rerun-if-changed={}", path.display());
        std::fs::read_to_string(path).ok()
    };
    let ggml_config = read(lib_dir.join("cmake").join("ggml").join("ggml-config.cmake"));
    let llama_config = read(lib_dir.join("cmake").join("llama").join("llama-config.cmake"));
    let installed = match &ggml_config {
        Some(text) => Installed::read(text, llama_config.as_deref()),
        None => {
            println!(
                "cargo:warning=llamacpp-sys: {} has no cmake/ggml/ggml-config.cmake (written by llama.cpp's CMake \
                 install), so its backends are not known",
                lib_dir.display()
            );
            let shared =
                installed::file_names("llama", Linkage::Dynamic, target).iter().any(|n| lib_dir.join(n).is_file());
            Installed { shared, ..Installed::default() }
        }
    };
    let linkage = match env::var("LLAMA_SYS_STATIC") {
        Some(v) if matches!(v.as_str(), "1" | "ON" | "on" | "true" | "yes") => Linkage::Static,
        Some(v) if matches!(v.as_str(), "0" | "OFF" | "off" | "false" | "no") => Linkage::Dynamic,
        Some(v) => fail(&format!("LLAMA_SYS_STATIC={v}: use 1 (static archives) or 0 (shared libraries)")),
        None if installed.shared => Linkage::Dynamic,
        None => Linkage::Static,
    };
    let names = installed::file_names("llama", linkage, target);
    for name in &names {
        println!("cargo:rerun-if-changed={}", lib_dir.join(name).display());
    }
    if !names.iter().any(|n| lib_dir.join(n).is_file()) {
        fail(&format!(
            "no {} in {}: set LLAMA_SYS_LIB_DIR to the folder of the installed libllama{}",
            names.join(" or "),
            lib_dir.display(),
            match linkage {
                Linkage::Static => " (LLAMA_SYS_STATIC=1 asks for the static archive)",
                Linkage::Dynamic => " (LLAMA_SYS_STATIC=0 asks for the shared library)",
            }
        ));
    }
    if ggml_config.is_none() && linkage == Linkage::Static {
        fail(&format!(
            "{} has no cmake/ggml/ggml-config.cmake, which says what a static libggml needs (backends, \
             OpenMP): install llama.cpp with its CMake (`cmake --install`), or link the shared libraries",
            lib_dir.display()
        ));
    }
    System { lib_dir, include_dir, linkage, installed }
}

fn pkg_config_dirs() -> (PathBuf, PathBuf) {
    let library =
        pkg_config::Config::new().cargo_metadata(false).env_metadata(true).probe("llama").unwrap_or_else(|e| {
            fail(&format!(
                "LLAMA_SYS_USE_PKG_CONFIG is set, but pkg-config cannot find llama ({e}). llama.cpp's \
                 `cmake --install` writes lib/pkgconfig/llama.pc: add that folder to PKG_CONFIG_PATH"
            ))
        });
    println!("llamacpp-sys: pkg-config found llama {}", library.version);
    let first = |paths: &[PathBuf], what: &str| {
        paths.first().cloned().unwrap_or_else(|| fail(&format!("pkg-config's llama.pc names no {what}")))
    };
    (first(&library.link_paths, "library folder (-L)"), first(&library.include_paths, "include folder (-I)"))
}

/// Prints the link lines: the search path and the libraries, after checking
/// that the backend features asked for are in the install.
pub fn link(system: &System, features: &Features, target: &Target, print: impl Fn(crate::features::Lib)) {
    let lib_dir = system.lib_dir.display().to_string();
    installed::check_features(features, &system.installed, &lib_dir).unwrap_or_else(|e| fail(&e));
    let libs = installed::libs(&system.installed, system.linkage, features, target)
        .unwrap_or_else(|e| fail(&format!("{lib_dir}: {e}")));
    println!("cargo:rustc-link-search=native={lib_dir}");
    if let Some(cuda) = (system.linkage == Linkage::Static
        && system.installed.backends.iter().any(|b| b == "ggml-cuda"))
    .then(|| env::var("CUDA_PATH"))
    .flatten()
    {
        crate::cuda_search_paths(Path::new(&cuda));
    }
    libs.into_iter().for_each(print);
}
