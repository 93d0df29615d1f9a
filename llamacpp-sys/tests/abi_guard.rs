//! The ABI guard (build/abi.rs): the checked-in header list matches the
//! headers of the llama.cpp tree this crate was built from (so a header
//! update cannot land without `scripts/regen-bindings.sh`), and a tree or an
//! installed llama.cpp with a changed, added or missing header is refused by
//! name unless `bindgen` generates the bindings, by the check itself and by
//! a real build of llamacpp-sys. A build that gets past the check without a
//! cmake says what to install.

#[path = "../build/abi.rs"]
#[allow(dead_code)]
mod abi;
#[path = "../build/pinned.rs"]
#[allow(dead_code)]
mod pinned;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use pinned::PINNED_COMMIT as PINNED;

fn source() -> &'static Path {
    Path::new(llamacpp_sys::SOURCE_DIR)
}

/// A copy of the headers of the source tree in a fresh temporary folder.
fn copy_of_headers(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("abi-guard-{name}"));
    let _ = fs::remove_dir_all(&dir);
    for sub in ["include", "ggml/include"] {
        fs::create_dir_all(dir.join(sub)).unwrap();
        for entry in fs::read_dir(source().join(sub)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                fs::copy(&path, dir.join(sub).join(path.file_name().unwrap())).unwrap();
            }
        }
    }
    fs::create_dir_all(dir.join("src")).unwrap();
    fs::copy(source().join("src/llama-ext.h"), dir.join("src/llama-ext.h")).unwrap();
    dir
}

/// The headers of the source tree as llama.cpp's `cmake --install` lays
/// them out: `include/` and `ggml/include/` in one folder, no `src/`.
fn installed_copy_of_headers(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("abi-guard-installed-{name}"));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    for sub in ["include", "ggml/include"] {
        for entry in fs::read_dir(source().join(sub)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
            }
        }
    }
    dir
}

fn append(path: &Path, text: &str) {
    let mut content = fs::read_to_string(path).unwrap();
    content.push_str(text);
    fs::write(path, content).unwrap();
}

#[test]
fn checked_in_list_matches_the_source_headers() {
    let expected = abi::parse(abi::CHECKED_IN).unwrap();
    let actual = abi::headers(abi::Layout::Tree(source())).unwrap();
    assert_eq!(
        abi::differences(&expected, &actual),
        Vec::<String>::new(),
        "llamacpp-sys/src/bindings.headers.sha256 does not match the headers in {}; run llamacpp-sys/scripts/regen-bindings.sh",
        source().display()
    );
    // What bindgen reads: llama.h and the ggml headers it pulls in; and
    // the staging header the shim's memory breakdown is written against.
    let paths: Vec<&str> = actual.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "ggml/include/ggml-alloc.h",
            "ggml/include/ggml-backend.h",
            "ggml/include/ggml-cpu.h",
            "ggml/include/ggml-opt.h",
            "ggml/include/ggml-rpc.h",
            "ggml/include/ggml.h",
            "ggml/include/gguf.h",
            "include/llama.h",
            "src/llama-ext.h",
        ]
    );
    // The file is exactly what the regeneration script would write.
    assert_eq!(abi::render(&actual), abi::CHECKED_IN);
    assert!(abi::check(abi::Layout::Tree(source()), false, PINNED, None).is_ok_and(|c| c.differences.is_empty()));
}

#[test]
fn a_changed_header_stops_the_build_by_name() {
    let dir = copy_of_headers("changed");
    append(&dir.join("include/llama.h"), "\n// a harmless line\n");
    let err = abi::check(abi::Layout::Tree(&dir), false, PINNED, None).unwrap_err();
    assert!(err.contains("Differing: include/llama.h (changed)."), "{err}");
    assert!(!err.contains("ggml.h"), "only the changed header is named: {err}");
    assert!(err.contains(&dir.display().to_string()), "{err}");
    assert!(err.contains(&format!("commit {PINNED}")), "{err}");
    assert!(err.contains("LLAMA_CPP_DIR") && err.contains("--features llamacpp-sys/bindgen"), "{err}");

    // With bindgen the bindings come from these headers: no error, but the
    // difference is reported (the build prints it as a warning).
    let checked = abi::check(abi::Layout::Tree(&dir), true, PINNED, None).unwrap();
    assert_eq!(checked.differences, ["include/llama.h (changed)"]);
    assert_eq!(checked.headers.len(), 9);
}

