//! Helpers shared by the safe-API integration tests (the `it` binary's
//! subjects and the binaries that need a process of their own:
//! `never_abort`, `hardening`, `stack_depth`, `threads`): the tiny and real
//! models, logits comparisons, a GGUF layout reader, and child-process
//! isolation for cases that could abort.

use std::path::PathBuf;
use std::process::Command;

use crate::synthetic::{TinyModelSpec, tiny_llama_path};
use llamacpp::{
    AddBos, Batch, Context, ContextParams, Logits, Model, ModelParams, Output, SeqId, Special, Token, Vocab,
};

/// The file of the default tiny synthetic model.
pub fn tiny_path() -> PathBuf {
    tiny_llama_path(&TinyModelSpec::default()).expect("write the tiny model")
}

/// The default tiny synthetic model (2 layers, n_embd 64, 703 tokens).
pub fn tiny_model() -> Model {
    Model::load(tiny_path(), &ModelParams::default()).expect("load the tiny model")
}

/// A tiny model of another shape, for "state of another model" tests.
pub fn other_tiny_model() -> Model {
    let spec = TinyModelSpec { n_layer: 3, n_embd: 32, n_head: 2, n_head_kv: 1, n_ff: 48, n_ctx_train: 512, seed: 7 };
    Model::load(tiny_llama_path(&spec).expect("write the tiny model"), &ModelParams::default())
        .expect("load the other tiny model")
}

/// The real default model (Gemma 3 270M Q4_K_M), fetched once and cached.
pub fn real_model() -> Model {
    let path = crate::model_cache::model_path().expect("the default model (see model_cache)");
    Model::load(path, &ModelParams::default()).expect("load the default model")
}

/// Small, single-threaded context parameters for the tiny model.
pub fn small_params() -> ContextParams {
    ContextParams::default().n_ctx(256).n_batch(64).n_ubatch(64).n_threads(1)
}

/// Normalized mean squared error, as in upstream tests/test-llama-archs.cpp.
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "rows of different lengths");
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        err += f64::from(x - y) * f64::from(x - y);
        norm += f64::from(x) * f64::from(x);
    }
    err / norm
}

/// The index of the first largest value.
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

/// Asserts two logits rows agree: NMSE at most 1e-4 and the same argmax.
#[track_caller]
pub fn assert_same_logits(expected: &[f32], actual: &[f32], what: &str) {
    let e = nmse(expected, actual);
    assert!(e <= 1e-4, "{what}: NMSE {e:e} > 1e-4");
    assert_eq!(argmax(expected), argmax(actual), "{what}: different argmax (NMSE {e:e})");
}

/// Tokenizes `text` with BOS.
pub fn tokens(vocab: &Vocab, text: &str) -> Vec<Token> {
    vocab.tokenize(text, AddBos::Yes).expect("tokenize")
}

/// Decodes `tokens` into `seq` from position `start` in batches of at most
/// `n_batch`, asking for the logits of the last token, and returns them.
pub fn decode_seq(ctx: &mut Context<'_>, tokens: &[Token], start: i32, seq: SeqId) -> Vec<f32> {
    let n_batch = ctx.n_batch() as usize;
    let mut batch = Batch::new(n_batch, 1);
    let mut pos = start;
    for (k, chunk) in tokens.chunks(n_batch).enumerate() {
        batch.clear();
        let last = (k + 1) * n_batch >= tokens.len();
        batch.push_sequence(chunk, pos, seq, Logits::from(last)).expect("fill batch");
        ctx.decode(&batch).expect("decode");
        pos += chunk.len() as i32;
    }
    ctx.logits(Output::Last).expect("logits of the last token").to_vec()
}

/// Greedily extends sequence 0, whose last decoded token is at `pos - 1` and
/// whose logits are `logits`: returns `n` tokens and the logits after each.
pub fn greedy_continue(
    ctx: &mut Context<'_>,
    mut logits: Vec<f32>,
    mut pos: i32,
    n: usize,
) -> (Vec<Token>, Vec<Vec<f32>>) {
    let (mut out, mut rows) = (Vec::new(), Vec::new());
    let mut batch = Batch::new(1, 1);
    for _ in 0..n {
        let t = Token(argmax(&logits) as i32);
        out.push(t);
        batch.clear();
        batch.push(t, pos, &[0], Logits::Yes).expect("push");
        ctx.decode(&batch).expect("decode");
        pos += 1;
        logits = ctx.logits(Output::Last).expect("logits").to_vec();
        rows.push(logits.clone());
    }
    (out, rows)
}

