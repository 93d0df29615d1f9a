//! The pinned llama.cpp: the one place that names it. llamacpp-sys's build
//! script (build/fetch.rs, build/source.rs), its ABI test and the workspace's
//! `cargo xtask` (which the scripts/ call for the sdist and the commit)
//! include this file, so the version, digest, archive prefix, commit and the
//! pip command that fetches the sdist exist once.
//!
//! The source is the llama.cpp tree vendored in llama-cpp-python's sdist on
//! PyPI (the one registry the build may reach); its digest is checked
//! before anything is extracted.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};

/// The sdist's version, as a literal for `concat!`.
macro_rules! sdist_version {
    () => {
        "0.3.36"
    };
}

/// The PyPI project that vendors llama.cpp.
pub const SDIST_PROJECT: &str = "llama-cpp-python";
/// `project==version`, as pip takes it.
pub const SDIST_REQUIREMENT: &str = concat!("llama-cpp-python==", sdist_version!());
/// The file pip downloads.
pub const SDIST_FILE: &str = concat!("llama_cpp_python-", sdist_version!(), ".tar.gz");
/// The sdist's sha256, checked before extraction.
pub const SDIST_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
/// The llama.cpp tree inside the archive, without a trailing slash.
pub const SDIST_PREFIX: &str = concat!("llama_cpp_python-", sdist_version!(), "/vendor/llama.cpp");
/// The upstream commit this crate's bindings and shim were written against.
pub const PINNED_COMMIT: &str = "0c1e57098bba43ac29e6e3b677cdceebdd22334f";

/// `python -m pip download` of the sdist alone into `dir`: `--no-binary`
/// for this project only, so pip takes the source archive and never builds
/// anything else from source (`:all:` would also make it compile the
/// `cmake` build requirement while it prepares the sdist's metadata).
pub fn pip_download_sdist(python: &str, dir: &Path) -> Command {
    let mut command = pip_download(python, dir);
    command.args(["--no-binary", SDIST_PROJECT, SDIST_REQUIREMENT]);
    command
}

/// `python -m pip download --no-deps -q -d DIR`; the caller adds what to get.
pub fn pip_download(python: &str, dir: &Path) -> Command {
    let mut command = Command::new(python);
    command.args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d"]).arg(dir);
    command
}

/// The sha256 of a file in hex, or `None` when it cannot be read.
pub fn sha256_file(path: &Path) -> Option<String> {
    let mut file = File::open(path).ok()?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf).ok()? {
            0 => break,
            n => hasher.update(&buf[..n]),
        }
    }
    Some(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether `path` is the pinned sdist (present, with the pinned digest).
pub fn is_pinned_sdist(path: &Path) -> bool {
    sha256_file(path).as_deref() == Some(SDIST_SHA256)
}
