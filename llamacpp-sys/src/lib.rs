//! Raw bindings to llama.cpp, built from a pinned, vendored source tree
//! (upstream commit `0c1e57098bba43ac29e6e3b677cdceebdd22334f`).
//!
//! Everything here is `unsafe` and mirrors `llama.h` (plus the parts of
//! `ggml.h`, `ggml-backend.h` and `gguf.h` that a safe layer needs). The
//! safe API is the `llamacpp` crate; use this crate for what it does not wrap.
//!
//! Calls that can throw a C++ exception through the C ABI have a twin in
//! [`shim`] that catches it and returns [`shim::EXCEPTION`] instead: call
//! those twins, never the raw function, from code that must not abort.
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case)]
#![allow(clippy::all, clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![allow(missing_debug_implementations, rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]
#![allow(rustdoc::bare_urls)]
#![warn(missing_docs)]

/// The C API as bindgen generates it from `llama.h` and the ggml headers.
/// Their documentation is llama.cpp's: the headers' comments are not
/// carried over, so `missing_docs` is off here alone.
#[allow(missing_docs)]
mod bindings {
    #[cfg(feature = "bindgen")]
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
    #[cfg(not(feature = "bindgen"))]
    include!("bindings.rs");
}
pub use bindings::*;

include!(concat!(env!("OUT_DIR"), "/paths.rs"));

pub mod shim;

#[cfg(feature = "mtmd")]
pub mod mtmd;

mod cpu;
pub use cpu::{cpu_variant, cpu_variant_forced, cpu_variant_score};

#[cfg(test)]
#[path = "../build/cpu_variants.rs"]
#[allow(dead_code)]
mod cpu_variants;
#[cfg(test)]
mod cpu_variants_tests;
#[cfg(test)]
#[path = "../build/features.rs"]
#[allow(dead_code)]
mod features;
#[cfg(test)]
mod features_tests;
#[cfg(test)]
#[path = "../build/gpu.rs"]
#[allow(dead_code)]
mod gpu;
#[cfg(test)]
mod gpu_tests;
#[cfg(test)]
#[path = "../build/installed.rs"]
#[allow(dead_code)]
mod installed;
#[cfg(test)]
mod installed_tests;
