//! The exception barrier (`llamacpp-sys/shim/shim.cpp`) for the calls that need
//! a full model or a context: decode, encode, sampler_sample,
//! state_seq_set_data_ext, set_adapters_lora and model_save_to_file. Each
//! test shows the normal path returns [`shim::OK`] with the right result,
//! and a thrown exception becomes [`shim::EXCEPTION`] with its message in
//! `llama_rs_last_exception()`.
//!
//! Real throws are used where llama.cpp has them (a grammar in a sampler
//! chain that forbids the sampled token → `std::runtime_error` from
//! `llama_sampler_sample`; sequence state with the ON_DEVICE flag and bad
//! data → `std::runtime_error` from `llama_state_seq_set_data_ext`). The
//! others only throw on a failing allocator or device, so the tests use
//! `llama_rs_shim_inject_exception()` and then show the next call works.
//!
//! Raw llamacpp-sys calls on the synthetic tiny model (llamacpp-sys's own tests
//! cannot use `llama_suite`; `llamacpp-sys/tests/shim.rs` covers the
//! vocabulary-only calls).

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::Path;
use std::ptr;
use std::sync::Once;

use llama_suite::synthetic::{TINY_BOS_ID, TINY_EOS_ID, TinyModelSpec, tiny_llama_path};
use llamacpp_sys as sys;
use sys::shim::{self, EXCEPTION, OK};

const INJECTED: &str = "exception injected by llama_rs_shim_inject_exception";

unsafe extern "C" fn quiet_log(level: sys::ggml_log_level::Type, text: *const c_char, _: *mut c_void) {
    if level == sys::ggml_log_level::GGML_LOG_LEVEL_ERROR && !text.is_null() {
        // SAFETY: llama.cpp passes a NUL-terminated message valid for the
        // duration of the callback (checked non-null above).
        eprint!("{}", unsafe { CStr::from_ptr(text) }.to_string_lossy());
    }
}

/// `llama_backend_init`, once per process, before any other llama call.
fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // SAFETY: `quiet_log` matches `ggml_log_callback`, lives for the
        // whole program and ignores its (null) user data; backend init has
        // no preconditions and runs once, before any other llama.cpp call.
        unsafe {
            sys::llama_log_set(Some(quiet_log), ptr::null_mut());
            sys::llama_backend_init();
        }
    });
}

fn c_path(path: &Path) -> CString {
    CString::new(path.to_str().expect("UTF-8 path")).expect("no NUL in path")
}

/// A loaded model, freed on drop.
struct Model(*mut sys::llama_model);

impl Model {
    fn load(path: &Path) -> Model {
        init();
        // SAFETY: returns a plain struct of defaults.
        let mut params = unsafe { sys::llama_model_default_params() };
        params.n_gpu_layers = 0;
        let path_c = c_path(path);
        // SAFETY: a NUL-terminated path and default parameters.
        let model = unsafe { sys::llama_model_load_from_file(path_c.as_ptr(), params) };
        assert!(!model.is_null(), "cannot load {}", path.display());
        Model(model)
    }

    fn tiny() -> Model {
        init();
        Model::load(&tiny_llama_path(&TinyModelSpec::default()).expect("write the tiny model"))
    }

    fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: a live model; the vocab lives as long as the model.
        unsafe { sys::llama_model_get_vocab(self.0) }
    }

    fn n_vocab(&self) -> usize {
        // SAFETY: a pure read of a live vocab.
        unsafe { sys::llama_vocab_n_tokens(self.vocab()) as usize }
    }

    /// `text` tokenized with BOS.
    fn tokenize(&self, text: &str) -> Vec<i32> {
        let mut tokens = vec![0; text.len() + 2];
        // SAFETY: `text` readable and `tokens` writable for their lengths.
        let n = unsafe {
            sys::llama_tokenize(
                self.vocab(),
                text.as_ptr().cast(),
                text.len() as i32,
                tokens.as_mut_ptr(),
                tokens.len() as i32,
                true,
                false,
            )
        };
        assert!(n > 0, "tokenize {text:?} gave {n}");
        tokens.truncate(n as usize);
        tokens
    }

    fn piece(&self, token: i32) -> String {
        let mut buf = [0u8; 64];
        // SAFETY: an in-range token; `buf` writable for its length.
        let n = unsafe { sys::llama_token_to_piece(self.vocab(), token, buf.as_mut_ptr().cast(), 64, 0, false) };
        String::from_utf8_lossy(&buf[..n.max(0) as usize]).into_owned()
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: loaded by `load`; every context and adapter of it is freed
        // before (declaration order in each test); freed once.
        unsafe { sys::llama_model_free(self.0) }
    }
}

