//! Builds the pinned llama.cpp, or finds an installed one, and links it:
//! find the source (build/source.rs), check that its headers are the ones
//! the bindings came from (build/abi.rs), then either find cmake, configure
//! and build (build/cmake_tool.rs, build/native.rs) or check the installed
//! libraries (build/system.rs, build/installed.rs); compile the exception
//! shim and print the link lines. Each step lives in its own module under
//! build/.

#[path = "build/abi.rs"]
mod abi;
#[path = "build/bindings.rs"]
mod bindings;
#[path = "build/cmake_tool.rs"]
mod cmake_tool;
#[path = "build/cpu_variants.rs"]
mod cpu_variants;
#[path = "build/dispatch.rs"]
mod dispatch;
#[path = "build/env.rs"]
mod env;
#[path = "build/features.rs"]
mod features;
#[path = "build/fetch.rs"]
mod fetch;
#[path = "build/gpu.rs"]
mod gpu;
#[path = "build/installed.rs"]
mod installed;
#[path = "build/mtmd.rs"]
mod mtmd;
#[path = "build/native.rs"]
mod native;
#[path = "build/pinned.rs"]
mod pinned;
#[path = "build/source.rs"]
mod source;
#[path = "build/system.rs"]
mod system;

use std::path::{Path, PathBuf};

use features::{Features, Lib, Sanitizer, Target};
use source::{Origin, Source, Tree};

