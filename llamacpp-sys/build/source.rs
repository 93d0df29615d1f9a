//! Where llama.cpp comes from; the first that applies wins:
//!
//! 1. an installed llama.cpp: `LLAMA_SYS_LIB_DIR` or
//!    `LLAMA_SYS_USE_PKG_CONFIG=1` (build/system.rs);
//! 2. `LLAMA_CPP_DIR`: a llama.cpp source tree of the user's;
//! 3. the tree bundled in the package: `llama.cpp/` next to llamacpp-sys's
//!    Cargo.toml, put there by `scripts/package.sh` (what the Rust
//!    registry's llamacpp-sys carries);
//! 4. in a git checkout of this repository only: `vendor/llama.cpp` at the
//!    workspace root, fetched from PyPI with pip when empty (build/fetch.rs).
//!
//! Only the fourth uses the network, and only it writes outside the target
//! directory (into the workspace's gitignored vendor/, never into the
//! llamacpp-sys package).

use std::path::{Path, PathBuf};

use crate::pinned::PINNED_COMMIT;
use crate::system::Request;
use crate::{env, fetch};

/// Where a llama.cpp source tree came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `LLAMA_CPP_DIR`.
    UserDir,
    /// `llama.cpp/` inside the package.
    Bundled,
    /// `vendor/llama.cpp` of a git checkout (fetched or put there).
    Checkout,
}

/// A llama.cpp source tree to build.
#[derive(Debug)]
pub struct Tree {
    pub root: PathBuf,
    pub origin: Origin,
}

impl Tree {
    /// The tree's commit, as far as it can be told: the bundled tree is
    /// `PINNED_COMMIT`; a checkout's `vendor/` tree and a user's tree say
    /// theirs through the `.pinned-commit` file of trees this crate
    /// extracted, and a user's tree that is a git repository of its own
    /// through git (not through a repository it merely sits in). The ABI
    /// guard checks the headers whatever this says.
    pub fn commit(&self) -> Option<String> {
        if self.origin == Origin::Bundled {
            return Some(PINNED_COMMIT.to_owned());
        }
        if let Ok(text) = std::fs::read_to_string(self.root.join(".pinned-commit")) {
            return Some(text.trim().to_owned()).filter(|c| !c.is_empty());
        }
        if self.origin == Origin::Checkout {
            return None;
        }
        let git = |args: &[&str]| {
            let output = std::process::Command::new("git").arg("-C").arg(&self.root).args(args).output();
            output.ok().filter(|o| o.status.success()).map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        };
        let top = git(&["rev-parse", "--show-toplevel"]).map(std::path::PathBuf::from);
        let own = top
            .zip(std::fs::canonicalize(&self.root).ok())
            .is_some_and(|(top, root)| std::fs::canonicalize(top).is_ok_and(|top| top == root));
        if !own {
            return None;
        }
        let commit = git(&["rev-parse", "HEAD"]);
        commit.filter(|c| c.len() == 40 && c.bytes().all(|b| b.is_ascii_hexdigit()))
    }
}

#[derive(Debug)]
pub enum Source {
    System(Request),
    Tree(Tree),
}

/// Finds the source, fetching it only in a git checkout of this repository
/// (`shared` is the target directory's `llamacpp-sys` folder, where the
/// download is kept).
pub fn locate(manifest_dir: &Path, shared: &Path) -> Source {
    let system = Request::from_env();
    let user_dir = env::var("LLAMA_CPP_DIR");
    if let (Some(system), Some(dir)) = (&system, &user_dir) {
        fail(&format!(
            "LLAMA_CPP_DIR={dir} asks to build a llama.cpp source tree, and {} asks to link an installed \
             llama.cpp: set only one of them",
            match system {
                Request::Dirs { .. } => "LLAMA_SYS_LIB_DIR",
                Request::PkgConfig => "LLAMA_SYS_USE_PKG_CONFIG",
            }
        ));
    }
    if let Some(system) = system {
        return Source::System(system);
    }
    if let Some(dir) = user_dir {
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
        return Source::Tree(Tree { root, origin: Origin::UserDir });
    }
    let bundled = manifest_dir.join("llama.cpp");
    if is_populated(&bundled) {
        return Source::Tree(Tree { root: bundled, origin: Origin::Bundled });
    }
    if let Some(vendor) = checkout_vendor_dir(manifest_dir) {
        if !is_populated(&vendor) {
            fetch::pinned_tree(&vendor, &shared.join("download"), is_populated);
        }
        return Source::Tree(Tree { root: vendor, origin: Origin::Checkout });
    }
    fail(&format!(
        "this llamacpp-sys package has no llama.cpp tree in {} (a package made without scripts/package.sh?). \
         Set LLAMA_CPP_DIR to a llama.cpp checkout at commit {PINNED_COMMIT}, or link an installed one with \
         LLAMA_SYS_LIB_DIR or LLAMA_SYS_USE_PKG_CONFIG=1",
        bundled.display()
    ))
}

fn is_populated(dir: &Path) -> bool {
    dir.join("include").join("llama.h").is_file() && dir.join("CMakeLists.txt").is_file()
}

/// `vendor/llama.cpp` at the workspace root when llamacpp-sys sits in a
/// checkout of this repository (the workspace manifest names it); `None`
/// for a package unpacked from the registry.
fn checkout_vendor_dir(manifest_dir: &Path) -> Option<PathBuf> {
    let root = manifest_dir.parent()?;
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).ok()?;
    let in_repo = manifest.contains("[workspace]") && manifest.contains("\"llamacpp-sys\"");
    in_repo.then(|| root.join("vendor").join("llama.cpp"))
}

pub fn fail(message: &str) -> ! {
    eprintln!("error: llamacpp-sys: {message}");
    panic!("llamacpp-sys: {message}");
}
