//! The streaming generator on the tiny synthetic model (fast, no download):
//! chunked prefill, context shift and overflow, token limits, prefix reuse,
//! cancellation, stop strings; plus the pure stop-string holdback logic.

use std::ops::ControlFlow;

use llama_suite::synthetic::{TINY_BOS_ID, TINY_VOCAB_SIZE, TinyModelSpec, tiny_llama_path};
use llamacpp::generate::{FinishReason, GenerateOptions, Overflow, Session, StopMatcher, stop_holdback};
use llamacpp::{ContextParams, Error, Logits, Model, ModelParams, Output, Sampler, Special, Token};

fn tiny_model() -> Model {
    // A long training context so that 10k-token contexts are in range.
    let spec = TinyModelSpec { n_ctx_train: 16_384, ..TinyModelSpec::default() };
    let path = tiny_llama_path(&spec).expect("write the tiny model");
    Model::load(&path, &ModelParams::default()).expect("load the tiny model")
}

/// BOS followed by `n - 1` ordinary tokens in a repeating pattern.
fn prompt(n: usize, salt: usize) -> Vec<Token> {
    let first_normal = 260;
    let span = TINY_VOCAB_SIZE - first_normal;
    let mut tokens = vec![Token(TINY_BOS_ID)];
    tokens.extend((1..n).map(|i| Token((first_normal + (i * 7 + salt) % span) as i32)));
    tokens
}

fn params(n_ctx: u32, n_batch: u32) -> ContextParams {
    ContextParams::default().n_ctx(n_ctx).n_batch(n_batch).n_ubatch(n_batch.min(512)).n_threads(2)
}

/// Runs a generation to its end, collecting the pieces and the final error.
fn collect(generation: &mut llamacpp::generate::Generation<'_, '_, '_>) -> (Vec<String>, Option<Error>) {
    let mut pieces = Vec::new();
    while let Some(piece) = generation.next_piece() {
        match piece {
            Ok(p) => pieces.push(p.to_owned()),
            Err(e) => {
                assert!(generation.next_piece().is_none(), "nothing after the error");
                return (pieces, Some(e));
            }
        }
    }
    (pieces, None)
}

#[test]
fn chunked_prefill_of_10k_tokens_with_n_batch_512() {
    let model = tiny_model();
    let mut ctx = model.new_context(&params(10_240, 512)).unwrap();
    assert_eq!(ctx.n_batch(), 512);
    let mut sampler = Sampler::greedy();
    let prompt = prompt(10_000, 0);
    let mut session = Session::new();
    ctx.reset_perf();
    let options = GenerateOptions::default().max_tokens(4).stop_at_eog(false);
    let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    let (_, error) = collect(&mut generation);
    assert!(error.is_none(), "{error:?}");
    let stats = generation.stats().clone();
    drop(generation);
    assert_eq!(stats.prompt_tokens, 10_000);
    assert_eq!(stats.prompt_evaluated, 10_000);
    assert_eq!(stats.generated_tokens, 4);
    assert_eq!(stats.finish_reason, Some(FinishReason::Length));
    assert!(stats.time_to_first_token.is_some());
    // The context counted every prompt token as prompt evaluation.
    assert_eq!(ctx.perf().prompt_tokens, 10_000);
    // The prompt and three of the four sampled tokens are in the cache (the
    // last sampled one is never decoded).
    assert_eq!(session.tokens().len(), 10_003);
    assert_eq!(&session.tokens()[..10_000], &prompt[..]);
    assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(10_002));
}

