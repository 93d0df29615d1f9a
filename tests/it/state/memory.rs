//! Issue 3: saving and restoring state, KV memory operations and the
//! context's counters.
//!
//! Saved state holds the KV cache but not the logits, so after a restore
//! the last token is decoded again (`redecode_last`) before sampling, as
//! upstream tests/test-save-load-state.cpp does with
//! `common_replay_last_token`.

use llama_suite::safe_api::*;
use llamacpp::{Batch, Context, Logits, Model, Output, StateError, Token};

const STEPS: usize = 10;

/// The prompt, and the greedy continuation of it without any save/load.
fn uninterrupted(model: &Model, prompt: &[Token]) -> (Vec<f32>, Vec<Token>) {
    let mut ctx = model.new_context(&small_params()).unwrap();
    let logits = decode_seq(&mut ctx, prompt, 0, 0);
    let (toks, _) = greedy_continue(&mut ctx, logits.clone(), prompt.len() as i32, STEPS);
    (logits, toks)
}

/// After a restore into `ctx` (sequence 0 holds `prompt`): replay the last
/// token and continue greedily; must match the uninterrupted run.
fn continue_after_restore(ctx: &mut Context<'_>, prompt: &[Token], expected: &(Vec<f32>, Vec<Token>), what: &str) {
    assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(prompt.len() as i32 - 1), "{what}: restored positions");
    if what != "source itself" {
        assert!(ctx.logits(Output::Last).is_err(), "{what}: logits are not part of the state");
    }
    ctx.redecode_last(prompt, 0).unwrap();
    let logits = ctx.logits(Output::Last).unwrap().to_vec();
    assert_same_logits(&expected.0, &logits, what);
    assert_eq!(ctx.logits(0).unwrap(), &logits[..], "{what}: the replayed token is batch index 0");
    let (toks, _) = greedy_continue(ctx, logits, prompt.len() as i32, STEPS);
    assert_eq!(toks, expected.1, "{what}: greedy tokens after restore");
}

#[test]
fn save_load_continue_equals_never_saving() {
    let model = tiny_model();
    let prompt = tokens(model.vocab(), "the quick brown fox jumps over the lazy dog");
    let expected = uninterrupted(&model, &prompt);
    assert_eq!(expected.1.len(), STEPS);
    let dir = tempfile::tempdir().unwrap();

    let mut source = model.new_context(&small_params()).unwrap();
    decode_seq(&mut source, &prompt, 0, 0);
    let whole = source.save_state().unwrap();
    assert_eq!(whole.len(), source.state_size());
    let seq = source.save_seq_state(0).unwrap();
    assert!(!seq.is_empty());
    source.save_state_file(dir.path().join("whole.state"), &prompt).unwrap();
    source.save_seq_state_file(dir.path().join("seq.state"), 0, &prompt).unwrap();
    let names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names.len(), 2, "only the two state files, no temporary ones: {names:?}");
    // Saving does not disturb the source context.
    continue_after_restore(&mut source, &prompt, &expected, "source itself");

    let mut ctx = model.new_context(&small_params()).unwrap();
    ctx.load_state(&whole).unwrap();
    continue_after_restore(&mut ctx, &prompt, &expected, "whole state from bytes");

    let mut ctx = model.new_context(&small_params()).unwrap();
    let saved = ctx.load_state_file(dir.path().join("whole.state")).unwrap();
    assert_eq!(saved, prompt);
    continue_after_restore(&mut ctx, &prompt, &expected, "whole state from a file");

    let mut ctx = model.new_context(&small_params()).unwrap();
    ctx.load_seq_state(&seq, 0).unwrap();
    continue_after_restore(&mut ctx, &prompt, &expected, "sequence from bytes");

    let mut ctx = model.new_context(&small_params()).unwrap();
    let saved = ctx.load_seq_state_file(dir.path().join("seq.state"), 0).unwrap();
    assert_eq!(saved, prompt);
    continue_after_restore(&mut ctx, &prompt, &expected, "sequence from a file");

    // Loading over a context that already holds something replaces it.
    let mut ctx = model.new_context(&small_params()).unwrap();
    decode_seq(&mut ctx, &tokens(model.vocab(), "something else entirely, and longer than the prompt"), 0, 0);
    ctx.load_state(&whole).unwrap();
    continue_after_restore(&mut ctx, &prompt, &expected, "whole state over other content");
}

