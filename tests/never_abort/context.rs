//! Contexts: parameters llama.cpp aborts on, vocab-only models, several
//! sequences without a unified cache, aborted decodes, the outputs a
//! decode leaves, thread counts.

use super::*;

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
            model.new_context(
                &small_params().kv_type(llamacpp::KvType::Q4_0).flash_attention(llamacpp::FlashAttention::Off)
            ),
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
