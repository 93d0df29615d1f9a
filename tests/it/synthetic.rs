//! The tiny synthetic model is a real, usable llama model: it loads, has the
//! requested shape, tokenizes (with byte fallback) and decodes to sane
//! logits. Uses the raw `llamacpp-sys` calls so that it does not depend on the
//! safe crate.

use std::ffi::{CStr, CString, c_char, c_void};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Instant;

use llama_suite::synthetic::{
    TINY_BOS_ID, TINY_CONTROL_TOKEN, TINY_CONTROL_TOKEN_ID, TINY_EOS_ID, TINY_FIRST_BYTE_ID, TINY_VOCAB_SIZE,
    TinyModelSpec, tiny_llama_path, write_tiny_llama,
};
use llamacpp_sys as sys;

/// Drops llama.cpp's informational logging; keeps warnings and errors.
unsafe extern "C" fn quiet_log(level: sys::ggml_log_level::Type, text: *const c_char, _: *mut c_void) {
    use sys::ggml_log_level::*;
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) && !text.is_null() {
        // SAFETY: llama.cpp passes a NUL-terminated message valid for the
        // duration of the callback (checked non-null above).
        let msg = unsafe { CStr::from_ptr(text) };
        eprint!("{}", msg.to_string_lossy());
    }
}

fn init_backend() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // SAFETY: `quiet_log` matches `ggml_log_callback` and is valid for
        // the whole program; it ignores `user_data`, which may be null.
        unsafe { sys::llama_log_set(Some(quiet_log), std::ptr::null_mut()) };
        // SAFETY: no preconditions; called once, before any other llama call.
        unsafe { sys::llama_backend_init() };
    });
}

/// A loaded model, freed on drop.
struct Model(*mut sys::llama_model);

impl Model {
    fn load(path: &Path) -> Model {
        init_backend();
        let c_path = CString::new(path.to_str().expect("UTF-8 temp path")).expect("no NUL in path");
        // SAFETY: no preconditions; returns a plain struct of defaults.
        let mut params = unsafe { sys::llama_model_default_params() };
        params.n_gpu_layers = 0;
        // SAFETY: `c_path` is a NUL-terminated path; `params` holds the
        // defaults (null callbacks and overrides), valid for the call.
        let model = unsafe { sys::llama_model_load_from_file(c_path.as_ptr(), params) };
        assert!(!model.is_null(), "failed to load {}", path.display());
        Model(model)
    }

    fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: the model is live; the vocab lives as long as the model.
        unsafe { sys::llama_model_get_vocab(self.0) }
    }

    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<sys::llama_token> {
        let mut tokens = vec![0; text.len() + 8];
        // SAFETY: the vocab is live; `text` is `text.len()` readable bytes;
        // `tokens` has room for `tokens.len()` tokens.
        let n = unsafe {
            sys::llama_tokenize(
                self.vocab(),
                text.as_ptr().cast(),
                i32::try_from(text.len()).expect("short text"),
                tokens.as_mut_ptr(),
                i32::try_from(tokens.len()).expect("short text"),
                add_special,
                parse_special,
            )
        };
        assert!(n >= 0, "tokenize {text:?} needs {} tokens", -n);
        tokens.truncate(n as usize);
        tokens
    }

    fn detokenize(&self, tokens: &[sys::llama_token], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let mut buf = vec![0u8; tokens.len() * 16 + 16];
        // SAFETY: the vocab is live; `tokens` is `tokens.len()` readable
        // tokens; `buf` has room for `buf.len()` bytes.
        let n = unsafe {
            sys::llama_detokenize(
                self.vocab(),
                tokens.as_ptr(),
                i32::try_from(tokens.len()).expect("few tokens"),
                buf.as_mut_ptr().cast(),
                i32::try_from(buf.len()).expect("small buffer"),
                remove_special,
                unparse_special,
            )
        };
        assert!(n >= 0, "detokenize needs {} bytes", -n);
        buf.truncate(n as usize);
        buf
    }

    fn token_text(&self, token: sys::llama_token) -> String {
        // SAFETY: the vocab is live and `token` is in range (callers pass
        // tokens from `tokenize`); the text lives as long as the vocab.
        let text = unsafe { CStr::from_ptr(sys::llama_vocab_get_text(self.vocab(), token)) };
        text.to_string_lossy().into_owned()
    }

    fn token_attr(&self, token: sys::llama_token) -> sys::llama_token_attr::Type {
        // SAFETY: the vocab is live and `token` is in range.
        unsafe { sys::llama_vocab_get_attr(self.vocab(), token) }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: the model came from `llama_model_load_from_file`, no
        // context of it is alive any more (`Context` borrows the `Model`),
        // and it is freed only here.
        unsafe { sys::llama_model_free(self.0) };
    }
}

