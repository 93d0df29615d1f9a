//! Issue 3: no safe call aborts the process on bad input.
//!
//! Each test drives one of llama.cpp's abort or throw paths (survey §1.18,
//! §4) from safe code and checks that it comes back as an `Err`, and that
//! the objects involved keep working afterwards. An abort would kill the
//! whole test binary, so each case runs in a child process
//! (`safe_api::isolated`): one that aborts fails alone, by name, with the
//! child's output, and the other cases still run.

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use llama::{
    AddBos, Batch, ContextParams, Detokenizer, Error, Logits, MetadataValue, Model, ModelParams, Output, Pooling,
    Sampler, SamplerChain, Special, StateError, Token,
};
use llama_suite::safe_api::*;
use llama_suite::synthetic::{GgufWriter, TINY_BOS_ID, TINY_EOS_ID, TINY_VOCAB_SIZE};

/// A context over the tiny model with `n_seq` sequences.
fn ctx_with_seqs(model: &Model, n_seq: u32, kv_unified: bool) -> llama::Context<'_> {
    model.new_context(&small_params().n_ctx(256 * n_seq).n_seq_max(n_seq).kv_unified(kv_unified)).expect("context")
}

#[test]
fn oversized_and_empty_batches_are_rejected() {
    isolated(|| {
        let model = tiny_model();
        let mut ctx = model.new_context(&small_params().n_batch(16).n_ubatch(16)).unwrap();
        assert_eq!(ctx.n_batch(), 16);
        let toks: Vec<Token> = (0..17).map(|i| Token(300 + i)).collect();
        let err = ctx.decode(&Batch::from_tokens(&toks, 0)).unwrap_err();
        assert!(matches!(err, Error::InvalidBatch(ref m) if m.contains("n_batch")), "{err:?}");
        let err = ctx.decode(&Batch::new(4, 1)).unwrap_err();
        assert!(matches!(err, Error::InvalidBatch(ref m) if m.contains("empty")), "{err:?}");
        assert_eq!(ctx.seq_pos_max(0).unwrap(), None, "a rejected batch must not reach the cache");

        // Exactly n_batch is fine, and the context is unharmed.
        ctx.decode(&Batch::from_tokens(&toks[..16], 0)).unwrap();
        assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(15));
        assert_eq!(ctx.logits(Output::Last).unwrap().len(), TINY_VOCAB_SIZE);

        // A batch refuses to grow past its capacity.
        let mut batch = Batch::new(2, 1);
        batch.push(Token(5), 0, &[0], Logits::No).unwrap();
        batch.push(Token(5), 1, &[0], Logits::No).unwrap();
        assert!(matches!(batch.push(Token(5), 2, &[0], Logits::No), Err(Error::BatchFull { capacity: 2 })));
        assert!(matches!(batch.push_sequence(&[Token(1)], 2, 0, Logits::Yes), Err(Error::BatchFull { .. })));
        assert!(matches!(Batch::new(4, 1).push(Token(5), 0, &[], Logits::Yes), Err(Error::InvalidArgument(_))));
        assert!(matches!(Batch::new(4, 1).push(Token(5), 0, &[0, 1], Logits::Yes), Err(Error::InvalidArgument(_))));
        assert!(matches!(
            Batch::new(4, 1).set_logits(0, Logits::Yes),
            Err(Error::OutOfRange { what: "batch", index: 0, len: 0 })
        ));
    });
}

#[test]
fn bad_positions_are_rejected() {
    isolated(|| {
        let model = tiny_model();
        let mut ctx = model.new_context(&small_params()).unwrap();
        for pos in [-1, -5, i32::MIN, i32::MAX] {
            let mut b = Batch::new(1, 1);
            b.push(Token(300), pos, &[0], Logits::Yes).unwrap();
            let err = ctx.decode(&b).unwrap_err();
            assert!(matches!(err, Error::InvalidBatch(ref m) if m.contains("position")), "{pos}: {err:?}");
        }
        ctx.decode(&Batch::from_tokens(&[Token(1), Token(300)], 0)).unwrap();
        // Not continuing the sequence, or a gap inside the batch.
        let mut b = Batch::new(2, 1);
        b.push(Token(300), 5, &[0], Logits::Yes).unwrap();
        assert!(matches!(ctx.decode(&b), Err(Error::InvalidBatch(_))));
        let mut b = Batch::new(2, 1);
        b.push(Token(300), 2, &[0], Logits::No).unwrap();
        b.push(Token(300), 4, &[0], Logits::Yes).unwrap();
        assert!(matches!(ctx.decode(&b), Err(Error::InvalidBatch(_))));
        assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(1));
        // A far position of a fresh sequence is accepted, but a shift that
        // would overflow i32 in llama.cpp is not.
        ctx.clear_kv();
        let mut b = Batch::new(1, 1);
        b.push(Token(300), 1 << 30, &[0], Logits::Yes).unwrap();
        ctx.decode(&b).unwrap();
        let err = ctx.seq_add(0, None, None, i32::MAX).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(1 << 30), "a rejected shift must not move anything");
        ctx.seq_add(0, None, None, -(1 << 30)).unwrap();
        assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(0));
    });
}

#[test]
fn bad_sequence_ids_are_rejected_by_every_operation() {
    isolated(|| {
        let model = tiny_model();
        let mut ctx = ctx_with_seqs(&model, 2, false);
        let mut unified = ctx_with_seqs(&model, 2, true);
        let prompt = tokens(model.vocab(), "Hello world");
        decode_seq(&mut ctx, &prompt, 0, 0);
        let state = ctx.save_seq_state(0).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("seq0.state");
        ctx.save_seq_state_file(&file, 0, &prompt).unwrap();

        for seq in [2, 3, 256, 1000, -1, -2, i32::MIN, i32::MAX] {
            let bad = |r: Result<(), Error>, op: &str| match r {
                Err(Error::InvalidSeqId { seq: s, n_seq_max: 2 }) => assert_eq!(s, seq, "{op}"),
                other => panic!("{op}({seq}): {other:?}"),
            };
            let mut b = Batch::new(1, 1);
            b.push(Token(300), 0, &[seq], Logits::Yes).unwrap();
            bad(ctx.decode(&b), "decode");
            let mut b = Batch::new(1, 2);
            b.push(Token(300), 0, &[0, seq], Logits::Yes).unwrap();
            // Without kv_unified, two sequences per token is refused first;
            // with it, the bad id.
            let r = ctx.decode(&b);
            assert!(matches!(r, Err(Error::InvalidBatch(ref m)) if m.contains("kv_unified")), "{seq}: {r:?}");
            bad(unified.decode(&b), "decode with a second, bad sequence (kv_unified)");
            bad(ctx.seq_rm(Some(seq), None, None).map(drop), "seq_rm");
            bad(ctx.seq_cp(seq, 0, None, None), "seq_cp src");
            bad(ctx.seq_cp(0, seq, None, None), "seq_cp dst");
            bad(ctx.seq_keep(seq), "seq_keep");
            bad(ctx.seq_add(seq, None, None, 1), "seq_add");
            bad(ctx.seq_div(seq, None, None, 2), "seq_div");
            bad(ctx.seq_pos_min(seq).map(drop), "seq_pos_min");
            bad(ctx.seq_pos_max(seq).map(drop), "seq_pos_max");
            bad(ctx.save_seq_state(seq).map(drop), "save_seq_state");
            bad(ctx.load_seq_state(&state, seq), "load_seq_state");
            bad(ctx.save_seq_state_file(dir.path().join("x"), seq, &prompt), "save_seq_state_file");
            bad(ctx.load_seq_state_file(&file, seq).map(drop), "load_seq_state_file");
            bad(ctx.sequence_embeddings(seq).map(drop), "sequence_embeddings");
            bad(ctx.redecode_last(&prompt, seq), "redecode_last");
        }
        assert!(!dir.path().join("x").exists(), "no file for a rejected save");
        // Everything was rejected before llama.cpp saw it: the cache is intact.
        assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(prompt.len() as i32 - 1));
        assert_eq!(ctx.seq_pos_max(1).unwrap(), None);
        let mut b = Batch::new(1, 1);
        b.push(Token(300), prompt.len() as i32, &[0], Logits::Yes).unwrap();
        ctx.decode(&b).unwrap();
    });
}

