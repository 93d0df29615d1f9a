//! Issue 3: the ways of getting to a KV cache state give the same model
//! outputs. Logits are compared as upstream tests/test-llama-archs.cpp does
//! (normalized MSE at most 1e-4) plus the same argmax.

use llama_suite::safe_api::*;
use llamacpp::{Batch, Context, Logits, Model, Output, Pooling, Token};

const PROMPTS: [&str; 3] = ["Hello world", "the quick brown fox jumps over the lazy dog", "你好 🦀 Rust"];
const STEPS: usize = 6;

/// Each prompt decoded alone in a one-sequence context, then `STEPS`
/// greedy tokens: the prompt's last logits and the logits after each step.
fn alone(model: &Model, prompt: &[Token]) -> (Vec<f32>, Vec<Token>, Vec<Vec<f32>>) {
    let mut ctx = model.new_context(&small_params()).unwrap();
    let first = decode_seq(&mut ctx, prompt, 0, 0);
    let (toks, rows) = greedy_continue(&mut ctx, first.clone(), prompt.len() as i32, STEPS);
    (first, toks, rows)
}

fn batched_equals_alone(kv_unified: bool) {
    let model = tiny_model();
    let prompts: Vec<Vec<Token>> = PROMPTS.iter().map(|p| tokens(model.vocab(), p)).collect();
    assert!(prompts.iter().map(Vec::len).collect::<std::collections::HashSet<_>>().len() == 3);
    let reference: Vec<_> = prompts.iter().map(|p| alone(&model, p)).collect();

    let mut ctx = model.new_context(&small_params().n_ctx(3 * 256).n_seq_max(3).kv_unified(kv_unified)).unwrap();
    // All three prompts in one batch, logits at the end of each.
    let mut batch = Batch::new(64, 1);
    let mut last_index = Vec::new();
    for (seq, p) in prompts.iter().enumerate() {
        batch.push_sequence(p, 0, seq as i32, Logits::Yes).unwrap();
        last_index.push(batch.len() as i32 - 1);
    }
    ctx.decode(&batch).unwrap();
    let mut next = Vec::new();
    for (seq, (first, toks, _)) in reference.iter().enumerate() {
        let row = ctx.logits(Output::Index(last_index[seq] as usize)).unwrap();
        assert_same_logits(first, row, &format!("prompt {seq} (kv_unified {kv_unified})"));
        next.push(Token(argmax(row) as i32));
        assert_eq!(next[seq], toks[0]);
    }
    // Then one token per sequence per batch.
    let mut pos: Vec<i32> = prompts.iter().map(|p| p.len() as i32).collect();
    for step in 0..STEPS {
        batch.clear();
        for seq in 0..3 {
            batch.push(next[seq], pos[seq], &[seq as i32], Logits::Yes).unwrap();
            pos[seq] += 1;
        }
        ctx.decode(&batch).unwrap();
        for (seq, (_, toks, rows)) in reference.iter().enumerate() {
            let row = ctx.logits(seq).unwrap();
            assert_same_logits(&rows[step], row, &format!("seq {seq} step {step} (kv_unified {kv_unified})"));
            next[seq] = Token(argmax(row) as i32);
            if step + 1 < STEPS {
                assert_eq!(next[seq], toks[step + 1], "seq {seq} step {step}");
            }
        }
    }
    for (seq, p) in prompts.iter().enumerate() {
        assert_eq!(ctx.seq_pos_min(seq as i32).unwrap(), Some(0));
        assert_eq!(ctx.seq_pos_max(seq as i32).unwrap(), Some((p.len() + STEPS) as i32 - 1));
    }
}

#[test]
fn three_sequences_in_one_batch_equal_each_alone() {
    batched_equals_alone(false);
}

#[test]
fn three_sequences_in_one_batch_equal_each_alone_unified() {
    batched_equals_alone(true);
}

/// Decodes `prefix` into sequence 0, copies it to sequence 1 with
/// `seq_cp`, decodes `rest` in sequence 1: the logits equal decoding
/// `prefix + rest` from scratch.
fn copied_prefix_equals_redecoding(ctx: &mut Context<'_>, prefix: &[Token], rest: &[Token], reference: &[f32]) {
    decode_seq(ctx, prefix, 0, 0);
    ctx.seq_cp(0, 1, None, None).unwrap();
    assert_eq!(ctx.seq_pos_max(1).unwrap(), Some(prefix.len() as i32 - 1));
    let got = decode_seq(ctx, rest, prefix.len() as i32, 1);
    assert_same_logits(reference, &got, "continuation of a copied prefix");
    // Sequence 0 is unaffected by sequence 1's tokens.
    assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(prefix.len() as i32 - 1));
}