/// A context on a `Model`, freed on drop.
struct Context<'m> {
    ctx: *mut sys::llama_context,
    _model: PhantomData<&'m Model>,
}

impl<'m> Context<'m> {
    fn new(model: &'m Model) -> Context<'m> {
        // SAFETY: no preconditions; returns a plain struct of defaults.
        let mut params = unsafe { sys::llama_context_default_params() };
        params.n_ctx = 256;
        params.n_batch = 64;
        params.n_ubatch = 64;
        params.n_threads = 2;
        params.n_threads_batch = 2;
        // SAFETY: the model is live and outlives the context (`'m`);
        // `params` holds defaults plus valid sizes.
        let ctx = unsafe { sys::llama_init_from_model(model.0, params) };
        assert!(!ctx.is_null(), "llama_init_from_model failed");
        Context { ctx, _model: PhantomData }
    }

    /// Clears the KV cache, decodes `tokens` as one batch from position 0
    /// and returns the logits of the last one.
    fn last_logits(&mut self, tokens: &[sys::llama_token]) -> Vec<f32> {
        // SAFETY: the context is live.
        let mem = unsafe { sys::llama_get_memory(self.ctx) };
        // SAFETY: `mem` is the live context's memory.
        unsafe { sys::llama_memory_clear(mem, true) };
        let mut tokens = tokens.to_vec();
        // SAFETY: `tokens` outlives the batch, which only borrows it for
        // the `llama_decode` call below; its length fits in i32.
        let batch = unsafe { sys::llama_batch_get_one(tokens.as_mut_ptr(), tokens.len() as i32) };
        // SAFETY: the context is live; the batch points into `tokens`, valid
        // tokens of this model, fewer than n_batch.
        let rc = unsafe { sys::llama_decode(self.ctx, batch) };
        assert_eq!(rc, 0, "llama_decode failed");
        // SAFETY: the context is live and the last decode output the logits
        // of its last token (llama_batch_get_one asks for exactly that).
        let logits = unsafe { sys::llama_get_logits_ith(self.ctx, -1) };
        assert!(!logits.is_null());
        // SAFETY: a logits row holds n_vocab floats, valid until the next
        // decode on this context; copied out at once.
        unsafe { std::slice::from_raw_parts(logits, TINY_VOCAB_SIZE) }.to_vec()
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: the context came from `llama_init_from_model` and is freed
        // only here, before its model (borrow).
        unsafe { sys::llama_free(self.ctx) };
    }
}

fn argmax(logits: &[f32]) -> usize {
    logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i).expect("non-empty logits")
}

/// A fresh folder for one test's files, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("llama-rs-synthetic-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn default_model() -> Model {
    let path = tiny_llama_path(&TinyModelSpec::default()).expect("write tiny model");
    Model::load(&path)
}

#[test]
fn loads_with_the_requested_shape() {
    let spec = TinyModelSpec::default();
    let model = default_model();
    // SAFETY: the model is live (all five calls).
    let (n_layer, n_embd, n_head, n_head_kv, n_ctx_train) = unsafe {
        (
            sys::llama_model_n_layer(model.0),
            sys::llama_model_n_embd(model.0),
            sys::llama_model_n_head(model.0),
            sys::llama_model_n_head_kv(model.0),
            sys::llama_model_n_ctx_train(model.0),
        )
    };
    assert_eq!(n_layer, spec.n_layer as i32);
    assert_eq!(n_embd, spec.n_embd as i32);
    assert_eq!(n_head, spec.n_head as i32);
    assert_eq!(n_head_kv, spec.n_head_kv as i32);
    assert_eq!(n_ctx_train, spec.n_ctx_train as i32);

    let vocab = model.vocab();
    // SAFETY: the vocab is live; the ids are in range.
    let (n_tokens, bos, eos, ctrl_is_control) = unsafe {
        (
            sys::llama_vocab_n_tokens(vocab),
            sys::llama_vocab_bos(vocab),
            sys::llama_vocab_eos(vocab),
            sys::llama_vocab_is_control(vocab, TINY_CONTROL_TOKEN_ID),
        )
    };
    assert_eq!(n_tokens as usize, TINY_VOCAB_SIZE);
    assert_eq!(bos, TINY_BOS_ID);
    assert_eq!(eos, TINY_EOS_ID);
    assert!(ctrl_is_control);
    assert_eq!(model.token_text(TINY_CONTROL_TOKEN_ID), TINY_CONTROL_TOKEN);
}

