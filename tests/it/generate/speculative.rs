//! Speculative decoding in `generate::Session` on the tiny synthetic model:
//! the same tokens as without it (greedy, decisive prompts), the same
//! distribution (seeded sampling, chi-square), stop strings and
//! `max_tokens` exactly where they land without it, and the settings and
//! contexts it refuses.

use llama_suite::synthetic::{TINY_BOS_ID, TINY_VOCAB_SIZE, TinyModelSpec, tiny_llama_path};
use llama_suite::teacher::rescore_with_kv;
use llamacpp::generate::{FinishReason, GenerateOptions, GenerationStats, Session};
use llamacpp::speculative::Speculation;
use llamacpp::{ContextParams, Error, KvType, Model, ModelParams, Sampler, SamplingParams, Special, Token};

fn tiny_model() -> Model {
    let path = tiny_llama_path(&TinyModelSpec::default()).expect("write the tiny model");
    Model::load(&path, &ModelParams::default()).expect("load the tiny model")
}

/// F32 KV cells: the batch of a draft and a single-token decode then
/// differ only in the order of f32 sums.
fn params() -> ContextParams {
    ContextParams::default().n_ctx(1024).n_batch(256).n_threads(2).kv_type(KvType::F32)
}

/// BOS, then a block of `block` tokens chosen by `salt`, repeated: text
/// that gives the n-gram drafter something to find.
fn repeating_prompt(block: usize, repeats: usize, salt: usize) -> Vec<Token> {
    let first_normal = 260;
    let span = TINY_VOCAB_SIZE - first_normal;
    let unit: Vec<Token> =
        (0..block).map(|i| Token((first_normal + (i * 37 + salt * 101 + i * i * salt) % span) as i32)).collect();
    let mut tokens = vec![Token(TINY_BOS_ID)];
    for _ in 0..repeats {
        tokens.extend_from_slice(&unit);
    }
    tokens.extend_from_slice(&unit[..block / 2]);
    tokens
}

struct Run {
    tokens: Vec<Token>,
    text: String,
    stats: GenerationStats,
}

/// Runs a whole generation in a fresh session on `ctx` (its cache
/// cleared), collecting the sampled tokens (a final end token excluded),
/// the text and the stats.
fn run(ctx: &mut llamacpp::Context<'_>, sampler: &mut Sampler<'_>, prompt: &[Token], options: &GenerateOptions) -> Run {
    ctx.clear_kv();
    let mut session = Session::new();
    let mut generation = session.generate(ctx, sampler, prompt, options).unwrap();
    let mut text = String::new();
    while let Some(piece) = generation.next_piece() {
        text.push_str(piece.unwrap());
    }
    let stats = generation.stats().clone();
    drop(generation);
    // The session's record: the prompt, then the sampled tokens up to the
    // last one decoded.
    let tokens = session.tokens()[prompt.len()..].to_vec();
    Run { tokens, text, stats }
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions::default().max_tokens(n).stop_at_eog(false).special(Special::Markup)
}

/// A best logit at least this far ahead of the second at every generated
/// position: where the batch of a draft and a single-token decode cannot
/// round to different greedy choices (see the engine's tests).
const DECISIVE: f32 = 2e-2;

#[test]
fn greedy_tokens_are_the_same_with_and_without_speculation() {
    let model = tiny_model();
    let mut ctx = model.new_context(&params()).unwrap();
    let (mut compared, mut drafted, mut accepted) = (0, 0, 0);
    for salt in 0..200 {
        let prompt = repeating_prompt(24, 3, salt);
        let mut sampler = Sampler::greedy();
        let plain = run(&mut ctx, &mut sampler, &prompt, &greedy(64));
        let check = rescore_with_kv(&model, KvType::F32, &prompt, &plain.tokens).unwrap();
        if check.first_near_tie(DECISIVE).is_some() {
            continue;
        }
        let spec = run(&mut ctx, &mut sampler, &prompt, &greedy(64).speculation(Speculation::ngram()));
        assert_eq!(spec.tokens, plain.tokens, "salt {salt}");
        assert_eq!(spec.text, plain.text);
        assert_eq!(spec.stats.generated_tokens, 64);
        assert_eq!(plain.stats.drafted_tokens, 0);
        drafted += spec.stats.drafted_tokens;
        accepted += spec.stats.accepted_draft_tokens;
        compared += 1;
        if compared == 6 {
            break;
        }
    }
    assert_eq!(compared, 6, "six decisive prompts");
    // Drafts were both confirmed and refused: both paths ran.
    assert!(accepted > 10 && drafted > accepted, "{accepted} of {drafted} draft tokens accepted");
}