#[test]
fn bad_token_ids_are_rejected_by_every_operation() {
    isolated(|| {
        let model = tiny_model();
        let vocab = model.vocab();
        let n = vocab.n_tokens() as i32;
        assert_eq!(n as usize, TINY_VOCAB_SIZE);
        let mut ctx = model.new_context(&small_params()).unwrap();
        for bad in [-1, -2, n, n + 1, i32::MAX, i32::MIN] {
            let t = Token(bad);
            let is_bad = |r: Result<(), Error>, op: &str| match r {
                Err(Error::InvalidToken { token, n_vocab }) => assert_eq!((token, n_vocab), (bad, n), "{op}"),
                other => panic!("{op}({bad}): {other:?}"),
            };
            is_bad(ctx.decode(&Batch::from_tokens(&[Token(1), t], 0)), "decode");
            is_bad(vocab.token_to_piece(t, Special::Plain).map(drop), "token_to_piece");
            is_bad(vocab.token_to_piece(t, Special::Markup).map(drop), "token_to_piece special");
            let mut out = b"kept".to_vec();
            is_bad(vocab.append_piece(t, Special::Plain, &mut out), "append_piece");
            assert_eq!(out, b"kept");
            is_bad(vocab.text(t).map(drop), "text");
            is_bad(vocab.score(t).map(drop), "score");
            is_bad(vocab.attrs(t).map(drop), "attrs");
            is_bad(vocab.detokenize(&[Token(300), t], AddBos::No, Special::Plain).map(drop), "detokenize");
            is_bad(Detokenizer::new(vocab, Special::Plain).push_str(t).map(drop), "Detokenizer::push");
            is_bad(vocab.check(t).map(drop), "check");
            assert!(!vocab.is_eog(t) && !vocab.is_control(t));
            is_bad(SamplerChain::new().logit_bias(vocab, &[(t, 1.0)]).greedy().build().map(drop), "logit_bias");
            is_bad(
                SamplerChain::new().grammar_lazy(vocab, "root ::= \"a\"", "root", &[], &[t]).greedy().build().map(drop),
                "grammar_lazy",
            );
        }
        assert_eq!(ctx.seq_pos_max(0).unwrap(), None);
        ctx.decode(&Batch::from_tokens(&[Token(1), Token(n - 1)], 0)).unwrap();
    });
}

#[test]
fn unrequested_outputs_are_rejected() {
    isolated(|| {
        let model = tiny_model();
        let mut ctx = model.new_context(&small_params()).unwrap();
        let prompt = tokens(model.vocab(), "the quick brown fox");
        let n = prompt.len();
        ctx.decode(&Batch::from_tokens(&prompt, 0)).unwrap();
        for i in 0..n - 1 {
            assert!(matches!(ctx.logits(i), Err(Error::NoOutput(Output::Index(j))) if j == i), "logits({i})");
        }
        let last = ctx.logits(n - 1).unwrap().to_vec();
        assert_eq!(ctx.logits(Output::Last).unwrap(), &last[..]);
        for i in [n, n + 100, usize::MAX] {
            assert!(matches!(ctx.logits(i), Err(Error::NoOutput(_))), "logits({i})");
        }
        // Embeddings are off in this context.
        assert!(matches!(ctx.embeddings(Output::Last), Err(Error::NoOutput(Output::Last))));
        assert!(matches!(ctx.embeddings(n - 1), Err(Error::NoOutput(_))));
        assert!(matches!(ctx.sequence_embeddings(0), Err(Error::NoSequenceOutput(0))));
        let mut greedy = Sampler::greedy();
        assert!(matches!(greedy.sample(&mut ctx, Output::Index(0)), Err(Error::NoOutput(Output::Index(0)))));
        greedy.sample(&mut ctx, Output::Last).unwrap();

        // A batch rejected before llama.cpp sees it leaves the outputs as they were.
        assert!(matches!(
            ctx.decode(&Batch::from_tokens(&[Token(-7)], n as i32)),
            Err(Error::InvalidToken { token: -7, .. })
        ));
        assert_eq!(ctx.logits(Output::Last).unwrap(), &last[..]);

        // Per-token embeddings: every token is an output, but only that many.
        let mut emb = model.new_context(&small_params().embeddings(true).pooling(Pooling::None)).unwrap();
        emb.decode(&Batch::from_tokens(&prompt, 0)).unwrap();
        for i in 0..n {
            assert_eq!(emb.embeddings(i).unwrap().len(), model.n_embd_out());
        }
        for i in [n, n + 1, usize::MAX] {
            assert!(matches!(emb.embeddings(i), Err(Error::NoOutput(_))), "embeddings({i})");
        }
        assert!(
            matches!(emb.sequence_embeddings(0), Err(Error::NoSequenceOutput(0))),
            "no pooled output without pooling"
        );
        // With pooling, llama.cpp extracts only the pooled embedding.
        let mut pooled = model.new_context(&small_params().embeddings(true).pooling(Pooling::Mean)).unwrap();
        pooled.decode(&Batch::from_tokens(&prompt, 0)).unwrap();
        assert!(matches!(pooled.embeddings(Output::Index(0)), Err(Error::NoOutput(Output::Index(0)))));
        assert_eq!(pooled.sequence_embeddings(0).unwrap().len(), model.n_embd_out());
    });
}

#[test]
fn shifts_the_cache_cannot_do_are_rejected() {
    isolated(|| {
        // The tiny model's cache can shift; the divisor is still checked.
        let model = tiny_model();
        let mut ctx = model.new_context(&small_params()).unwrap();
        assert!(ctx.can_shift());
        decode_seq(&mut ctx, &tokens(model.vocab(), "Hello world again"), 0, 0);
        for d in [0, -1, i32::MIN] {
            let err = ctx.seq_div(0, None, None, d);
            assert!(matches!(err, Err(Error::InvalidParameter { name: "divisor", .. })), "seq_div by {d}");
        }
        ctx.seq_div(0, None, None, 1).unwrap();

        // Gemma 3 has sliding-window layers: with a smaller window cache
        // (swa_full off, n_ctx well above the window) it cannot shift, and
        // llama.cpp would abort at the next decode ("does not support K-shift").
        let gemma = real_model();
        assert!(gemma.n_swa() > 0);
        let params = ContextParams::default().n_ctx(2048).n_batch(64).n_ubatch(64).n_threads(2);
        let mut ctx = gemma.new_context(&params.clone().swa_full(false)).unwrap();
        assert!(!ctx.can_shift());
        let prompt = tokens(gemma.vocab(), "The capital of France is");
        let before = decode_seq(&mut ctx, &prompt, 0, 0);
        let end = prompt.len() as i32;
        assert!(matches!(ctx.seq_add(0, Some(2), None, -1), Err(Error::CannotShift)));
        assert!(matches!(ctx.seq_add(0, None, None, 5), Err(Error::CannotShift)));
        assert!(matches!(ctx.seq_div(0, None, None, 2), Err(Error::CannotShift)));
        assert!(matches!(ctx.seq_div(0, None, None, 0), Err(Error::InvalidParameter { name: "divisor", .. })));
        assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(end - 1));
        // The next decode works, and the cache was not disturbed: redoing the
        // last token gives the same logits.
        ctx.seq_rm(Some(0), Some(end - 1), None).unwrap();
        let again = decode_seq(&mut ctx, &prompt[prompt.len() - 1..], end - 1, 0);
        assert_same_logits(&before, &again, "gemma after rejected shifts");
        // With a full-size window cache the same model can shift.
        let ctx = gemma.new_context(&params.swa_full(true)).unwrap();
        assert!(ctx.can_shift());
    });
}

#[test]
fn chains_without_a_selecting_sampler_are_rejected() {
    isolated(|| {
        assert!(matches!(SamplerChain::new().top_k(5).build(), Err(Error::NoSelector)));
        assert!(matches!(SamplerChain::new().build(), Err(Error::NoSelector)));
        assert!(matches!(SamplerChain::new().top_k(5).top_p(0.9, 1).temp(0.7).build(), Err(Error::NoSelector)));
        assert!(matches!(SamplerChain::new().greedy().top_k(5).build(), Err(Error::NoSelector)));
        assert!(matches!(SamplerChain::new().dist(1).temp(0.5).build(), Err(Error::NoSelector)));
        for (chain, len) in [
            (SamplerChain::new().top_k(5).greedy(), 2),
            (SamplerChain::new().top_k(5).dist(3), 2),
            (SamplerChain::new().mirostat_v2(1, 5.0, 0.1), 1),
            (SamplerChain::new().temp(0.8).adaptive_p(0.5, 0.9, 4), 2),
        ] {
            assert_eq!(chain.build().unwrap().len(), len);
        }
    });
}

