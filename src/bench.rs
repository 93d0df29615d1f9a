//! What the criterion benchmarks share: the model (the default one, or
//! `LLAMA_MODEL`), loaded once, and the thread count (`LLAMA_BENCH_THREADS`,
//! default 2).

use std::sync::OnceLock;

use llamacpp::{Model, ModelParams};

/// The benchmarks' model, loaded on first use. Panics (a benchmark has no
/// other way to fail) when it cannot be fetched or loaded.
pub fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = crate::model_cache::model_path().unwrap_or_else(|e| panic!("no model: {e}"));
        Model::load(&path, &ModelParams::default()).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()))
    })
}

/// Threads for the benchmarks' contexts.
pub fn threads() -> i32 {
    std::env::var("LLAMA_BENCH_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(2)
}