#[test]
fn max_tokens_and_stop_strings_land_where_they_do_without_speculation() {
    let model = tiny_model();
    let mut ctx = model.new_context(&params()).unwrap();
    // salt 1 drafts often and has no near tie in its first 64 tokens.
    let prompt = repeating_prompt(24, 3, 1);
    let mut sampler = Sampler::greedy();
    let spec = Speculation::ngram();
    let plain = run(&mut ctx, &mut sampler, &prompt, &greedy(64));
    let mut accepted = 0;
    for max in 1..=40 {
        let run = run(&mut ctx, &mut sampler, &prompt, &greedy(max).speculation(spec));
        assert_eq!(run.stats.generated_tokens, max);
        assert_eq!(run.stats.finish_reason, Some(FinishReason::Length));
        // The record holds what was decoded: all but the last sampled
        // token, as without speculation.
        assert_eq!(run.tokens, plain.tokens[..max - 1], "max_tokens {max}");
        accepted += run.stats.accepted_draft_tokens;
    }
    assert!(accepted >= 5, "{accepted} draft tokens accepted over the runs");

    // Stop strings: every 3-character piece of the text at a few offsets.
    let chars: Vec<char> = plain.text.chars().collect();
    let mut stopped = 0;
    for at in (4..chars.len().saturating_sub(3)).step_by(chars.len() / 12) {
        let stop: String = chars[at..at + 3].iter().collect();
        let options = greedy(64).stop([stop.clone()]);
        let without = run(&mut ctx, &mut sampler, &prompt, &options);
        let with = run(&mut ctx, &mut sampler, &prompt, &options.clone().speculation(spec));
        assert_eq!(with.text, without.text, "stop {stop:?}");
        assert_eq!(with.stats.finish_reason, without.stats.finish_reason);
        assert_eq!(with.stats.generated_tokens, without.stats.generated_tokens);
        assert_eq!(with.tokens, without.tokens);
        assert!(!with.text.contains(&stop));
        stopped += usize::from(matches!(with.stats.finish_reason, Some(FinishReason::Stop(_))));
    }
    assert!(stopped >= 8, "{stopped} runs ended at their stop string");
}

#[test]
fn sampled_tokens_keep_their_distribution() {
    // Seeded sampling with and without speculation over many seeds: the
    // runs must follow the same distribution. The statistic compared is
    // the number of generated tokens that repeat what followed the same
    // two tokens earlier (what a draft proposes), the quantity a wrong
    // acceptance rule shifts. Shown once (2026-12-05): accepting every
    // draft token gives chi-square 597.5 over 18 df (critical 42.4); the
    // rule as it is gives 0.0, since a seed draws the same numbers with
    // and without speculation.
    let model = tiny_model();
    let mut ctx = model.new_context(&params()).unwrap();
    let prompt = repeating_prompt(24, 3, 1);
    const RUNS: u32 = 800;
    let mut histogram = |speculation: Option<Speculation>| {
        let mut counts = std::collections::HashMap::<usize, u32>::new();
        let (mut drafted, mut accepted) = (0, 0);
        for seed in 0..RUNS {
            let mut sampler = SamplingParams::default().temperature(0.3).seed(seed).sampler(&model).unwrap();
            let run = run(&mut ctx, &mut sampler, &prompt, &greedy(25).speculation(speculation));
            let history: Vec<Token> = prompt.iter().chain(&run.tokens).copied().collect();
            *counts.entry(repeats(&history, prompt.len())).or_default() += 1;
            drafted += run.stats.drafted_tokens;
            accepted += run.stats.accepted_draft_tokens;
        }
        (counts, drafted, accepted)
    };
    let (plain, _, _) = histogram(None);
    let (spec, drafted, accepted) = histogram(Some(Speculation::ngram()));
    assert!(accepted > 300 && drafted > 2 * accepted, "{accepted} of {drafted} draft tokens accepted");
    let (x2, df) = two_sample_chi_square(&plain, &spec);
    // The 0.1% critical value for df degrees of freedom (Wilson-Hilferty).
    let a = 2.0 / (9.0 * df as f64);
    let critical = df as f64 * (1.0 - a + 3.09 * a.sqrt()).powi(3);
    assert!(df >= 3, "only {df} degrees of freedom: {plain:?}");
    assert!(x2 < critical, "chi-square {x2:.1} over {df} df (critical {critical:.1}): {plain:?} vs {spec:?}");
}

