//! Finding a cmake executable: `CMAKE`, then `cmake` on PATH. In a git
//! checkout of this repository (and only there: a packaged llamacpp-sys never
//! uses the network) the `cmake` wheel from PyPI is the fallback, unpacked
//! once into the shared build folder; `LLAMA_SYS_FETCH_CMAKE=1` takes it
//! even where a cmake is installed, which proves the fresh-machine path on
//! a machine that has one.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::env;
use crate::fetch::{lock, pip_download};
use crate::source::fail;

/// What to install, for the error that ends a build without cmake.
const INSTALL_CMAKE: &str = "Install CMake 3.14 or newer (3.18 for the cuda feature): Debian/Ubuntu \
    `apt install cmake`, Fedora `dnf install cmake`, Arch `pacman -S cmake`, macOS `brew install cmake`, \
    Windows `winget install Kitware.CMake`, or `pip install cmake`; or set CMAKE to the path of a cmake executable";

/// `may_fetch`: the source is a git checkout's, so the PyPI wheel may be
/// fetched when no cmake is installed.
pub fn find(cache_dir: &Path, may_fetch: bool) -> PathBuf {
    let fetch = env::flag("LLAMA_SYS_FETCH_CMAKE");
    if fetch && !may_fetch {
        fail(
            "LLAMA_SYS_FETCH_CMAKE asks to fetch cmake from PyPI, which only a git checkout of llamacpp-sys does \
             (this build uses no network): unset it, and install cmake or set CMAKE",
        );
    }
    if !fetch {
        if let Some(cmake) = env::var("CMAKE") {
            if !runs(Path::new(&cmake)) {
                fail(&format!("CMAKE={cmake} does not run (`{cmake} --version` failed). {INSTALL_CMAKE}."));
            }
            return PathBuf::from(cmake);
        }
        if runs(Path::new("cmake")) {
            return PathBuf::from("cmake");
        }
        if !may_fetch {
            fail(&format!(
                "llamacpp-sys builds llama.cpp with CMake, and no `cmake` is on PATH. {INSTALL_CMAKE}. (llamacpp-sys {}, host {}, target {})",
                env::cargo("CARGO_PKG_VERSION"),
                env::cargo("HOST"),
                env::cargo("TARGET")
            ));
        }
    }
    let binary = cache_dir.join("cmake").join("data").join("bin").join("cmake");
    if !runs(&binary) {
        fetch_wheel(cache_dir);
    }
    if !runs(&binary) {
        fail(&format!(
            "the cmake wheel was unpacked into {}, but {} does not run. {INSTALL_CMAKE}.",
            cache_dir.display(),
            binary.display()
        ));
    }
    println!("cargo:warning=llamacpp-sys: no cmake on PATH; using cmake from the PyPI wheel: {}", binary.display());
    binary
}

fn runs(cmake: &Path) -> bool {
    Command::new(cmake).arg("--version").output().is_ok_and(|o| o.status.success())
}

fn fetch_wheel(cache_dir: &Path) {
    let parent = cache_dir.parent().expect("cache dir has a parent");
    fs::create_dir_all(parent).unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", parent.display())));
    let _lock = lock(&parent.join("cmake-fetch.lock"));
    if cache_dir.join("cmake").is_dir() {
        return;
    }
    let download = parent.join(format!(".cmake-wheel-{}", std::process::id()));
    let _ = fs::remove_dir_all(&download);
    fs::create_dir_all(&download).unwrap();
    if let Err(e) = pip_download(&["--only-binary", ":all:", "cmake>=3.18,<5"], &download) {
        fail(&format!("no cmake on PATH, and fetching the cmake wheel from PyPI failed: {e}. {INSTALL_CMAKE}."));
    }
    let wheel = fs::read_dir(&download)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .unwrap_or_else(|| fail(&format!("pip downloaded no cmake wheel for this platform. {INSTALL_CMAKE}.")));
    let staging = download.join("unpacked");
    let status = Command::new(env::python()).args(["-m", "zipfile", "-e"]).arg(&wheel).arg(&staging).status();
    if !status.is_ok_and(|s| s.success()) {
        fail(&format!("cannot unzip {}", wheel.display()));
    }
    // zipfile drops the executable bits.
    let bin = staging.join("cmake").join("data").join("bin");
    for entry in fs::read_dir(&bin).unwrap_or_else(|e| fail(&format!("{} has no cmake binary: {e}", wheel.display()))) {
        make_executable(&entry.unwrap().path());
    }
    if let Err(e) = fs::rename(&staging, cache_dir) {
        fail(&format!("cannot move cmake into {}: {e}", cache_dir.display()));
    }
    let _ = fs::remove_dir_all(&download);
}

#[cfg(unix)]
fn make_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o755));
}

#[cfg(not(unix))]
fn make_executable(_path: &Path) {}