#[test]
fn grammar_misuse_is_an_error() {
    isolated(|| {
        let model = tiny_model();
        let vocab = model.vocab();
        let (a, b) = (token_for_piece(vocab, "a"), token_for_piece(vocab, "b"));
        let eos = Token(TINY_EOS_ID);
        assert!(vocab.is_eog(eos));
        let mut s = SamplerChain::new().grammar(vocab, r#"root ::= "a" "b""#, "root").greedy().build().unwrap();
        // A forbidden token, and EOG before the grammar is complete: llama.cpp
        // would throw / GGML_ABORT in llama_grammar_accept_impl.
        assert!(matches!(s.accept(b), Err(Error::Grammar(_))));
        assert!(matches!(s.accept(eos), Err(Error::Grammar(_))));
        s.accept(a).unwrap();
        assert!(matches!(s.accept(a), Err(Error::Grammar(_))));
        assert!(matches!(s.accept(eos), Err(Error::Grammar(_))));
        assert!(matches!(s.accept(Token(-1)), Err(Error::InvalidToken { token: -1, .. })));
        s.accept(b).unwrap();
        assert!(matches!(s.accept(a), Err(Error::Grammar(_))));
        s.accept(eos).unwrap(); // complete now

        // Sampling under the grammar works and honours it.
        let mut ctx = model.new_context(&small_params()).unwrap();
        let prompt = tokens(vocab, "Hello world");
        decode_seq(&mut ctx, &prompt, 0, 0);
        s.reset();
        assert_eq!(vocab.token_to_piece(s.sample(&mut ctx, Output::Last).unwrap(), Special::Plain).unwrap(), b"a");

        // A lazy grammar whose trigger token it then rejects: llama.cpp throws
        // after emptying the grammar's stacks, and the next apply would abort
        // (GGML_ASSERT(!stacks.empty())). The chain refuses until reset.
        let trigger = token_for_piece(vocab, "b");
        let mut lazy = SamplerChain::new()
            .grammar_lazy(vocab, r#"root ::= "a""#, "root", &[], &[trigger])
            .greedy()
            .build()
            .unwrap();
        lazy.accept(Token(300)).unwrap(); // not a trigger: no constraint yet
        assert!(matches!(lazy.accept(trigger), Err(Error::Grammar(_))));
        assert!(matches!(lazy.sample(&mut ctx, Output::Last), Err(Error::Grammar(ref m)) if m.contains("reset")));
        assert!(matches!(lazy.accept(a), Err(Error::Grammar(_))));
        let copy = lazy.try_clone().unwrap();
        let mut copy = copy;
        assert!(
            matches!(copy.sample(&mut ctx, Output::Last), Err(Error::Grammar(_))),
            "a copy of a failed chain fails too"
        );
        lazy.reset();
        lazy.sample(&mut ctx, Output::Last).unwrap();
        // The same with a trigger pattern whose replayed text the grammar rejects.
        let mut lazy =
            SamplerChain::new().grammar_lazy(vocab, r#"root ::= "a""#, "root", &["x.*"], &[]).greedy().build().unwrap();
        let results: Vec<bool> =
            vocab.tokenize("xyz", AddBos::No).unwrap().into_iter().map(|t| lazy.accept(t).is_ok()).collect();
        assert!(results.contains(&false), "{results:?}");
        assert!(matches!(lazy.sample(&mut ctx, Output::Last), Err(Error::Grammar(ref m)) if m.contains("reset")));
        lazy.reset();
        lazy.sample(&mut ctx, Output::Last).unwrap();
    });
}

#[test]
fn grammars_that_do_not_parse_are_rejected() {
    isolated(|| {
        let model = tiny_model();
        let vocab = model.vocab();
        for gbnf in [
            r#"root ::= "a"#,
            "root ::= undefined-rule",
            "root ::= [a-",
            "root ::= root \"a\"",
            r#"root ::= "a"{5,2"#,
            "root = \"a\"",
            r#"root ::= "\q""#,
            "root ::= (\"a\"",
            "::= \"a\"",
        ] {
            let r = SamplerChain::new().grammar(vocab, gbnf, "root").greedy().build();
            assert!(matches!(r, Err(Error::Grammar(_))), "{gbnf:?} was accepted");
        }
        assert!(matches!(
            SamplerChain::new().grammar(vocab, r#"start ::= "a""#, "root").greedy().build(),
            Err(Error::Grammar(_))
        ));
        assert!(matches!(
            SamplerChain::new().grammar(vocab, "root ::= \"a\0\"", "root").greedy().build(),
            Err(Error::Nul(_))
        ));
        let bad_regex =
            SamplerChain::new().grammar_lazy(vocab, r#"root ::= "a""#, "root", &["(unclosed"], &[]).greedy().build();
        assert!(matches!(bad_regex, Err(Error::Grammar(_))), "invalid trigger regex");
        assert!(SamplerChain::new().grammar(vocab, r#"root ::= "a" | "b""#, "root").greedy().build().is_ok());
    });
}

// ---------------------------------------------------------------- files

fn assert_load_fails(path: &Path, what: &str) {
    match Model::load(path, &ModelParams::default()) {
        Err(Error::ModelLoad { .. } | Error::Io { .. }) => {}
        Err(other) => panic!("{what}: unexpected error {other:?}"),
        Ok(_) => panic!("{what}: a broken file loaded"),
    }
}

#[test]
fn broken_model_files_are_rejected() {
    isolated(|| {
        let dir = tempfile::tempdir().unwrap();
        let good = fs::read(tiny_path()).unwrap();

        assert!(matches!(Model::load(dir.path(), &ModelParams::default()), Err(Error::ModelLoad { .. })));
        assert!(matches!(Model::load(dir.path().join("missing.gguf"), &ModelParams::default()), Err(Error::Io { .. })));
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            fs::write(&p, bytes).unwrap();
            p
        };
        assert_load_fails(&write("empty.gguf", b""), "empty");
        assert_load_fails(&write("short.gguf", b"GGU"), "3 bytes");
        assert_load_fails(&write("magic.gguf", b"GGUF"), "magic only");
        assert_load_fails(&write("half.gguf", &good[..good.len() / 2]), "first half");
        assert_load_fails(&write("header.gguf", &good[..20_000]), "header only");
        assert_load_fails(&write("no-tail.gguf", &good[..good.len() - 1]), "last byte missing");
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let random: Vec<u8> = (0..good.len())
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        assert_load_fails(&write("random.gguf", &random), "random bytes");
        let mut magic_then_random = random.clone();
        magic_then_random[..4].copy_from_slice(b"GGUF");
        magic_then_random[4..8].copy_from_slice(&3u32.to_le_bytes());
        assert_load_fails(&write("magic-random.gguf", &magic_then_random), "GGUF header, random rest");

        // Targeted corruption of the header and tensor infos.
        let lay = layout(&good);
        let value_of = |key: &str| lay.kv.iter().find(|(k, ..)| k == key).unwrap_or_else(|| panic!("{key}")).1;
        let patch = |name: &str, at: usize, bytes: &[u8]| {
            let mut d = good.clone();
            d[at..at + bytes.len()].copy_from_slice(bytes);
            write(name, &d)
        };
        let cases: Vec<(&str, usize, Vec<u8>)> = vec![
            ("magic", 0, b"GGUX".to_vec()),
            ("version 0", 4, 0u32.to_le_bytes().to_vec()),
            ("version 99", 4, 99u32.to_le_bytes().to_vec()),
            ("tensor count + 1", 8, (lay.tensors.len() as u64 + 1).to_le_bytes().to_vec()),
            ("tensor count huge", 8, u64::MAX.to_le_bytes().to_vec()),
            ("kv count huge", 16, (1u64 << 40).to_le_bytes().to_vec()),
            ("block_count 0", value_of("llama.block_count"), 0u32.to_le_bytes().to_vec()),
            ("block_count huge", value_of("llama.block_count"), 0x0100_0002u32.to_le_bytes().to_vec()),
            ("block_count 3", value_of("llama.block_count"), 3u32.to_le_bytes().to_vec()),
            ("head_count_kv huge", value_of("llama.attention.head_count_kv"), 0x1000_0002u32.to_le_bytes().to_vec()),
            ("head_count 0", value_of("llama.attention.head_count"), 0u32.to_le_bytes().to_vec()),
            ("embedding_length", value_of("llama.embedding_length"), 65u32.to_le_bytes().to_vec()),
            ("rms eps < 0", value_of("llama.attention.layer_norm_rms_epsilon"), (-1e-5f32).to_le_bytes().to_vec()),
            ("rms eps NaN", value_of("llama.attention.layer_norm_rms_epsilon"), f32::NAN.to_le_bytes().to_vec()),
            ("architecture", value_of("general.architecture") + 8, b"xxxxx".to_vec()),
            ("tensor n_dims 9", lay.tensors[0].1, 9u32.to_le_bytes().to_vec()),
            ("tensor type 200", lay.tensors[0].2, 200u32.to_le_bytes().to_vec()),
            ("tensor type Q4_0", lay.tensors[2].2, 2u32.to_le_bytes().to_vec()),
            ("tensor offset past the end", lay.tensors[3].3, (1u64 << 40).to_le_bytes().to_vec()),
            ("tensor offset misaligned", lay.tensors[3].3, 1u64.to_le_bytes().to_vec()),
            ("tensor dim 0", lay.tensors[1].1 + 4, 0u64.to_le_bytes().to_vec()),
            ("tensor dim huge", lay.tensors[1].1 + 4, (1u64 << 62).to_le_bytes().to_vec()),
        ];
        for (what, at, bytes) in &cases {
            assert_load_fails(&patch("patched.gguf", *at, bytes), what);
        }
        // The unpatched copy still loads: the cases fail because of the patch.
        Model::load(write("copy.gguf", &good), &ModelParams::default()).unwrap();
    });
}

/// Flips every byte of the fixed header, the hyper-parameters and the
/// tensor infos (and a sample of the vocabulary arrays), one at a time:
/// loading must return, and where it succeeds, so must decoding.
#[test]
fn no_single_byte_corruption_of_the_header_aborts() {
    isolated(|| {
        let good = fs::read(tiny_path()).unwrap();
        let lay = layout(&good);
        let vocab_start = lay.kv.iter().find(|(k, ..)| k == "tokenizer.ggml.tokens").unwrap().1;
        let mut positions: Vec<usize> = (0..vocab_start).collect();
        positions.extend((vocab_start..lay.info.0).step_by(97));
        positions.extend(lay.info.0..lay.info.1);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flipped.gguf");
        fs::write(&path, &good).unwrap();
        let mut file = fs::OpenOptions::new().write(true).open(&path).unwrap();
        let (mut loaded, mut rejected) = (0, 0);
        for &at in &positions {
            file.seek(SeekFrom::Start(at as u64)).unwrap();
            file.write_all(&[good[at] ^ 0xff]).unwrap();
            match Model::load(&path, &ModelParams::default()) {
                Ok(model) => {
                    loaded += 1;
                    // Running the damaged model may fail, but only with an Err.
                    match model.new_context(&small_params()) {
                        Ok(mut ctx) => match ctx.decode(&Batch::from_tokens(&[Token(1), Token(300)], 0)) {
                            Ok(()) | Err(Error::InvalidToken { .. }) => {}
                            Err(other) => panic!("byte {at}: decode: {other:?}"),
                        },
                        Err(Error::ContextCreate(_)) => {}
                        Err(other) => panic!("byte {at}: context: {other:?}"),
                    }
                }
                Err(Error::ModelLoad { .. }) => rejected += 1,
                Err(other) => panic!("byte {at}: {other:?}"),
            }
            file.seek(SeekFrom::Start(at as u64)).unwrap();
            file.write_all(&[good[at]]).unwrap();
        }
        assert_eq!(loaded + rejected, positions.len());
        assert!(rejected > positions.len() / 2, "only {rejected} of {} flips rejected", positions.len());
        assert!(loaded > 0, "flips of names and scores leave a loadable model");
    });
}

#[test]
fn bad_metadata_overrides_are_rejected() {
    isolated(|| {
        let path = tiny_path();
        let with =
            |key: &str, value: MetadataValue| Model::load(&path, &ModelParams::default().metadata_override(key, value));
        for (key, value) in [
            ("llama.block_count", MetadataValue::Int(0)),
            ("llama.block_count", MetadataValue::Int(513)),
            ("llama.block_count", MetadataValue::Int(1 << 32)), // truncates to 0 in llama.cpp
            ("llama.attention.head_count_kv", MetadataValue::Int(8)),
            ("llama.attention.layer_norm_rms_epsilon", MetadataValue::Float(-1.0)),
            ("llama.attention.layer_norm_rms_epsilon", MetadataValue::Float(f64::NAN)),
            ("llama.rope.scaling.type", MetadataValue::Str("bogus".into())),
            ("llama.expert_count", MetadataValue::Int(4)),
        ] {
            let r = with(key, value.clone());
            assert!(matches!(r, Err(Error::ModelLoad { .. })), "{key} = {value:?}: {:?}", r.err());
        }
        for key in ["", &"k".repeat(128)] {
            let r = with(key, MetadataValue::Int(1));
            assert!(matches!(r, Err(Error::InvalidArgument(_))), "key {key:?}: {r:?}");
        }
        let r = with("a\0b", MetadataValue::Int(1));
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
        assert!(matches!(with("general.name", MetadataValue::Str("x".repeat(128))), Err(Error::InvalidArgument(_))));
        // Valid overrides of the same keys load.
        with("llama.attention.layer_norm_rms_epsilon", MetadataValue::Float(1e-6)).unwrap();
        with("llama.rope.scaling.type", MetadataValue::Str("linear".into())).unwrap();
    });
}

#[test]
fn context_parameters_llama_cpp_aborts_on_are_rejected() {
    isolated(|| {
        let model = tiny_model();
        for (what, params) in [
            ("n_seq_max 0", small_params().n_seq_max(0)),
            ("n_seq_max 300", small_params().n_seq_max(300).n_batch(512).n_ctx(512)),
            ("n_seq_max > n_batch", small_params().n_seq_max(8).n_batch(4)),
            ("n_seq_max > n_ctx", small_params().n_seq_max(8).n_ctx(4).n_batch(64)),
            ("n_batch 0", small_params().n_batch(0)),
            ("n_threads 0", small_params().n_threads(0)),
            ("n_threads_batch -1", small_params().n_threads_batch(-1)),
            // llama.cpp pads n_ctx up to a multiple of 256 in a u32: it wraps.
            ("n_ctx u32::MAX", small_params().n_ctx(u32::MAX)),
        ] {
            let err = model.new_context(&params).unwrap_err();
            let name = what.split(' ').next().unwrap();
            assert!(matches!(err, Error::InvalidParameter { name: n, .. } if n == name), "{what}: {err:?}");
        }
        // llama.cpp's own refusals come back as ContextCreate.
        assert!(matches!(
            model.new_context(&small_params().kv_type(llama::KvType::Q4_0).flash_attention(llama::FlashAttention::Off)),
            Err(Error::ContextCreate(_))
        ));
        // Mean pooling where llama.cpp's graph reservation would abort
        // (GGML_ASSERT(ggml_can_mul_mat)): min(n_ctx, n_ubatch) = 64 is not a
        // multiple of 3 sequences.
        let mean = small_params().pooling(Pooling::Mean).n_seq_max(3).n_ctx(768);
        let err = model.new_context(&mean.clone().embeddings(true)).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(ref m) if m.contains("n_seq_max")), "{err:?}");
        let mut ctx = model.new_context(&mean.clone()).unwrap();
        assert!(matches!(ctx.set_embeddings(true), Err(Error::InvalidArgument(_))));
        let mut b = Batch::new(3, 1);
        b.push_sequence(&[Token(1), Token(300)], 0, 2, Logits::from(true)).unwrap();
        ctx.decode(&b).unwrap(); // still a working (logits) context
        let mut ok = model.new_context(&mean.n_ubatch(63).embeddings(true)).unwrap();
        ok.decode(&b).unwrap();
        assert_eq!(ok.sequence_embeddings(2).unwrap().len(), model.n_embd_out());
        ok.set_embeddings(false).unwrap();
        // The edges that are valid.
        let ctx = model.new_context(&small_params().n_seq_max(256).n_batch(256).n_ctx(256).kv_unified(true)).unwrap();
        assert_eq!(ctx.n_seq_max(), 256);
        let mut ctx = model.new_context(&small_params()).unwrap();
        assert!(matches!(ctx.set_n_threads(0, 1), Err(Error::InvalidParameter { name: "n_threads", .. })));
        assert!(matches!(ctx.set_n_threads(1, 0), Err(Error::InvalidParameter { name: "n_threads_batch", .. })));
        ctx.set_n_threads(1, 1).unwrap();
    });
}

#[test]
fn a_vocab_only_model_tokenizes_but_cannot_run() {
    isolated(|| {
        let model = Model::load(tiny_path(), &ModelParams::default().vocab_only(true)).unwrap();
        assert!(model.is_vocab_only());
        assert_eq!(model.vocab().n_tokens(), TINY_VOCAB_SIZE);
        let toks = model.vocab().tokenize("Hello world", AddBos::No).unwrap();
        assert_eq!(model.vocab().detokenize(&toks, AddBos::No, Special::Plain).unwrap(), "Hello world");
        // llama.cpp creates the context and aborts at its first decode.
        let err = model.new_context(&small_params()).unwrap_err();
        assert!(matches!(err, Error::ContextCreate(ref m) if m.contains("vocab_only")), "{err:?}");
        assert!(!tiny_model().is_vocab_only());
    });
}

#[test]
fn multi_sequence_tokens_need_a_unified_cache() {
    isolated(|| {
        let model = tiny_model();
        let mut shared = Batch::new(2, 2);
        shared.push(Token(1), 0, &[0, 1], Logits::No).unwrap();
        shared.push(Token(300), 1, &[0, 1], Logits::Yes).unwrap();

        let mut split = ctx_with_seqs(&model, 2, false);
        let err = split.decode(&shared).unwrap_err();
        assert!(matches!(err, Error::InvalidBatch(ref m) if m.contains("kv_unified")), "{err:?}");
        assert_eq!(split.seq_pos_max(0).unwrap(), None);

        let mut unified = ctx_with_seqs(&model, 2, true);
        unified.decode(&shared).unwrap();
        assert_eq!((unified.seq_pos_max(0).unwrap(), unified.seq_pos_max(1).unwrap()), (Some(1), Some(1)));
        // Sequences that diverged cannot be coupled again: sequence 1 ends at
        // position 1, so a shared token at 3 does not continue it.
        let mut b = Batch::new(1, 1);
        b.push(Token(300), 2, &[0], Logits::Yes).unwrap();
        unified.decode(&b).unwrap();
        let mut b = Batch::new(1, 2);
        b.push(Token(300), 3, &[0, 1], Logits::Yes).unwrap();
        let r = unified.decode(&b);
        assert!(matches!(r, Err(Error::InvalidBatch(ref m)) if m.contains("sequence 1")), "{r:?}");
    });
}

#[test]
fn partial_copies_between_streams_need_a_unified_cache() {
    isolated(|| {
        let model = tiny_model();
        let prompt = tokens(model.vocab(), "the quick brown fox");
        let n = prompt.len() as i32;

        let mut split = ctx_with_seqs(&model, 2, false);
        decode_seq(&mut split, &prompt, 0, 0);
        for (p0, p1) in [(Some(1), None), (None, Some(2)), (Some(1), Some(3)), (None, Some(0))] {
            let err = split.seq_cp(0, 1, p0, p1).unwrap_err();
            assert!(
                matches!(err, Error::InvalidArgument(ref m) if m.contains("kv_unified")),
                "{p0:?}..{p1:?}: {err:?}"
            );
        }
        assert_eq!(split.seq_pos_max(1).unwrap(), None);
        split.seq_cp(0, 0, Some(1), Some(2)).unwrap(); // same sequence: a no-op
        split.seq_cp(0, 1, Some(0), None).unwrap(); // whole copies work
        assert_eq!((split.seq_pos_min(1).unwrap(), split.seq_pos_max(1).unwrap()), (Some(0), Some(n - 1)));

        let mut unified = ctx_with_seqs(&model, 2, true);
        decode_seq(&mut unified, &prompt, 0, 0);
        unified.seq_cp(0, 1, Some(1), Some(3)).unwrap();
        assert_eq!((unified.seq_pos_min(1).unwrap(), unified.seq_pos_max(1).unwrap()), (Some(1), Some(2)));
    });
}

#[test]
fn state_of_another_model_or_configuration_is_rejected() {
    isolated(|| {
        let model = tiny_model();
        let other = other_tiny_model();
        let prompt = tokens(model.vocab(), "Hello world");
        let mut ctx = model.new_context(&small_params()).unwrap();
        let logits = decode_seq(&mut ctx, &prompt, 0, 0);
        let whole = ctx.save_state().unwrap();
        let seq = ctx.save_seq_state(0).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (whole_file, seq_file) = (dir.path().join("whole"), dir.path().join("seq"));
        ctx.save_state_file(&whole_file, &prompt).unwrap();
        ctx.save_seq_state_file(&seq_file, 0, &prompt).unwrap();

        let fresh_targets = [
            ("another model", other.new_context(&small_params()).unwrap()),
            ("F32 cache", model.new_context(&small_params().kv_type(llama::KvType::F32)).unwrap()),
            ("two streams", ctx_with_seqs(&model, 2, false)),
        ];
        for (what, mut target) in fresh_targets {
            assert!(
                matches!(target.load_state(&whole), Err(Error::State { kind: StateError::Mismatch, .. })),
                "{what}: whole bytes"
            );
            assert!(
                matches!(target.load_state_file(&whole_file), Err(Error::State { kind: StateError::Mismatch, .. })),
                "{what}: whole file"
            );
            // (Sequence data records the stream layout too.)
            assert!(
                matches!(target.load_seq_state(&seq, 0), Err(Error::State { kind: StateError::Mismatch, .. })),
                "{what}: seq bytes"
            );
            assert!(
                matches!(
                    target.load_seq_state_file(&seq_file, 0),
                    Err(Error::State { kind: StateError::Mismatch, .. })
                ),
                "{what}: seq file"
            );
            // The target still works.
            let toks = tokens(target.model().vocab(), "ok");
            decode_seq(&mut target, &toks, 0, 0);
        }

        // Garbage, truncated, empty and foreign files.
        let mut target = model.new_context(&small_params()).unwrap();
        for (what, data) in [
            ("half", &whole[..whole.len() / 2]),
            ("empty", &[][..]),
            ("seq as whole", &seq[..]),
            ("random", &[0x5au8; 900][..]),
        ] {
            // (llama.cpp would first allocate the 4-byte "name length" these
            // start with -- up to 4 GiB -- to compare an architecture name.)
            let t = std::time::Instant::now();
            assert!(matches!(target.load_state(data), Err(Error::State { kind: StateError::Mismatch, .. })), "{what}");
            assert!(t.elapsed().as_secs() < 1, "{what}: rejecting took {:?}", t.elapsed());
            if what != "seq as whole" {
                let r = target.load_seq_state(data, 0);
                assert!(matches!(r, Err(Error::State { kind: StateError::Mismatch, .. })), "{what} (seq): {r:?}");
            }
        }
        assert!(matches!(
            target.load_seq_state(&seq[..seq.len() - 3], 0),
            Err(Error::State { kind: StateError::Mismatch, .. })
        ));
        assert!(matches!(target.load_state_file(tiny_path()), Err(Error::State { kind: StateError::Mismatch, .. })));
        assert!(matches!(target.load_state_file(dir.path()), Err(Error::State { kind: StateError::Mismatch, .. })));
        assert!(matches!(target.load_state_file(dir.path().join("missing")), Err(Error::Io { .. })));
        assert!(matches!(
            target.load_seq_state_file(tiny_path(), 0),
            Err(Error::State { kind: StateError::Mismatch, .. })
        ));
        assert!(matches!(target.redecode_last(&[], 0), Err(Error::InvalidArgument(_))));
        // And the right state still restores after all that.
        target.load_state(&whole).unwrap();
        target.redecode_last(&prompt, 0).unwrap();
        assert_same_logits(&logits, target.logits(Output::Last).unwrap(), "restored after failed loads");
    });
}

/// Flips each byte of a saved state (whole and per sequence) and loads it:
/// an `Err` or a state that decodes, never an abort.
#[test]
fn no_single_byte_corruption_of_a_state_aborts() {
    isolated(|| {
        let model = tiny_model();
        let mut ctx = model.new_context(&small_params()).unwrap();
        let prompt = tokens(model.vocab(), "Hello");
        decode_seq(&mut ctx, &prompt, 0, 0);
        let whole = ctx.save_state().unwrap();
        let seq = ctx.save_seq_state(0).unwrap();
        let mut target = model.new_context(&small_params()).unwrap();
        let mut failures = 0;
        for (is_seq, data) in [(false, &whole), (true, &seq)] {
            for at in 0..data.len() {
                for mask in [0xffu8, 0x01] {
                    let mut d = data.clone();
                    d[at] ^= mask;
                    let r = if is_seq { target.load_seq_state(&d, 0) } else { target.load_state(&d) };
                    match r {
                        Ok(()) => {}
                        Err(Error::State { kind: StateError::Mismatch, .. }) => {
                            failures += 1;
                            continue;
                        }
                        Err(other) => {
                            panic!("byte {at} ^ {mask:#x} ({}): {other:?}", if is_seq { "seq" } else { "whole" })
                        }
                    }
                    // Whatever was restored, the next decode returns.
                    let next = target.seq_pos_max(0).unwrap().map_or(0, |p| p + 1);
                    let mut b = Batch::new(1, 1);
                    b.push(Token(300), next, &[0], Logits::Yes).unwrap();
                    match target.decode(&b) {
                        Ok(()) | Err(Error::NoKvSlot | Error::InvalidBatch(_)) => {}
                        Err(other) => panic!("byte {at} ^ {mask:#x}: decode after the load: {other:?}"),
                    }
                }
            }
        }
        assert!(failures > 0);
        target.clear_kv();
        target.load_state(&whole).unwrap();
    });
}

/// `llama_encode` on a decoder-only model builds a graph that reads the KV
/// cache without preparing it and crashes (SIGSEGV in
/// `build_input_k_idxs`); the wrapper refuses before llama.cpp runs.
#[test]
fn encoding_with_a_decoder_only_model_is_an_error() {
    isolated(|| {
        let model = tiny_model();
        assert!(!model.has_encoder());
        for params in [
            small_params(),
            small_params().embeddings(true),
            small_params().embeddings(true).pooling(Pooling::Mean),
            small_params().attention(llama::Attention::NonCausal),
        ] {
            let mut ctx = model.new_context(&params).unwrap();
            let batch = Batch::from_tokens(&[Token(1), Token(300), Token(400)], 0);
            let err = ctx.encode(&batch).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(ref m) if m.contains("decode")), "{err:?}");
            assert!(matches!(ctx.logits(Output::Last), Err(Error::NoOutput(Output::Last))));
            assert!(matches!(ctx.embeddings(Output::Last), Err(Error::NoOutput(Output::Last))));
            ctx.decode(&batch).unwrap();
        }
    });
}

/// The abort handle stops a decode with an error, not a process abort, and
/// the context decodes again once it is reset.
#[test]
fn an_aborted_decode_is_an_error_and_the_context_recovers() {
    isolated(|| {
        let model = tiny_model();
        let mut ctx = model.new_context(&small_params()).unwrap();
        let prompt = tokens(model.vocab(), "the quick brown fox");
        let handle = ctx.abort_handle();
        handle.abort();
        assert!(handle.is_aborted());
        assert!(matches!(ctx.decode(&Batch::from_tokens(&prompt, 0)), Err(Error::Aborted)));
        assert_eq!(ctx.seq_pos_max(0).unwrap(), None, "the aborted micro-batch is removed");
        assert!(matches!(ctx.logits(Output::Last), Err(Error::NoOutput(Output::Last))));
        // Another thread can hold the handle.
        std::thread::spawn(move || handle.reset()).join().unwrap();
        let logits = decode_seq(&mut ctx, &prompt, 0, 0);
        let mut fresh = model.new_context(&small_params()).unwrap();
        assert_same_logits(&decode_seq(&mut fresh, &prompt, 0, 0), &logits, "after an aborted decode");
    });
}

// ------------------------------------------------ hand-made tiny models
//
// The synthetic generator's models are llama and Mamba networks. These tiny
// GGUF files of other architectures reach llama.cpp's paths for
// encoder-decoder (T5), memory-less (BERT) and recurrent (Mamba) models:
// random F32 weights and a small SentencePiece vocabulary, written with the
// generator's `GgufWriter` (ggml's own GGUF writer).

/// A metadata value of a hand-made model.
enum Kv {
    Str(String),
    U32(u32),
    F32(f32),
    Bool(bool),
    Strs(Vec<String>),
    F32s(Vec<f32>),
    I32s(Vec<i32>),
}

/// A GGUF file under construction: metadata and F32 tensors, written at
/// the end (the writer needs every tensor's size up front).
struct GgufFile {
    kv: Vec<(String, Kv)>,
    tensors: Vec<(String, Vec<u64>, Vec<f32>)>,
    rng: u64,
    n_vocab: u64,
}

impl GgufFile {
    /// A file of architecture `arch` with the tiny vocabulary: `<unk>`,
    /// `<s>`, `</s>`, the 256 byte tokens, then a few words.
    fn new(arch: &str) -> GgufFile {
        let mut f = GgufFile { kv: Vec::new(), tensors: Vec::new(), rng: 0x2545_f491_4f6c_dd1d, n_vocab: 0 };
        f.str("general.architecture", arch);
        let mut texts: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
        texts.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
        texts.extend(["▁", "a", "b", "c", "▁a", "▁b", "▁c", "▁ab", "▁abc"].map(String::from));
        // llama_token_type: UNKNOWN 2, CONTROL 3, BYTE 6, NORMAL 1.
        let types: Vec<i32> =
            (0..texts.len()).map(|i| [2, 3, 3].get(i).copied().unwrap_or(if i < 259 { 6 } else { 1 })).collect();
        let scores: Vec<f32> = (0..texts.len()).map(|i| -(i as f32)).collect();
        f.n_vocab = texts.len() as u64;
        f.str("tokenizer.ggml.model", "llama");
        f.kv.push(("tokenizer.ggml.tokens".into(), Kv::Strs(texts)));
        f.kv.push(("tokenizer.ggml.scores".into(), Kv::F32s(scores)));
        f.kv.push(("tokenizer.ggml.token_type".into(), Kv::I32s(types)));
        f
    }

    fn str(&mut self, key: &str, value: &str) {
        self.kv.push((key.into(), Kv::Str(value.into())));
    }

    fn u32(&mut self, key: &str, value: u32) {
        self.kv.push((key.into(), Kv::U32(value)));
    }

    fn f32(&mut self, key: &str, value: f32) {
        self.kv.push((key.into(), Kv::F32(value)));
    }

    fn bool(&mut self, key: &str, value: bool) {
        self.kv.push((key.into(), Kv::Bool(value)));
    }

    /// An F32 tensor of shape `ne` (ggml order): `center` plus uniform
    /// noise in `[-spread, spread)`.
    fn tensor(&mut self, name: &str, ne: &[u64], center: f32, spread: f32) {
        let n: u64 = ne.iter().product();
        let data = (0..n)
            .map(|_| {
                // xorshift64: deterministic weights, so runs are reproducible.
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                center + spread * ((self.rng >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            })
            .collect();
        self.tensors.push((name.to_owned(), ne.to_vec(), data));
    }

    /// A weight matrix `[n_in, n_out]` with variance-preserving noise.
    fn matrix(&mut self, name: &str, n_in: u64, n_out: u64) {
        self.tensor(name, &[n_in, n_out], 0.0, (3.0 / n_in as f32).sqrt());
    }

    fn ones(&mut self, name: &str, n: u64) {
        self.tensor(name, &[n], 1.0, 0.0);
    }

    fn write(&self, path: &Path) {
        let sizes: Vec<u64> = self.tensors.iter().map(|(_, ne, _)| ne.iter().product()).collect();
        let mut w = GgufWriter::for_tensors(&sizes).unwrap();
        for (key, value) in &self.kv {
            match value {
                Kv::Str(v) => w.set_str(key, v),
                Kv::U32(v) => w.set_u32(key, *v),
                Kv::F32(v) => w.set_f32(key, *v),
                Kv::Bool(v) => w.set_bool(key, *v),
                Kv::Strs(v) => w.set_arr_str(key, v),
                Kv::F32s(v) => w.set_arr_f32(key, v),
                Kv::I32s(v) => w.set_arr_i32(key, v),
            }
            .unwrap();
        }
        for (name, ne, data) in &self.tensors {
            let ne: Vec<u32> = ne.iter().map(|&d| u32::try_from(d).unwrap()).collect();
            w.add_f32_tensor(name, &ne, data).unwrap();
        }
        w.write(path).unwrap();
    }

    fn load(&self, dir: &Path, name: &str) -> Model {
        let path = dir.join(name);
        self.write(&path);
        Model::load(&path, &ModelParams::default()).unwrap_or_else(|e| panic!("load {name}: {e}"))
    }
}

const HAND_EMBD: u64 = 16;

/// A one-layer T5 (encoder-decoder): n_embd 16, 2 heads, n_ff 32; or,
/// without `decoder`, its encoder alone (`t5encoder`).
fn tiny_t5(dir: &Path, decoder: bool) -> Model {
    let (e, ff, heads, buckets) = (HAND_EMBD, 32, 2, 8);
    let arch = if decoder { "t5" } else { "t5encoder" };
    let mut f = GgufFile::new(arch);
    let v = f.n_vocab;
    f.u32(&format!("{arch}.context_length"), 64);
    f.u32(&format!("{arch}.embedding_length"), e as u32);
    f.u32(&format!("{arch}.feed_forward_length"), ff as u32);
    f.u32(&format!("{arch}.block_count"), 1);
    f.u32(&format!("{arch}.attention.head_count"), heads as u32);
    f.f32(&format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-6);
    f.u32(&format!("{arch}.attention.relative_buckets_count"), buckets as u32);
    f.tensor("token_embd.weight", &[e, v], 0.0, 1.0);
    f.ones("enc.output_norm.weight", e);
    f.matrix("output.weight", e, v);
    let parts: &[&str] = if decoder {
        f.u32("t5.decoder_start_token_id", 0);
        f.ones("dec.output_norm.weight", e);
        &["enc", "dec"]
    } else {
        &["enc"]
    };
    for &part in parts {
        f.ones(&format!("{part}.blk.0.attn_norm.weight"), e);
        f.tensor(&format!("{part}.blk.0.attn_rel_b.weight"), &[heads, buckets], 0.0, 0.5);
        for m in ["attn_q", "attn_k", "attn_v", "attn_o"] {
            f.matrix(&format!("{part}.blk.0.{m}.weight"), e, e);
        }
        if part == "dec" {
            f.ones("dec.blk.0.cross_attn_norm.weight", e);
            for m in ["cross_attn_q", "cross_attn_k", "cross_attn_v", "cross_attn_o"] {
                f.matrix(&format!("dec.blk.0.{m}.weight"), e, e);
            }
        }
        f.ones(&format!("{part}.blk.0.ffn_norm.weight"), e);
        f.matrix(&format!("{part}.blk.0.ffn_up.weight"), e, ff);
        f.matrix(&format!("{part}.blk.0.ffn_down.weight"), ff, e);
    }
    f.load(dir, &format!("tiny-{arch}.gguf"))
}

/// A one-layer BERT: an embedding model without a KV cache.
fn tiny_bert(dir: &Path) -> Model {
    let (e, ff, n_ctx) = (HAND_EMBD, 32, 64);
    let mut f = GgufFile::new("bert");
    let v = f.n_vocab;
    f.u32("bert.context_length", n_ctx as u32);
    f.u32("bert.embedding_length", e as u32);
    f.u32("bert.feed_forward_length", ff as u32);
    f.u32("bert.block_count", 1);
    f.u32("bert.attention.head_count", 2);
    f.f32("bert.attention.layer_norm_epsilon", 1e-12);
    f.bool("bert.attention.causal", false);
    f.u32("tokenizer.ggml.token_type_count", 2);
    f.tensor("token_embd.weight", &[e, v], 0.0, 1.0);
    f.tensor("position_embd.weight", &[e, n_ctx], 0.0, 0.1);
    f.ones("token_embd_norm.weight", e);
    f.tensor("token_embd_norm.bias", &[e], 0.0, 0.0);
    for m in ["attn_q", "attn_k", "attn_v", "attn_output"] {
        f.matrix(&format!("blk.0.{m}.weight"), e, e);
    }
    for norm in ["attn_output_norm", "layer_output_norm"] {
        f.ones(&format!("blk.0.{norm}.weight"), e);
        f.tensor(&format!("blk.0.{norm}.bias"), &[e], 0.0, 0.0);
    }
    f.matrix("blk.0.ffn_up.weight", e, ff);
    f.matrix("blk.0.ffn_down.weight", ff, e);
    f.load(dir, "tiny-bert.gguf")
}

/// A two-layer Mamba: a recurrent model, one state per sequence
/// (`llama_suite::synthetic::write_tiny_mamba`).
fn tiny_mamba() -> Model {
    let path = llama_suite::synthetic::tiny_mamba_path(&llama_suite::synthetic::TinyModelSpec::default())
        .expect("write the tiny Mamba model");
    Model::load(path, &ModelParams::default()).expect("load the tiny Mamba model")
}

/// Decoding a T5 model before encoding aborts in llama.cpp
/// (`GGML_ASSERT(!cross->seq_ids_enc.empty() && "llama_encode must be called
/// first")`); the wrapper refuses. The encoder output lives in the context,
/// so clearing the KV cache keeps it.
#[test]
fn an_encoder_decoder_model_decodes_only_after_encoding() {
    isolated(|| {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_t5(dir.path(), true);
        assert!(model.has_encoder() && model.has_decoder());
        let start = model.decoder_start_token().expect("decoder start token");
        let n_vocab = model.vocab().n_tokens();
        let mut ctx = model.new_context(&small_params()).unwrap();
        let input = [Token(260), Token(261), Token(262), Token(TINY_EOS_ID)];
        let first_step = Batch::from_tokens(&[start], 0);

        let err = ctx.decode(&first_step).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(ref m) if m.contains("encode")), "{err:?}");
        assert_eq!(ctx.seq_pos_max(0).unwrap(), None);

        ctx.encode(&Batch::from_tokens(&input, 0)).unwrap();
        // The encoder computes no logits (the rows llama.cpp would hand out
        // were never written), and embeddings are off.
        for i in [Output::Index(0), Output::Index(3), Output::Last, Output::Index(4)] {
            assert!(matches!(ctx.logits(i), Err(Error::NoOutput(_))), "logits({i}) after encode");
            assert!(matches!(ctx.embeddings(i), Err(Error::NoOutput(_))), "embeddings({i}) after encode");
        }

        ctx.decode(&first_step).unwrap();
        let logits = ctx.logits(Output::Last).unwrap().to_vec();
        assert_eq!(logits.len(), n_vocab);
        assert!(logits.iter().all(|x| x.is_finite()));
        assert!(logits.iter().any(|&x| x != logits[0]), "a real row, not a zeroed buffer");
        let next = Token(argmax(&logits) as i32);
        let mut step = Batch::new(1, 1);
        step.push(next, 1, &[0], Logits::Yes).unwrap();
        ctx.decode(&step).unwrap();
        let second = ctx.logits(Output::Index(0)).unwrap().to_vec();

        // Clearing the KV cache keeps the encoder output: decoding again gives
        // the same logits.
        ctx.clear_kv();
        ctx.decode(&first_step).unwrap();
        assert_eq!(ctx.logits(Output::Last).unwrap(), &logits[..]);
        ctx.decode(&step).unwrap();
        assert_eq!(ctx.logits(Output::Index(0)).unwrap(), &second[..]);

        // A new input: clear the decoder's cache (llama.cpp checks even the
        // encoder's positions against it), encode, and decode from the start.
        ctx.clear_kv();
        ctx.encode(&Batch::from_tokens(&[Token(265), Token(266), Token(TINY_EOS_ID)], 0)).unwrap();
        ctx.decode(&first_step).unwrap();
        assert_ne!(ctx.logits(Output::Last).unwrap(), &logits[..]);

        // With embeddings on, the encoder's per-token output can be read.
        let mut emb = model.new_context(&small_params().embeddings(true).pooling(Pooling::None)).unwrap();
        emb.encode(&Batch::from_tokens(&input, 0)).unwrap();
        for i in 0..input.len() {
            let row = emb.embeddings(i).unwrap();
            assert_eq!(row.len(), model.n_embd_out());
            assert!(row.iter().all(|x| x.is_finite()));
        }
        let last_row = emb.embeddings(input.len() - 1).unwrap().to_vec();
        assert_eq!(emb.embeddings(Output::Last).unwrap(), &last_row[..]);
        assert!(matches!(emb.logits(Output::Index(0)), Err(Error::NoOutput(Output::Index(0)))));
    });
}

/// An encoder-only T5 has no cross-attention: it decodes without encoding
/// first (llama.cpp runs its encoder graph), and computes no logits.
#[test]
fn an_encoder_only_model_needs_no_encode_first() {
    isolated(|| {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_t5(dir.path(), false);
        assert!(model.has_encoder() && !model.has_decoder());
        let input = [Token(260), Token(261), Token(262), Token(TINY_EOS_ID)];
        let mut ctx = model.new_context(&small_params().embeddings(true).pooling(Pooling::None)).unwrap();
        ctx.encode(&Batch::from_tokens(&input, 0)).unwrap();
        let encoded: Vec<Vec<f32>> = (0..4usize).map(|i| ctx.embeddings(i).unwrap().to_vec()).collect();
        assert!(encoded.iter().all(|r| r.len() == model.n_embd_out() && r.iter().all(|x| x.is_finite())));
        assert!(matches!(ctx.logits(Output::Index(3)), Err(Error::NoOutput(Output::Index(3)))));

        // (The encoder attends both ways only in a non-causal context.)
        let params = small_params().embeddings(true).pooling(Pooling::None).attention(llama::Attention::NonCausal);
        let mut ctx = model.new_context(&params).unwrap();
        ctx.decode(&Batch::from_tokens(&input, 0)).unwrap();
        assert!(matches!(ctx.logits(Output::Last), Err(Error::NoOutput(_))), "the encoder graph computes no logits");
        for (i, row) in encoded.iter().enumerate() {
            assert_same_logits(
                row,
                ctx.embeddings(Output::Index(i)).unwrap(),
                "decode = encode for an encoder-only model",
            );
        }
    });
}

/// T5's cross-attention aborts (`GGML_ASSERT(!ubatch->equal_seqs())`) on a
/// cache with one stream per sequence; several sequences need kv_unified.
#[test]
fn an_encoder_decoder_model_needs_a_unified_cache_for_several_sequences() {
    isolated(|| {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_t5(dir.path(), true);
        let err = model.new_context(&small_params().n_ctx(512).n_seq_max(2)).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(ref m) if m.contains("kv_unified")), "{err:?}");

        let mut ctx = model.new_context(&small_params().n_ctx(512).n_seq_max(2).kv_unified(true)).unwrap();
        let start = model.decoder_start_token().unwrap();
        let mut input = Batch::new(8, 1);
        input.push_sequence(&[Token(260), Token(261), Token(TINY_EOS_ID)], 0, 0, Logits::from(false)).unwrap();
        input.push_sequence(&[Token(262), Token(TINY_EOS_ID)], 0, 1, Logits::from(false)).unwrap();
        ctx.encode(&input).unwrap();
        let mut both = Batch::new(2, 1);
        both.push(start, 0, &[0], Logits::Yes).unwrap();
        both.push(start, 0, &[1], Logits::Yes).unwrap();
        ctx.decode(&both).unwrap();
        let (a, b) = (ctx.logits(0).unwrap().to_vec(), ctx.logits(1).unwrap().to_vec());
        assert_ne!(a, b, "each sequence attends to its own encoder input");
    });
}

