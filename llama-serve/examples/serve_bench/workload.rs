//! Deterministic workloads, as token-id prompts, so that every backend gets
//! exactly the same tokens.
//!
//! Prompts are BOS (id 2, Gemma's) followed by ids drawn uniformly from
//! `1000..100000` (inside Gemma 3's 262,144-token vocabulary, clear of its
//! control and special tokens) by a xorshift64* generator. Each scenario,
//! and each level of a scenario, has its own stream derived from `--seed`,
//! so no two requests of a run share more than the BOS token unless the
//! scenario wants them to (the prefix scenario's A and B).

use std::time::Duration;

pub use llama_suite::token_prompts::XorShift;

/// One request: a prompt and how many tokens to generate.
#[derive(Debug, Clone)]
pub struct Request {
    /// Names the request in the per-request records (`stream3`, `long`, `B`…).
    pub label: String,
    pub prompt: Vec<i32>,
    pub n_predict: usize,
}

/// The warm-up request sent (and not measured) before the scenarios.
pub fn warmup(seed: u64) -> Request {
    Request { label: "warmup".into(), prompt: XorShift::new(seed, "warmup").prompt(8), n_predict: 4 }
}

/// (a) `throughput`: `n` concurrent streams, each a distinct prompt of
/// `prompt_len` tokens generating `n_predict` tokens, all sent at once.
pub fn throughput(seed: u64, n: usize, prompt_len: usize, n_predict: usize) -> Vec<Request> {
    let mut rng = XorShift::new(seed, &format!("throughput/{n}"));
    (0..n).map(|i| Request { label: format!("stream{i}"), prompt: rng.prompt(prompt_len), n_predict }).collect()
}

/// (b) `long-short`: a running stream; once its first token is in, a long
/// prompt; then `shorts.len()` short requests, the i-th (from 0) sent
/// `(i + 1) * gap` after the long one (all at once when `gap` is zero).
#[derive(Debug, Clone)]
pub struct LongShort {
    pub running: Request,
    pub long: Request,
    pub shorts: Vec<Request>,
    pub gap: Duration,
}

/// Sizes of the long-short scenario.
#[derive(Debug, Clone, Copy)]
pub struct LongShortSizes {
    pub running_prompt: usize,
    pub running_predict: usize,
    pub long_prompt: usize,
    pub long_predict: usize,
    pub short_prompt: usize,
    pub short_predict: usize,
    pub shorts: usize,
    pub gap: Duration,
}

impl Default for LongShortSizes {
    fn default() -> Self {
        LongShortSizes {
            running_prompt: 128,
            running_predict: 256,
            long_prompt: 4000,
            long_predict: 16,
            short_prompt: 16,
            short_predict: 16,
            shorts: 1,
            gap: Duration::ZERO,
        }
    }
}

pub fn long_short(seed: u64, s: &LongShortSizes) -> LongShort {
    let mut rng = XorShift::new(seed, &format!("long-short/{}/{}", s.shorts, s.gap.as_millis()));
    let running =
        Request { label: "running".into(), prompt: rng.prompt(s.running_prompt), n_predict: s.running_predict };
    let long = Request { label: "long".into(), prompt: rng.prompt(s.long_prompt), n_predict: s.long_predict };
    let shorts = (0..s.shorts)
        .map(|i| Request { label: format!("short{i}"), prompt: rng.prompt(s.short_prompt), n_predict: s.short_predict })
        .collect();
    LongShort { running, long, shorts, gap: s.gap }
}

/// (c) `prefix`: A = a shared prefix + suffix 1; after A finishes, B = the
/// same prefix + suffix 2; then C, a cold prompt as long as A, sharing
/// nothing but BOS.
#[derive(Debug, Clone)]
pub struct Prefix {
    pub a: Request,
    pub b: Request,
    pub c: Request,
}

pub fn prefix(seed: u64, prefix_len: usize, suffix_len: usize, n_predict: usize) -> Prefix {
    let mut rng = XorShift::new(seed, &format!("prefix/{prefix_len}/{suffix_len}"));
    let shared = rng.prompt(prefix_len);
    let with_suffix = |rng: &mut XorShift| {
        let mut p = shared.clone();
        p.extend(rng.tokens(suffix_len));
        p
    };
    let a = Request { label: "A".into(), prompt: with_suffix(&mut rng), n_predict };
    let b = Request { label: "B".into(), prompt: with_suffix(&mut rng), n_predict };
    let c = Request { label: "C".into(), prompt: rng.prompt(prefix_len + suffix_len), n_predict };
    Prefix { a, b, c }
}
