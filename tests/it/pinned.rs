//! The pinned llama.cpp (sdist version, digest, archive prefix, commit, the
//! pip command) is named in one place, llamacpp-sys/build/pinned.rs, which the
//! build script, its ABI test and `cargo xtask` include: no other code line
//! in the repository repeats those facts, so they cannot drift apart.

#[path = "../../llamacpp-sys/build/pinned.rs"]
#[allow(dead_code)]
mod facts;

use std::path::Path;
use std::process::Command;

const HOME: &str = "llamacpp-sys/build/pinned.rs";

/// The repository's files as git sees them (tracked, and untracked ones it
/// does not ignore).
fn repository_files() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .output()
        .expect("run git (this test reads the checkout's file list)");
    assert!(out.status.success(), "git ls-files failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect()
}

/// Lines of code that contain `needle`: prose (Markdown) and comment lines
/// may mention the pin, code may not.
fn code_lines_with(needle: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut hits = Vec::new();
    for file in repository_files() {
        if file.ends_with(".md") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(&file)) else { continue };
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            let comment = ["//", "#", "*", "/*"].iter().any(|c| code.starts_with(c)) && !code.starts_with("#[");
            if !comment && line.contains(needle) {
                hits.push(format!("{file}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    hits
}

#[test]
fn each_pinned_fact_is_written_once() {
    let version = facts::SDIST_REQUIREMENT.split("==").nth(1).unwrap();
    for (what, needle) in [
        ("the sdist's sha256", facts::SDIST_SHA256),
        ("the commit", facts::PINNED_COMMIT),
        ("the sdist's version", version),
    ] {
        let hits = code_lines_with(needle);
        assert_eq!(hits.len(), 1, "{what} ({needle}) is written in more than one code line:\n{}", hits.join("\n"));
        assert!(hits[0].starts_with(HOME), "{what} ({needle}) is written outside {HOME}: {}", hits[0]);
    }
}

#[test]
fn the_pinned_facts_agree_with_each_other() {
    let version = facts::SDIST_REQUIREMENT.split("==").nth(1).unwrap();
    assert_eq!(facts::SDIST_FILE, format!("llama_cpp_python-{version}.tar.gz"));
    assert_eq!(facts::SDIST_PREFIX, format!("llama_cpp_python-{version}/vendor/llama.cpp"));
    assert_eq!(facts::SDIST_REQUIREMENT, format!("{}=={version}", facts::SDIST_PROJECT));
    assert!(facts::PINNED_COMMIT.len() == 40 && facts::PINNED_COMMIT.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(facts::SDIST_SHA256.len() == 64 && facts::SDIST_SHA256.bytes().all(|b| b.is_ascii_hexdigit()));
    // The crate's version says the commit in its build metadata.
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("llamacpp-sys/Cargo.toml")).unwrap();
    let short = &facts::PINNED_COMMIT[..7];
    let version =
        manifest.lines().find(|l| l.starts_with("version = ")).expect("llamacpp-sys/Cargo.toml has a version");
    assert!(
        version.ends_with(&format!("+llama.cpp-{short}\"")),
        "llamacpp-sys/Cargo.toml's {version} names another commit than {short}"
    );
}

#[test]
fn pip_fetches_the_sdist_alone_from_source() {
    // `--no-binary :all:` would make pip compile the sdist's build
    // requirements (cmake) from source while it prepares the metadata.
    let command = facts::pip_download_sdist("python3", Path::new("/tmp/d"));
    let args: Vec<_> = command.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
    assert_eq!(
        args,
        [
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "-d",
            "/tmp/d",
            "--no-binary",
            "llama-cpp-python",
            facts::SDIST_REQUIREMENT
        ]
    );
}