#[test]
fn context_shift_keeps_generating_past_n_ctx() {
    let model = tiny_model();
    let mut ctx = model.new_context(&params(256, 256)).unwrap();
    let n_ctx = ctx.n_ctx() as usize;
    assert!(ctx.can_shift());
    let mut sampler = Sampler::greedy();
    let prompt = prompt(100, 3);
    let mut session = Session::new();
    let options =
        GenerateOptions::default().max_tokens(3 * n_ctx).n_keep(8).overflow(Overflow::Shift).stop_at_eog(false);
    let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    let mut max_past = 0;
    loop {
        match generation.next_piece() {
            None => break,
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("{e}"),
        }
        max_past = max_past.max(generation.n_past());
    }
    let stats = generation.stats().clone();
    drop(generation);
    assert_eq!(stats.generated_tokens, 3 * n_ctx);
    assert_eq!(stats.finish_reason, Some(FinishReason::Length));
    assert!(stats.context_shifts >= 2, "{stats:?}");
    assert!(max_past <= n_ctx, "n_past {max_past} > n_ctx {n_ctx}");
    // Positions stay inside the context, the kept tokens are the prompt's
    // first ones, and the session's record matches the cache.
    let pos_max = ctx.seq_pos_max(0).unwrap().unwrap() as usize;
    assert!(pos_max < n_ctx);
    assert_eq!(ctx.seq_pos_min(0).unwrap(), Some(0));
    assert_eq!(session.tokens().len(), pos_max + 1);
    assert_eq!(&session.tokens()[..8], &prompt[..8]);
}

#[test]
fn overflow_error_stops_at_the_boundary() {
    let model = tiny_model();
    let mut ctx = model.new_context(&params(256, 256)).unwrap();
    let n_ctx = ctx.n_ctx() as usize;
    let mut sampler = Sampler::greedy();
    let prompt = prompt(200, 1);
    let mut session = Session::new();
    let options = GenerateOptions::default().stop_at_eog(false);
    let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    let (_, error) = collect(&mut generation);
    assert!(matches!(error, Some(Error::ContextFull { n_ctx: n }) if n as usize == n_ctx), "{error:?}");
    assert_eq!(generation.finish_reason(), Some(&FinishReason::ContextFull));
    // Positions 200..n_ctx were filled with sampled tokens, and one more was
    // sampled that had no room.
    assert_eq!(generation.stats().generated_tokens, n_ctx - 200 + 1);
    assert_eq!(generation.n_past(), n_ctx);
    drop(generation);
    assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(n_ctx as i32 - 1));

    // A shift that could discard nothing is a full context too.
    let mut session = Session::new();
    let options = GenerateOptions::default().stop_at_eog(false).overflow(Overflow::Shift).n_keep(100_000);
    let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    let (_, error) = collect(&mut generation);
    assert!(matches!(error, Some(Error::ContextFull { .. })), "{error:?}");
}

/// A prompt of exactly the context length fills it: `n_past` reaches
/// `n_ctx` (not below it, as the docs once said), the first token is still
/// sampled from the prompt's logits, and the next decode reports a full
/// context.
#[test]
fn a_prompt_of_exactly_n_ctx_tokens_fills_the_context() {
    let model = tiny_model();
    let mut ctx = model.new_context(&params(256, 64)).unwrap();
    let n_ctx = ctx.n_ctx() as usize;
    assert_eq!(ctx.n_ctx_seq() as usize, n_ctx);
    let mut sampler = Sampler::greedy();
    let mut session = Session::new();
    let full = prompt(n_ctx, 3);
    let options = GenerateOptions::default().stop_at_eog(false);
    let mut generation = session.generate(&mut ctx, &mut sampler, &full, &options).unwrap();
    assert_eq!(generation.n_past(), 0, "nothing is decoded before the first piece is asked for");
    let (_, error) = collect(&mut generation);
    assert!(matches!(error, Some(Error::ContextFull { n_ctx: n }) if n as usize == n_ctx), "{error:?}");
    assert_eq!(generation.n_past(), n_ctx);
    assert_eq!(generation.stats().prompt_evaluated, n_ctx);
    assert_eq!(generation.stats().generated_tokens, 1, "one token sampled, no room to decode it");
    drop(generation);
    assert_eq!(session.tokens(), &full[..]);
    assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(n_ctx as i32 - 1));
}

