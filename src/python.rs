//! The Python interpreter of the tests that compare against Python tools
//! (jinja2's rendering of chat templates): `LLAMA_TEST_PYTHON` if set,
//! else the venv `scripts/python-venv.sh` creates in `target/py-venv` with
//! the pinned packages of `scripts/requirements-test.txt` (created on first
//! use; `.ci/run` creates it up front).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The venv's python, creating the venv if needed.
///
/// # Errors
/// A message saying what failed (no python3, no venv module, pip).
pub fn python() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("LLAMA_TEST_PYTHON").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(root.join("scripts/python-venv.sh"))
        .output()
        .map_err(|e| format!("cannot run scripts/python-venv.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/python-venv.sh failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    Ok(PathBuf::from(path))
}