#[test]
fn a_header_the_source_newly_includes_is_hashed_too() {
    let dir = copy_of_headers("added");
    append(&dir.join("ggml/include/ggml.h"), "\n#  include \"ggml-extra.h\"\n");
    fs::write(dir.join("ggml/include/ggml-extra.h"), "struct ggml_extra { int x; };\n").unwrap();
    let err = abi::check(abi::Layout::Tree(&dir), false, PINNED, None).unwrap_err();
    assert!(err.contains("ggml/include/ggml-extra.h (new"), "{err}");
    assert!(err.contains("ggml/include/ggml.h (changed)"), "{err}");
}

#[test]
fn a_header_the_source_no_longer_has_is_named() {
    let dir = copy_of_headers("missing");
    fs::remove_file(dir.join("ggml/include/ggml-opt.h")).unwrap();
    let err = abi::check(abi::Layout::Tree(&dir), false, PINNED, None).unwrap_err();
    assert!(err.contains("ggml/include/ggml-opt.h (missing"), "{err}");
    // A root header that is gone is an error of its own.
    fs::remove_file(dir.join("include/llama.h")).unwrap();
    let err = abi::check(abi::Layout::Tree(&dir), true, PINNED, None).unwrap_err();
    assert!(err.contains("cannot read") && err.contains("llama.h"), "{err}");
}

#[test]
fn line_endings_do_not_count() {
    let dir = copy_of_headers("crlf");
    let header = dir.join("include/llama.h");
    let crlf = fs::read_to_string(&header).unwrap().replace('\n', "\r\n");
    fs::write(&header, crlf).unwrap();
    assert!(abi::check(abi::Layout::Tree(&dir), false, PINNED, None).is_ok_and(|c| c.differences.is_empty()));
}

#[test]
fn list_format_round_trips_and_rejects_garbage() {
    let headers = vec![("a/b.h".to_owned(), "0".repeat(64)), ("include/llama.h".to_owned(), "ab".repeat(32))];
    assert_eq!(abi::parse(&abi::render(&headers)).unwrap(), headers);
    // sha256sum's output reads the same (binary-mode `*` included).
    let sums = format!("{}  include/llama.h\n{} *a/b.h\n", "AB".repeat(32), "0".repeat(64));
    assert_eq!(abi::parse(&sums).unwrap(), headers);
    assert!(abi::parse("not-a-hash  include/llama.h\n").is_err());
    assert!(abi::parse(&"0".repeat(64)).is_err());
}

#[test]
fn differences_are_sorted_and_say_how() {
    let h = |p: &str, c: char| (p.to_owned(), c.to_string().repeat(64));
    let expected = vec![h("a.h", '1'), h("b.h", '2'), h("c.h", '3')];
    let actual = vec![h("a.h", '1'), h("b.h", '9'), h("d.h", '4')];
    let diff = abi::differences(&expected, &actual);
    assert_eq!(diff.len(), 3);
    assert_eq!(diff[0], "b.h (changed)");
    assert!(diff[1].starts_with("c.h (missing"));
    assert!(diff[2].starts_with("d.h (new"));
    assert!(abi::differences(&expected, &expected).is_empty());
}

#[test]
fn an_installed_layout_is_checked_without_src() {
    let dir = installed_copy_of_headers("same");
    let checked = abi::check(abi::Layout::Installed(&dir), false, PINNED, Some("0c1e570")).unwrap();
    assert!(checked.differences.is_empty(), "{:?}", checked.differences);
    // The same tree paths and hashes as the checked-in list, less the
    // staging header an install does not have.
    let expected: Vec<(String, String)> =
        abi::parse(abi::CHECKED_IN).unwrap().into_iter().filter(|(p, _)| !p.starts_with("src/")).collect();
    assert_eq!(checked.headers, expected);
    assert_eq!(checked.headers.len(), 8);
}

#[test]
fn a_changed_installed_header_is_refused_naming_both_commits() {
    let dir = installed_copy_of_headers("changed");
    append(&dir.join("ggml.h"), "\n// another commit\n");
    let err = abi::check(abi::Layout::Installed(&dir), false, PINNED, Some("1234abc")).unwrap_err();
    assert!(err.contains("Differing: ggml/include/ggml.h (changed)."), "{err}");
    assert!(err.contains(&format!("installed llama.cpp headers in {}", dir.display())), "{err}");
    assert!(err.contains("(at commit 1234abc)") && err.contains(&format!("llama.cpp commit {PINNED}")), "{err}");
    assert!(err.contains("LLAMA_SYS_LIB_DIR") && err.contains("--features llamacpp-sys/bindgen"), "{err}");
    let err = abi::check(abi::Layout::Installed(&dir), false, PINNED, None).unwrap_err();
    assert!(err.contains("(of an unknown commit)"), "{err}");
}