/// Without a KV cache, llama.cpp runs `decode` as `encode`: every token is
/// an output and no logits are computed, whatever the batch asked for.
#[test]
fn a_model_without_a_cache_decodes_through_the_encoder() {
    isolated(|| {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_bert(dir.path());
        let input = [Token(TINY_BOS_ID), Token(260), Token(261), Token(262)];

        let mut ctx = model.new_context(&small_params()).unwrap();
        ctx.decode(&Batch::from_tokens(&input, 0)).unwrap();
        for i in [Output::Index(0), Output::Index(3), Output::Last] {
            assert!(matches!(ctx.logits(i), Err(Error::NoOutput(_))), "logits({i}) of an embedding model");
        }

        let mut emb = model.new_context(&small_params().embeddings(true).pooling(Pooling::None)).unwrap();
        // Logits asked for the last token only, yet every token is an output.
        emb.decode(&Batch::from_tokens(&input, 0)).unwrap();
        let rows: Vec<Vec<f32>> = (0..4usize).map(|i| emb.embeddings(i).unwrap().to_vec()).collect();
        assert!(rows.iter().all(|r| r.len() == model.n_embd_out() && r.iter().all(|x| x.is_finite())));
        assert_ne!(rows[0], rows[1]);
        assert_eq!(emb.embeddings(Output::Last).unwrap(), &rows[3][..]);
        assert!(matches!(emb.embeddings(Output::Index(4)), Err(Error::NoOutput(Output::Index(4)))));
        assert!(matches!(emb.logits(Output::Index(3)), Err(Error::NoOutput(Output::Index(3)))));
        // `encode` is the same pass.
        emb.encode(&Batch::from_tokens(&input, 0)).unwrap();
        assert_eq!(emb.embeddings(Output::Index(2)).unwrap(), &rows[2][..]);
    });
}

