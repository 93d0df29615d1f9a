//! Repository tasks, run as `cargo xtask NAME` (the alias is in
//! .cargo/config.toml). The scripts under scripts/ ask this binary for the
//! pinned llama.cpp instead of naming it themselves, so llamacpp-sys's
//! build/pinned.rs stays the one place that does.
//!
//! - `cargo xtask pinned`: the pinned facts as shell assignments, for
//!   `eval "$(cargo xtask pinned)"` (SDIST_FILE, SDIST_SHA256,
//!   SDIST_PREFIX, PINNED_COMMIT).
//! - `cargo xtask sdist`: the path of the verified sdist in
//!   target/llamacpp-sys/download (where llamacpp-sys's build keeps it), fetched
//!   by URL first (checked before it is kept) when it is missing or its
//!   digest is wrong.

#[path = "../../llamacpp-sys/build/pinned.rs"]
mod pinned;

use std::fs::{self, File};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask pinned | cargo xtask sdist";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["pinned"] => {
            print!("{}", shell_assignments());
            Ok(())
        }
        ["sdist"] => sdist().map(|path| println!("{}", path.display())),
        _ => Err(USAGE.to_owned()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `NAME=value` lines; the values hold no characters a shell would read.
fn shell_assignments() -> String {
    [
        ("SDIST_FILE", pinned::SDIST_FILE),
        ("SDIST_SHA256", pinned::SDIST_SHA256),
        ("SDIST_PREFIX", pinned::SDIST_PREFIX),
        ("PINNED_COMMIT", pinned::PINNED_COMMIT),
    ]
    .iter()
    .map(|(name, value)| format!("{name}={value}\n"))
    .collect()
}

/// The workspace's target folder: CARGO_TARGET_DIR, else target/ at the root.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("target"),
    }
}

/// The verified sdist, fetched by URL when missing. Holds the lock that
/// llamacpp-sys's build takes around its own fetch (`fetch.lock`), so a build
/// and a script never download into the folder at once.
fn sdist() -> Result<PathBuf, String> {
    let dir = target_dir().join("llamacpp-sys").join("download");
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let lock_path = dir.join("fetch.lock");
    let lock = File::create(&lock_path).map_err(|e| format!("cannot create {}: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
    let tarball = dir.join(pinned::SDIST_FILE);
    if !pinned::is_pinned_sdist(&tarball) {
        eprintln!("xtask: fetching {} from {}", pinned::SDIST_REQUIREMENT, pinned::SDIST_URL);
        let _ = fs::remove_file(&tarball);
        let python = std::env::var("PYTHON").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".to_owned());
        let mut fetch = pinned::fetch_sdist(&python, &dir);
        let shown = format!("{fetch:?}");
        match fetch.status() {
            Ok(status) if status.success() => {}
            Ok(status) => return Err(format!("`{shown}` failed ({status})")),
            Err(e) => return Err(format!("cannot run `{shown}` (python3; or set PYTHON): {e}")),
        }
        if !pinned::is_pinned_sdist(&tarball) {
            let digest = pinned::sha256_file(&tarball).unwrap_or_else(|| "none (no file)".to_owned());
            let _ = fs::remove_file(&tarball);
            return Err(format!("{} has sha256 {digest}, expected {}", tarball.display(), pinned::SDIST_SHA256));
        }
    }
    Ok(tarball)
}