/// The token whose piece (without special rendering) is exactly `piece`,
/// preferring a normal token over a byte token.
pub fn token_for_piece(vocab: &Vocab, piece: &str) -> Token {
    (0..vocab.n_tokens() as i32)
        .map(Token)
        .filter(|&t| vocab.token_to_piece(t, Special::Plain).is_ok_and(|p| p == piece.as_bytes()))
        .max_by_key(|&t| !vocab.attrs(t).is_ok_and(|a| a.contains(llamacpp::TokenAttrs::BYTE)))
        .unwrap_or_else(|| panic!("no token with piece {piece:?}"))
}

/// Where the pieces of a GGUF file are: offsets of metadata values and of
/// the tensor-info fields, parsed by hand from the format (little-endian,
/// version 3).
#[derive(Debug)]
pub struct Layout {
    /// `(key, offset of the value, end of the entry)`.
    pub kv: Vec<(String, usize, usize)>,
    /// Offsets of each tensor info's `n_dims`, `type` and `offset` fields.
    pub tensors: Vec<(String, usize, usize, usize)>,
    /// Where the tensor infos start and end.
    pub info: (usize, usize),
}

pub fn layout(d: &[u8]) -> Layout {
    let u32_at = |o: usize| u32::from_le_bytes(d[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(d[o..o + 8].try_into().unwrap()) as usize;
    let string = |o: usize| {
        let n = u64_at(o);
        (String::from_utf8_lossy(&d[o + 8..o + 8 + n]).into_owned(), o + 8 + n)
    };
    let size = |t: usize| match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        other => panic!("GGUF type {other}"),
    };
    assert_eq!(&d[..4], b"GGUF");
    let (n_tensors, n_kv) = (u64_at(8), u64_at(16));
    let mut o = 24;
    let mut kv = Vec::new();
    for _ in 0..n_kv {
        let (key, after) = string(o);
        let t = u32_at(after);
        let value = after + 4;
        o = match t {
            8 => string(value).1,
            9 => {
                let (at, n) = (u32_at(value), u64_at(value + 4));
                let mut p = value + 12;
                if at == 8 {
                    for _ in 0..n {
                        p = string(p).1;
                    }
                    p
                } else {
                    p + size(at) * n
                }
            }
            t => value + size(t),
        };
        kv.push((key, value, o));
    }
    let start = o;
    let mut tensors = Vec::new();
    for _ in 0..n_tensors {
        let (name, after) = string(o);
        let n_dims = u32_at(after);
        let ty = after + 4 + 8 * n_dims;
        tensors.push((name, after, ty, ty + 4));
        o = ty + 12;
    }
    Layout { kv, tensors, info: (start, o) }
}

/// Set in a child's environment to the name of the one test it runs.
const CHILD_ENV: &str = "LLAMA_SUITE_CHILD_TEST";
/// Printed by a child whose test body returned.
const CHILD_PASSED: &str = "llama-suite: child test body passed";

/// Runs the calling test's `body` in a child process: this test binary
/// again, with `--exact` and the test's name (libtest names each test's
/// thread after the test). The parent asserts that the child exited
/// normally (no signal: an abort, a stack overflow) and printed that its
/// body passed, so a case that aborts fails alone and by name while the
/// other cases of the file still run. In the child, `body` runs on the
/// test's thread.
pub fn isolated(body: impl FnOnce()) {
    isolated_with(body, |body| body());
}

/// [`isolated`], running `body` in the child on a thread with `stack`
/// bytes of stack.
pub fn isolated_with_stack(stack: usize, body: impl FnOnce() + Send + 'static) {
    isolated_with(body, |body| {
        let thread = std::thread::Builder::new().stack_size(stack).spawn(body).expect("spawn the small-stack thread");
        if let Err(panic) = thread.join() {
            std::panic::resume_unwind(panic);
        }
    });
}

fn isolated_with<B>(body: B, run: impl FnOnce(B)) {
    let thread = std::thread::current();
    let name = thread.name().expect("libtest names the thread of each test").to_owned();
    if std::env::var(CHILD_ENV).as_deref() == Ok(name.as_str()) {
        run(body);
        println!("{CHILD_PASSED}");
        return;
    }
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &name)
        .output()
        .expect("run the child test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(CHILD_PASSED),
        "the child process running {name} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
}
