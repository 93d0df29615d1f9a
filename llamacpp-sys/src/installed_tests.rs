//! Unit tests of build/installed.rs: reading an installed llama.cpp's CMake
//! package files and the link lines that follow. The CI's system-library
//! step links real installs (static and shared); these cover the cases it
//! cannot have here (GPU backends, macOS and Windows names, bad installs).

use crate::features::{Features, Lib, Target};
use crate::installed::{Installed, Linkage, check_features, cmake_sets, file_names, libs};

fn linux() -> Target {
    Target { os: "linux".into(), arch: "x86_64".into(), env: "gnu".into(), ..Target::default() }
}

/// The lines that matter of a ggml-config.cmake as llama.cpp's install
/// writes it (static, OpenMP, CPU only), among lines that must be skipped.
const GGML_CONFIG: &str = r#"
set(GGML_ACCELERATE "ON")
set(GGML_AVAILABLE_BACKENDS "ggml-cpu")
set(GGML_BACKEND_DL "OFF")
set(GGML_OPENMP "ON")
set(GGML_OPENMP_ENABLED "ON")
set(GGML_SHARED_LIB "OFF")
set(GGML_VERSION "0.25.3")
macro(set_and_check _var _file)
  set(${_var} "${_file}")
endmacro()
    if (GGML_OPENMP_ENABLED)
        set(GGML_OPENMP_INTERFACE_LINK_LIBRARIES "")
"#;

const LLAMA_CONFIG: &str = "set(LLAMA_VERSION      0.5.0-dev)\nset(LLAMA_BUILD_COMMIT 0c1e570)\nset(LLAMA_BUILD_NUMBER 0)\nset(LLAMA_SHARED_LIB   OFF)\n";

#[test]
fn cmake_sets_reads_quoted_and_bare_values_and_skips_the_rest() {
    let sets = cmake_sets(GGML_CONFIG);
    assert_eq!(sets[0], ("GGML_ACCELERATE".to_owned(), "ON".to_owned()));
    assert_eq!(sets.iter().filter(|(n, _)| n == "GGML_OPENMP_ENABLED").count(), 1);
    // `set(${_var} …)` is not a plain name; the indented line inside the
    // `if` is a plain set and is read (the last value of a name wins).
    assert!(sets.iter().all(|(n, _)| !n.contains('$')));
    assert_eq!(sets.last().unwrap(), &("GGML_OPENMP_INTERFACE_LINK_LIBRARIES".to_owned(), String::new()));
    assert_eq!(cmake_sets(LLAMA_CONFIG)[0], ("LLAMA_VERSION".to_owned(), "0.5.0-dev".to_owned()));
}