#[test]
fn a_sequence_restores_into_another_sequence() {
    let model = tiny_model();
    let prompt = tokens(model.vocab(), "Hello world");
    let expected = uninterrupted(&model, &prompt);
    let mut single = model.new_context(&small_params()).unwrap();
    decode_seq(&mut single, &prompt, 0, 0);
    let from_single = single.save_seq_state(0).unwrap();

    for kv_unified in [false, true] {
        let params = small_params().n_ctx(512).n_seq_max(2).kv_unified(kv_unified);
        let mut source = model.new_context(&params).unwrap();
        decode_seq(&mut source, &prompt, 0, 0);
        let seq = source.save_seq_state(0).unwrap();
        let mut ctx = model.new_context(&params).unwrap();
        // The data records the cache's stream layout: one stream (a
        // one-sequence or unified cache) does not load into two.
        assert_eq!(ctx.load_seq_state(&from_single, 1).is_ok(), kv_unified);
        ctx.clear_kv();
        let other = tokens(model.vocab(), "the lazy dog");
        decode_seq(&mut ctx, &other, 0, 0);
        ctx.load_seq_state(&seq, 1).unwrap();
        assert_eq!(ctx.seq_pos_max(1).unwrap(), Some(prompt.len() as i32 - 1));
        assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(other.len() as i32 - 1), "sequence 0 untouched");
        ctx.redecode_last(&prompt, 1).unwrap();
        assert_same_logits(
            &expected.0,
            ctx.logits(Output::Last).unwrap(),
            &format!("restored into seq 1 ({kv_unified})"),
        );
        // Move it back to sequence 0 through bytes of sequence 1.
        let moved = ctx.save_seq_state(1).unwrap();
        ctx.load_seq_state(&moved, 0).unwrap();
        ctx.seq_rm(Some(1), None, None).unwrap();
        assert_eq!(ctx.seq_pos_max(1).unwrap(), None);
        continue_after_restore(&mut ctx, &prompt, &expected, &format!("moved back to seq 0 ({kv_unified})"));
    }
}

#[test]
fn memory_operations_do_what_they_say() {
    let model = tiny_model();
    let mut ctx = model.new_context(&small_params().n_ctx(512).n_seq_max(2).kv_unified(true)).unwrap();
    let text = tokens(model.vocab(), "the quick brown fox jumps over the lazy dog");
    let n = text.len() as i32;
    for seq in 0..2 {
        assert_eq!((ctx.seq_pos_min(seq).unwrap(), ctx.seq_pos_max(seq).unwrap()), (None, None));
    }
    decode_seq(&mut ctx, &text, 0, 0);
    assert_eq!((ctx.seq_pos_min(0).unwrap(), ctx.seq_pos_max(0).unwrap()), (Some(0), Some(n - 1)));

    // Removing the tail, then a middle piece (a hole is allowed in the
    // cache; min/max report the ends).
    assert!(ctx.seq_rm(Some(0), Some(n - 2), None).unwrap());
    assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(n - 3));
    assert!(ctx.seq_rm(Some(0), Some(2), Some(4)).unwrap());
    assert_eq!((ctx.seq_pos_min(0).unwrap(), ctx.seq_pos_max(0).unwrap()), (Some(0), Some(n - 3)));
    // The tail can be decoded again after the removal.
    let mut b = Batch::new(2, 1);
    b.push_sequence(&text[n as usize - 2..], n - 2, 0, Logits::Yes).unwrap();
    ctx.decode(&b).unwrap();
    assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(n - 1));

    // Copy, then keep only the copy.
    ctx.seq_cp(0, 1, None, None).unwrap();
    assert_eq!((ctx.seq_pos_min(1).unwrap(), ctx.seq_pos_max(1).unwrap()), (Some(0), Some(n - 1)));
    ctx.seq_keep(1).unwrap();
    assert_eq!(ctx.seq_pos_max(0).unwrap(), None);
    assert_eq!(ctx.seq_pos_max(1).unwrap(), Some(n - 1));
    // Removing every sequence's positions from 5 on leaves 0, 1 and 4 (the
    // copy kept the hole at 2..4).
    assert!(ctx.seq_rm(None, Some(5), None).unwrap());
    assert_eq!((ctx.seq_pos_min(1).unwrap(), ctx.seq_pos_max(1).unwrap()), (Some(0), Some(4)));
    // Shifts and divisions move positions.
    ctx.seq_add(1, None, None, 10).unwrap();
    assert_eq!((ctx.seq_pos_min(1).unwrap(), ctx.seq_pos_max(1).unwrap()), (Some(10), Some(14)));
    ctx.seq_add(1, Some(14), None, 2).unwrap(); // only the last one
    assert_eq!(ctx.seq_pos_max(1).unwrap(), Some(16));
    ctx.seq_div(1, None, None, 2).unwrap();
    assert_eq!((ctx.seq_pos_min(1).unwrap(), ctx.seq_pos_max(1).unwrap()), (Some(5), Some(8)));
    ctx.seq_add(1, None, None, -100).unwrap(); // below zero: the cells are dropped
    assert_eq!(ctx.seq_pos_max(1).unwrap(), None);
    // Clearing empties everything and drops the outputs.
    decode_seq(&mut ctx, &text, 0, 0);
    assert!(ctx.logits(Output::Last).is_ok());
    ctx.clear_kv_zeroed();
    assert_eq!(ctx.seq_pos_max(0).unwrap(), None);
    assert!(ctx.logits(Output::Last).is_err());
    // And the cache takes a fresh sequence from position 0 again.
    decode_seq(&mut ctx, &text, 0, 0);
}

