//! The exception barrier (`shim/shim.cpp`), call by call, on a vocab-only
//! model (`models/ggml-vocab-llama-spm.gguf` from the llama.cpp tree the
//! crate was built from): every `llama_rs_*` twin that needs no context
//! returns [`shim::OK`] with the right result on the normal path, and
//! [`shim::EXCEPTION`] with the exception's message in
//! `llama_rs_last_exception()` when the wrapped call throws.
//!
//! Where llama.cpp really throws for some input, that input is used (a token
//! id outside the vocabulary → `std::out_of_range`, an unknown load mode →
//! `std::invalid_argument`, a grammar fed a token it forbids →
//! `std::runtime_error`, an invalid trigger regex → `std::regex_error`).
//! Calls whose real throw needs a failing allocator are driven with
//! `llama_rs_shim_inject_exception()`, which makes the next shim call on
//! the thread throw inside its `try` block; each such test then shows the
//! following call works normally. The calls that need a context (decode,
//! encode, sample, state, LoRA, save) are tested in the workspace's
//! `tests/it/shim_context.rs` on a synthetic model.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::PathBuf;
use std::ptr;
use std::sync::Once;

use llamacpp_sys as sys;
use sys::shim::{self, EXCEPTION, OK};

/// The message of an injected exception (shim.cpp).
const INJECTED: &str = "exception injected by llama_rs_shim_inject_exception";

/// Token ids of the llama-spm vocabulary, from its `.out` test vectors
/// ("Hello world" → 15043 3186) and its fixed layout.
const BOS: i32 = 1;
const HELLO: i32 = 15043; // "▁Hello"
const WORLD: i32 = 3186; // "▁world"
const BYTE_00: i32 = 3; // "<0x00>"
const N_VOCAB: i32 = 32000;

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

/// A vocab-only model, freed on drop.
struct VocabModel(*mut sys::llama_model);

impl VocabModel {
    fn load(name: &str) -> VocabModel {
        init();
        let source = sys::SOURCE_DIR;
        let path = PathBuf::from(source).join("models").join(name);
        assert!(
            path.is_file(),
            "{} is missing: the llama.cpp tree llamacpp-sys was built from ({source:?}) has no models/ folder \
             with the vocab test files; build against a full llama.cpp tree",
            path.display()
        );
        let c_path = CString::new(path.to_str().expect("UTF-8 path")).expect("no NUL in path");
        // SAFETY: returns a plain struct of defaults.
        let mut params = unsafe { sys::llama_model_default_params() };
        params.vocab_only = true;
        // SAFETY: a NUL-terminated path and default parameters.
        let model = unsafe { sys::llama_model_load_from_file(c_path.as_ptr(), params) };
        assert!(!model.is_null(), "cannot load {}", path.display());
        VocabModel(model)
    }

    fn spm() -> VocabModel {
        Self::load("ggml-vocab-llama-spm.gguf")
    }

    fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: a live model; the vocab lives as long as the model.
        unsafe { sys::llama_model_get_vocab(self.0) }
    }
}

impl Drop for VocabModel {
    fn drop(&mut self) {
        // SAFETY: loaded by `load`, freed once, nothing uses it afterwards.
        unsafe { sys::llama_model_free(self.0) }
    }
}

/// A sampler, freed on drop.
struct Sampler(*mut sys::llama_sampler);

impl Drop for Sampler {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a sampler we own and free once.
            unsafe { sys::llama_sampler_free(self.0) }
        }
    }
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

/// Asserts that a shim call reported an exception whose message contains
/// `needle`, and returns the message.
#[track_caller]
fn assert_threw(code: c_int, needle: &str) -> String {
    assert_eq!(code, EXCEPTION, "the call should have thrown");
    let message = last_exception();
    assert!(message.contains(needle), "exception message {message:?} lacks {needle:?}");
    message
}

/// `std::vector::at`'s `std::out_of_range` names the bad index (libstdc++;
/// other C++ libraries word it differently).
#[track_caller]
fn assert_out_of_range(code: c_int, token: i32) {
    let message = assert_threw(code, "");
    assert!(!message.is_empty(), "an out_of_range exception has a message");
    if cfg!(all(target_os = "linux", target_env = "gnu")) {
        assert!(
            message.contains("_M_range_check") && message.contains(&(token as i64 as u64).to_string()),
            "unexpected out_of_range message {message:?}"
        );
    }
}

fn tokenize(vocab: *const sys::llama_vocab, text: &str, add_special: bool, parse_special: bool) -> (c_int, Vec<i32>) {
    let mut tokens = vec![0; text.len() + 4];
    let mut n = i32::MIN;
    // SAFETY: `text` is readable for its length, `tokens` writable for its
    // length, the vocab is live.
    let code = unsafe {
        shim::llama_rs_tokenize(
            vocab,
            text.as_ptr().cast(),
            text.len() as i32,
            tokens.as_mut_ptr(),
            tokens.len() as i32,
            add_special,
            parse_special,
            &mut n,
        )
    };
    if code == OK {
        assert!(n >= 0, "buffer large enough, got {n}");
        tokens.truncate(n as usize);
    }
    (code, tokens)
}

