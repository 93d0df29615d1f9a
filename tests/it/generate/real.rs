//! The streaming generator on the real default model (Gemma 3 270M
//! Q4_K_M, or `LLAMA_MODEL`), fetched and cached by
//! `llama_suite::model_cache`. These never skip: without the model they fail.

use std::sync::OnceLock;

use llama_suite::model_cache::model_path;
use llamacpp::generate::{FinishReason, GenerateOptions, Generation, Session};
use llamacpp::{
    AddBos, Batch, Context, ContextParams, Error, Logits, Model, ModelParams, Output, Sampler, Special, Token,
};

fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = model_path().unwrap_or_else(|e| panic!("the real model is needed: {e}"));
        Model::load(&path, &ModelParams::default()).unwrap_or_else(|e| panic!("{e}"))
    })
}

fn context(n_ctx: u32, n_batch: u32) -> Context<'static> {
    model().new_context(&ContextParams::default().n_ctx(n_ctx).n_batch(n_batch).n_ubatch(512)).unwrap()
}

/// Drives a generation to its end: the pieces, and the error that ended it.
fn collect(generation: &mut Generation<'_, '_, '_>) -> (Vec<String>, Option<Error>) {
    let mut pieces = Vec::new();
    while let Some(piece) = generation.next_piece() {
        match piece {
            Ok(p) => pieces.push(p.to_owned()),
            Err(e) => return (pieces, Some(e)),
        }
    }
    (pieces, None)
}

/// A long, varied English text: `n` tokens of it, BOS first.
fn long_prompt(n: usize) -> Vec<Token> {
    let mut text = String::new();
    let animals = ["fox", "heron", "badger", "otter", "lynx", "crow", "hare"];
    let places = ["river", "forest", "meadow", "hill", "marsh", "valley"];
    let mut i = 0;
    loop {
        let tokens = model().vocab().tokenize(&text, AddBos::Yes).unwrap();
        if tokens.len() >= n {
            return tokens[..n].to_vec();
        }
        for _ in 0..50 {
            text.push_str(&format!(
                "On day {i}, the {} walked past the {} and counted {} stones. ",
                animals[i % animals.len()],
                places[(i * 5) % places.len()],
                i * 37 % 101
            ));
            i += 1;
        }
    }
}

#[test]
fn greedy_eiffel_tower_is_in_paris() {
    let mut ctx = context(512, 512);
    let mut sampler = Sampler::greedy();
    let prompt = model().vocab().tokenize("The Eiffel Tower is located in the city of", AddBos::Yes).unwrap();
    let mut session = Session::new();
    let options = GenerateOptions::default().max_tokens(12);
    let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    let (pieces, error) = collect(&mut generation);
    assert!(error.is_none(), "{error:?}");
    let text = pieces.concat();
    assert!(text.contains("Paris"), "{text:?}");
    let stats = generation.stats();
    assert_eq!(stats.prompt_tokens, prompt.len());
    assert!(stats.generated_tokens >= 1 && stats.generated_tokens <= 12);
    assert!(stats.time_to_first_token.is_some());
}

#[test]
fn a_5000_token_prompt_prefills_in_chunks_of_512() {
    let mut ctx = context(5_376, 512);
    assert!(ctx.n_ctx() >= 5_200);
    assert_eq!(ctx.n_batch(), 512);
    let mut sampler = Sampler::greedy();
    let prompt = long_prompt(5_000);
    let mut session = Session::new();
    ctx.reset_perf();
    let options = GenerateOptions::default().max_tokens(3).stop_at_eog(false);
    let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    let (_, error) = collect(&mut generation);
    assert!(error.is_none(), "{error:?}");
    let stats = generation.stats().clone();
    drop(generation);
    assert_eq!(stats.prompt_evaluated, 5_000);
    assert_eq!(stats.generated_tokens, 3);
    assert_eq!(stats.finish_reason, Some(FinishReason::Length));
    assert_eq!(ctx.perf().prompt_tokens, 5_000);
    assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(5_001));
}

#[test]
fn prefix_cache_evaluates_only_what_follows_the_shared_prefix() {
    let mut ctx = context(2_048, 512);
    let mut sampler = Sampler::greedy();
    let vocab = model().vocab();
    let shared = long_prompt(1_000);
    let mut first = shared.clone();
    first.extend(vocab.tokenize("Question: which animal walked past the river on day 3?", AddBos::No).unwrap());
    let mut second = shared.clone();
    second.extend(vocab.tokenize("Summary of the story in one sentence:", AddBos::No).unwrap());
    assert_ne!(first[1_000], second[1_000], "the prompts share exactly 1,000 tokens");
    let options = GenerateOptions::default().max_tokens(4).stop_at_eog(false);
    let mut session = Session::new();

    ctx.reset_perf();
    let mut generation = session.generate(&mut ctx, &mut sampler, &first, &options).unwrap();
    assert!(collect(&mut generation).1.is_none());
    assert_eq!(generation.stats().prompt_evaluated, first.len());
    drop(generation);
    assert_eq!(ctx.perf().prompt_tokens, first.len() as i32);

    ctx.reset_perf();
    let mut generation = session.generate(&mut ctx, &mut sampler, &second, &options).unwrap();
    assert!(collect(&mut generation).1.is_none());
    let stats = generation.stats().clone();
    drop(generation);
    let new_tokens = second.len() - 1_000;
    assert!(new_tokens > 1);
    // The context's own counter: only the tokens after the shared prefix
    // went through prompt evaluation.
    assert_eq!(ctx.perf().prompt_tokens, new_tokens as i32);
    assert_eq!(stats.prompt_evaluated, new_tokens);
    assert_eq!(stats.reused_tokens(), 1_000);

    // The whole prompt cached: only its last token is decoded again, one
    // single-token decode (counted by llama.cpp as an eval).
    ctx.reset_perf();
    let mut generation = session.generate(&mut ctx, &mut sampler, &second, &options).unwrap();
    assert!(collect(&mut generation).1.is_none());
    assert_eq!(generation.stats().prompt_evaluated, 1);
    drop(generation);
    assert_eq!(ctx.perf().eval_tokens, 4);
}

