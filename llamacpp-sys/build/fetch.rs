//! The network path, for git checkouts of this repository only: the pinned
//! llama.cpp sdist from PyPI's file host, by URL, checked against its pinned
//! digest before it is kept (nothing from it runs before that); and, in
//! build/cmake_tool.rs, the cmake wheel, pinned by version and digests. A
//! packaged llamacpp-sys carries its llama.cpp tree and never gets here.

use std::fs::{self, File};
use std::path::{Component, Path};
use std::process::Command;

use crate::env;
use crate::pinned::{self, PINNED_COMMIT, SDIST_FILE, SDIST_PREFIX, SDIST_REQUIREMENT, SDIST_SHA256, SDIST_URL};
use crate::source::fail;

/// Downloads the pinned sdist, checks its digest and extracts the part that
/// the library build and the tests need into `tree`. The tree appears under
/// its final name in one rename, so an interrupted build never leaves half a
/// tree, and a lock keeps two concurrent builds from fetching at once.
pub fn pinned_tree(tree: &Path, download_dir: &Path, is_populated: impl Fn(&Path) -> bool) {
    let parent = tree.parent().expect("the tree's folder has a parent");
    fs::create_dir_all(parent).unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", parent.display())));
    fs::create_dir_all(download_dir)
        .unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", download_dir.display())));
    let _lock = lock(&download_dir.join("fetch.lock"));
    if is_populated(tree) {
        return; // another build finished while we waited for the lock
    }
    let tarball = download_dir.join(SDIST_FILE);
    if !pinned::is_pinned_sdist(&tarball) {
        println!(
            "cargo:warning=llamacpp-sys: fetching llama.cpp {} from PyPI ({SDIST_REQUIREMENT})",
            &PINNED_COMMIT[..7]
        );
        run_pip(pinned::fetch_sdist(&env::python(), download_dir))
            .unwrap_or_else(|e| fail(&format!("{e} while fetching the llama.cpp source. {}", how_to_provide())));
        let digest = pinned::sha256_file(&tarball).unwrap_or_default();
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
    if let Err(e) = fs::rename(&staging, tree) {
        let _ = fs::remove_dir_all(&staging);
        if !is_populated(tree) {
            fail(&format!("cannot move the extracted source to {}: {e}", tree.display()));
        }
    }
}

/// Is this path (relative to the llama.cpp root) part of what we extract?
/// The library build needs the CMake files and sources (libmtmd's, for the
/// feature `mtmd`, in tools/mtmd); the tests need the tokenizer vectors and
/// chat templates under models/ and libmtmd's test media.
fn wanted(rel: &Path) -> bool {
    let s = rel.to_string_lossy();
    let first = rel.components().next();
    let top_level = matches!(first, Some(Component::Normal(c)) if [
        "CMakeLists.txt", "cmake", "include", "src", "ggml", "vendor", "LICENSE", "licenses",
    ].iter().any(|w| c == *w));
    top_level
        || s.starts_with("models/ggml-vocab-")
        || s.starts_with("models/templates/")
        || s.starts_with("tools/mtmd/")
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

/// Runs `python3 -m pip download --no-deps ARGS -d DIR`; the error says
/// which command failed and how.
pub fn pip_download(args: &[&str], dir: &Path) -> Result<(), String> {
    let mut command = Command::new(env::python());
    command.args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d"]).arg(dir).args(args);
    run_pip(command)
}

/// Runs a pip command; the error names it and says how it failed.
fn run_pip(mut command: Command) -> Result<(), String> {
    let shown = format!("{command:?}");
    match command.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("`{shown}` failed ({s})")),
        Err(e) => Err(format!("cannot run `{shown}` (python3 with pip; or set PYTHON): {e}")),
    }
}

fn how_to_provide() -> String {
    format!(
        "llamacpp-sys needs the llama.cpp source (commit {PINNED_COMMIT}). Provide it in one of these ways: \
         (1) set LLAMA_CPP_DIR to a llama.cpp checkout at that commit; \
         (2) put that tree in vendor/llama.cpp at the workspace root; \
         (3) let the build fetch it: it needs python3 and access to PyPI's file host ({SDIST_REQUIREMENT}, {SDIST_URL}); \
         (4) link an installed llama.cpp at that commit: LLAMA_SYS_LIB_DIR, or LLAMA_SYS_USE_PKG_CONFIG=1. \
         The llamacpp-sys package on the Rust registry bundles the tree and needs none of these."
    )
}

/// An exclusive lock on a file, released when dropped.
pub fn lock(path: &Path) -> File {
    let file = File::create(path).unwrap_or_else(|e| fail(&format!("cannot create lock {}: {e}", path.display())));
    file.lock().unwrap_or_else(|e| fail(&format!("cannot lock {}: {e}", path.display())));
    file
}