/// One session over contexts with different `n_batch`: its batch follows
/// the context it runs on (chunked prefill in the context's `n_batch`).
#[test]
fn a_session_sizes_its_batch_for_each_context() {
    let model = tiny_model();
    let options = GenerateOptions::default().max_tokens(3).stop_at_eog(false);
    let mut sampler = Sampler::greedy();
    let p = prompt(150, 5);
    let mut reference = None;
    let mut session = Session::new();
    for n_batch in [32, 128, 7, 512] {
        let mut ctx = model.new_context(&params(512, n_batch)).unwrap();
        let mut generation = session.generate(&mut ctx, &mut sampler, &p, &options).unwrap();
        let (pieces, error) = collect(&mut generation);
        assert!(error.is_none(), "n_batch {n_batch}: {error:?}");
        assert_eq!(generation.stats().prompt_evaluated, p.len(), "a new context starts empty");
        drop(generation);
        let tokens = session.tokens().to_vec();
        assert_eq!(tokens.len(), p.len() + 2);
        let reference = reference.get_or_insert_with(|| (pieces.concat(), tokens.clone()));
        assert_eq!(reference.1, tokens, "n_batch {n_batch} samples the same tokens");
        assert_eq!(reference.0, pieces.concat());
    }
}

#[test]
fn prompt_must_fit_and_be_valid() {
    let model = tiny_model();
    let mut ctx = model.new_context(&params(256, 256)).unwrap();
    let n_ctx = ctx.n_ctx() as usize;
    let mut sampler = Sampler::greedy();
    let mut session = Session::new();
    let options = GenerateOptions::default();
    let too_long = prompt(n_ctx + 1, 0);
    assert!(matches!(
        session.generate(&mut ctx, &mut sampler, &too_long, &options).map(|_| ()),
        Err(Error::PromptTooLong { tokens, limit }) if tokens == n_ctx + 1 && limit == n_ctx
    ));
    assert!(matches!(session.generate(&mut ctx, &mut sampler, &[], &options).map(|_| ()), Err(Error::EmptyPrompt)));
    assert!(matches!(
        session.generate(&mut ctx, &mut sampler, &[Token(1), Token(1_000_000)], &options).map(|_| ()),
        Err(Error::InvalidToken { .. })
    ));
    assert!(matches!(
        session.generate(&mut ctx, &mut sampler, &[Token(1)], &options.clone().seq(1)).map(|_| ()),
        Err(Error::InvalidSeqId { .. })
    ));
}

#[test]
fn max_tokens_is_respected() {
    let model = tiny_model();
    let mut ctx = model.new_context(&params(512, 512)).unwrap();
    let mut sampler = Sampler::greedy();
    let prompt = prompt(20, 2);
    let mut session = Session::new();
    for max in [0, 1, 7, 33] {
        session.clear(&mut ctx).unwrap();
        let options = GenerateOptions::default().max_tokens(max).stop_at_eog(false);
        let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
        let (pieces, error) = collect(&mut generation);
        assert!(error.is_none());
        assert_eq!(generation.stats().generated_tokens, max);
        assert_eq!(generation.finish_reason(), Some(&FinishReason::Length));
        if max == 0 {
            assert!(pieces.is_empty());
        }
        drop(generation);
        assert_eq!(session.tokens().len(), 20 + max.saturating_sub(1));
    }
}