fn token_to_piece(vocab: *const sys::llama_vocab, token: i32, special: bool) -> (c_int, i32, Vec<u8>) {
    let mut buf = vec![0u8; 64];
    let mut n = i32::MIN;
    // SAFETY: `buf` is writable for its length; the vocab is live; a bad
    // token id makes llama.cpp throw, which the shim catches.
    let code = unsafe {
        shim::llama_rs_token_to_piece(vocab, token, buf.as_mut_ptr().cast(), buf.len() as i32, 0, special, &mut n)
    };
    buf.truncate(n.max(0) as usize);
    (code, n, buf)
}

fn detokenize(vocab: *const sys::llama_vocab, tokens: &[i32], unparse_special: bool) -> (c_int, i32, Vec<u8>) {
    let mut buf = vec![0u8; 256];
    let mut n = i32::MIN;
    // SAFETY: `tokens` readable, `buf` writable for their lengths; the
    // vocab is live; a bad token id throws inside the shim.
    let code = unsafe {
        shim::llama_rs_detokenize(
            vocab,
            tokens.as_ptr(),
            tokens.len() as i32,
            buf.as_mut_ptr().cast(),
            buf.len() as i32,
            false,
            unparse_special,
            &mut n,
        )
    };
    buf.truncate(n.max(0) as usize);
    (code, n, buf)
}

fn vocab_get_text(vocab: *const sys::llama_vocab, token: i32) -> (c_int, Option<String>) {
    let mut text: *const c_char = ptr::null();
    // SAFETY: the vocab is live; a bad token id throws inside the shim.
    let code = unsafe { shim::llama_rs_vocab_get_text(vocab, token, &mut text) };
    // SAFETY: on success a NUL-terminated string owned by the vocab.
    let text = (!text.is_null()).then(|| unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned());
    (code, text)
}

fn grammar(vocab: *const sys::llama_vocab, gbnf: &str) -> (c_int, Sampler) {
    let (g, root) = (CString::new(gbnf).unwrap(), CString::new("root").unwrap());
    let mut smpl = ptr::null_mut();
    // SAFETY: NUL-terminated strings; the vocab outlives the sampler (each
    // test drops samplers before the model).
    let code = unsafe { shim::llama_rs_sampler_init_grammar(vocab, g.as_ptr(), root.as_ptr(), &mut smpl) };
    (code, Sampler(smpl))
}

/// A grammar that accepts exactly " Hello world" (the pieces of HELLO, WORLD).
const HELLO_WORLD: &str = r#"root ::= " Hello world""#;

fn accept(smpl: &Sampler, token: i32) -> c_int {
    // SAFETY: a live sampler; a forbidden token throws inside the shim.
    unsafe { shim::llama_rs_sampler_accept(smpl.0, token) }
}

/// Runs `smpl` on candidates with ids `ids` (logit 1.0 each) and returns
/// the shim code and the logits after.
fn apply(smpl: &Sampler, ids: &[i32]) -> (c_int, Vec<f32>) {
    let mut data: Vec<sys::llama_token_data> =
        ids.iter().map(|&id| sys::llama_token_data { id, logit: 1.0, p: 0.0 }).collect();
    let mut cur =
        sys::llama_token_data_array { data: data.as_mut_ptr(), size: data.len(), selected: -1, sorted: false };
    // SAFETY: a live sampler and a candidate array of `size` entries that
    // outlives the call.
    let code = unsafe { shim::llama_rs_sampler_apply(smpl.0, &mut cur) };
    (code, data.iter().map(|d| d.logit).collect())
}

#[test]
fn last_exception_is_empty_before_any_exception() {
    init();
    // A fresh thread has caught nothing yet.
    let message = std::thread::spawn(last_exception).join().unwrap();
    assert_eq!(message, "");
}

#[test]
fn tokenize_normal_and_injected() {
    init();
    let model = VocabModel::spm();
    let vocab = model.vocab();

    let (code, tokens) = tokenize(vocab, "Hello world", true, false);
    assert_eq!(code, OK);
    assert_eq!(tokens, [BOS, HELLO, WORLD]);

    // Too small a buffer: still a normal return, with minus the size needed.
    let mut one = [0i32; 1];
    let mut n = 0;
    // SAFETY: `one` is writable for 1 token; the vocab is live.
    let code = unsafe {
        shim::llama_rs_tokenize(vocab, "Hello world".as_ptr().cast(), 11, one.as_mut_ptr(), 1, false, false, &mut n)
    };
    assert_eq!((code, n), (OK, -2));

    inject();
    let (code, _) = tokenize(vocab, "Hello world", true, false);
    assert_threw(code, INJECTED);

    let (code, tokens) = tokenize(vocab, "Hello world", false, false);
    assert_eq!((code, tokens), (OK, vec![HELLO, WORLD]));
}