/// Runs `cargo build -p llamacpp-sys` in a target folder of its own with
/// `envs` set, and returns its stderr; the build must fail.
fn failing_build(name: &str, envs: &[(&str, &Path)]) -> String {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .args(["build", "--offline", "--quiet", "-p", "llamacpp-sys", "--manifest-path"])
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("abi-guard-build-{name}")));
    for var in [
        "LLAMA_CPP_DIR",
        "LLAMA_SYS_LIB_DIR",
        "LLAMA_SYS_INCLUDE_DIR",
        "LLAMA_SYS_USE_PKG_CONFIG",
        "LLAMA_SYS_FETCH_CMAKE",
    ] {
        cargo.env_remove(var);
    }
    for (var, value) in envs {
        cargo.env(var, value);
    }
    let output = cargo.output().expect("run cargo");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "the build of llamacpp-sys with {envs:?} succeeded:\n{stderr}");
    stderr
}

#[test]
fn the_build_refuses_a_changed_llama_h_in_a_tree_or_an_install() {
    // A tree (LLAMA_CPP_DIR): the check runs before cmake, so the headers
    // alone make a tree that far.
    let tree = copy_of_headers("build");
    append(&tree.join("include/llama.h"), "\n// a harmless line\n");
    let err = failing_build("tree", &[("LLAMA_CPP_DIR", &tree)]);
    assert!(err.contains("Differing: include/llama.h (changed)."), "{err}");
    assert!(
        err.contains(&format!("llama.cpp commit {PINNED}")) && err.contains("--features llamacpp-sys/bindgen"),
        "{err}"
    );

    // An install (LLAMA_SYS_LIB_DIR): a shared libllama is found, then the
    // installed headers are refused before anything is linked.
    let include = installed_copy_of_headers("build");
    append(&include.join("llama.h"), "\n// a harmless line\n");
    let lib = include.parent().unwrap().join("abi-guard-installed-build-lib");
    fs::create_dir_all(&lib).unwrap();
    fs::write(lib.join("libllama.so"), b"").unwrap();
    let err = failing_build("installed", &[("LLAMA_SYS_LIB_DIR", &lib), ("LLAMA_SYS_INCLUDE_DIR", &include)]);
    assert!(
        err.contains("installed llama.cpp headers") && err.contains("Differing: include/llama.h (changed)."),
        "{err}"
    );
    assert!(
        err.contains(&format!("llama.cpp commit {PINNED}")) && err.contains("--features llamacpp-sys/bindgen"),
        "{err}"
    );
}

#[test]
fn a_build_without_a_working_cmake_says_what_to_install() {
    // The pinned headers pass the check; then CMAKE names nothing that runs.
    let tree = copy_of_headers("no-cmake");
    let missing = Path::new("/nonexistent/bin/cmake");
    let err = failing_build("tree", &[("LLAMA_CPP_DIR", &tree), ("CMAKE", missing)]);
    assert!(err.contains("CMAKE=/nonexistent/bin/cmake does not run"), "{err}");
    assert!(err.contains("apt install cmake") && err.contains("brew install cmake"), "{err}");
    assert!(!err.contains("Differing"), "the pinned headers pass the check: {err}");
}

#[test]
fn the_build_refuses_an_install_of_another_commit_even_with_the_same_headers() {
    // The pinned headers, installed; the install's CMake package says
    // another commit: the library behind them may differ (the shim
    // declares one function of llama.cpp's unstable C++ API itself).
    let include = installed_copy_of_headers("other-commit");
    let lib = include.parent().unwrap().join("abi-guard-installed-other-commit-lib");
    fs::create_dir_all(lib.join("cmake/ggml")).unwrap();
    fs::create_dir_all(lib.join("cmake/llama")).unwrap();
    fs::write(lib.join("libllama.so"), b"").unwrap();
    fs::write(
        lib.join("cmake/ggml/ggml-config.cmake"),
        "set(GGML_SHARED_LIB \"ON\")\nset(GGML_AVAILABLE_BACKENDS \"ggml-cpu\")\n",
    )
    .unwrap();
    fs::write(lib.join("cmake/llama/llama-config.cmake"), "set(LLAMA_BUILD_COMMIT \"1234abc\")\n").unwrap();
    let err = failing_build("other-commit", &[("LLAMA_SYS_LIB_DIR", &lib), ("LLAMA_SYS_INCLUDE_DIR", &include)]);
    assert!(err.contains("is commit 1234abc (its LLAMA_BUILD_COMMIT)"), "{err}");
    assert!(
        err.contains(&format!("llama.cpp commit {PINNED}")) && err.contains("--features llamacpp-sys/bindgen"),
        "{err}"
    );
    assert!(!err.contains("Differing"), "the headers themselves match: {err}");
}