#[test]
fn stop_string_spanning_tokens_is_not_emitted() {
    let mut ctx = context(512, 512);
    let mut sampler = Sampler::greedy();
    let prompt = model().vocab().tokenize("Here is a short story about a lighthouse keeper:", AddBos::Yes).unwrap();
    let mut session = Session::new();
    let plain = GenerateOptions::default().max_tokens(40).stop_at_eog(false);
    let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &plain).unwrap();
    let (pieces, error) = collect(&mut generation);
    drop(generation);
    assert!(error.is_none());
    let full = pieces.concat();

    // The last two characters of one piece and the first two of the next,
    // after some text: a stop string that no single token holds.
    let k = (4..pieces.len())
        .find(|&k| {
            let (a, b) = (&pieces[k - 1], &pieces[k]);
            a.trim().chars().count() >= 2 && b.trim().chars().count() >= 2
        })
        .expect("two word pieces in a row");
    let tail: String = pieces[k - 1].chars().rev().take(2).collect::<Vec<_>>().into_iter().rev().collect();
    let head: String = pieces[k].chars().take(2).collect();
    let stop = format!("{tail}{head}");
    let at = full.find(&stop).unwrap();

    session.clear(&mut ctx).unwrap();
    let options = plain.clone().stop([stop.clone()]);
    let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    let (stopped, error) = collect(&mut generation);
    assert!(error.is_none());
    assert_eq!(generation.finish_reason(), Some(&FinishReason::Stop(stop.clone())));
    let text = stopped.concat();
    assert_eq!(text, full[..at], "stop {stop:?}: output ends right before it");
    // No piece carries any part of the stop string beyond the text before it.
    assert!(!text.contains(&stop));
    assert!(stopped.iter().all(|p| !p.is_empty()));
}

#[test]
fn chinese_and_emoji_stream_as_valid_utf8() {
    let model = model();
    let vocab = model.vocab();
    let prompt = vocab.tokenize("中文问答。\n问：你最喜欢的水果是什么？🍎🍌😀\n答：", AddBos::Yes).unwrap();
    let max = 48;

    // Oracle: a plain greedy loop, its bytes detokenized at the end.
    let mut ctx = context(1_024, 512);
    let mut sampler = Sampler::greedy();
    ctx.decode(&Batch::from_tokens(&prompt, 0)).unwrap();
    let mut tokens = Vec::new();
    for i in 0..max {
        let token = sampler.sample(&mut ctx, Output::Last).unwrap();
        if vocab.is_eog(token) {
            break;
        }
        tokens.push(token);
        let mut batch = Batch::new(1, 1);
        batch.push(token, (prompt.len() + i) as i32, &[0], Logits::Yes).unwrap();
        ctx.decode(&batch).unwrap();
    }
    let expected = vocab.detokenize(&tokens, AddBos::No, Special::Plain).unwrap();

    ctx.clear_kv();
    let mut session = Session::new();
    let options = GenerateOptions::default().max_tokens(max);
    let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    let (pieces, error) = collect(&mut generation);
    assert!(error.is_none());
    let text = pieces.concat();
    assert_eq!(text, expected);
    assert!(!text.is_ascii(), "expected non-ASCII output, got {text:?}");
    assert!(!text.contains('\u{FFFD}'), "{text:?}");
    assert!(pieces.iter().all(|p| !p.is_empty()));
    // Nothing was left in the detokenizer when the run ended.
    assert_eq!(generation.stats().incomplete_utf8_bytes, 0);
}

#[test]
fn speculative_greedy_passes_the_teacher_forced_check() {
    // A copy task through a Session with speculation: most tokens come
    // from drafts, and every one is the model's greedy choice within the
    // rounding of a batch (re-scored alone).
    let prompt = model().vocab().tokenize(include_str!("../../../benches/prompts/copy.txt"), AddBos::Yes).unwrap();
    let mut ctx = context(1_024, 512);
    let mut sampler = Sampler::greedy();
    let mut session = Session::new();
    let options = GenerateOptions::default()
        .max_tokens(97)
        .stop_at_eog(false)
        .speculation(llamacpp::speculative::Speculation::ngram());
    let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    let (_, error) = collect(&mut generation);
    assert!(error.is_none(), "{error:?}");
    let stats = generation.stats().clone();
    drop(generation);
    assert_eq!(stats.generated_tokens, 97);
    assert!(stats.accepted_draft_tokens >= 60, "{stats}");
    let generated = &session.tokens()[prompt.len()..];
    assert_eq!(generated.len(), 96);
    let check = llama_suite::teacher::rescore(model(), &prompt, generated).unwrap();
    assert!(check.worst() <= 1.0, "gaps {:?}", check.gaps);
}
