//! Leak checks: loading and dropping a model, and creating and dropping a
//! context, 1,000 times each must leave the process's resident memory
//! flat. A leak of even a few KiB per cycle (a vocabulary's token table, a
//! context's KV cache or compute buffers) shows up as megabytes here.
//!
//! Each test warms up first (allocator arenas, lazily initialised backend
//! state, the page cache of the mapped file), then reads `VmRSS` from
//! `/proc/self/status` before and after the measured cycles. The tests of
//! this file take a lock so that they never run at the same time: RSS is
//! per process, and one test's allocations would show up in the other's
//! measurement.
//!
//! Measured on the development machine (debug test profile, llama.cpp
//! built Release, x86-64 Linux, glibc malloc), four runs:
//! - 1,000 vocab-only loads of the synthetic tiny model: RSS growth 0 to
//!   24 KiB; about 3 s.
//! - 1,000 contexts (`n_ctx` 256, one thread), each decoding one token,
//!   on the same model: growth 0 to 144 KiB; about 2 s.
//! - Leaking on purpose (`std::mem::forget` instead of `drop` in the loop)
//!   fails both tests: 142,092 KiB growth for the models (about 140 KiB
//!   per vocab-only model), 1,324,252 KiB for the contexts (about 1.3 MiB
//!   per context).
//!
//! The bound, [`MAX_GROWTH_KIB`] = 4 MiB, is almost 30 times the largest growth measured
//! and catches any leak of 4 KiB or more per cycle.
//!
//! Under AddressSanitizer (`LLAMA_SYS_SANITIZE=address`) freed memory is
//! held in a quarantine, so RSS grows without a leak and this file is not
//! meaningful: ASan's own leak checker covers that build.
#![cfg(target_os = "linux")]

use std::sync::Mutex;

use llama_suite::synthetic::{TinyModelSpec, tiny_llama_path};
use llamacpp::{AddBos, Batch, ContextParams, Model, ModelParams, Output};

/// Cycles run before the first measurement.
const WARMUP: usize = 50;
/// Cycles measured.
const CYCLES: usize = 1_000;
/// Largest RSS growth over the measured cycles that still counts as flat.
const MAX_GROWTH_KIB: u64 = 4 * 1024;

/// Keeps the tests of this file from measuring each other.
static SERIAL: Mutex<()> = Mutex::new(());

/// The resident set size of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS in /proc/self/status");
    // "VmRSS:	   12345 kB"
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("VmRSS value in kB")
}

/// Runs `cycle` [`WARMUP`] times, then [`CYCLES`] times between two RSS
/// readings, and asserts that RSS grew by less than [`MAX_GROWTH_KIB`].
fn assert_flat_rss(what: &str, mut cycle: impl FnMut()) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..WARMUP {
        cycle();
    }
    let before = rss_kib();
    let start = std::time::Instant::now();
    for _ in 0..CYCLES {
        cycle();
    }
    let after = rss_kib();
    let growth = after.saturating_sub(before);
    eprintln!(
        "{what}: RSS {before} KiB -> {after} KiB over {CYCLES} cycles (growth {growth} KiB) in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(
        growth < MAX_GROWTH_KIB,
        "{what}: RSS grew by {growth} KiB over {CYCLES} cycles ({before} -> {after} KiB), bound {MAX_GROWTH_KIB} KiB"
    );
}

#[test]
fn vocab_only_load_and_drop_keeps_rss_flat() {
    // The synthetic model, not one of llama.cpp's vocabulary fixtures: a
    // vocab-only load of `ggml-vocab-gpt-2.gguf` (50,257 tokens) takes
    // about 260 ms here, nearly all of it llama.cpp building its token and
    // BPE merge tables (`llama_vocab::impl::load`), so 1,000 of them take
    // over four minutes; the tiny model's 703-token vocabulary loads in
    // under 2 ms.
    let path = tiny_llama_path(&TinyModelSpec::default()).expect("write the tiny model");
    let params = ModelParams::default().vocab_only(true);
    assert_flat_rss("vocab-only model load/drop", || {
        let model = Model::load(&path, &params).expect("load the vocab-only model");
        assert!(model.is_vocab_only());
        assert!(model.vocab().n_tokens() > 0);
        drop(model);
    });
}

#[test]
fn context_create_and_drop_keeps_rss_flat() {
    let path = tiny_llama_path(&TinyModelSpec::default()).expect("write the tiny model");
    let model = Model::load(&path, &ModelParams::default()).expect("load the tiny model");
    let params = ContextParams::default().n_ctx(256).n_batch(32).n_ubatch(32).n_threads(1).n_threads_batch(1);
    let batch = Batch::from_tokens(&model.vocab().tokenize("Hello", AddBos::Yes).expect("tokenize"), 0);
    assert_flat_rss("context create/decode/drop", || {
        let mut ctx = model.new_context(&params).expect("create a context");
        // One decode, so that what the first pass allocates (output
        // buffers, the scheduler's graph) is freed with the context too.
        ctx.decode(&batch).expect("decode");
        assert!(ctx.logits(Output::Last).is_ok());
        drop(ctx);
    });
}

#[test]
fn an_invalid_lazy_grammar_trigger_leaks_nothing() {
    // llama.cpp allocates the grammar sampler (80 bytes) before compiling
    // the trigger patterns and leaked it when one did not compile (found
    // by the grammar_lazy fuzz target under LeakSanitizer); the shim now
    // compiles them first. 100 attempts per cycle: 100,000 in all, 8 MB if
    // each leaked 80 bytes.
    let path = tiny_llama_path(&TinyModelSpec::default()).expect("write the tiny model");
    let model = Model::load(&path, &ModelParams::default().vocab_only(true)).expect("load");
    assert_flat_rss("invalid lazy-grammar trigger pattern", || {
        for _ in 0..100 {
            let r = llamacpp::SamplerChain::new()
                .grammar_lazy(model.vocab(), "root ::= \"a\"", "root", &["(unclosed"], &[])
                .build();
            assert!(matches!(r, Err(llamacpp::Error::Grammar(_))), "{r:?}");
        }
    });
}
