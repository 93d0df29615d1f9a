//! The ABI guard (build/abi.rs): the checked-in header list matches the
//! headers of the llama.cpp tree this crate was built from (so a header
//! update cannot land without `scripts/regen-bindings.sh`), and a tree with
//! a changed, added or missing header is refused by name unless `bindgen`
//! generates the bindings.

#[path = "../build/abi.rs"]
#[allow(dead_code)]
mod abi;

use std::fs;
use std::path::{Path, PathBuf};

const PINNED: &str = "0c1e57098bba43ac29e6e3b677cdceebdd22334f";

fn source() -> &'static Path {
    Path::new(llama_sys::SOURCE_DIR)
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

fn append(path: &Path, text: &str) {
    let mut content = fs::read_to_string(path).unwrap();
    content.push_str(text);
    fs::write(path, content).unwrap();
}

#[test]
fn checked_in_list_matches_the_source_headers() {
    let expected = abi::parse(abi::CHECKED_IN).unwrap();
    let actual = abi::headers(source()).unwrap();
    assert_eq!(
        abi::differences(&expected, &actual),
        Vec::<String>::new(),
        "llama-sys/src/bindings.headers.sha256 does not match the headers in {}; run llama-sys/scripts/regen-bindings.sh",
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
            "ggml/include/ggml.h",
            "ggml/include/gguf.h",
            "include/llama.h",
            "src/llama-ext.h",
        ]
    );
    // The file is exactly what the regeneration script would write.
    assert_eq!(abi::render(&actual), abi::CHECKED_IN);
    assert!(abi::check(source(), false, PINNED).is_ok_and(|c| c.differences.is_empty()));
}

#[test]
fn a_changed_header_stops_the_build_by_name() {
    let dir = copy_of_headers("changed");
    append(&dir.join("include/llama.h"), "\n// a harmless line\n");
    let err = abi::check(&dir, false, PINNED).unwrap_err();
    assert!(err.contains("Differing: include/llama.h (changed)."), "{err}");
    assert!(!err.contains("ggml.h"), "only the changed header is named: {err}");
    assert!(err.contains(&dir.display().to_string()), "{err}");
    assert!(err.contains(&format!("commit {PINNED}")), "{err}");
    assert!(err.contains("LLAMA_CPP_DIR") && err.contains("--features llama-sys/bindgen"), "{err}");

    // With bindgen the bindings come from these headers: no error, but the
    // difference is reported (the build prints it as a warning).
    let checked = abi::check(&dir, true, PINNED).unwrap();
    assert_eq!(checked.differences, ["include/llama.h (changed)"]);
    assert_eq!(checked.headers.len(), 8);
}

#[test]
fn a_header_the_source_newly_includes_is_hashed_too() {
    let dir = copy_of_headers("added");
    append(&dir.join("ggml/include/ggml.h"), "\n#  include \"ggml-extra.h\"\n");
    fs::write(dir.join("ggml/include/ggml-extra.h"), "struct ggml_extra { int x; };\n").unwrap();
    let err = abi::check(&dir, false, PINNED).unwrap_err();
    assert!(err.contains("ggml/include/ggml-extra.h (new"), "{err}");
    assert!(err.contains("ggml/include/ggml.h (changed)"), "{err}");
}

#[test]
fn a_header_the_source_no_longer_has_is_named() {
    let dir = copy_of_headers("missing");
    fs::remove_file(dir.join("ggml/include/ggml-opt.h")).unwrap();
    let err = abi::check(&dir, false, PINNED).unwrap_err();
    assert!(err.contains("ggml/include/ggml-opt.h (missing"), "{err}");
    // A root header that is gone is an error of its own.
    fs::remove_file(dir.join("include/llama.h")).unwrap();
    let err = abi::check(&dir, true, PINNED).unwrap_err();
    assert!(err.contains("cannot read") && err.contains("llama.h"), "{err}");
}

#[test]
fn line_endings_do_not_count() {
    let dir = copy_of_headers("crlf");
    let header = dir.join("include/llama.h");
    let crlf = fs::read_to_string(&header).unwrap().replace('\n', "\r\n");
    fs::write(&header, crlf).unwrap();
    assert!(abi::check(&dir, false, PINNED).is_ok_and(|c| c.differences.is_empty()));
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
