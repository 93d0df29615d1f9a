//! The ABI guard. `src/bindings.rs` copies the layout of every struct and
//! enum in the headers it was generated from; built against other headers
//! (`LLAMA_CPP_DIR` at another llama.cpp), every struct passed by value
//! would silently have the wrong layout. So `scripts/regen-bindings.sh`
//! checks in the sha256 of those headers next to the bindings
//! (`src/bindings.headers.sha256`), and the build compares it with the
//! headers of the source it builds: a difference stops the build unless the
//! `bindgen` feature generates the bindings from the headers in use.
//!
//! Kept free of the build script's other modules so that
//! `tests/abi_guard.rs` can include this file.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The headers bindgen reads (the `wrapper.h` of build/bindings.rs), and
/// `src/llama-ext.h`, whose C++ declarations `shim/shim.cpp` (and the
/// `llama_rs_buffer_memory` copy in `src/shim.rs`) were written against, as
/// paths relative to the llama.cpp root. Whatever they `#include "…"` from
/// the include directories is hashed too.
pub const ROOTS: &[&str] = &[
    "include/llama.h",
    "ggml/include/gguf.h",
    "ggml/include/ggml-backend.h",
    "ggml/include/ggml-cpu.h",
    "src/llama-ext.h",
];

/// bindgen's `-I` directories, in order.
const INCLUDE_DIRS: &[&str] = &["include", "ggml/include"];

/// The name of the list, in `src/` (checked in) and in OUT_DIR (written by
/// a `bindgen` build, copied to `src/` by the regeneration script).
pub const FILE_NAME: &str = "bindings.headers.sha256";

/// The checked-in list: the headers `src/bindings.rs` came from.
pub const CHECKED_IN: &str = include_str!("../src/bindings.headers.sha256");

/// Header path (relative to the llama.cpp root, `/`-separated) and the
/// sha256 of its text, sorted by path.
pub type Headers = Vec<(String, String)>;

/// The headers bindgen would read in the llama.cpp tree at `root`: the
/// [`ROOTS`] and, transitively, each `#include "name"` found next to the
/// including header or in an include directory (a name found in neither,
/// such as a platform header behind an `#ifdef`, is not part of the set).
pub fn headers(root: &Path) -> Result<Headers, String> {
    let mut found: Headers = Vec::new();
    let mut queue: Vec<String> = ROOTS.iter().map(|s| (*s).to_owned()).collect();
    while let Some(rel) = queue.pop() {
        if found.iter().any(|(p, _)| *p == rel) {
            continue;
        }
        let path = root.join(&rel);
        let text = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let text = normalize(&text);
        found.push((rel.clone(), sha256_hex(&text)));
        let dir = Path::new(&rel).parent().unwrap_or(Path::new("")).to_path_buf();
        for name in quoted_includes(&String::from_utf8_lossy(&text)) {
            let candidates = std::iter::once(dir.clone()).chain(INCLUDE_DIRS.iter().map(PathBuf::from));
            if let Some(hit) = candidates.map(|d| d.join(&name)).find(|c| root.join(c).is_file()) {
                queue.push(slash_path(&hit));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The names in `#include "name"` lines (not `<name>`).
fn quoted_includes(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix('#')?.trim_start().strip_prefix("include")?;
            let rest = rest.trim_start().strip_prefix('"')?;
            Some(rest[..rest.find('"')?].to_owned())
        })
        .collect()
}

/// CRLF read as LF, so that a checkout with Windows line endings hashes the
/// same; otherwise the bytes as they are (what `sha256sum` prints).
fn normalize(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for (i, &b) in bytes.iter().enumerate() {
        if !(b == b'\r' && bytes.get(i + 1) == Some(&b'\n')) {
            out.push(b);
        }
    }
    out
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn slash_path(path: &Path) -> String {
    // Join with '/' whatever the host, and drop `./` and `a/../` steps.
    let mut parts: Vec<String> = Vec::new();
    for c in path.components() {
        match c {
            std::path::Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            std::path::Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    parts.join("/")
}

/// The list as checked in: a comment, then `sha256  path` lines (the format
/// of `sha256sum`).
pub fn render(headers: &Headers) -> String {
    let mut s = String::from(
        "# sha256 of the llama.cpp headers that src/bindings.rs was generated from\n\
         # (CRLF read as LF). Written by scripts/regen-bindings.sh; the build\n\
         # compares it with the headers it builds against (build/abi.rs).\n",
    );
    for (path, hash) in headers {
        s.push_str(&format!("{hash}  {path}\n"));
    }
    s
}

/// Reads what [`render`] wrote; blank and `#` lines are skipped.
pub fn parse(text: &str) -> Result<Headers, String> {
    let mut headers = Headers::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let Some((hash, path)) = line.split_once(char::is_whitespace) else {
            return Err(format!("`{line}` is not `sha256  path`"));
        };
        let path = path.trim_start().trim_start_matches('*');
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("`{hash}` in `{line}` is not a sha256"));
        }
        headers.push((path.to_owned(), hash.to_ascii_lowercase()));
    }
    headers.sort();
    Ok(headers)
}

/// The headers that differ, each with how: `include/llama.h (changed)`.
pub fn differences(expected: &Headers, actual: &Headers) -> Vec<String> {
    let mut paths: Vec<&String> = expected.iter().chain(actual).map(|(p, _)| p).collect();
    paths.sort();
    paths.dedup();
    let hash = |list: &'_ Headers, p: &String| list.iter().find(|(q, _)| q == p).map(|(_, h)| h.clone());
    paths
        .into_iter()
        .filter_map(|p| match (hash(expected, p), hash(actual, p)) {
            (Some(e), Some(a)) if e == a => None,
            (Some(_), Some(_)) => Some(format!("{p} (changed)")),
            (Some(_), None) => Some(format!("{p} (missing: the bindings have it, this source does not)")),
            (None, _) => Some(format!("{p} (new: included by this source, not by the one the bindings came from)")),
        })
        .collect()
}

/// What the build's check found: the headers of the tree being built, and
/// how they differ from the checked-in list (empty when they do not).
#[derive(Debug)]
pub struct Checked {
    pub headers: Headers,
    pub differences: Vec<String>,
}

/// The build's check of the llama.cpp tree at `root`: an error message when
/// its headers differ from the checked-in list and the bindings are not
/// generated now (`bindgen` off).
pub fn check(root: &Path, bindgen: bool, pinned_commit: &str) -> Result<Checked, String> {
    let expected = parse(CHECKED_IN).map_err(|e| format!("src/{FILE_NAME} is corrupt: {e}"))?;
    let headers = headers(root)?;
    let differences = differences(&expected, &headers);
    if differences.is_empty() || bindgen {
        return Ok(Checked { headers, differences });
    }
    Err(format!(
        "the llama.cpp headers in {} are not the ones the checked-in bindings (src/bindings.rs) were generated \
         from, llama.cpp commit {pinned_commit}. Differing: {}. Structs passed by value would have the wrong \
         layout, so the build stops here. Either point LLAMA_CPP_DIR at a llama.cpp checkout at commit \
         {pinned_commit} (or unset it to build the vendored copy), or build with the llama-sys feature \
         `bindgen` (`--features llama-sys/bindgen`, needs libclang), which generates the bindings from these \
         headers.",
        root.display(),
        differences.join(", ")
    ))
}