/// After a logits-only decode, turning embeddings on computes none: the
/// outputs are those of the last decode (llama.cpp would read a NULL
/// buffer, and a debug build aborts).
#[test]
fn outputs_are_those_the_last_decode_produced() {
    isolated(|| {
        let model = tiny_model();
        let prompt = tokens(model.vocab(), "the quick brown fox");
        let n = prompt.len() as i32;
        for pooling in [Pooling::None, Pooling::Mean] {
            let mut ctx = model.new_context(&small_params().pooling(pooling)).unwrap();
            ctx.decode(&Batch::from_tokens(&prompt, 0)).unwrap();
            let logits = ctx.logits(Output::Last).unwrap().to_vec();
            ctx.set_embeddings(true).unwrap();
            for i in [-1, 0, n - 1] {
                assert!(
                    matches!(ctx.embeddings(Output::Index(i as usize)), Err(Error::NoOutput(_))),
                    "{pooling:?}: embeddings({i})"
                );
            }
            assert!(matches!(ctx.sequence_embeddings(0), Err(Error::NoSequenceOutput(0))), "{pooling:?}");
            assert_eq!(ctx.logits(Output::Last).unwrap(), &logits[..], "the logits are still there");

            // The next decode runs with embeddings: every token is an output.
            let mut b = Batch::new(2, 1);
            b.push_sequence(&[Token(300), Token(301)], n, 0, Logits::from(false)).unwrap();
            ctx.decode(&b).unwrap();
            if pooling == Pooling::None {
                assert_eq!(ctx.embeddings(0).unwrap().len(), model.n_embd_out());
                let last = ctx.embeddings(Output::Last).unwrap().to_vec();
                // Turning embeddings off does not take back what was computed.
                ctx.set_embeddings(false).unwrap();
                assert_eq!(ctx.embeddings(1).unwrap(), &last[..]);
            } else {
                let pooled = ctx.sequence_embeddings(0).unwrap().to_vec();
                assert_eq!(pooled.len(), model.n_embd_out());
                ctx.set_embeddings(false).unwrap();
                assert_eq!(ctx.sequence_embeddings(0).unwrap(), &pooled[..]);
                // A cleared cache invalidates the pooled output too.
                ctx.clear_kv();
                assert!(matches!(ctx.sequence_embeddings(0), Err(Error::NoSequenceOutput(0))));
            }
        }
    });
}