#[test]
fn token_to_piece_bad_token_throws_out_of_range() {
    init();
    let model = VocabModel::spm();
    let vocab = model.vocab();

    let (code, n, piece) = token_to_piece(vocab, HELLO, false);
    assert_eq!((code, n), (OK, 6));
    assert_eq!(piece, b" Hello");
    // A control token renders only with `special`.
    assert_eq!(token_to_piece(vocab, BOS, false), (OK, 0, Vec::new()));
    assert_eq!(token_to_piece(vocab, BOS, true), (OK, 3, b"<s>".to_vec()));

    for bad in [N_VOCAB, N_VOCAB + 1000, -1] {
        let (code, _, _) = token_to_piece(vocab, bad, false);
        assert_out_of_range(code, bad);
    }

    inject();
    let (code, _, _) = token_to_piece(vocab, HELLO, false);
    assert_threw(code, INJECTED);
    assert_eq!(token_to_piece(vocab, WORLD, false), (OK, 6, b" world".to_vec()));
}

#[test]
fn detokenize_bad_token_throws_out_of_range() {
    init();
    let model = VocabModel::spm();
    let vocab = model.vocab();

    let (code, n, text) = detokenize(vocab, &[BOS, HELLO, WORLD], true);
    assert_eq!((code, n), (OK, 15));
    assert_eq!(text, b"<s> Hello world");
    let (code, _, text) = detokenize(vocab, &[HELLO, WORLD], false);
    assert_eq!((code, text.as_slice()), (OK, &b"Hello world"[..]));

    let (code, _, _) = detokenize(vocab, &[HELLO, N_VOCAB + 7], false);
    assert_out_of_range(code, N_VOCAB + 7);

    inject();
    let (code, _, _) = detokenize(vocab, &[HELLO, WORLD], false);
    assert_threw(code, INJECTED);
    let (code, _, text) = detokenize(vocab, &[WORLD], false);
    assert_eq!((code, text.as_slice()), (OK, &b"world"[..]));
}

#[test]
fn vocab_get_text_bad_token_throws_out_of_range() {
    init();
    let model = VocabModel::spm();
    let vocab = model.vocab();

    assert_eq!(vocab_get_text(vocab, HELLO), (OK, Some("▁Hello".to_owned())));
    assert_eq!(vocab_get_text(vocab, BOS), (OK, Some("<s>".to_owned())));
    assert_eq!(vocab_get_text(vocab, BYTE_00), (OK, Some("<0x00>".to_owned())));

    let (code, text) = vocab_get_text(vocab, N_VOCAB);
    assert_out_of_range(code, N_VOCAB);
    assert_eq!(text, None, "the result is left untouched on an exception");

    inject();
    assert_threw(vocab_get_text(vocab, HELLO).0, INJECTED);
    assert_eq!(vocab_get_text(vocab, WORLD), (OK, Some("▁world".to_owned())));
}

#[test]
fn vocab_get_score_bad_token_throws_out_of_range() {
    init();
    let model = VocabModel::spm();
    let vocab = model.vocab();
    let score = |token| {
        let mut s = f32::NAN;
        // SAFETY: the vocab is live; a bad token throws inside the shim.
        let code = unsafe { shim::llama_rs_vocab_get_score(vocab, token, &mut s) };
        (code, s)
    };

    // SentencePiece scores: BOS 0, byte tokens 0, merges negative and
    // falling with the id (a later merge has a lower score).
    assert_eq!(score(BOS), (OK, 0.0));
    assert_eq!(score(BYTE_00), (OK, 0.0));
    let (code, hello) = score(HELLO);
    assert_eq!(code, OK);
    let (_, world) = score(WORLD);
    assert!(hello < world && world < 0.0, "scores {hello} {world}");
    // SAFETY: an in-range token on a live vocab: the unwrapped call is safe.
    assert_eq!(hello, unsafe { sys::llama_vocab_get_score(vocab, HELLO) });

    let (code, s) = score(N_VOCAB + 3);
    assert_out_of_range(code, N_VOCAB + 3);
    assert!(s.is_nan(), "the result is left untouched on an exception");

    inject();
    assert_threw(score(HELLO).0, INJECTED);
    assert_eq!(score(HELLO), (OK, hello));
}

