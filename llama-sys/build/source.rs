//! Finding the llama.cpp source: `LLAMA_CPP_DIR`, then a populated
//! `vendor/llama.cpp`, then the pinned sdist fetched from PyPI with pip.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::env;

/// The upstream commit this crate's bindings and shim were written against.
pub const PINNED_COMMIT: &str = "0c1e57098bba43ac29e6e3b677cdceebdd22334f";
const SDIST_PACKAGE: &str = "llama-cpp-python==0.3.36";
const SDIST_FILE: &str = "llama_cpp_python-0.3.36.tar.gz";
const SDIST_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
const SDIST_PREFIX: &str = "llama_cpp_python-0.3.36/vendor/llama.cpp/";

pub struct Source {
    pub root: PathBuf,
    /// True when the tree is the pinned one (vendored or fetched), so its
    /// build number and commit are known.
    pub pinned: bool,
}

pub fn locate(vendor_dir: &Path, download_dir: &Path) -> Source {
    if let Some(dir) = env::var("LLAMA_CPP_DIR") {
        let root = PathBuf::from(dir);
        let header = root.join("include").join("llama.h");
        if !header.is_file() {
            fail(&format!(
                "LLAMA_CPP_DIR is set to {}, but {} does not exist. Point LLAMA_CPP_DIR at the root of a llama.cpp checkout (commit {PINNED_COMMIT}).",
                root.display(),
                header.display()
            ));
        }
        // A user's own checkout can change under us: rebuild when it does.
        for sub in ["CMakeLists.txt", "include", "src", "ggml"] {
            println!("cargo:rerun-if-changed={}", root.join(sub).display());
        }
        return Source { root, pinned: false };
    }
    if !is_populated(vendor_dir) {
        fetch_pinned(vendor_dir, download_dir);
    }
    Source { root: vendor_dir.to_path_buf(), pinned: true }
}

fn is_populated(dir: &Path) -> bool {
    dir.join("include").join("llama.h").is_file() && dir.join("CMakeLists.txt").is_file()
}

/// Downloads the pinned sdist, checks its digest and extracts the part that
/// the library build and the tests need. The tree appears under its final
/// name in one rename, so an interrupted build never leaves half a tree, and
/// a lock keeps two concurrent builds from fetching at once.
fn fetch_pinned(vendor_dir: &Path, download_dir: &Path) {
    let parent = vendor_dir.parent().expect("vendor dir has a parent");
    fs::create_dir_all(parent).unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", parent.display())));
    fs::create_dir_all(download_dir)
        .unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", download_dir.display())));
    let _lock = lock(&download_dir.join("fetch.lock"));
    if is_populated(vendor_dir) {
        return; // another build finished while we waited for the lock
    }
    let tarball = download_dir.join(SDIST_FILE);
    if !tarball.is_file() || sha256_file(&tarball) != SDIST_SHA256 {
        println!("cargo:warning=llama-sys: fetching llama.cpp {} from PyPI ({SDIST_PACKAGE})", &PINNED_COMMIT[..7]);
        pip_download(&["--no-binary", "llama-cpp-python", SDIST_PACKAGE], download_dir, "the llama.cpp source");
        let digest = sha256_file(&tarball);
        if digest != SDIST_SHA256 {
            let _ = fs::remove_file(&tarball);
            fail(&format!(
                "{SDIST_FILE} has sha256 {digest}, expected {SDIST_SHA256}; the file was deleted. {}",
                how_to_provide()
            ));
        }
    }
    let staging = parent.join(format!(".llama.cpp.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    extract(&tarball, &staging);
    fs::write(staging.join(".pinned-commit"), format!("{PINNED_COMMIT}\n")).unwrap();
    if let Err(e) = fs::rename(&staging, vendor_dir) {
        let _ = fs::remove_dir_all(&staging);
        if !is_populated(vendor_dir) {
            fail(&format!("cannot move the extracted source to {}: {e}", vendor_dir.display()));
        }
    }
}

/// Is this path (relative to the llama.cpp root) part of what we extract?
/// The library build needs the CMake files and sources; the tests need the
/// tokenizer vectors and chat templates under models/.
pub fn wanted(rel: &Path) -> bool {
    let s = rel.to_string_lossy();
    let first = rel.components().next();
    let top_level = matches!(first, Some(Component::Normal(c)) if [
        "CMakeLists.txt", "cmake", "include", "src", "ggml", "vendor", "LICENSE", "licenses",
    ].iter().any(|w| c == *w));
    top_level || s.starts_with("models/ggml-vocab-") || s.starts_with("models/templates/")
}

fn extract(tarball: &Path, dest: &Path) {
    let file = File::open(tarball).unwrap_or_else(|e| fail(&format!("cannot open {}: {e}", tarball.display())));
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    archive.set_preserve_mtime(true);
    let entries = archive.entries().unwrap_or_else(|e| fail(&format!("{} is not a tar.gz: {e}", tarball.display())));
    for entry in entries {
        let mut entry = entry.unwrap_or_else(|e| fail(&format!("corrupt archive {}: {e}", tarball.display())));
        let path = entry.path().unwrap().into_owned();
        let Ok(rel) = path.strip_prefix(SDIST_PREFIX) else {
            continue;
        };
        // Only plain relative names: no `..`, no absolute paths.
        if rel.as_os_str().is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) || !wanted(rel) {
            continue;
        }
        let target = dest.join(rel);
        if let Some(dir) = target.parent() {
            fs::create_dir_all(dir).unwrap();
        }
        entry.unpack(&target).unwrap_or_else(|e| fail(&format!("cannot extract {}: {e}", target.display())));
    }
}

/// Runs `python3 -m pip download --no-deps ARGS -d DIR`.
pub fn pip_download(args: &[&str], dir: &Path, what: &str) {
    let python = env::python();
    let status = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q"])
        .args(args)
        .arg("-d")
        .arg(dir)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!(
            "`{python} -m pip download {}` failed ({s}) while fetching {what}. {}",
            args.join(" "),
            how_to_provide()
        )),
        Err(e) => fail(&format!(
            "cannot run `{python}` to fetch {what} with pip: {e}. Install python3 with pip, or set PYTHON. {}",
            how_to_provide()
        )),
    }
}

fn how_to_provide() -> String {
    format!(
        "llama-sys needs the llama.cpp source (commit {PINNED_COMMIT}). Provide it in one of three ways: \
         (1) set LLAMA_CPP_DIR to a llama.cpp checkout at that commit; \
         (2) put that tree in vendor/llama.cpp at the workspace root; \
         (3) let the build fetch it: it needs python3 with pip and access to PyPI ({SDIST_PACKAGE})."
    )
}

pub fn sha256_file(path: &Path) -> String {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(_) => return String::new(),
    };
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(_) => return String::new(),
        }
    }
    hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// An exclusive lock on a file, released when dropped.
pub fn lock(path: &Path) -> File {
    let file = File::create(path).unwrap_or_else(|e| fail(&format!("cannot create lock {}: {e}", path.display())));
    file.lock().unwrap_or_else(|e| fail(&format!("cannot lock {}: {e}", path.display())));
    file
}

pub fn fail(message: &str) -> ! {
    eprintln!("error: llama-sys: {message}");
    panic!("llama-sys: {message}");
}