#[test]
fn thread_counts_above_ggml_s_limit_are_rejected() {
    isolated(|| {
        let model = tiny_model();
        for (what, params) in [
            ("n_threads 100000", small_params().n_threads(100_000)),
            ("n_threads 513", small_params().n_threads(513)),
            ("n_threads_batch 65536", small_params().n_threads_batch(65_536)),
            ("n_threads_batch i32::MAX", small_params().n_threads_batch(i32::MAX)),
        ] {
            let err = model.new_context(&params).unwrap_err();
            let name = what.split(' ').next().unwrap();
            assert!(
                matches!(err, Error::InvalidParameter { name: n, ref message } if n == name && message.contains("512")),
                "{what}: {err:?}"
            );
        }
        let mut ctx = model.new_context(&small_params()).unwrap();
        for (a, b) in [(513, 1), (1, 513), (i32::MAX, 1), (1, 65_536)] {
            let err = ctx.set_n_threads(a, b);
            assert!(matches!(err, Err(Error::InvalidParameter { .. })), "set_n_threads({a}, {b})");
        }
        assert_eq!(ctx.n_threads(), (1, 1), "a rejected change keeps the old counts");
        ctx.set_n_threads(512, 512).unwrap();
        assert_eq!(ctx.n_threads(), (512, 512));
        ctx.set_n_threads(1, 2).unwrap();
        decode_seq(&mut ctx, &tokens(model.vocab(), "Hello"), 0, 0);
    });
}