#[test]
fn vocab_get_attr_bad_token_throws_out_of_range() {
    init();
    use sys::llama_token_attr::*;
    let model = VocabModel::spm();
    let vocab = model.vocab();
    let attr = |token| {
        let mut a = LLAMA_TOKEN_ATTR_UNDEFINED;
        // SAFETY: the vocab is live; a bad token throws inside the shim.
        let code = unsafe { shim::llama_rs_vocab_get_attr(vocab, token, &mut a) };
        (code, a)
    };

    assert_eq!(attr(HELLO), (OK, LLAMA_TOKEN_ATTR_NORMAL));
    assert_eq!(attr(BOS), (OK, LLAMA_TOKEN_ATTR_CONTROL));
    assert_eq!(attr(0), (OK, LLAMA_TOKEN_ATTR_UNKNOWN));
    assert_eq!(attr(BYTE_00), (OK, LLAMA_TOKEN_ATTR_BYTE));

    let (code, _) = attr(-5);
    assert_out_of_range(code, -5);

    inject();
    assert_threw(attr(HELLO).0, INJECTED);
    assert_eq!(attr(BOS), (OK, LLAMA_TOKEN_ATTR_CONTROL));
}

#[test]
fn load_mode_from_str_unknown_throws_invalid_argument() {
    init();
    use sys::llama_load_mode::*;
    init();
    let parse = |s: &str| {
        let s = CString::new(s).unwrap();
        let mut mode = 12345;
        // SAFETY: a NUL-terminated string; an unknown name throws inside
        // the shim.
        let code = unsafe { shim::llama_rs_load_mode_from_str(s.as_ptr(), &mut mode) };
        (code, mode)
    };

    for (name, mode) in [
        ("auto", LLAMA_LOAD_MODE_AUTO),
        ("none", LLAMA_LOAD_MODE_NONE),
        ("mmap", LLAMA_LOAD_MODE_MMAP),
        ("mlock", LLAMA_LOAD_MODE_MLOCK),
        ("mmap+mlock", LLAMA_LOAD_MODE_MMAP_MLOCK),
        ("dio", LLAMA_LOAD_MODE_DIRECT_IO),
    ] {
        assert_eq!(parse(name), (OK, mode), "{name}");
    }

    let (code, mode) = parse("bogus");
    assert_eq!(assert_threw(code, "bogus"), "unknown load mode: bogus");
    assert_eq!(mode, 12345, "the result is left untouched on an exception");

    inject();
    assert_threw(parse("mmap").0, INJECTED);
    assert_eq!(parse("mmap"), (OK, LLAMA_LOAD_MODE_MMAP));
}

#[test]
fn chat_apply_template_normal_and_injected() {
    init();
    let (user, hi) = (CString::new("user").unwrap(), CString::new("hi").unwrap());
    let chat = [sys::llama_chat_message { role: user.as_ptr(), content: hi.as_ptr() }];
    let run = |tmpl: &str| {
        let tmpl = CString::new(tmpl).unwrap();
        let mut buf = vec![0u8; 256];
        let mut n = i32::MIN;
        // SAFETY: NUL-terminated template and messages that outlive the
        // call; `buf` is writable for its length.
        let code = unsafe {
            shim::llama_rs_chat_apply_template(
                tmpl.as_ptr(),
                chat.as_ptr(),
                chat.len(),
                true,
                buf.as_mut_ptr().cast(),
                buf.len() as i32,
                &mut n,
            )
        };
        buf.truncate(n.max(0) as usize);
        (code, n, String::from_utf8(buf).unwrap())
    };

    let expected = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(run("chatml"), (OK, expected.len() as i32, expected.to_owned()));
    // An unknown template is a normal -1, not an exception.
    assert_eq!(run("no-such-template").0, OK);
    assert_eq!(run("no-such-template").1, -1);

    inject();
    assert_threw(run("chatml").0, INJECTED);
    assert_eq!(run("chatml"), (OK, expected.len() as i32, expected.to_owned()));
}

#[test]
fn exceptions_are_per_thread() {
    init();
    let model = VocabModel::spm();
    let vocab = model.vocab() as usize;
    // An injection on one thread does not affect another, and each thread
    // keeps its own last message.
    inject();
    let other = std::thread::spawn(move || {
        let vocab = vocab as *const sys::llama_vocab;
        let (code, tokens) = tokenize(vocab, "Hello world", false, false);
        let (bad, _, _) = token_to_piece(vocab, N_VOCAB, false);
        (code, tokens, bad, last_exception())
    })
    .join()
    .unwrap();
    assert_eq!((other.0, other.1), (OK, vec![HELLO, WORLD]));
    assert_eq!(other.2, EXCEPTION);
    assert!(!other.3.contains(INJECTED));
    let vocab = vocab as *const sys::llama_vocab;
    assert_threw(tokenize(vocab, "Hello world", false, false).0, INJECTED);
    assert_eq!(last_exception(), INJECTED);
}

mod grammar;