#[test]
fn a_non_default_spec_loads_too() {
    let spec = TinyModelSpec { n_layer: 3, n_embd: 32, n_head: 2, n_head_kv: 1, n_ff: 48, n_ctx_train: 512, seed: 7 };
    let model = Model::load(&tiny_llama_path(&spec).expect("write tiny model"));
    // SAFETY: the model is live.
    let (n_layer, n_embd, n_head_kv) = unsafe {
        (sys::llama_model_n_layer(model.0), sys::llama_model_n_embd(model.0), sys::llama_model_n_head_kv(model.0))
    };
    assert_eq!((n_layer, n_embd, n_head_kv), (3, 32, 1));
    let mut ctx = Context::new(&model);
    let logits = ctx.last_logits(&model.tokenize("Hello world", true, false));
    assert!(logits.iter().all(|l| l.is_finite()));
}

#[test]
fn hello_world_tokenizes_to_word_pieces_after_bos() {
    let model = default_model();
    let tokens = model.tokenize("Hello world", true, false);
    assert_eq!(tokens.first(), Some(&TINY_BOS_ID), "{tokens:?}");
    let texts: Vec<String> = tokens[1..].iter().map(|&t| model.token_text(t)).collect();
    assert_eq!(texts, ["▁Hello", "▁world"]);

    let no_bos = model.tokenize("Hello world", false, false);
    assert_eq!(no_bos, tokens[1..]);
    assert_eq!(model.detokenize(&no_bos, false, false), b"Hello world");
}

#[test]
fn any_utf8_round_trips_through_byte_fallback() {
    let model = default_model();
    let texts = [
        "你好，世界！🦀🎉 ok",
        "Hello world",
        " leading space",
        "two  spaces\nand\ttabs\r\n",
        "Ünïcödé ñ €100 — ½ 𝄞",
        "\u{0}nul and \u{7f} del",
    ];
    for text in texts {
        let tokens = model.tokenize(text, false, false);
        assert!(!tokens.is_empty());
        assert!(tokens.iter().all(|&t| t >= 0 && (t as usize) < TINY_VOCAB_SIZE), "{tokens:?}");
        let back = model.detokenize(&tokens, false, false);
        assert_eq!(String::from_utf8_lossy(&back), text, "tokens {tokens:?}");
    }

    // The CJK text really goes through byte tokens.
    let tokens = model.tokenize("你好", false, false);
    let bytes: Vec<sys::llama_token> = tokens
        .iter()
        .copied()
        .filter(|&t| model.token_attr(t) & sys::llama_token_attr::LLAMA_TOKEN_ATTR_BYTE != 0)
        .collect();
    let expected: Vec<sys::llama_token> = "你好".bytes().map(|b| TINY_FIRST_BYTE_ID + i32::from(b)).collect();
    assert_eq!(bytes, expected);
}

#[test]
fn control_token_is_parsed_only_on_request() {
    let model = default_model();
    let plain = model.tokenize(TINY_CONTROL_TOKEN, false, false);
    assert!(!plain.contains(&TINY_CONTROL_TOKEN_ID), "{plain:?}");
    assert_eq!(model.detokenize(&plain, false, false), TINY_CONTROL_TOKEN.as_bytes());

    let special = model.tokenize(TINY_CONTROL_TOKEN, false, true);
    assert_eq!(special, [TINY_CONTROL_TOKEN_ID]);
    // Rendered only when asked to.
    assert_eq!(model.detokenize(&special, false, false), b"");
    assert_eq!(model.detokenize(&special, false, true), TINY_CONTROL_TOKEN.as_bytes());
}