/// A recurrent model's state cannot drop its last token: `redecode_last`
/// says so instead of failing later with a misleading batch error, and
/// leaves the cache as it was.
#[test]
fn a_recurrent_sequence_state_with_several_cells_is_refused() {
    isolated(|| {
        let model = tiny_mamba();
        assert!(model.is_recurrent() && !model.is_hybrid());
        let mut ctx = model.new_context(&small_params().n_seq_max(2)).unwrap();
        let tokens = model.vocab().tokenize("Hello world, the quick brown fox", AddBos::Yes).unwrap();
        ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
        let saved = ctx.save_seq_state(0).unwrap();
        // llama.cpp's magic, the sequence id, then one cell: the count, the
        // cell's position and an empty sequence list.
        assert_eq!(u32::from_ne_bytes(saved[8..12].try_into().unwrap()), 1);
        // The genuine state restores into the other sequence.
        ctx.load_seq_state(&saved, 1).unwrap();
        assert_eq!(ctx.seq_pos_max(1).unwrap(), Some(tokens.len() as i32 - 1));

        // Claim two cells (llama.cpp would put both in one and assert).
        let mut crafted = saved[..8].to_vec();
        crafted.extend_from_slice(&2u32.to_ne_bytes());
        crafted.extend_from_slice(&saved[12..20]);
        crafted.extend_from_slice(&0i32.to_ne_bytes());
        crafted.extend_from_slice(&0u32.to_ne_bytes());
        crafted.extend_from_slice(&saved[20..]);
        let err = ctx.load_seq_state(&crafted, 1).unwrap_err();
        assert!(
            matches!(err, Error::State { kind: StateError::Mismatch, message: ref m } if m.contains("one cell")),
            "{err:?}"
        );
        // The same bytes from a file.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("seq.state");
        ctx.save_seq_state_file(&file, 0, &tokens).unwrap();
        let mut bytes = std::fs::read(&file).unwrap();
        let at = 12 + 4 * tokens.len();
        assert_eq!(bytes[at..at + 4], 1u32.to_ne_bytes());
        bytes[at..at + 4].copy_from_slice(&2u32.to_ne_bytes());
        std::fs::write(&file, &bytes).unwrap();
        let err = ctx.load_seq_state_file(&file, 1).unwrap_err();
        assert!(
            matches!(err, Error::State { kind: StateError::Mismatch, message: ref m } if m.contains("one cell")),
            "{err:?}"
        );
        // The context still works.
        let mut batch = Batch::new(1, 1);
        batch.push(tokens[0], tokens.len() as i32, &[0], Logits::Yes).unwrap();
        ctx.decode(&batch).unwrap();
    });
}

