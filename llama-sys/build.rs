//! Builds the pinned llama.cpp and links it: find the source, check that its
//! headers are the ones the bindings came from, find cmake, configure and
//! build, compile the exception shim, print the link lines. Each step lives
//! in its own module under build/.

#[path = "build/abi.rs"]
mod abi;
#[path = "build/bindings.rs"]
mod bindings;
#[path = "build/cmake_tool.rs"]
mod cmake_tool;
#[path = "build/env.rs"]
mod env;
#[path = "build/features.rs"]
mod features;
#[path = "build/native.rs"]
mod native;
#[path = "build/source.rs"]
mod source;

use std::path::{Path, PathBuf};

use features::{Features, Lib, Sanitizer, Target};

fn main() {
    for path in ["build.rs", "build", "shim"] {
        println!("cargo:rerun-if-changed={path}");
    }
    let manifest_dir = env::cargo_path("CARGO_MANIFEST_DIR");
    let out_dir = env::cargo_path("OUT_DIR");

    if env::var("DOCS_RS").is_some() {
        // docs.rs has no network and no need for the native library.
        write_paths(&out_dir, Path::new(""));
        return;
    }

    let shared = shared_dir(&out_dir);
    let src = source::locate(&vendor_dir(&manifest_dir, &shared), &shared.join("download"));
    write_paths(&out_dir, &src.root);
    println!("cargo:root={}", src.root.display());
    let headers = check_abi(&src.root);

    let features = Features::from_enabled(env::feature);
    let target = target();
    let sanitizer = sanitizer(&target);
    let cmake = cmake_tool::find(&shared.join("cmake-wheel"));
    let install = native::build(&src, &features, &target, sanitizer, &cmake, &shared);

    println!("cargo:include={}", install.prefix.join("include").display());
    println!("cargo:lib={}", install.prefix.join("lib").display());
    println!("cargo:ggml_cmake_dir={}", install.prefix.join("lib").join("cmake").join("ggml").display());
    println!("cargo:llama_cmake_dir={}", install.prefix.join("lib").join("cmake").join("llama").display());
    println!("cargo:commit={}", source::PINNED_COMMIT);

    // The shim references libllama, so it goes first on the link line.
    compile_shim(&src.root, sanitizer);
    link(&features, &target, sanitizer, &install.prefix.join("lib"));

    // The regeneration script copies both files into src/.
    std::fs::write(out_dir.join(abi::FILE_NAME), abi::render(&headers)).expect("write the header list");
    #[cfg(feature = "bindgen")]
    bindings::generate(&src.root, &out_dir.join("bindings.rs"));
}

/// Stops the build when the headers of the source are not the ones the
/// checked-in bindings came from (unless `bindgen` generates them now).
fn check_abi(root: &Path) -> abi::Headers {
    let checked = abi::check(root, env::feature("bindgen"), source::PINNED_COMMIT).unwrap_or_else(|e| source::fail(&e));
    for (header, _) in &checked.headers {
        println!("cargo:rerun-if-changed={}", root.join(header).display());
    }
    if !checked.differences.is_empty() {
        println!(
            "cargo:warning=llama-sys: the headers in {} differ from the ones src/bindings.rs came from ({}); \
             using bindings generated from them now. The hand-written declarations in src/shim.rs are not \
             regenerated: check them against these headers.",
            root.display(),
            checked.differences.join(", ")
        );
    }
    checked.headers
}

/// `LLAMA_SYS_SANITIZE=address`: AddressSanitizer for llama.cpp and the shim.
fn sanitizer(target: &Target) -> Option<Sanitizer> {
    let sanitizer = Sanitizer::parse(&env::var("LLAMA_SYS_SANITIZE")?).unwrap_or_else(|e| source::fail(&e));
    if let Err(e) = sanitizer.runtime(target) {
        source::fail(&e);
    }
    println!("cargo:sanitize=address");
    Some(sanitizer)
}

