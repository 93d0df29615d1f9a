//! The one place the build script reads the environment.

use std::path::PathBuf;

/// A user-facing environment variable: printed with `rerun-if-env-changed`
/// so that changing it rebuilds, and logged so that build logs show it.
/// An empty value counts as unset.
pub fn var(name: &str) -> Option<String> {
    println!("cargo:rerun-if-env-changed={name}");
    let value = std::env::var(name).ok().filter(|v| !v.is_empty());
    if let Some(v) = &value {
        println!("llamacpp-sys: {name} = {v}");
    }
    value
}

/// A user-facing switch: set to anything but `0`, `false`, `off` or empty.
pub fn flag(name: &str) -> bool {
    var(name).is_some_and(|v| !matches!(v.to_ascii_lowercase().as_str(), "0" | "false" | "off" | "no"))
}

/// A variable that cargo sets for every build script; no rerun line needed.
pub fn cargo(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("cargo did not set {name}; run the build through cargo"))
}

/// A path that cargo sets for every build script.
pub fn cargo_path(name: &str) -> PathBuf {
    PathBuf::from(cargo(name))
}

/// Whether a cargo feature of this crate is enabled.
pub fn feature(name: &str) -> bool {
    let key = format!("CARGO_FEATURE_{}", name.to_ascii_uppercase().replace('-', "_"));
    std::env::var_os(key).is_some()
}

/// The Python interpreter used for pip (`PYTHON`, default `python3`).
pub fn python() -> String {
    var("PYTHON").unwrap_or_else(|| "python3".to_owned())
}