#[test]
fn state_sizes_and_file_tokens_round_trip() {
    let model = tiny_model();
    let mut ctx = model.new_context(&small_params()).unwrap();
    let empty = ctx.state_size();
    let prompt = tokens(model.vocab(), "the quick brown fox");
    decode_seq(&mut ctx, &prompt, 0, 0);
    let full = ctx.state_size();
    assert!(full > empty, "{full} <= {empty}");
    // Each cell stores K and V of 2 layers: 2 * 2 * 32 halves = 256 bytes.
    let per_token = (full - empty) / prompt.len();
    assert!(per_token >= 256, "{per_token} bytes per token");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.state");
    // A file may carry any tokens (e.g. a longer transcript), up to n_ctx.
    let many: Vec<Token> = (0..ctx.n_ctx() as i32).map(|i| Token(i % 700)).collect();
    ctx.save_state_file(&path, &many).unwrap();
    let mut other = model.new_context(&small_params()).unwrap();
    assert_eq!(other.load_state_file(&path).unwrap(), many);
    // More tokens than the loading context holds is an error, not an overflow.
    let mut small = model.new_context(&small_params().n_ctx(128)).unwrap();
    // (n_ctx is padded to 256, so save more than that.)
    let too_many: Vec<Token> = (0..300).map(Token).collect();
    ctx.save_state_file(&path, &too_many).unwrap();
    assert!(matches!(small.load_state_file(&path), Err(llamacpp::Error::State { kind: StateError::TooLarge, .. })));
    // A save into a directory that does not exist fails cleanly, as the
    // I/O error it is, naming the path.
    let missing = dir.path().join("missing").join("x");
    let r = ctx.save_state_file(&missing, &prompt);
    assert!(matches!(&r, Err(llamacpp::Error::Io { path, .. }) if *path == missing), "{r:?}");
    let r = ctx.save_seq_state_file(&missing, 0, &prompt);
    assert!(matches!(&r, Err(llamacpp::Error::Io { path, .. }) if *path == missing), "{r:?}");
    assert!(!dir.path().join("missing").exists());
}

/// `perf()` counts prompt tokens (batches of several tokens) and
/// single-token evaluations separately; llama.cpp accounts at each
/// synchronisation, which reading the logits does.
#[test]
fn perf_counters_count_prompt_and_generated_tokens() {
    let model = tiny_model();
    let mut ctx = model.new_context(&small_params().perf(true)).unwrap();
    let prompt = tokens(model.vocab(), "the quick brown fox jumps");
    let p = prompt.len();
    assert!(p > 1);
    let logits = decode_seq(&mut ctx, &prompt, 0, 0);
    let after_prompt = ctx.perf();
    assert_eq!(after_prompt.prompt_tokens, p as i32);
    let g = 7;
    greedy_continue(&mut ctx, logits, p as i32, g);
    let perf = ctx.perf();
    assert_eq!(perf.prompt_tokens, p as i32);
    assert_eq!(perf.eval_tokens, g as i32);
    assert!(perf.prompt_ms >= 0.0 && perf.eval_ms > 0.0, "{perf:?}");

    ctx.reset_perf();
    let zero = ctx.perf();
    // llama.cpp reports at least 1 for each count.
    assert_eq!((zero.prompt_tokens, zero.eval_tokens), (1, 1));
    assert_eq!((zero.prompt_ms, zero.eval_ms), (0.0, 0.0));
}