#[test]
fn decode_gives_finite_varied_logits() {
    let dir = TempDir::new("decode");
    let path = dir.0.join("tiny.gguf");
    let t0 = Instant::now();
    write_tiny_llama(&path, &TinyModelSpec::default()).expect("write tiny model");
    let t_write = t0.elapsed();
    let model = Model::load(&path);
    let t_load = t0.elapsed();
    let mut ctx = Context::new(&model);
    let tokens = model.tokenize("Hello world", true, false);
    let logits = ctx.last_logits(&tokens);
    let t_decode = t0.elapsed();
    eprintln!(
        "tiny model ({} bytes): write {t_write:?}, load {:?}, context + decode of {} tokens {:?}",
        std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
        t_load - t_write,
        tokens.len(),
        t_decode - t_load,
    );

    assert_eq!(logits.len(), TINY_VOCAB_SIZE);
    assert!(logits.iter().all(|l| l.is_finite()), "non-finite logits");
    let (min, max) = logits.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &l| (lo.min(l), hi.max(l)));
    assert!(max - min > 1.0, "flat logits: {min}..{max}");

    // Decoding is deterministic, and different inputs pick different tokens.
    assert_eq!(ctx.last_logits(&tokens), logits);
    let mut argmaxes: Vec<usize> = ["Hello", "world", "the quick brown fox", "你好", "42", "Rust is fast"]
        .iter()
        .map(|text| argmax(&ctx.last_logits(&model.tokenize(text, true, false))))
        .collect();
    argmaxes.sort_unstable();
    argmaxes.dedup();
    assert!(argmaxes.len() >= 3, "argmax barely depends on the input: {argmaxes:?}");
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let dir = TempDir::new("determinism");
    let spec = TinyModelSpec::default();
    let (a, b, c) = (dir.0.join("a.gguf"), dir.0.join("b.gguf"), dir.0.join("c.gguf"));
    write_tiny_llama(&a, &spec).expect("write a");
    write_tiny_llama(&b, &spec).expect("write b");
    write_tiny_llama(&c, &TinyModelSpec { seed: spec.seed + 1, ..spec }).expect("write c");
    let (a, b, c) =
        (std::fs::read(a).expect("read a"), std::fs::read(b).expect("read b"), std::fs::read(c).expect("read c"));
    assert_eq!(&a[..4], b"GGUF");
    assert!(a == b, "same spec, different bytes");
    assert_eq!(a.len(), c.len());
    assert!(a != c, "different seed, same bytes");

    // The cached file is the same model, and only temporary files are gone.
    let cached = tiny_llama_path(&spec).expect("cached path");
    assert_eq!(tiny_llama_path(&spec).expect("cached path again"), cached);
    assert!(std::fs::read(&cached).expect("read cached") == a);
    let names: Vec<_> = std::fs::read_dir(&dir.0).expect("list").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(names.len(), 3, "leftover files: {names:?}");
}

#[test]
fn concurrent_first_use_yields_one_complete_file() {
    // A spec no other test uses, with a seed unique to this run so that
    // the file is really written here, by all threads at once.
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let spec = TinyModelSpec {
        n_layer: 1,
        n_embd: 16,
        n_head: 2,
        n_head_kv: 2,
        n_ff: 32,
        n_ctx_train: 128,
        seed: nanos ^ u64::from(std::process::id()),
    };
    let paths: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6).map(|_| s.spawn(|| tiny_llama_path(&spec))).collect();
        handles.into_iter().map(|h| h.join().expect("thread").expect("tiny_llama_path")).collect()
    });
    assert!(paths.windows(2).all(|w| w[0] == w[1]));
    let dir = TempDir::new("concurrent");
    let fresh = dir.0.join("fresh.gguf");
    write_tiny_llama(&fresh, &spec).expect("write fresh");
    assert!(std::fs::read(&paths[0]).expect("read cached") == std::fs::read(&fresh).expect("read fresh"));
    let model = Model::load(&paths[0]);
    drop(model);
    let _ = std::fs::remove_file(&paths[0]);
}

#[test]
fn invalid_spec_is_an_invalid_input_error() {
    let dir = TempDir::new("invalid");
    let spec = TinyModelSpec { n_head: 3, ..TinyModelSpec::default() };
    let err = write_tiny_llama(&dir.0.join("bad.gguf"), &spec).expect_err("bad spec accepted");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let err = tiny_llama_path(&spec).expect_err("bad spec accepted");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);

    let err = write_tiny_llama(&dir.0.join("missing").join("x.gguf"), &TinyModelSpec::default())
        .expect_err("write into a missing folder");
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
}
