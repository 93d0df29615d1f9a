//! Generating `bindings.rs` with bindgen (feature `bindgen` only). The same
//! function serves the build (writing to OUT_DIR) and
//! `scripts/regen-bindings.sh` (copying that file over src/bindings.rs), so
//! the checked-in file and a fresh generation can only differ when the
//! headers or bindgen differ.

/// `include_dirs`: where `llama.h` and the ggml headers are (a source
/// tree's `include/` and `ggml/include/`, or an install's one folder).
#[cfg(feature = "bindgen")]
pub fn generate(include_dirs: &[std::path::PathBuf], out: &std::path::Path) {
    let mut builder = bindgen::Builder::default();
    for dir in include_dirs {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    let bindings = builder
        .header_contents(
            "wrapper.h",
            "#include \"llama.h\"\n#include \"gguf.h\"\n#include \"ggml-backend.h\"\n#include \"ggml-cpu.h\"\n#include \"ggml-rpc.h\"\n",
        )
        .allowlist_function("llama_.*")
        .allowlist_type("llama_.*")
        .allowlist_var("LLAMA_.*")
        .allowlist_function("ggml_backend_.*")
        .allowlist_function("gguf_.*")
        .allowlist_type("gguf_.*")
        // What test code needs to declare tensors for a synthetic model.
        .allowlist_function(
            "ggml_(init|free|new_tensor|new_tensor_[1-4]d|set_name|get_name|nbytes|nelements|row_size|type_size|blck_size|type_name|tensor_overhead|get_data|set_abort_callback|log_set|time_init)",
        )
        .allowlist_type("ggml_(type|log_level|numa_strategy|init_params|tensor|context)")
        .allowlist_var("GGML_(MAX_DIMS|DEFAULT_N_THREADS|MAX_NAME|RPC_MAX_SERVERS)")
        // ggml-rpc.h (linked with the `rpc` feature only).
        .allowlist_var("RPC_PROTO_.*")
        .default_enum_style(bindgen::EnumVariation::ModuleConsts)
        .prepend_enum_name(false)
        .size_t_is_usize(true)
        .generate_comments(true)
        .layout_tests(false)
        .derive_default(true)
        .rust_target(bindgen::RustTarget::stable(85, 0).unwrap())
        .rust_edition(bindgen::RustEdition::Edition2024)
        .wrap_unsafe_ops(true)
        .generate()
        .unwrap_or_else(|e| {
            panic!("bindgen failed on the headers in {include_dirs:?}: {e}. Install libclang-dev (Debian) or set LIBCLANG_PATH.")
        });
    bindings.write_to_file(out).expect("write bindings.rs");
}