/// A context on a model, freed on drop.
struct Context<'m> {
    ptr: *mut sys::llama_context,
    model: &'m Model,
}

impl<'m> Context<'m> {
    fn new(model: &'m Model) -> Context<'m> {
        // SAFETY: returns a plain struct of defaults.
        let mut params = unsafe { sys::llama_context_default_params() };
        params.n_ctx = 256;
        params.n_batch = 64;
        params.n_ubatch = 64;
        params.n_threads = 2;
        params.n_threads_batch = 2;
        // SAFETY: a live model that outlives the context ('m) and valid sizes.
        let ptr = unsafe { sys::llama_init_from_model(model.0, params) };
        assert!(!ptr.is_null(), "llama_init_from_model failed");
        Context { ptr, model }
    }

    /// Decodes `tokens` as one batch (positions continue the sequence)
    /// through the shim.
    fn decode(&mut self, tokens: &[i32]) -> (c_int, i32) {
        let mut tokens = tokens.to_vec();
        // SAFETY: `tokens` outlives the batch, which only points into it.
        let batch = unsafe { sys::llama_batch_get_one(tokens.as_mut_ptr(), tokens.len() as i32) };
        let mut result = i32::MIN;
        // SAFETY: a live context and a batch of in-range tokens that fits
        // n_batch (or an empty one, which llama.cpp rejects with -1); the
        // shim catches exceptions.
        let code = unsafe { shim::llama_rs_decode(self.ptr, batch, &mut result) };
        (code, result)
    }

    /// The logits of the last output of the last decode.
    fn last_logits(&mut self) -> Vec<f32> {
        // SAFETY: the last decode produced an output; the row has n_vocab
        // floats and is copied out at once.
        unsafe {
            let row = sys::llama_get_logits_ith(self.ptr, -1);
            assert!(!row.is_null(), "no logits");
            std::slice::from_raw_parts(row, self.model.n_vocab()).to_vec()
        }
    }

    fn memory(&mut self) -> sys::llama_memory_t {
        // SAFETY: the context's own memory handle.
        unsafe { sys::llama_get_memory(self.ptr) }
    }

    fn clear(&mut self) {
        let mem = self.memory();
        // SAFETY: the live context's memory.
        unsafe { sys::llama_memory_clear(mem, true) }
    }

    fn pos_max(&mut self, seq: i32) -> i32 {
        let mem = self.memory();
        // SAFETY: seq 0 is below n_seq_max (1).
        unsafe { sys::llama_memory_seq_pos_max(mem, seq) }
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: created by `new`, freed once.
        unsafe { sys::llama_free(self.ptr) }
    }
}

/// A sampler (chain), freed on drop.
struct Sampler(*mut sys::llama_sampler);

impl Sampler {
    fn chain(parts: &[*mut sys::llama_sampler]) -> Sampler {
        // SAFETY: default chain parameters; the chain takes ownership of
        // each (non-null, fresh) sampler added.
        unsafe {
            let chain = sys::llama_sampler_chain_init(sys::llama_sampler_chain_default_params());
            for &p in parts {
                assert!(!p.is_null());
                sys::llama_sampler_chain_add(chain, p);
            }
            Sampler(chain)
        }
    }