#[test]
fn a_copied_prefix_gives_the_same_next_logits() {
    let model = tiny_model();
    let all = tokens(model.vocab(), "the quick brown fox jumps over the lazy dog");
    let (prefix, rest) = all.split_at(5);
    let mut fresh = model.new_context(&small_params()).unwrap();
    let reference = decode_seq(&mut fresh, &all, 0, 0);

    for kv_unified in [false, true] {
        let mut ctx = model.new_context(&small_params().n_ctx(512).n_seq_max(2).kv_unified(kv_unified)).unwrap();
        copied_prefix_equals_redecoding(&mut ctx, prefix, rest, &reference);
        // The same prefix, used again after the first copy was removed.
        ctx.seq_rm(Some(1), None, None).unwrap();
        assert_eq!(ctx.seq_pos_max(1).unwrap(), None);
        ctx.seq_cp(0, 1, None, None).unwrap();
        let again = decode_seq(&mut ctx, rest, prefix.len() as i32, 1);
        assert_same_logits(&reference, &again, "second copy");
    }

    // A partial copy (unified cache): only the first 3 positions, then
    // decode the rest of the text from there.
    let mut ctx = model.new_context(&small_params().n_ctx(256).n_seq_max(2).kv_unified(true)).unwrap();
    decode_seq(&mut ctx, prefix, 0, 0);
    ctx.seq_cp(0, 1, None, Some(3)).unwrap();
    assert_eq!((ctx.seq_pos_min(1).unwrap(), ctx.seq_pos_max(1).unwrap()), (Some(0), Some(2)));
    let got = decode_seq(&mut ctx, &all[3..], 3, 1);
    assert_same_logits(&reference, &got, "continuation of a partial copy");
    // seq_keep drops the other sequence.
    ctx.seq_keep(1).unwrap();
    assert_eq!(ctx.seq_pos_max(0).unwrap(), None);
    assert_eq!(ctx.seq_pos_max(1).unwrap(), Some(all.len() as i32 - 1));
}

/// The classic context shift: keep the first `n_keep` positions, drop half
/// of the rest, move the remainder down, and keep decoding past `n_ctx`.
#[test]
fn a_context_shift_keeps_decoding_within_n_ctx() {
    let model = tiny_model();
    let vocab = model.vocab();
    let mut ctx = model.new_context(&small_params()).unwrap();
    let n_ctx = ctx.n_ctx() as i32;
    assert_eq!(n_ctx, 256);
    assert!(ctx.can_shift());
    // Fill the whole cache with a token stream.
    let text = "the quick brown fox jumps over the lazy dog and runs back to the green model ".repeat(80);
    let stream: Vec<Token> = tokens(vocab, &text);
    assert!(stream.len() > 3 * n_ctx as usize);
    decode_seq(&mut ctx, &stream[..n_ctx as usize], 0, 0);
    assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(n_ctx - 1));
    // The cache is full: one more token does not fit.
    let mut one = Batch::new(1, 1);
    one.push(stream[n_ctx as usize], n_ctx, &[0], Logits::Yes).unwrap();
    assert!(matches!(ctx.decode(&one), Err(llamacpp::Error::NoKvSlot)));
    assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(n_ctx - 1), "a failed decode leaves the cache as it was");

    let n_keep = 4;
    let mut n_past = n_ctx;
    let mut fed = n_ctx as usize;
    for round in 0..3 {
        let n_discard = (n_past - n_keep) / 2;
        assert!(ctx.seq_rm(Some(0), Some(n_keep), Some(n_keep + n_discard)).unwrap());
        assert_eq!(ctx.seq_pos_min(0).unwrap(), Some(0));
        assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(n_past - 1), "the tail is still in place");
        ctx.seq_add(0, Some(n_keep + n_discard), Some(n_past), -n_discard).unwrap();
        n_past -= n_discard;
        assert_eq!(ctx.seq_pos_min(0).unwrap(), Some(0), "round {round}");
        assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(n_past - 1), "round {round}");
        // The old next position no longer continues the sequence.
        one.clear();
        one.push(stream[fed], n_past + n_discard, &[0], Logits::Yes).unwrap();
        assert!(matches!(ctx.decode(&one), Err(llamacpp::Error::InvalidBatch(_))));
        // Decode until the cache is full again, one token at a time.
        while n_past < n_ctx {
            one.clear();
            one.push(stream[fed], n_past, &[0], Logits::Yes).unwrap();
            ctx.decode(&one).unwrap();
            assert!(ctx.logits(Output::Last).unwrap().iter().all(|x| x.is_finite()));
            n_past += 1;
            fed += 1;
            let max = ctx.seq_pos_max(0).unwrap().unwrap();
            assert!(max < n_ctx && max == n_past - 1);
        }
    }
    assert_eq!(fed, 256 + 3 * 126, "tokens decoded through a 256-token context");
}

