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
    assert_eq!(facts::SDIST_REQUIREMENT, format!("llama-cpp-python=={version}"));
    assert!(
        facts::SDIST_URL.starts_with("https://files.pythonhosted.org/")
            && facts::SDIST_URL.ends_with(facts::SDIST_FILE)
    );
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

/// An sdist whose build backend, if anything runs it, writes `sentinel`:
/// a pyproject with an in-tree backend and no build requirements.
fn booby_trapped_sdist(dir: &Path, sentinel: &Path) -> std::path::PathBuf {
    let src = dir.join("trap-1.0");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(
        src.join("pyproject.toml"),
        "[build-system]\nrequires = []\nbuild-backend = \"backend\"\nbackend-path = [\".\"]\n",
    )
    .unwrap();
    let backend = format!("open({:?}, 'w').write('ran')\n", sentinel.to_str().unwrap());
    std::fs::write(src.join("backend.py"), backend).unwrap();
    std::fs::write(src.join("PKG-INFO"), "Metadata-Version: 2.1\nName: trap\nVersion: 1.0\n").unwrap();
    let tarball = dir.join("trap-1.0.tar.gz");
    let status = Command::new("tar").arg("czf").arg(&tarball).arg("-C").arg(dir).arg("trap-1.0").status().unwrap();
    assert!(status.success());
    tarball
}

/// The build fetches the sdist by URL with Python's standard library and
/// checks its digest before keeping it: nothing in it runs, and a file
/// with another digest is not kept. The control: `pip download` of the
/// same archive (the old path) runs its build backend before any digest of
/// ours could be checked.
#[test]
fn the_sdist_is_fetched_by_url_and_nothing_in_it_runs_before_its_digest_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let sentinel = dir.path().join("backend-ran");
    let tarball = booby_trapped_sdist(dir.path(), &sentinel);
    let url = format!("file://{}", tarball.display());
    let dest = dir.path().join("fetched.tar.gz");

    let refused = facts::fetch_verified("python3", &url, &dest, facts::SDIST_SHA256).output().unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("nothing was kept"), "{refused:?}");
    assert!(!dest.exists() && !sentinel.exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 2, "only the trap's folder and archive: {leftovers:?}");

    let digest = facts::sha256_file(&tarball).unwrap();
    let kept = facts::fetch_verified("python3", &url, &dest, &digest).status().unwrap();
    assert!(kept.success() && dest.exists() && !sentinel.exists());

    // The build's own command: the pinned URL, digest and file name, no pip.
    let command = facts::fetch_sdist("python3", Path::new("/tmp/d"));
    let args: Vec<String> = command.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
    assert_eq!(args[0], "-c");
    assert_eq!(&args[2..], [facts::SDIST_URL, &format!("/tmp/d/{}", facts::SDIST_FILE), facts::SDIST_SHA256]);
    assert!(!args.iter().any(|a| a == "pip"));

    // The control: pip runs the backend to read the metadata.
    let out = dir.path().join("pip-out");
    let pip = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--no-index", "--no-binary", ":all:", "-q", "-d"])
        .arg(&out)
        .arg(&tarball)
        .output()
        .unwrap();
    assert!(sentinel.exists(), "pip download ran the sdist's backend: {pip:?}");
}