#[test]
fn an_install_says_its_backends_openmp_linkage_version_and_commit() {
    let installed = Installed::read(GGML_CONFIG, Some(LLAMA_CONFIG));
    assert_eq!(
        installed,
        Installed {
            backends: vec!["ggml-cpu".into()],
            openmp: true,
            shared: false,
            backend_dl: false,
            version: Some("0.5.0-dev".into()),
            commit: Some("0c1e570".into()),
        }
    );
    let shared = GGML_CONFIG
        .replace(r#"GGML_SHARED_LIB "OFF""#, r#"GGML_SHARED_LIB "ON""#)
        .replace(r#""ggml-cpu""#, r#""ggml-cpu;ggml-rpc;ggml-cuda""#);
    let unknown = LLAMA_CONFIG.replace("0c1e570", "unknown");
    let installed = Installed::read(&shared, Some(&unknown));
    assert!(installed.shared);
    assert_eq!(installed.backends, ["ggml-cpu", "ggml-rpc", "ggml-cuda"]);
    // The list as some ggml versions write it, separators escaped.
    let escaped = GGML_CONFIG.replace(r#""ggml-cpu""#, r#""ggml-cpu\;ggml-rpc""#);
    assert_eq!(Installed::read(&escaped, None).backends, ["ggml-cpu", "ggml-rpc"]);
    assert_eq!(installed.commit, None, "`unknown` is no commit");
    assert_eq!(Installed::read(GGML_CONFIG, None).version, None);
}

#[test]
fn a_static_install_links_like_the_bundled_build() {
    let installed = Installed::read(GGML_CONFIG, Some(LLAMA_CONFIG));
    let got = libs(&installed, Linkage::Static, &Features::default(), &linux()).unwrap();
    // The bundled build's own list for the same configuration.
    let bundled = crate::features::link_libs(&Features { openmp: true, ..Features::default() }, &linux(), false, true);
    assert_eq!(got, bundled);
    assert_eq!(
        got[..4],
        [Lib::Static("llama"), Lib::Static("ggml"), Lib::Static("ggml-cpu"), Lib::Static("ggml-base")]
    );
    assert!(got.contains(&Lib::Dylib("gomp")) && got.contains(&Lib::Dylib("stdc++")));

    // Without OpenMP there is no OpenMP runtime to link.
    let no_omp = Installed { openmp: false, ..installed.clone() };
    assert!(!libs(&no_omp, Linkage::Static, &Features::default(), &linux()).unwrap().contains(&Lib::Dylib("gomp")));

    // A static ggml-rpc is linked before ggml-cpu, as in the bundled build.
    let rpc = Installed { backends: vec!["ggml-cpu".into(), "ggml-rpc".into()], ..installed };
    let got = libs(&rpc, Linkage::Static, &Features::default(), &linux()).unwrap();
    let at = |lib: &'static str| got.iter().position(|l| *l == Lib::Static(lib)).unwrap();
    assert!(at("ggml-rpc") < at("ggml-cpu"));
}

#[test]
fn a_static_link_of_what_cannot_be_linked_statically_is_refused() {
    let installed = Installed::read(GGML_CONFIG, Some(LLAMA_CONFIG));
    let shared = Installed { shared: true, ..installed.clone() };
    let err = libs(&shared, Linkage::Static, &Features::default(), &linux()).unwrap_err();
    assert!(err.contains("shared libraries") && err.contains("LLAMA_SYS_STATIC"), "{err}");
    let sycl = Installed { backends: vec!["ggml-cpu".into(), "ggml-sycl".into()], ..installed };
    let err = libs(&sycl, Linkage::Static, &Features::default(), &linux()).unwrap_err();
    assert!(err.contains("ggml-sycl") && err.contains("BUILD_SHARED_LIBS=ON"), "{err}");
}

#[test]
fn a_shared_install_links_llama_ggml_and_base_plus_the_backends_asked_for() {
    let installed = Installed {
        backends: vec!["ggml-cpu".into(), "ggml-rpc".into(), "ggml-sycl".into()],
        shared: true,
        ..Installed::default()
    };
    let got = libs(&installed, Linkage::Dynamic, &Features::default(), &linux()).unwrap();
    assert_eq!(got, [Lib::Dylib("llama"), Lib::Dylib("ggml"), Lib::Dylib("ggml-base")]);
    let rpc = Features { rpc: true, ..Features::default() };
    let got = libs(&installed, Linkage::Dynamic, &rpc, &linux()).unwrap();
    assert_eq!(got, [Lib::Dylib("llama"), Lib::Dylib("ggml"), Lib::Dylib("ggml-rpc"), Lib::Dylib("ggml-base")]);
}

#[test]
fn a_backend_feature_must_name_a_backend_the_install_has() {
    let installed = Installed::read(GGML_CONFIG, Some(LLAMA_CONFIG));
    // native and openmp are how the install was compiled: not checked.
    let cpu = Features { native: true, openmp: false, ..Features::default() };
    assert_eq!(check_features(&cpu, &installed, "/usr/lib"), Ok(()));
    let gpu = Features { cuda: true, rpc: true, ..Features::default() };
    let err = check_features(&gpu, &installed, "/usr/lib").unwrap_err();
    assert!(err.contains("cuda, rpc") && err.contains("/usr/lib") && err.contains("its backends: ggml-cpu"), "{err}");
    let with_rpc = Installed { backends: vec!["ggml-cpu".into(), "ggml-rpc".into()], ..installed };
    assert_eq!(check_features(&Features { rpc: true, ..Features::default() }, &with_rpc, "/usr/lib"), Ok(()));
}

#[test]
fn library_file_names_follow_the_platform() {
    let macos = Target { os: "macos".into(), ..Target::default() };
    let msvc = Target { os: "windows".into(), env: "msvc".into(), ..Target::default() };
    let mingw = Target { os: "windows".into(), env: "gnu".into(), ..Target::default() };
    assert_eq!(file_names("llama", Linkage::Static, &linux()), ["libllama.a"]);
    assert_eq!(file_names("llama", Linkage::Dynamic, &linux()), ["libllama.so"]);
    assert_eq!(file_names("llama", Linkage::Dynamic, &macos), ["libllama.dylib"]);
    assert_eq!(file_names("llama", Linkage::Static, &msvc), ["llama.lib"]);
    assert_eq!(file_names("llama", Linkage::Dynamic, &mingw), ["libllama.dll.a", "llama.dll"]);
}