/// A shift of every position changes no relative position, so it must not
/// change the model's output: decode a text at positions 100.., shift it
/// down to 0.., and the next token's logits equal a plain decode at 0...
/// This checks the RoPE re-rotation of the cached keys.
#[test]
fn shifting_a_whole_sequence_does_not_change_its_logits() {
    let model = tiny_model();
    let all = tokens(model.vocab(), "the quick brown fox jumps over the lazy dog");
    let (text, next) = all.split_at(all.len() - 1);
    let mut plain = model.new_context(&small_params()).unwrap();
    let reference = decode_seq(&mut plain, &all, 0, 0);

    for (start, kv_type) in [(100, llamacpp::KvType::F16), (37, llamacpp::KvType::F32), (200, llamacpp::KvType::F32)] {
        let mut ctx = model.new_context(&small_params().n_ctx(512).kv_type(kv_type)).unwrap();
        decode_seq(&mut ctx, text, start, 0);
        assert_eq!(ctx.seq_pos_min(0).unwrap(), Some(start));
        ctx.seq_add(0, None, None, -start).unwrap();
        assert_eq!(ctx.seq_pos_min(0).unwrap(), Some(0));
        assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(text.len() as i32 - 1));
        let got = decode_seq(&mut ctx, next, text.len() as i32, 0);
        assert_same_logits(&reference, &got, &format!("shifted down from {start} ({kv_type:?})"));
        // And seq_div: halving the positions merges them, so the next
        // token's logits must differ from the reference.
        ctx.seq_rm(Some(0), Some(text.len() as i32), None).unwrap();
        ctx.seq_div(0, None, None, 2).unwrap();
        assert_eq!(ctx.seq_pos_max(0).unwrap(), Some((text.len() as i32 - 1) / 2));
        let halved = decode_seq(&mut ctx, next, (text.len() as i32 - 1) / 2 + 1, 0);
        let e = nmse(&reference, &halved);
        println!("seq_div ({kv_type:?}): NMSE {e:e}");
        assert!(e > 1e-3, "seq_div changed nothing ({kv_type:?}): NMSE {e:e}");
    }
}

/// The check above (NMSE at most 1e-4 and the same argmax) fails, by a wide
/// margin, for the bugs it is there to catch: a wrong position shift, the
/// wrong sequence's row, a dropped token.
#[test]
fn the_logits_check_catches_real_bugs() {
    let model = tiny_model();
    let all = tokens(model.vocab(), "the quick brown fox jumps over the lazy dog");
    let (text, next) = all.split_at(all.len() - 1);
    let mut plain = model.new_context(&small_params()).unwrap();
    let reference = decode_seq(&mut plain, &all, 0, 0);
    let mut wrong = Vec::new();

    // A shift by the wrong amount: the first half of the prompt moved five
    // positions on, so its distances to the new token are wrong.
    let mut ctx = model.new_context(&small_params()).unwrap();
    decode_seq(&mut ctx, text, 0, 0);
    ctx.seq_add(0, Some(0), Some(text.len() as i32 / 2), 5).unwrap();
    wrong.push(("wrong shift", decode_seq(&mut ctx, next, text.len() as i32, 0)));

    // Another sequence's row: the same last token after another prompt.
    let other = tokens(model.vocab(), "Hello world, this is another prompt");
    let mut ctx = model.new_context(&small_params()).unwrap();
    decode_seq(&mut ctx, &other, 0, 0);
    wrong.push(("wrong sequence", decode_seq(&mut ctx, next, other.len() as i32, 0)));

    // A dropped token in the middle of the prompt.
    let mut dropped = all.clone();
    dropped.remove(all.len() / 2);
    let mut ctx = model.new_context(&small_params()).unwrap();
    wrong.push(("dropped token", decode_seq(&mut ctx, &dropped, 0, 0)));

    for (what, row) in &wrong {
        let e = nmse(&reference, row);
        println!("{what}: NMSE {e:e}");
        assert!(e > 1e-2, "{what}: NMSE {e:e} is not far above the 1e-4 threshold");
        let caught = std::panic::catch_unwind(|| assert_same_logits(&reference, row, what));
        assert!(caught.is_err(), "{what}: the logits check passed");
    }
}

