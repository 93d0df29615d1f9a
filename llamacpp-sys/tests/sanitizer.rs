//! `LLAMA_SYS_SANITIZE` (build/features.rs): the value it takes, the
//! llama.cpp options and compiler flags it turns on, and the runtime it
//! links. The sanitized build itself is run by hand (see build.rs), not
//! here: it compiles llama.cpp a second time.

#[path = "../build/features.rs"]
#[allow(dead_code)]
mod features;

use features::{Features, Lib, Options, Sanitizer, Target, cmake_defines};

fn linux() -> Target {
    Target { os: "linux".into(), arch: "x86_64".into(), env: "gnu".into(), ..Target::default() }
}

fn defines(sanitizer: Option<Sanitizer>) -> Vec<(&'static str, String)> {
    let options = Options { build_type: "Release".into(), sanitizer, ..Options::default() };
    cmake_defines(&Features { openmp: true, native: true, ..Features::default() }, &linux(), &options)
}

#[test]
fn address_is_the_one_value() {
    assert_eq!(Sanitizer::parse("address"), Ok(Sanitizer::Address));
    assert_eq!(Sanitizer::parse("ASan"), Ok(Sanitizer::Address));
    let err = Sanitizer::parse("thread").unwrap_err();
    assert!(err.contains("LLAMA_SYS_SANITIZE=thread") && err.contains("`address`"), "{err}");
}

#[test]
fn address_turns_on_both_llama_and_ggml_options() {
    let on = defines(Some(Sanitizer::Address));
    for key in ["LLAMA_SANITIZE_ADDRESS", "GGML_SANITIZE_ADDRESS"] {
        assert!(on.iter().any(|(k, v)| *k == key && v == "ON"), "{key}");
    }
    // Without it the defines are exactly the usual ones, so the usual build
    // folder (keyed by the defines) is kept, and the sanitized one differs.
    let off = defines(None);
    assert!(!off.iter().any(|(k, _)| k.contains("SANITIZE")));
    assert_eq!(on.len(), off.len() + 2);
    assert_eq!(Sanitizer::Address.compile_flags(), ["-fsanitize=address", "-fno-omit-frame-pointer"]);
}

#[test]
fn the_runtime_is_gccs_libasan() {
    assert_eq!(Sanitizer::Address.runtime(&linux()), Ok(Lib::Dylib("asan")));
    let clang = Target { clang: true, ..linux() };
    assert!(Sanitizer::Address.runtime(&clang).unwrap_err().contains("CC=gcc"));
    let msvc = Target { os: "windows".into(), env: "msvc".into(), ..Target::default() };
    assert!(Sanitizer::Address.runtime(&msvc).is_err());
}
