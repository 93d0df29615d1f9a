//! The pinned llama.cpp: the one place that names it. llamacpp-sys's build
//! script (build/fetch.rs, build/source.rs), its ABI test and the workspace's
//! `cargo xtask` (which the scripts/ call for the sdist and the commit)
//! include this file, so the version, digest, archive prefix, commit and the
//! command that fetches the sdist exist once.
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

/// `project==version`, as pip takes it.
pub const SDIST_REQUIREMENT: &str = concat!("llama-cpp-python==", sdist_version!());
/// The file the fetch writes.
pub const SDIST_FILE: &str = concat!("llama_cpp_python-", sdist_version!(), ".tar.gz");
/// The sdist's sha256, checked before extraction.
pub const SDIST_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
/// The llama.cpp tree inside the archive, without a trailing slash.
pub const SDIST_PREFIX: &str = concat!("llama_cpp_python-", sdist_version!(), "/vendor/llama.cpp");
/// The upstream commit this crate's bindings and shim were written against.
pub const PINNED_COMMIT: &str = "0c1e57098bba43ac29e6e3b677cdceebdd22334f";

/// Where PyPI's file host serves the sdist (as its simple index lists it).
pub const SDIST_URL: &str = concat!(
    "https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/",
    "llama_cpp_python-",
    sdist_version!(),
    ".tar.gz"
);

/// A download with Python's standard library alone (`python -c`, arguments
/// URL, DEST, SHA256): into a new file beside DEST, hashed as it arrives,
/// renamed to DEST only when the digest is the expected one, removed
/// otherwise (exit status 1). Nothing in what it downloads runs: `pip
/// download` of an sdist installs its build requirements and runs its
/// build backend to read its metadata, before any digest of ours is
/// checked. `PIP_CERT` or `SSL_CERT_FILE` name the CA bundle where set.
const FETCH_SCRIPT: &str = r#"
import hashlib, os, ssl, sys, tempfile, urllib.request
url, dest, want = sys.argv[1:4]
ca = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or None
context = ssl.create_default_context(cafile=ca)
fd, temp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(dest)), prefix=".download-")
digest = hashlib.sha256()
try:
    with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=180, context=context) as response:
        while True:
            block = response.read(1 << 20)
            if not block:
                break
            digest.update(block)
            out.write(block)
    if digest.hexdigest() != want:
        sys.exit(f"{url} has sha256 {digest.hexdigest()}, expected {want}; nothing was kept")
    os.replace(temp, dest)
    temp = None
finally:
    if temp is not None and os.path.exists(temp):
        os.remove(temp)
"#;

/// `python -c FETCH_SCRIPT url dest sha256`: see [`FETCH_SCRIPT`].
pub fn fetch_verified(python: &str, url: &str, dest: &Path, sha256: &str) -> Command {
    let mut command = Command::new(python);
    command.args(["-c", FETCH_SCRIPT, url]).arg(dest).arg(sha256);
    command
}

/// The pinned sdist into `dir` (as [`SDIST_FILE`]), checked before it is
/// kept; nothing from it runs.
pub fn fetch_sdist(python: &str, dir: &Path) -> Command {
    fetch_verified(python, SDIST_URL, &dir.join(SDIST_FILE), SDIST_SHA256)
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
