//! libmtmd (feature `mtmd`): the headers `src/mtmd.rs` and the shim's
//! `llama_rs_mtmd_*` twins were written against, checked like the ABI
//! guard checks the bindings' headers (build/abi.rs), and the shim's
//! include folder. libmtmd itself is built by llama.cpp's CMake
//! (`LLAMA_BUILD_MTMD`, build/features.rs).

use std::path::{Path, PathBuf};

use crate::abi;

/// The headers, relative to the llama.cpp root, and their sha256 (CRLF
/// read as LF) at the pinned commit.
pub const HEADERS: &[(&str, &str)] = &[
    ("tools/mtmd/mtmd.h", "b0f1ba884e8688980789f0547147d2b7330d65772ebac8f36c0dbb8ece7cf7d0"),
    ("tools/mtmd/mtmd-helper.h", "893b42990d4b386b8c52d8078499f5615c2d7b0c92d0c30501816d65cab8db6c"),
];

/// The folder of `mtmd.h` in the tree at `root`, after checking the
/// headers; the error names each header that differs or is missing.
pub fn include_dir(root: &Path) -> Result<PathBuf, String> {
    let mut differ = Vec::new();
    for (rel, expected) in HEADERS {
        let path = root.join(rel);
        println!("cargo:rerun-if-changed={}", path.display());
        match std::fs::read(&path) {
            Ok(text) if abi::sha256_hex(&abi::normalize(&text)) == *expected => {}
            Ok(_) => differ.push(format!("{rel} differs")),
            Err(e) => differ.push(format!("{rel} cannot be read ({e})")),
        }
    }
    if differ.is_empty() {
        return Ok(root.join("tools").join("mtmd"));
    }
    Err(format!(
        "the feature `mtmd` binds libmtmd as the pinned llama.cpp has it, and in {}: {}. Build the pinned \
         llama.cpp (unset LLAMA_CPP_DIR; a vendor/llama.cpp fetched before libmtmd was bound lacks \
         tools/mtmd: delete it to fetch it again), or leave the feature off",
        root.display(),
        differ.join(", ")
    ))
}