    fn sample(&self, ctx: &mut Context<'_>) -> (c_int, i32) {
        let mut token = i32::MIN;
        // SAFETY: a live chain and context with logits for output -1; the
        // shim catches exceptions.
        let code = unsafe { shim::llama_rs_sampler_sample(self.0, ctx.ptr, -1, &mut token) };
        (code, token)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        // SAFETY: a chain we own, freed once, with every sampler in it.
        unsafe { sys::llama_sampler_free(self.0) }
    }
}

fn greedy() -> *mut sys::llama_sampler {
    // SAFETY: no preconditions.
    unsafe { sys::llama_sampler_init_greedy() }
}

fn last_exception() -> String {
    // SAFETY: the shim returns a thread-local NUL-terminated string, valid
    // until the next shim call on this thread; copied at once.
    unsafe { CStr::from_ptr(shim::llama_rs_last_exception()) }.to_string_lossy().into_owned()
}

fn inject() {
    // SAFETY: sets a thread-local flag; no preconditions.
    unsafe { shim::llama_rs_shim_inject_exception() }
}

#[track_caller]
fn assert_threw(code: c_int, needle: &str) -> String {
    assert_eq!(code, EXCEPTION, "the call should have thrown");
    let message = last_exception();
    assert!(message.contains(needle), "exception message {message:?} lacks {needle:?}");
    message
}

fn argmax(v: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as i32
}

#[test]
fn decode_normal_and_injected() {
    init();
    let model = Model::tiny();
    let mut ctx = Context::new(&model);
    let prompt = model.tokenize("Hello world");
    assert_eq!(prompt[0], TINY_BOS_ID);

    assert_eq!(ctx.decode(&prompt), (OK, 0));
    assert_eq!(ctx.pos_max(0), prompt.len() as i32 - 1);
    let logits = ctx.last_logits();
    assert!(logits.iter().all(|x| x.is_finite()));

    // A batch llama.cpp rejects is a normal return code, not an exception.
    assert_eq!(ctx.decode(&[]), (OK, -1));

    ctx.clear();
    inject();
    let (code, result) = ctx.decode(&prompt);
    assert_threw(code, INJECTED);
    assert_eq!(result, i32::MIN, "the result is left untouched on an exception");
    assert_eq!(ctx.pos_max(0), -1, "nothing reached the KV cache");

    assert_eq!(ctx.decode(&prompt), (OK, 0));
    assert_eq!(ctx.last_logits(), logits, "the same prompt gives the same logits");
}

#[test]
fn encode_normal_and_injected() {
    init();
    // The tiny model is decoder-only: llama.cpp cannot run a real encoder
    // batch on it (its graph needs a KV cache the encoder path does not
    // provide). An empty batch is llama_encode's own, normal rejection.
    let model = Model::tiny();
    let ctx = Context::new(&model);
    let encode = || {
        // SAFETY: an empty batch (no pointers are read).
        let batch = unsafe { sys::llama_batch_get_one(ptr::null_mut(), 0) };
        let mut result = i32::MIN;
        // SAFETY: a live context; llama.cpp returns -1 for an empty batch
        // before touching anything else; the shim catches exceptions.
        let code = unsafe { shim::llama_rs_encode(ctx.ptr, batch, &mut result) };
        (code, result)
    };

    assert_eq!(encode(), (OK, -1));
    inject();
    let (code, result) = encode();
    assert_threw(code, INJECTED);
    assert_eq!(result, i32::MIN);
    assert_eq!(encode(), (OK, -1));
}

#[test]
fn sampler_sample_grammar_rejecting_the_choice_throws() {
    init();
    let model = Model::tiny();
    let mut ctx = Context::new(&model);
    let prompt = model.tokenize("Hello world");
    assert_eq!(ctx.decode(&prompt), (OK, 0));
    let best = argmax(&ctx.last_logits());

    let plain = Sampler::chain(&[greedy()]);
    assert_eq!(plain.sample(&mut ctx), (OK, best));

    // logit bias makes "▁Hello" the greedy choice; the grammar after it
    // only allows "z...", so accepting the choice throws
    // std::runtime_error inside llama_sampler_sample.
    let hello = prompt[1];
    assert_eq!(model.piece(hello), " Hello");
    assert_ne!(hello, TINY_EOS_ID, "an end-of-generation token would abort in the grammar instead");
    let bias = sys::llama_logit_bias { token: hello, bias: 1000.0 };
    let (g, root) = (CString::new(r#"root ::= "z"+"#).unwrap(), CString::new("root").unwrap());
    // SAFETY: `bias` is copied; the strings are NUL-terminated; the vocab
    // outlives the sampler (dropped before the model).
    let (biased, grammar) = unsafe {
        (
            sys::llama_sampler_init_logit_bias(model.n_vocab() as i32, 1, &bias),
            sys::llama_sampler_init_grammar(model.vocab(), g.as_ptr(), root.as_ptr()),
        )
    };
    let rejecting = Sampler::chain(&[biased, greedy(), grammar]);
    let (code, token) = rejecting.sample(&mut ctx);
    let message = assert_threw(code, "Unexpected empty grammar stack after accepting piece:  Hello");
    assert!(message.contains(&format!("({hello})")), "{message:?}");
    assert_eq!(token, i32::MIN, "the result is left untouched on an exception");

    inject();
    assert_threw(plain.sample(&mut ctx).0, INJECTED);
    assert_eq!(plain.sample(&mut ctx), (OK, best));
}

#[test]
fn state_seq_set_data_on_device_with_bad_data_throws() {
    init();
    let model = Model::tiny();
    let mut ctx = Context::new(&model);
    let prompt = model.tokenize("Hello world");
    assert_eq!(ctx.decode(&prompt), (OK, 0));
    let logits = ctx.last_logits();

    // SAFETY: sequence 0 of a live context; `state` is writable for `size`.
    let state = unsafe {
        let size = sys::llama_state_seq_get_size_ext(ctx.ptr, 0, 0);
        let mut state = vec![0u8; size];
        assert_eq!(sys::llama_state_seq_get_data_ext(ctx.ptr, state.as_mut_ptr(), size, 0, 0), size);
        state
    };
    assert!(!state.is_empty());
    let set = |ctx: &mut Context<'_>, data: &[u8], flags: u32| {
        let mut read = usize::MAX;
        // SAFETY: `data` is readable for its length; sequence 0 exists; the
        // shim catches exceptions.
        let code =
            unsafe { shim::llama_rs_state_seq_set_data_ext(ctx.ptr, data.as_ptr(), data.len(), 0, flags, &mut read) };
        (code, read)
    };

    ctx.clear();
    assert_eq!(set(&mut ctx, &state, 0), (OK, state.len()));
    assert_eq!(ctx.pos_max(0), prompt.len() as i32 - 1, "the sequence is back");
    // Host-memory state with bad data: llama.cpp catches its own error and
    // returns 0 read bytes.
    assert_eq!(set(&mut ctx, &[1, 2, 3, 4, 5, 6, 7, 8], 0), (OK, 0));

    // With ON_DEVICE the first reads happen outside llama.cpp's own try.
    let on_device = sys::LLAMA_STATE_SEQ_FLAGS_ON_DEVICE;
    let (code, read) = set(&mut ctx, &[0xde, 0xad], on_device);
    assert_eq!(assert_threw(code, "end of buffer"), "unexpectedly reached end of buffer");
    assert_eq!(read, usize::MAX, "the result is left untouched on an exception");
    let (code, _) = set(&mut ctx, &[1, 2, 3, 4, 5, 6, 7, 8], on_device);
    assert_eq!(assert_threw(code, "magic"), "wrong sequence state magic");

    ctx.clear();
    inject();
    assert_threw(set(&mut ctx, &state, 0).0, INJECTED);
    assert_eq!(ctx.pos_max(0), -1, "nothing was restored");
    assert_eq!(set(&mut ctx, &state, 0), (OK, state.len()));
    assert_eq!(ctx.pos_max(0), prompt.len() as i32 - 1);

    // The restored cache continues exactly like the original.
    let next = argmax(&logits);
    assert_eq!(ctx.decode(&[next]), (OK, 0));
    let restored = ctx.last_logits();
    ctx.clear();
    assert_eq!(ctx.decode(&prompt), (OK, 0));
    assert_eq!(ctx.decode(&[next]), (OK, 0));
    assert_eq!(ctx.last_logits(), restored);
}

#[test]
fn set_adapters_lora_normal_and_injected() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let lora_path = dir.path().join("lora.gguf");
    let spec = TinyModelSpec::default();
    llama_suite::synthetic::write_tiny_lora(&lora_path, &spec, 4).unwrap();

    let model = Model::tiny();
    let lora_c = c_path(&lora_path);
    // SAFETY: a live model and a NUL-terminated path.
    let adapter = unsafe { sys::llama_adapter_lora_init(model.0, lora_c.as_ptr()) };
    assert!(!adapter.is_null(), "llama.cpp rejected the test LoRA");
    let prompt = model.tokenize("Hello world");
    {
        let mut ctx = Context::new(&model);
        let set = |ctx: &mut Context<'_>, scale: Option<f32>| {
            let mut adapters = [adapter];
            let mut scales = [scale.unwrap_or(0.0)];
            let (a, s, n) = match scale {
                Some(_) => (adapters.as_mut_ptr(), scales.as_mut_ptr(), 1),
                None => (ptr::null_mut(), ptr::null_mut(), 0),
            };
            let mut result = i32::MIN;
            // SAFETY: `n` adapters of this context's model (alive until
            // after the context) and scales, or NULL with 0; the shim
            // catches exceptions.
            let code = unsafe { shim::llama_rs_set_adapters_lora(ctx.ptr, a, n, s, &mut result) };
            (code, result)
        };
        let logits_of = |ctx: &mut Context<'_>| {
            ctx.clear();
            assert_eq!(ctx.decode(&prompt), (OK, 0));
            ctx.last_logits()
        };

