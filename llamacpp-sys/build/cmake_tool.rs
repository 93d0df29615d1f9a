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

/// The cmake wheel a checkout without cmake fetches: this version, and one
/// of these digests (its Linux wheels, glibc and musl, every architecture
/// PyPI has them for), checked by pip (`--require-hashes`) and again here
/// before anything in it runs. Elsewhere pip finds no wheel with a listed
/// digest and the build asks for an installed cmake.
const CMAKE_WHEEL_VERSION: &str = "4.4.5";
const CMAKE_WHEEL_SHA256: [&str; 14] = [
    "85625a9b6d5e88ff99c7eb79123d85570844e77ac076366cf75c609cc0b1b579", // manylinux x86_64
    "25fc8469e67857124ef10c002331c0ab416eb7b8d9e1d6e4c58e84e730013ece", // manylinux aarch64
    "c5cb1d0495e3911d0452a8e1354ed13ae30b6092567ea14fbe521c07046b19a0", // manylinux i686
    "009bbc02297d860fe7dd93751a78dcc5810f257a1a98acfc1214c99817d5eff7", // manylinux ppc64le
    "f5c6e586748e23b1fb23d9a8e5b469ec24e5b30ef08b7fc7b52e5c0de2f7a883", // manylinux s390x
    "ae8857735715b1a50d79323824e92d286ef2f7728e9f942df1f13cfdc42b13b1", // manylinux armv7l
    "7d0815ff6a3898ccd03946e1cfb4ee952a8ac2b3945e468fd5aef9c95503659f", // manylinux riscv64
    "56851f57f3017d81187793fa61f269d583c500c2904aff99cf5208cd341dec79", // musllinux x86_64
    "7d7ef56092bc46b202c3d87796444a0a1db3145cea48523cdd4ebd13fef847b7", // musllinux aarch64
    "f5ca274b0dba1c7621f3b9922df87fdc6c4edb04c93fe331e0534e93cc664c08", // musllinux i686
    "45e7aafd99589295ad7faf937e2b6e7c3feddfa8c39cb3b3b03b53e1691697bc", // musllinux ppc64le
    "868c4d8f3e71e7acb29a1fb6b868fbcd276318d217fe594c5b52c03c5459d700", // musllinux s390x
    "3d59508ed268cb0a0a8b53429da4e28109fa62fca95c9d2d829222e4496d6fea", // musllinux armv7l
    "8a8df5bd834b57643ec496f37dc5a6f54673cae81a658c3e82c6107692a5e482", // musllinux riscv64
];

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
    let requirements = download.join("cmake-requirement.txt");
    let hashes: String = CMAKE_WHEEL_SHA256.iter().map(|h| format!(" --hash=sha256:{h}")).collect();
    fs::write(&requirements, format!("cmake=={CMAKE_WHEEL_VERSION}{hashes}\n")).unwrap();
    let requirement_file = requirements.to_string_lossy().into_owned();
    let args = ["--only-binary", ":all:", "--require-hashes", "-r", &requirement_file];
    if let Err(e) = pip_download(&args, &download) {
        fail(&format!("no cmake on PATH, and fetching the cmake wheel from PyPI failed: {e}. {INSTALL_CMAKE}."));
    }
    let wheel = fs::read_dir(&download)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .unwrap_or_else(|| fail(&format!("pip downloaded no cmake wheel for this platform. {INSTALL_CMAKE}.")));
    // Checked again before anything from it is unpacked or run.
    let digest = crate::pinned::sha256_file(&wheel).unwrap_or_default();
    if !CMAKE_WHEEL_SHA256.contains(&digest.as_str()) {
        let _ = fs::remove_dir_all(&download);
        fail(&format!("{} has sha256 {digest}, not a pinned one; deleted. {INSTALL_CMAKE}.", wheel.display()));
    }
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
