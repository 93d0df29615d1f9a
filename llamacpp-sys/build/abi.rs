//! The ABI guard. `src/bindings.rs` copies the layout of every struct and
//! enum in the headers it was generated from; built against other headers
//! (`LLAMA_CPP_DIR` at another llama.cpp, or an installed llama.cpp of
//! another commit), every struct passed by value would silently have the
//! wrong layout. So `scripts/regen-bindings.sh` checks in the sha256 of
//! those headers next to the bindings (`src/bindings.headers.sha256`), and
//! every build compares it with the headers it builds or links against,
//! whatever their origin: a difference stops the build unless the `bindgen`
//! feature generates the bindings from the headers in use. An installed
//! llama.cpp has no `src/llama-ext.h`; there the other headers are
//! compared, and the shim declares the one function it uses from it.
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
    "ggml/include/ggml-rpc.h",
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

/// Where the headers are: a llama.cpp source tree, or the include folder
/// of an installed llama.cpp (where `include/` and `ggml/include/` are
/// merged into one folder and `src/llama-ext.h` is not installed).
#[derive(Clone, Copy, Debug)]
pub enum Layout<'a> {
    Tree(&'a Path),
    Installed(&'a Path),
}

impl Layout<'_> {
    /// The folder the layout is rooted at.
    pub fn dir(&self) -> &Path {
        match self {
            Layout::Tree(root) | Layout::Installed(root) => root,
        }
    }

    /// Whether a header of the checked-in list (a tree path) can be found
    /// in this layout: an installed llama.cpp has no `src/`.
    fn has(&self, rel: &str) -> bool {
        matches!(self, Layout::Tree(_)) || !rel.starts_with("src/")
    }

    /// The file of a header named by its tree path.
    pub fn file(&self, rel: &str) -> PathBuf {
        match self {
            Layout::Tree(root) => root.join(rel),
            Layout::Installed(dir) => dir.join(rel.rsplit('/').next().unwrap_or(rel)),
        }
    }

    /// The tree path of `#include "name"` found in the header `from` (a
    /// tree path), if the file exists: next to the including header or in
    /// an include directory. An installed layout has one folder; a header
    /// it holds is named by the checked-in list's tree path for that file
    /// name (`include/` or `ggml/include/`), a header the list lacks by
    /// `include/name`.
    fn resolve(&self, from: &str, name: &str) -> Option<String> {
        match self {
            Layout::Tree(root) => {
                let dir = Path::new(from).parent().unwrap_or(Path::new("")).to_path_buf();
                let candidates = std::iter::once(dir).chain(INCLUDE_DIRS.iter().map(PathBuf::from));
                candidates.map(|d| d.join(name)).find(|c| root.join(c).is_file()).map(|hit| slash_path(&hit))
            }
            Layout::Installed(dir) => {
                let file_name = slash_path(Path::new(name));
                if file_name.contains('/') || !dir.join(&file_name).is_file() {
                    return None;
                }
                let known = parse(CHECKED_IN).unwrap_or_default();
                let rel = known.into_iter().map(|(p, _)| p).find(|p| p.rsplit('/').next() == Some(file_name.as_str()));
                Some(rel.unwrap_or_else(|| format!("include/{file_name}")))
            }
        }
    }
}

/// The headers bindgen would read in `layout`: the [`ROOTS`] and,
/// transitively, each `#include "name"` found next to the including header
/// or in an include directory (a name found in neither, such as a platform
/// header behind an `#ifdef`, is not part of the set). Each is named by its
/// path in a llama.cpp tree, `/`-separated, and the list is sorted.
pub fn headers(layout: Layout<'_>) -> Result<Headers, String> {
    let mut found: Headers = Vec::new();
    let mut queue: Vec<String> = ROOTS.iter().filter(|r| layout.has(r)).map(|s| (*s).to_owned()).collect();
    while let Some(rel) = queue.pop() {
        if found.iter().any(|(p, _)| *p == rel) {
            continue;
        }
        let path = layout.file(&rel);
        let text = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let text = normalize(&text);
        found.push((rel.clone(), sha256_hex(&text)));
        for name in quoted_includes(&String::from_utf8_lossy(&text)) {
            queue.extend(layout.resolve(&rel, &name));
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
pub fn normalize(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for (i, &b) in bytes.iter().enumerate() {
        if !(b == b'\r' && bytes.get(i + 1) == Some(&b'\n')) {
            out.push(b);
        }
    }
    out
}

pub fn sha256_hex(bytes: &[u8]) -> String {
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

/// The build's check of the headers in `layout`, from llama.cpp commit
/// `found_commit` when that is known: an error message when they differ
/// from the checked-in list and the bindings are not generated now
/// (`bindgen` off). The message names both commits and the way out.
pub fn check(
    layout: Layout<'_>,
    bindgen: bool,
    pinned_commit: &str,
    found_commit: Option<&str>,
) -> Result<Checked, String> {
    let expected = parse(CHECKED_IN).map_err(|e| format!("src/{FILE_NAME} is corrupt: {e}"))?;
    let expected: Headers = expected.into_iter().filter(|(p, _)| layout.has(p)).collect();
    let headers = headers(layout)?;
    let differences = differences(&expected, &headers);
    if differences.is_empty() || bindgen {
        return Ok(Checked { headers, differences });
    }
    let (what, use_pinned) = match layout {
        Layout::Tree(root) => (
            format!("the llama.cpp headers in {}", root.display()),
            format!(
                "Either point LLAMA_CPP_DIR at a llama.cpp checkout at commit {pinned_commit} (or unset it to \
                 build the bundled copy)"
            ),
        ),
        Layout::Installed(dir) => (
            format!("the installed llama.cpp headers in {}", dir.display()),
            format!(
                "Either install llama.cpp at commit {pinned_commit} (or unset LLAMA_SYS_LIB_DIR and \
                 LLAMA_SYS_USE_PKG_CONFIG to build the bundled copy)"
            ),
        ),
    };
    let found = found_commit.map_or_else(|| "of an unknown commit".to_owned(), |c| format!("at commit {c}"));
    Err(format!(
        "{what} ({found}) are not the ones the checked-in bindings (src/bindings.rs) were generated from, \
         llama.cpp commit {pinned_commit}. Differing: {}. Structs passed by value would have the wrong layout, \
         so the build stops here. {use_pinned}, or build with the llamacpp-sys feature `bindgen` \
         (`--features llamacpp-sys/bindgen`, needs libclang), which generates the bindings from these headers.",
        differences.join(", ")
    ))
}