/// Where the fetched source goes: `vendor/llama.cpp` at the workspace root
/// when llama-sys sits in this repository, otherwise the shared build folder
/// (a crates.io checkout is read-only).
fn vendor_dir(manifest_dir: &Path, shared: &Path) -> PathBuf {
    let root = manifest_dir.parent().unwrap_or(manifest_dir);
    let in_repo = std::fs::read_to_string(root.join("Cargo.toml")).is_ok_and(|s| s.contains("\"llama-sys\""));
    if in_repo { root.join("vendor").join("llama.cpp") } else { shared.join("llama.cpp") }
}

/// A folder shared by every profile: `<target-dir>/llama-sys`, found from
/// OUT_DIR (`<target-dir>/<profile>/build/llama-sys-<hash>/out`).
fn shared_dir(out_dir: &Path) -> PathBuf {
    let mut ancestors = out_dir.ancestors();
    let build = ancestors.nth(2);
    match (build, ancestors.nth(1)) {
        (Some(b), Some(target_dir)) if b.file_name().is_some_and(|n| n == "build") => target_dir.join("llama-sys"),
        _ => out_dir.join("llama-sys"),
    }
}

fn target() -> Target {
    let cfg = |name: &str| std::env::var(name).unwrap_or_default();
    Target {
        os: cfg("CARGO_CFG_TARGET_OS"),
        arch: cfg("CARGO_CFG_TARGET_ARCH"),
        env: cfg("CARGO_CFG_TARGET_ENV"),
        cpu_features: cfg("CARGO_CFG_TARGET_FEATURE").split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect(),
        clang: cc::Build::new().cargo_metadata(false).get_compiler().is_like_clang(),
    }
}

fn compile_shim(llama_root: &Path, sanitizer: Option<Sanitizer>) {
    let mut build = cc::Build::new();
    if let Some(sanitizer) = sanitizer {
        for flag in sanitizer.compile_flags() {
            build.flag(flag);
        }
        // GCC 12 with -fsanitize=address warns about libstdc++'s own
        // <regex> internals (a known false positive).
        build.flag_if_supported("-Wno-maybe-uninitialized");
    }
    build
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .file("shim/shim.cpp")
        .include(llama_root.join("include"))
        .include(llama_root.join("ggml").join("include"))
        // For src/llama-ext.h alone (the memory breakdown).
        .include(llama_root.join("src"))
        .warnings(true)
        .compile("llama_rs_shim");
}

fn link(features: &Features, target: &Target, sanitizer: Option<Sanitizer>, lib_dir: &Path) {
    let print = |lib: Lib| match lib {
        Lib::Static(name) => println!("cargo:rustc-link-lib=static={name}"),
        Lib::Dylib(name) => println!("cargo:rustc-link-lib=dylib={name}"),
        Lib::Framework(name) => println!("cargo:rustc-link-lib=framework={name}"),
    };
    // The sanitizer's runtime goes first: ASan checks at start-up that it
    // comes before every other shared library (libstdc++, libc) it wraps.
    if let Some(runtime) = sanitizer.and_then(|s| s.runtime(target).ok()) {
        print(runtime);
    }
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    if let Some(cuda) = features.cuda.then(|| env::var("CUDA_PATH")).flatten() {
        let cuda = PathBuf::from(cuda);
        println!("cargo:rustc-link-search=native={}", cuda.join("lib64").display());
        println!("cargo:rustc-link-search=native={}", cuda.join("lib64").join("stubs").display());
    }
    features::link_libs(features, target).into_iter().for_each(print);
}

fn write_paths(out_dir: &Path, root: &Path) {
    let code = format!(
        "/// The llama.cpp source tree this crate was built from (empty on docs.rs).\npub const SOURCE_DIR: &str = {:?};\n",
        root.display().to_string()
    );
    std::fs::write(out_dir.join("paths.rs"), code).expect("write paths.rs");
}