fn main() {
    for path in ["build.rs", "build", "shim"] {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo::rustc-check-cfg=cfg(llama_sys_cpu_dispatch)");
    let manifest_dir = env::cargo_path("CARGO_MANIFEST_DIR");
    let out_dir = env::cargo_path("OUT_DIR");

    if env::var("DOCS_RS").is_some() {
        docs_rs(&manifest_dir, &out_dir);
        return;
    }

    let shared = shared_dir(&out_dir);
    let features = Features::from_enabled(env::feature);
    let target = target();
    let built = match source::locate(&manifest_dir, &shared) {
        Source::Tree(tree) => build_tree(&tree, &features, &target, &shared, &out_dir),
        Source::System(request) => link_installed(request, &features, &target),
    };
    write_paths(&out_dir, &built);
    // The regeneration script copies both files into src/.
    std::fs::write(out_dir.join(abi::FILE_NAME), abi::render(&built.headers)).expect("write the header list");
    #[cfg(feature = "bindgen")]
    bindings::generate(&built.include_dirs, &out_dir.join("bindings.rs"));
}

/// What the rest of the build needs from either path.
struct Built {
    /// The headers checked against the bindings' list.
    headers: abi::Headers,
    /// Where bindgen finds `llama.h` and the ggml headers.
    #[cfg_attr(not(feature = "bindgen"), allow(dead_code))]
    include_dirs: Vec<PathBuf>,
    /// The llama.cpp source tree (`llamacpp_sys::SOURCE_DIR`); empty for an
    /// installed llama.cpp.
    source_dir: PathBuf,
    /// The CPU variants linked in (`llamacpp_sys::CPU_VARIANTS`); empty
    /// without runtime dispatch.
    cpu_variants: Vec<String>,
    /// Where an installed llama.cpp may keep backend modules
    /// (`llamacpp_sys::INSTALLED_BACKEND_DIRS`); empty for a built one.
    backend_dirs: Vec<PathBuf>,
}

/// Builds a llama.cpp source tree with CMake into the target directory.
fn build_tree(tree: &Tree, features: &Features, target: &Target, shared: &Path, out_dir: &Path) -> Built {
    println!("llamacpp-sys: building llama.cpp from {} ({:?})", tree.root.display(), tree.origin);
    println!("cargo:root={}", tree.root.display());
    let commit = tree.commit();
    let headers = check_abi(abi::Layout::Tree(&tree.root), commit.clone());
    let sanitizer = sanitizer(target);
    let cmake = cmake_tool::find(&shared.join("cmake-wheel"), tree.origin == Origin::Checkout);
    let setting = cpu_variants::Setting::parse(env::var("LLAMA_SYS_CPU_VARIANTS").as_deref())
        .unwrap_or_else(|e| source::fail(&e));
    let cpu_dispatch = cpu_variants::dispatches(features.native, &target.os, &target.arch, &target.env, &setting);
    gpu::check(features.vulkan, features.cuda, &target.os, env::var).unwrap_or_else(|e| source::fail(&e));
    let install = native::build(tree, features, target, sanitizer, cpu_dispatch, &cmake, shared);
    let dispatch =
        cpu_dispatch.then(|| dispatch::build(tree, &install, &setting, &target.arch, &cmake, shared, out_dir));

    let lib_dir = install.prefix.join("lib");
    println!("cargo:include={}", install.prefix.join("include").display());
    println!("cargo:lib={}", lib_dir.display());
    println!("cargo:ggml_cmake_dir={}", lib_dir.join("cmake").join("ggml").display());
    println!("cargo:llama_cmake_dir={}", lib_dir.join("cmake").join("llama").display());
    if let Some(commit) = &commit {
        println!("cargo:commit={commit}");
    }

    let include_dirs = vec![tree.root.join("include"), tree.root.join("ggml").join("include")];
    // src/ for src/llama-ext.h alone (the memory breakdown); tools/mtmd
    // for libmtmd's headers (feature `mtmd`).
    let mtmd_dir = features.mtmd.then(|| mtmd::include_dir(&tree.root).unwrap_or_else(|e| source::fail(&e)));
    let shim_includes: Vec<PathBuf> =
        include_dirs.iter().cloned().chain([tree.root.join("src")]).chain(mtmd_dir.clone()).collect();
    // The shim references libllama (and libmtmd), so it goes first on the
    // link line.
    compile_shim(&shim_includes, sanitizer, false, mtmd_dir.is_some());
    // The sanitizer's runtime goes first: ASan checks at start-up that it
    // comes before every other shared library (libstdc++, libc) it wraps.
    if let Some(runtime) = sanitizer.and_then(|s| s.runtime(target).ok()) {
        print_lib(runtime);
    }
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    if features.mtmd {
        // libvendor-hash.a (libmtmd's SHA-256) is built, not installed:
        // the `cmake` crate builds in the prefix's build/.
        println!(
            "cargo:rustc-link-search=native={}",
            install.prefix.join("build").join("vendor").join("hash").display()
        );
    }
    if let Some(dispatch) = &dispatch {
        println!("cargo:rustc-link-search=native={}", dispatch.lib_dir.display());
        println!("cargo:rustc-cfg=llama_sys_cpu_dispatch");
        println!("cargo:cpu_variants={}", dispatch.variants.join(","));
    }
    if let Some(cuda) = features.cuda.then(|| env::var("CUDA_PATH")).flatten() {
        cuda_search_paths(Path::new(&cuda));
    }
    features::link_libs(features, target, dispatch.is_some(), !install.cuda_no_vmm).into_iter().for_each(print_lib);
    let cpu_variants = dispatch.map(|d| d.variants).unwrap_or_default();
    Built { headers, include_dirs, source_dir: tree.root.clone(), cpu_variants, backend_dirs: Vec::new() }
}

/// Links an installed llama.cpp (`LLAMA_SYS_LIB_DIR` or pkg-config).
fn link_installed(request: system::Request, features: &Features, target: &Target) -> Built {
    if env::var("LLAMA_SYS_SANITIZE").is_some() {
        source::fail(
            "LLAMA_SYS_SANITIZE builds llama.cpp with a sanitizer, which an installed llama.cpp cannot be: \
             unset it, or unset LLAMA_SYS_LIB_DIR / LLAMA_SYS_USE_PKG_CONFIG",
        );
    }
    let system = system::find(request, target);
    println!(
        "llamacpp-sys: linking the installed llama.cpp in {} ({:?}, version {}, commit {})",
        system.lib_dir.display(),
        system.linkage,
        system.installed.version.as_deref().unwrap_or("unknown"),
        system.installed.commit.as_deref().unwrap_or("unknown")
    );
    let headers = check_abi(abi::Layout::Installed(&system.include_dir), system.installed.commit.clone());
    check_installed_commit(system.installed.commit.as_deref(), &system.lib_dir);
    println!("cargo:include={}", system.include_dir.display());
    println!("cargo:lib={}", system.lib_dir.display());
    for (key, dir) in [("ggml_cmake_dir", "ggml"), ("llama_cmake_dir", "llama")] {
        let dir = system.lib_dir.join("cmake").join(dir);
        if dir.is_dir() {
            println!("cargo:{key}={}", dir.display());
        }
    }
    if let Some(commit) = &system.installed.commit {
        println!("cargo:commit={commit}");
    }
    println!("cargo:system=1");

    if features.mtmd {
        source::fail(
            "the feature `mtmd` builds libmtmd with the bundled llama.cpp; an installed llama.cpp \
             (LLAMA_SYS_LIB_DIR / LLAMA_SYS_USE_PKG_CONFIG) is not supported with it yet: unset those, or \
             leave `mtmd` off",
        );
    }
    compile_shim(std::slice::from_ref(&system.include_dir), None, true, false);
    system::link(&system, features, target, print_lib);
    // A GGML_BACKEND_DL install keeps its modules in its bin/ (or its
    // GGML_BACKEND_DIR, which ggml searches by itself) or beside the libraries.
    let backend_dirs = vec![system.lib_dir.join("..").join("bin"), system.lib_dir.clone()];
    Built {
        headers,
        include_dirs: vec![system.include_dir.clone()],
        source_dir: PathBuf::new(),
        cpu_variants: Vec::new(),
        backend_dirs,
    }
}

/// docs.rs builds without network and without the native library. The
/// `links` metadata other crates read still comes first: the bundled
/// headers (the package carries them) and the commit.
fn docs_rs(manifest_dir: &Path, out_dir: &Path) {
    let bundled = manifest_dir.join("llama.cpp");
    let root = if bundled.join("include").join("llama.h").is_file() { bundled } else { PathBuf::new() };
    if !root.as_os_str().is_empty() {
        println!("cargo:root={}", root.display());
        println!("cargo:include={}", root.join("include").display());
    }
    println!("cargo:commit={}", pinned::PINNED_COMMIT);
    write_paths(
        out_dir,
        &Built {
            headers: Vec::new(),
            include_dirs: Vec::new(),
            source_dir: root,
            cpu_variants: Vec::new(),
            backend_dirs: Vec::new(),
        },
    );
    std::fs::write(out_dir.join(abi::FILE_NAME), abi::CHECKED_IN).expect("write the header list");
    // With `bindgen`, lib.rs includes OUT_DIR/bindings.rs: the checked-in
    // bindings are the ones for these headers.
    if env::feature("bindgen") {
        std::fs::copy(manifest_dir.join("src").join("bindings.rs"), out_dir.join("bindings.rs"))
            .expect("copy src/bindings.rs to OUT_DIR");
    }
}

/// Stops the build when the headers in `layout` are not the ones the
/// checked-in bindings came from (unless `bindgen` generates them now).
fn check_abi(layout: abi::Layout<'_>, commit: Option<String>) -> abi::Headers {
    let checked = abi::check(layout, env::feature("bindgen"), pinned::PINNED_COMMIT, commit.as_deref())
        .unwrap_or_else(|e| source::fail(&e));
    for (header, _) in &checked.headers {
        println!("cargo:rerun-if-changed={}", layout.file(header).display());
    }
    if !checked.differences.is_empty() {
        println!(
            "cargo:warning=llamacpp-sys: the headers in {} differ from the ones src/bindings.rs came from ({}); \
             using bindings generated from them now. The hand-written declarations in src/shim.rs are not \
             regenerated: check them against these headers.",
            layout.dir().display(),
            checked.differences.join(", ")
        );
    }
    checked.headers
}

/// An installed llama.cpp says its commit (`LLAMA_BUILD_COMMIT`, often
/// abbreviated) in its CMake package. Headers that match can still belong
/// to another commit whose library differs behind them (the shim declares
/// one function of llama.cpp's unstable C++ API itself, from the pinned
/// commit): a known other commit stops the build unless `bindgen` is on,
/// which takes responsibility for the headers; an unknown one is a warning.
fn check_installed_commit(commit: Option<&str>, lib_dir: &Path) {
    let pinned = pinned::PINNED_COMMIT;
    match commit {
        Some(c) if c.len() >= 7 && pinned.starts_with(&c.to_ascii_lowercase()) => {}
        Some(c) if env::feature("bindgen") => println!(
            "cargo:warning=llamacpp-sys: the llama.cpp in {} is commit {c}, not {pinned}; bindings are generated \
             from its headers (bindgen), but the shim's own declaration of llama_get_memory_breakdown is the \
             pinned commit's",
            lib_dir.display()
        ),
        Some(c) => source::fail(&format!(
            "the llama.cpp installed in {} is commit {c} (its LLAMA_BUILD_COMMIT), and these bindings were \
             generated from llama.cpp commit {pinned}. Install llama.cpp at commit {pinned} (or unset \
             LLAMA_SYS_LIB_DIR and LLAMA_SYS_USE_PKG_CONFIG to build the bundled copy), or build with the \
             llamacpp-sys feature `bindgen` (`--features llamacpp-sys/bindgen`, needs libclang)",
            lib_dir.display()
        )),
        None => println!(
            "cargo:warning=llamacpp-sys: the llama.cpp in {} does not say its commit (LLAMA_BUILD_COMMIT unknown); \
             its headers match the pinned commit {pinned}'s, so it is taken to be that commit",
            lib_dir.display()
        ),
    }
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

/// A folder shared by every profile: `<target-dir>/llamacpp-sys`, found from
/// OUT_DIR (`<target-dir>/<profile>/build/llamacpp-sys-<hash>/out`).
fn shared_dir(out_dir: &Path) -> PathBuf {
    let mut ancestors = out_dir.ancestors();
    let build = ancestors.nth(2);
    match (build, ancestors.nth(1)) {
        (Some(b), Some(target_dir)) if b.file_name().is_some_and(|n| n == "build") => target_dir.join("llamacpp-sys"),
        _ => out_dir.join("llamacpp-sys"),
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

/// Compiles shim/shim.cpp against `includes`; `installed` headers have no
/// `src/llama-ext.h`, so the shim declares what it uses of it itself;
/// `mtmd` adds the twins of libmtmd's calls.
fn compile_shim(includes: &[PathBuf], sanitizer: Option<Sanitizer>, installed: bool, mtmd: bool) {
    let mut build = cc::Build::new();
    if let Some(sanitizer) = sanitizer {
        for flag in sanitizer.compile_flags() {
            build.flag(flag);
        }
        // GCC 12 with -fsanitize=address warns about libstdc++'s own
        // <regex> internals (a known false positive).
        build.flag_if_supported("-Wno-maybe-uninitialized");
    }
    if installed {
        build.define("LLAMA_RS_INSTALLED_HEADERS", None);
    }
    if mtmd {
        build.define("LLAMA_RS_MTMD", None);
    }
    build
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .file("shim/shim.cpp")
        .includes(includes)
        .warnings(true)
        .compile("llama_rs_shim");
}

fn print_lib(lib: Lib) {
    match lib {
        Lib::Static(name) => println!("cargo:rustc-link-lib=static={name}"),
        Lib::Dylib(name) => println!("cargo:rustc-link-lib=dylib={name}"),
        Lib::Framework(name) => println!("cargo:rustc-link-lib=framework={name}"),
    }
}

/// The CUDA toolkit's library folders (`CUDA_PATH`), for a static ggml-cuda.
fn cuda_search_paths(cuda: &Path) {
    println!("cargo:rustc-link-search=native={}", cuda.join("lib64").display());
    println!("cargo:rustc-link-search=native={}", cuda.join("lib64").join("stubs").display());
}

fn write_paths(out_dir: &Path, built: &Built) {
    let dirs: Vec<String> = built.backend_dirs.iter().map(|d| d.display().to_string()).collect();
    let code = format!(
        "/// The llama.cpp source tree this crate was built from (empty on docs.rs and for an installed llama.cpp).\n\
         pub const SOURCE_DIR: &str = {:?};\n\
         /// The variants of ggml's CPU backend linked into this build for runtime dispatch, from the least to the \
         most demanding (empty without dispatch: a `native` build, `LLAMA_SYS_CPU_VARIANTS=none`, a target other \
         than x86-64 Linux, an installed llama.cpp).\npub const CPU_VARIANTS: &[&str] = &{:?};\n\
         /// Where the installed llama.cpp this crate links may keep its backend modules (a `GGML_BACKEND_DL` \
         build): its bin/ and lib/ folders. Empty for a llama.cpp built by this crate.\n\
         pub const INSTALLED_BACKEND_DIRS: &[&str] = &{:?};\n",
        built.source_dir.display().to_string(),
        built.cpu_variants,
        dirs
    );
    std::fs::write(out_dir.join("paths.rs"), code).expect("write paths.rs");
}
