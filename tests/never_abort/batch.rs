//! Batches, positions, sequence and token ids, outputs and cache shifts
//! that llama.cpp would abort on.

use super::*;

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