#[test]
fn redecode_last_explains_a_recurrent_cache() {
    isolated(|| {
        let model = tiny_mamba();
        assert!(model.is_recurrent());
        let mut ctx = model.new_context(&small_params()).unwrap();
        let prompt = [Token(TINY_BOS_ID), Token(260), Token(261), Token(262)];
        let logits = decode_seq(&mut ctx, &prompt, 0, 0);
        let err = ctx.redecode_last(&prompt, 0).unwrap_err();
        assert!(
            matches!(err, Error::State { kind: StateError::Unsupported, message: ref m } if m.contains("recurrent")),
            "{err:?}"
        );
        assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(3), "the cache is unchanged");
        // The advised recovery: clear and decode everything again.
        ctx.seq_rm(Some(0), None, None).unwrap();
        assert_same_logits(&logits, &decode_seq(&mut ctx, &prompt, 0, 0), "mamba after clear and redecode");
    });
}

/// A recurrent model's session reuses its cached state when the next prompt
/// continues it (the sliding-window check must not run: its cache reports
/// the last position as the first), and the result is that of a fresh run.
#[test]
fn a_recurrent_session_reuses_a_continued_prompt() {
    isolated(|| {
        use llama::generate::{GenerateOptions, Session};
        let model = tiny_mamba();
        assert_eq!(model.n_swa(), 0);
        let params = small_params().n_ctx(512);
        let mut ctx = model.new_context(&params).unwrap();
        let mut sampler = Sampler::greedy();
        let options = GenerateOptions::default().max_tokens(4).stop_at_eog(false);
        let first: Vec<Token> = [TINY_BOS_ID, 260, 261, 262, 263, 264].map(Token).to_vec();

        let mut session = Session::new();
        let mut generation = session.generate(&mut ctx, &mut sampler, &first, &options).unwrap();
        while let Some(piece) = generation.next_piece() {
            piece.unwrap();
        }
        assert_eq!(generation.stats().prompt_evaluated, first.len());
        drop(generation);
        let cached = session.tokens().to_vec();
        assert_eq!(cached.len(), first.len() + 3, "the last of 4 sampled tokens is not decoded yet");
        assert_eq!(ctx.seq_pos_min(0).unwrap(), ctx.seq_pos_max(0).unwrap(), "one state, at the last position");

        // The next turn continues everything cached: only the new tokens run.
        let mut second = cached.clone();
        second.extend([Token(265), Token(266)]);
        let run = |session: &mut Session, ctx: &mut llama::Context<'_>, sampler: &mut Sampler<'_>| {
            let mut generation = session.generate(ctx, sampler, &second, &options).unwrap();
            let mut text = String::new();
            while let Some(piece) = generation.next_piece() {
                text.push_str(piece.unwrap());
            }
            let evaluated = generation.stats().prompt_evaluated;
            drop(generation);
            (evaluated, text, session.tokens().to_vec())
        };
        let (evaluated, text, tokens_after) = run(&mut session, &mut ctx, &mut sampler);
        assert_eq!(evaluated, 2);
        let mut fresh_ctx = model.new_context(&params).unwrap();
        let (fresh_evaluated, fresh_text, fresh_tokens) = run(&mut Session::new(), &mut fresh_ctx, &mut sampler);
        assert_eq!(fresh_evaluated, second.len());
        assert_eq!(tokens_after, fresh_tokens, "reusing the state samples what a fresh run samples");
        assert_eq!(text, fresh_text);

        // A prompt that diverges inside the cached tokens cannot cut the state
        // back: the sequence is cleared and decoded whole.
        let mut diverged = first.clone();
        diverged[3] = Token(267);
        let mut generation = session.generate(&mut ctx, &mut sampler, &diverged, &options).unwrap();
        while let Some(piece) = generation.next_piece() {
            piece.unwrap();
        }
        assert_eq!(generation.stats().prompt_evaluated, diverged.len());
    });
}