#[test]
fn iterator_callback_and_next_piece_agree() {
    let model = tiny_model();
    let mut ctx = model.new_context(&params(512, 512)).unwrap();
    let mut sampler = Sampler::greedy();
    let prompt = prompt(30, 5);
    let options = GenerateOptions::default().max_tokens(40).stop_at_eog(false);

    let mut session = Session::new();
    let via_iter: Vec<String> =
        session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap().collect::<Result<_, _>>().unwrap();
    session.clear(&mut ctx).unwrap();
    let mut via_stream = String::new();
    let stats = session
        .generate(&mut ctx, &mut sampler, &prompt, &options)
        .unwrap()
        .stream(|p| {
            assert!(!p.is_empty());
            via_stream.push_str(p);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(via_iter.concat(), via_stream);
    assert!(via_iter.iter().all(|p| !p.is_empty()));
    assert_eq!(stats.generated_tokens, 40);
    assert_eq!(via_stream, String::from_utf8_lossy(&detokenize_run(&model, &prompt, 40)));
}

/// An independent greedy loop: the bytes of `n` tokens generated after
/// `prompt`, decoded one by one with plain `Context::decode`.
fn detokenize_run(model: &Model, prompt: &[Token], n: usize) -> Vec<u8> {
    let mut ctx = model.new_context(&params(512, 512)).unwrap();
    let mut sampler = Sampler::greedy();
    let mut batch = llamacpp::Batch::new(512, 1);
    batch.push_sequence(prompt, 0, 0, Logits::Yes).unwrap();
    ctx.decode(&batch).unwrap();
    let mut bytes = Vec::new();
    let mut pos = prompt.len() as i32;
    for i in 0..n {
        let token = sampler.sample(&mut ctx, Output::Last).unwrap();
        model.vocab().append_piece(token, Special::Plain, &mut bytes).unwrap();
        if i + 1 < n {
            batch.clear();
            batch.push(token, pos, &[0], Logits::Yes).unwrap();
            ctx.decode(&batch).unwrap();
            pos += 1;
        }
    }
    bytes
}

#[test]
fn prefix_cache_decodes_only_the_new_tokens() {
    let model = tiny_model();
    let mut ctx = model.new_context(&params(2048, 512)).unwrap();
    let mut sampler = Sampler::greedy();
    let options = GenerateOptions::default().max_tokens(5).stop_at_eog(false);
    let mut session = Session::new();

    let shared = prompt(600, 0);
    let mut first = shared.clone();
    first.extend(prompt(40, 11).into_iter().skip(1));
    let mut second = shared.clone();
    second.extend(prompt(30, 13).into_iter().skip(1));
    assert_ne!(first[600], second[600]);

    let run = |session: &mut Session, ctx: &mut llamacpp::Context<'_>, sampler: &mut Sampler<'_>, tokens: &[Token]| {
        ctx.reset_perf();
        let mut generation = session.generate(ctx, sampler, tokens, &options).unwrap();
        let (_, error) = collect(&mut generation);
        assert!(error.is_none());
        generation.stats().clone()
    };

    let stats = run(&mut session, &mut ctx, &mut sampler, &first);
    assert_eq!(stats.prompt_evaluated, first.len());
    assert_eq!(ctx.perf().prompt_tokens, first.len() as i32);

    // Shares 600 tokens: only the 29 after them are decoded.
    let stats = run(&mut session, &mut ctx, &mut sampler, &second);
    assert_eq!(stats.prompt_evaluated, second.len() - 600);
    assert_eq!(stats.reused_tokens(), 600);
    assert_eq!(ctx.perf().prompt_tokens, (second.len() - 600) as i32);

    // The same prompt again: only its last token is decoded again (a
    // single-token decode, which llama.cpp counts as an eval, not prompt).
    let stats = run(&mut session, &mut ctx, &mut sampler, &second);
    assert_eq!(stats.prompt_evaluated, 1);
    let perf = ctx.perf();
    assert_eq!(perf.eval_tokens, 5, "1 re-decoded prompt token + 4 sampled tokens");

    // Prompt + what was generated: the cached continuation is reused too.
    let mut continued = session.tokens().to_vec();
    continued.push(Token(300));
    let stats = run(&mut session, &mut ctx, &mut sampler, &continued);
    assert_eq!(stats.prompt_evaluated, 1);

    // The generation with a reused prefix gives what a fresh one gives.
    let cached_text: String = {
        let mut generation = session.generate(&mut ctx, &mut sampler, &first, &options).unwrap();
        collect(&mut generation).0.concat()
    };
    let mut fresh = Session::new();
    let mut ctx2 = model.new_context(&params(2048, 512)).unwrap();
    let fresh_text: String = {
        let mut generation = fresh.generate(&mut ctx2, &mut sampler, &first, &options).unwrap();
        collect(&mut generation).0.concat()
    };
    assert_eq!(cached_text, fresh_text);

    // A cache changed behind the session's back is noticed.
    ctx.clear_kv();
    let stats = run(&mut session, &mut ctx, &mut sampler, &first);
    assert_eq!(stats.prompt_evaluated, first.len());
}

#[test]
fn other_sequences_work_and_sessions_are_per_sequence() {
    let model = tiny_model();
    let mut ctx = model.new_context(&params(1024, 256).n_seq_max(2)).unwrap();
    let mut sampler = Sampler::greedy();
    let p = prompt(50, 4);
    let mut session = Session::new();
    let options = GenerateOptions::default().max_tokens(3).stop_at_eog(false).seq(1);
    let text: Vec<String> =
        session.generate(&mut ctx, &mut sampler, &p, &options).unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(text.len(), text.iter().filter(|p| !p.is_empty()).count());
    assert_eq!(session.tokens().len(), 52);
    assert_eq!(session.seq(), 1);
    assert_eq!(ctx.seq_pos_max(1).unwrap(), Some(51));
    assert_eq!(ctx.seq_pos_max(0).unwrap(), None);
}

#[test]
fn cancellation_ends_cleanly_with_stats() {
    let model = tiny_model();
    let mut ctx = model.new_context(&params(512, 512)).unwrap();
    let mut sampler = Sampler::greedy();
    let prompt = prompt(40, 6);
    let handle = ctx.abort_handle();
    let options = GenerateOptions::default().max_tokens(100).stop_at_eog(false);
    let mut session = Session::new();

    // Aborted before it starts: nothing is decoded.
    handle.abort();
    let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    let (pieces, error) = collect(&mut generation);
    assert!(pieces.is_empty() && error.is_none());
    assert_eq!(generation.finish_reason(), Some(&FinishReason::Cancelled));
    assert_eq!(generation.stats().generated_tokens, 0);
    drop(generation);
    assert!(session.tokens().is_empty());
    handle.reset();

    // Aborted from the callback's side after a few tokens (as a Ctrl-C
    // handler would): the run stops at the next token.
    let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    let stats = generation
        .stream(|_| {
            handle.abort();
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(stats.finish_reason, Some(FinishReason::Cancelled));
    assert!(stats.generated_tokens >= 1 && stats.generated_tokens < 100, "{stats:?}");
    drop(generation);
    handle.reset();
    let n = ctx.seq_pos_max(0).unwrap().unwrap() as usize + 1;
    assert_eq!(session.tokens().len(), n);

    // Breaking out of the callback cancels too.
    let mut calls = 0;
    let stats = session
        .generate(&mut ctx, &mut sampler, &prompt, &options)
        .unwrap()
        .stream(|_| {
            calls += 1;
            if calls == 3 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })
        .unwrap();
    assert_eq!(calls, 3);
    assert_eq!(stats.finish_reason, Some(FinishReason::Cancelled));
}

#[test]
fn stop_string_spanning_tokens_is_never_emitted() {
    let model = tiny_model();
    let mut ctx = model.new_context(&params(512, 512)).unwrap();
    let mut sampler = Sampler::greedy();
    let prompt = prompt(25, 9);
    let mut session = Session::new();
    let plain = GenerateOptions::default().max_tokens(60).stop_at_eog(false);
    let pieces: Vec<String> =
        session.generate(&mut ctx, &mut sampler, &prompt, &plain).unwrap().collect::<Result<_, _>>().unwrap();
    let full = pieces.concat();

    // A stop string made of the end of one piece, a whole piece and the
    // start of the next: it spans three tokens' text.
    let k = (1..pieces.len() - 1)
        .find(|&k| pieces[k - 1].chars().count() >= 2 && !pieces[k].is_empty() && !pieces[k + 1].is_empty())
        .expect("three pieces in a row");
    let tail: String = pieces[k - 1].chars().rev().take(2).collect::<Vec<_>>().into_iter().rev().collect();
    let head: String = pieces[k + 1].chars().take(1).collect();
    let stop = format!("{tail}{}{head}", pieces[k]);
    let at = full.find(&stop).unwrap();

    session.clear(&mut ctx).unwrap();
    let options = plain.clone().stop([stop.clone(), "never appears \u{1}".to_owned()]);
    let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    let (stopped, error) = collect(&mut generation);
    assert!(error.is_none());
    assert_eq!(generation.finish_reason(), Some(&FinishReason::Stop(stop.clone())));
    let text = stopped.concat();
    assert_eq!(text, full[..at], "output ends right before the stop string");
    assert!(!text.contains(&stop));
}

mod stops;
