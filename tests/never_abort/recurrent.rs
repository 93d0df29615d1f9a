//! Recurrent models (Mamba): a sequence's state and sessions.

use super::*;

/// A two-layer Mamba: a recurrent model, one state per sequence
/// (`llama_suite::synthetic::write_tiny_mamba`).
fn tiny_mamba() -> Model {
    let path = llama_suite::synthetic::tiny_mamba_path(&llama_suite::synthetic::TinyModelSpec::default())
        .expect("write the tiny Mamba model");
    Model::load(path, &ModelParams::default()).expect("load the tiny Mamba model")
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
        use llamacpp::generate::{GenerateOptions, Session};
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
        let run = |session: &mut Session, ctx: &mut llamacpp::Context<'_>, sampler: &mut Sampler<'_>| {
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