/// Mean pooling equals the mean of the per-token embeddings.
#[test]
fn pooled_embeddings_equal_the_mean_of_token_embeddings() {
    let model = tiny_model();
    let n_embd = model.n_embd_out();
    assert_eq!(n_embd, 64);
    let prompts: Vec<Vec<Token>> = PROMPTS.iter().map(|p| tokens(model.vocab(), p)).collect();

    let mut per_token = model.new_context(&small_params().embeddings(true).pooling(Pooling::None)).unwrap();
    let mut rows_of = |p: &[Token]| {
        per_token.clear_kv();
        per_token.decode(&Batch::from_tokens(p, 0)).unwrap();
        (0..p.len() as i32)
            .map(|i| per_token.embeddings(Output::Index(i as usize)).unwrap().to_vec())
            .collect::<Vec<_>>()
    };
    let rows: Vec<Vec<Vec<f32>>> = prompts.iter().map(|p| rows_of(p)).collect();

    let mean = |rows: &[Vec<f32>]| {
        (0..n_embd).map(|j| rows.iter().map(|r| r[j]).sum::<f32>() / rows.len() as f32).collect::<Vec<f32>>()
    };
    let close = |a: &[f32], b: &[f32], what: &str| {
        let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(diff <= 1e-4, "{what}: max difference {diff}");
    };

    for (pooling, expected) in [
        (Pooling::Mean, prompts.iter().zip(&rows).map(|(_, r)| mean(r)).collect::<Vec<_>>()),
        (Pooling::Last, rows.iter().map(|r| r[r.len() - 1].clone()).collect()),
        (Pooling::Cls, rows.iter().map(|r| r[0].clone()).collect()),
    ] {
        // All three prompts as three sequences of one batch. One cache
        // stream: llama.cpp pools per micro-batch, and separate streams
        // would cut sequences of different lengths into several.
        let params = small_params().embeddings(true).pooling(pooling).n_seq_max(3).n_ctx(768);
        // n_ubatch a multiple of n_seq_max: see never_abort's mean-pooling case.
        let mut ctx = model.new_context(&params.clone().kv_unified(true).n_ubatch(63)).unwrap();
        let mut batch = Batch::new(64, 1);
        for (seq, p) in prompts.iter().enumerate() {
            batch.push_sequence(p, 0, seq as i32, Logits::No).unwrap();
        }
        let mut split = model.new_context(&params.clone().n_ubatch(63)).unwrap();
        let err = split.decode(&batch).unwrap_err();
        assert!(matches!(err, llamacpp::Error::InvalidBatch(ref m) if m.contains("kv_unified")), "{err:?}");
        ctx.decode(&batch).unwrap();
        for (seq, want) in expected.iter().enumerate() {
            let got = ctx.sequence_embeddings(seq as i32).unwrap();
            assert_eq!(got.len(), n_embd);
            assert!(got.iter().all(|x| x.is_finite()));
            close(want, got, &format!("{pooling:?} pooling of sequence {seq}"));
        }
        // With separate streams, one sequence per batch is right.
        for (seq, p) in prompts.iter().enumerate() {
            split.clear_kv();
            split.decode(&Batch::from_tokens(p, 0)).unwrap();
            close(&expected[seq], split.sequence_embeddings(0).unwrap(), &format!("{pooling:?} alone, {seq}"));
        }
        // Distinct inputs, distinct embeddings -- except the first token:
        // under causal attention BOS sees only itself.
        let a = ctx.sequence_embeddings(0).unwrap().to_vec();
        let b = ctx.sequence_embeddings(1).unwrap().to_vec();
        if pooling == Pooling::Cls {
            close(&a, &b, "CLS (BOS) of two prompts");
        } else {
            assert!(nmse(&a, &b) > 1e-3, "{pooling:?}: two prompts, same embedding");
        }
    }
}
