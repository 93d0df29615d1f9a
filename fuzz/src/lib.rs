//! Shared set-up of the fuzz targets: the fixtures (vocab files, the tiny
//! synthetic model), the contexts `state_load` uses, and the input formats,
//! so that `make_seeds` writes seeds the targets parse the same way.
//!
//! Everything here calls only the safe `llamacpp` API.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use llamacpp::{AddBos, ContextParams, Model, ModelParams, Output, Token};

/// The synthetic GGUF writer (`llamacpp::testing`, feature `testing`).
pub use llamacpp::testing as synthetic;

/// Inputs longer than this are cut: tokenize and the grammar parsers
/// recurse per character in places (see README "Known limits").
pub const MAX_TEXT: usize = 4096;

/// The repository root (the fuzz crate sits in `fuzz/`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("fuzz/ has a parent").to_path_buf()
}

/// The vocab fixtures: every `ggml-vocab-*.gguf` in
/// `vendor/llama.cpp/models` (or `$LLAMA_FUZZ_VOCAB_DIR`), sorted by name.
pub fn vocab_paths() -> &'static [PathBuf] {
    static PATHS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    PATHS.get_or_init(|| {
        let dir = std::env::var_os("LLAMA_FUZZ_VOCAB_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join("vendor/llama.cpp/models"));
        let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot list the vocab fixtures in {}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("ggml-vocab-") && n.ends_with(".gguf"))
            })
            .collect();
        v.sort();
        assert!(!v.is_empty(), "no ggml-vocab-*.gguf in {}", dir.display());
        v
    })
}

/// Vocab fixture `i % n`, loaded vocab-only on first use. `None` when
/// llama.cpp cannot load it (some fixtures need a newer llama.cpp).
pub fn vocab_model(i: usize) -> Option<&'static Model> {
    static MODELS: OnceLock<Vec<OnceLock<Option<Model>>>> = OnceLock::new();
    let paths = vocab_paths();
    let slots = MODELS.get_or_init(|| paths.iter().map(|_| OnceLock::new()).collect());
    let i = i % paths.len();
    slots[i]
        .get_or_init(|| {
            let params = ModelParams::default().vocab_only(true);
            Model::load(&paths[i], &params).ok()
        })
        .as_ref()
}

/// The shape of the tiny model the targets run: as small as the writer
/// allows, so that a decode costs microseconds and the GGUF seed is small.
pub const TINY_SPEC: synthetic::TinyModelSpec =
    synthetic::TinyModelSpec { n_layer: 1, n_embd: 16, n_head: 2, n_head_kv: 1, n_ff: 32, n_ctx_train: 512, seed: 7 };

/// The tiny synthetic llama model (written once to the temp dir, then
/// loaded once per process).
pub fn tiny_model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = synthetic::tiny_llama_path(&TINY_SPEC).expect("write the tiny model");
        Model::load(&path, &ModelParams::default()).expect("load the tiny model")
    })
}

/// The contexts of `state_load`: one sequence, or two (one stream each).
pub fn ctx_params(n_seq: u32) -> ContextParams {
    ContextParams::default().n_ctx(256).n_batch(64).n_ubatch(64).n_seq_max(n_seq).n_threads(1).n_threads_batch(1)
}

/// Splits `data` at the first `n - 1` zero bytes into at most `n` parts.
pub fn split_nul(data: &[u8], n: usize) -> Vec<&[u8]> {
    data.splitn(n, |&b| b == 0).collect()
}

/// Lossy UTF-8 of at most [`MAX_TEXT`] bytes.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_TEXT)]).into_owned()
}

/// Little-endian i32 token ids read from `bytes` (up to `max` of them),
/// in range or not: the safe API must reject the ones outside the vocab.
pub fn raw_tokens(bytes: &[u8], max: usize) -> Vec<Token> {
    bytes.chunks_exact(4).take(max).map(|c| Token(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect()
}

thread_local! {
    /// A one-sequence context of the tiny model that has decoded a short
    /// prompt once, so that samplers have logits to sample from.
    static SAMPLE_CTX: std::cell::RefCell<llamacpp::Context<'static>> = std::cell::RefCell::new({
        let model = tiny_model();
        let mut ctx = model.new_context(&ctx_params(1)).expect("tiny context");
        let prompt = model.vocab().tokenize("Hello world", AddBos::Yes).expect("tokenize");
        ctx.decode(&llamacpp::Batch::from_tokens(&prompt, 0)).expect("decode");
        ctx
    });
}

/// Feeds a grammar sampler: accepts the tokens of `text` (stopping at the
/// first the grammar refuses), accepts the raw ids `extra` (mostly invalid),
/// then samples up to `n_sample` tokens from the tiny context.
pub fn drive_sampler(sampler: &mut llamacpp::Sampler<'_>, text: &str, extra: &[Token], n_sample: usize) {
    let vocab = tiny_model().vocab();
    let tokens = vocab.tokenize(text, AddBos::No).unwrap_or_default();
    for &t in tokens.iter().take(256) {
        if sampler.accept(t).is_err() {
            break;
        }
    }
    for &t in extra {
        let _ = sampler.accept(t);
    }
    SAMPLE_CTX.with(|ctx| {
        let mut ctx = ctx.borrow_mut();
        for _ in 0..n_sample {
            match sampler.sample(&mut ctx, Output::Last) {
                Ok(t) if vocab.is_eog(t) => break,
                Ok(_) => {}
                Err(_) => {
                    sampler.reset();
                    break;
                }
            }
        }
    });
    // A reset grammar must work again.
    sampler.reset();
    if let Some(&t) = tokens.first() {
        let _ = sampler.accept(t);
    }
}