/// How many tokens of `history` from `from` on equal the token that
/// followed the latest earlier occurrence of the two tokens before them.
fn repeats(history: &[Token], from: usize) -> usize {
    (from.max(2)..history.len())
        .filter(|&i| {
            let key = &history[i - 2..i];
            (2..i).rev().find(|&p| &history[p - 2..p] == key).is_some_and(|p| history[p] == history[i])
        })
        .count()
}

/// Two-sample chi-square of equal-size samples over the categories seen at
/// least 10 times in both together (the rest pooled into one category):
/// the statistic and its degrees of freedom.
fn two_sample_chi_square(
    a: &std::collections::HashMap<usize, u32>,
    b: &std::collections::HashMap<usize, u32>,
) -> (f64, usize) {
    let mut keys: Vec<usize> = a.keys().chain(b.keys()).copied().collect();
    keys.sort_unstable();
    keys.dedup();
    let count = |h: &std::collections::HashMap<usize, u32>, k| f64::from(h.get(&k).copied().unwrap_or(0));
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut rest = (0.0, 0.0);
    for k in keys {
        let (x, y) = (count(a, k), count(b, k));
        if x + y >= 10.0 {
            cells.push((x, y));
        } else {
            rest = (rest.0 + x, rest.1 + y);
        }
    }
    if rest.0 + rest.1 > 0.0 {
        cells.push(rest);
    }
    // Equal sample sizes: each cell contributes (x - y)^2 / (x + y).
    let x2 = cells.iter().map(|&(x, y)| (x - y).powi(2) / (x + y)).sum();
    (x2, cells.len().saturating_sub(1))
}

#[test]
fn bad_settings_and_caches_that_cannot_drop_a_draft_are_refused() {
    let model = tiny_model();
    let mut ctx = model.new_context(&params()).unwrap();
    let mut sampler = Sampler::greedy();
    let prompt = repeating_prompt(8, 2, 0);
    let mut session = Session::new();
    for bad in [Speculation::ngram().draft_max(0), Speculation::ngram().ngram_sizes(3, 2)] {
        let err = session.generate(&mut ctx, &mut sampler, &prompt, &greedy(4).speculation(bad)).unwrap_err();
        assert!(matches!(err, Error::InvalidParameter { .. }), "{err}");
    }

    let path = llama_suite::synthetic::tiny_mamba_path(&TinyModelSpec::default()).unwrap();
    let mamba = Model::load(&path, &ModelParams::default()).unwrap();
    let mut ctx = mamba.new_context(&params()).unwrap();
    let mut sampler = Sampler::greedy();
    let err = Session::new()
        .generate(&mut ctx, &mut sampler, &prompt, &greedy(4).speculation(Speculation::ngram()))
        .unwrap_err();
    assert!(matches!(err, Error::CannotSpeculate(_)), "{err}");
    // Without speculation the same run works.
    assert_eq!(run(&mut ctx, &mut sampler, &prompt, &greedy(4)).stats.generated_tokens, 4);
}