        let base = logits_of(&mut ctx);
        assert_eq!(set(&mut ctx, Some(1.0)), (OK, 0));
        let adapted = logits_of(&mut ctx);
        assert_ne!(adapted, base, "the adapter changes the output");
        assert_eq!(set(&mut ctx, None), (OK, 0));
        assert_eq!(logits_of(&mut ctx), base, "removing it restores the output");

        inject();
        let (code, result) = set(&mut ctx, Some(1.0));
        assert_threw(code, INJECTED);
        assert_eq!(result, i32::MIN);
        assert_eq!(logits_of(&mut ctx), base, "the failed call set nothing");
        assert_eq!(set(&mut ctx, Some(1.0)), (OK, 0));
        assert_eq!(logits_of(&mut ctx), adapted);
    }
    // SAFETY: the context that used it is gone; the model is alive.
    unsafe { sys::llama_adapter_lora_free(adapter) };
}

#[test]
fn model_save_to_file_normal_and_injected() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let model = Model::tiny();
    let save = |path: &Path| {
        let p = c_path(path);
        // SAFETY: a live model and a NUL-terminated path; the shim catches
        // exceptions.
        unsafe { shim::llama_rs_model_save_to_file(model.0, p.as_ptr()) }
    };

    let injected = dir.path().join("injected.gguf");
    inject();
    assert_threw(save(&injected), INJECTED);
    assert!(!injected.exists(), "nothing was written");

    let saved = dir.path().join("saved.gguf");
    assert_eq!(save(&saved), OK);
    let copy = Model::load(&saved);
    // SAFETY: pure reads of two live models.
    unsafe {
        assert_eq!(sys::llama_model_n_params(copy.0), sys::llama_model_n_params(model.0));
        assert_eq!(sys::llama_model_n_layer(copy.0), sys::llama_model_n_layer(model.0));
    }
    assert_eq!(copy.n_vocab(), model.n_vocab());
    let prompt = model.tokenize("Hello world");
    assert_eq!(copy.tokenize("Hello world"), prompt);
    let logits = |m: &Model| {
        let mut ctx = Context::new(m);
        assert_eq!(ctx.decode(&prompt), (OK, 0));
        ctx.last_logits()
    };
    assert_eq!(logits(&copy), logits(&model), "the saved model computes the same logits");
}
