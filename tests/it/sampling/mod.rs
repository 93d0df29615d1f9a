//! Issue 3: sampling. The shortcuts of `Sampler::sample` (an argmax for a
//! greedy chain, top-k preselection for chains that start with top-k) pick
//! exactly the tokens llama.cpp's own `llama_sampler_sample` picks from an
//! identically built chain; custom samplers, panics in them, penalties,
//! logit bias, grammars, clone and reset behave: the shortcuts here,
//! custom samplers in `custom`, the built-in constraints in `constraints`.

mod constraints;
mod custom;

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use llama_suite::safe_api::*;
use llama_suite::synthetic::{TINY_EOS_ID, TinyModelSpec};
use llamacpp::{
    AddBos, Batch, Candidates, Context, CustomSampler, Error, Logits, Model, Output, SamplePath, Sampler, SamplerChain,
    Special, Token, Vocab, sys,
};

/// Samples `steps` tokens with `ours` (the crate's path) and `theirs`
/// (llama.cpp's `llama_sampler_sample` on an identically built chain),
/// feeding our token back each step; asserts equal tokens and returns them
/// with the paths taken.
fn compare_with_llama_cpp(
    ctx: &mut Context<'_>,
    ours: &mut Sampler<'_>,
    theirs: &mut Sampler<'_>,
    start: i32,
    steps: usize,
) -> (Vec<Token>, Vec<SamplePath>) {
    let (mut toks, mut paths) = (Vec::new(), Vec::new());
    let mut batch = Batch::new(1, 1);
    for step in 0..steps {
        let (t, path) = ours.sample_with_path(ctx, Output::Last).unwrap();
        // SAFETY: both pointers are live (a chain we own, a context we
        // hold), the context's last decode produced logits for output -1,
        // and the chain ends with a selecting sampler, so
        // llama_sampler_sample neither reads out of bounds nor aborts.
        let reference = unsafe { sys::llama_sampler_sample(theirs.as_ptr(), ctx.as_ptr(), -1) };
        assert_eq!(t, Token(reference), "step {step}: {path:?} path picked {t}, llama.cpp picked {reference}");
        toks.push(t);
        paths.push(path);
        batch.clear();
        batch.push(t, start + step as i32, &[0], Logits::Yes).unwrap();
        ctx.decode(&batch).unwrap();
    }
    (toks, paths)
}

fn distinct(toks: &[Token]) -> usize {
    let mut v = toks.to_vec();
    v.sort();
    v.dedup();
    v.len()
}

fn prompt_ctx<'m>(model: &'m Model, text: &str) -> (Context<'m>, i32) {
    let mut ctx = model.new_context(&small_params()).unwrap();
    let toks = tokens(model.vocab(), text);
    decode_seq(&mut ctx, &toks, 0, 0);
    (ctx, toks.len() as i32)
}

#[test]
fn greedy_shortcut_picks_what_llama_cpp_picks() {
    let model = tiny_model();
    let (mut ctx, n) = prompt_ctx(&model, "Hello world");
    let (toks, paths) = compare_with_llama_cpp(&mut ctx, &mut Sampler::greedy(), &mut Sampler::greedy(), n, 60);
    assert!(paths.iter().all(|&p| p == SamplePath::Greedy), "{paths:?}");
    assert!(distinct(&toks) > 1, "{toks:?}");
}

#[test]
fn top_k_shortcut_picks_what_llama_cpp_picks() {
    let model = tiny_model();
    let chain = |seed| SamplerChain::new().top_k(40).top_p(0.9, 1).temp(0.8).dist(seed).build().unwrap();
    for seed in [1, 42, 1234] {
        let (mut ctx, n) = prompt_ctx(&model, "the quick brown fox");
        let (toks, paths) = compare_with_llama_cpp(&mut ctx, &mut chain(seed), &mut chain(seed), n, 60);
        assert!(paths.iter().all(|&p| p == SamplePath::TopK), "seed {seed}: {paths:?}");
        assert!(distinct(&toks) > 5, "seed {seed}: a random chain should vary: {toks:?}");
    }
    // Chains the shortcut does not apply to take the full path, also equal.
    let others: [fn() -> Sampler<'static>; 4] = [
        || SamplerChain::new().temp(0.9).dist(5).build().unwrap(),
        || SamplerChain::new().top_k(0).temp(0.9).dist(5).build().unwrap(),
        || SamplerChain::new().top_k(5000).dist(5).build().unwrap(), // k above n_vocab
        || SamplerChain::new().penalties(16, 1.3, 0.1, 0.1).top_k(20).min_p(0.05, 1).dist(5).build().unwrap(),
    ];
    for (i, make) in others.iter().enumerate() {
        let (mut ctx, n) = prompt_ctx(&model, "Hello world");
        let (_, paths) = compare_with_llama_cpp(&mut ctx, &mut make(), &mut make(), n, 25);
        assert!(paths.iter().all(|&p| p == SamplePath::Full), "chain {i}: {paths:?}");
    }
    // A top-k chain with penalties after the top-k keeps the shortcut.
    let make = || SamplerChain::new().top_k(30).penalties(16, 1.5, 0.2, 0.2).temp(0.7).dist(9).build().unwrap();
    let (mut ctx, n) = prompt_ctx(&model, "Hello world");
    let (_, paths) = compare_with_llama_cpp(&mut ctx, &mut make(), &mut make(), n, 40);
    assert!(paths.iter().all(|&p| p == SamplePath::TopK));
}

/// The same on the real Gemma 3 model, whose 262,144-token vocabulary is
/// what the shortcuts are for: 64 greedy steps, then 64 steps of a top-k
/// chain for each of 3 seeds.
#[test]
fn shortcuts_pick_what_llama_cpp_picks_on_gemma() {
    let model = real_model();
    assert_eq!(model.vocab().n_tokens(), 262_144);
    let (mut ctx, toks) = gemma_ctx(&model);
    let n = toks.len() as i32;
    let (greedy, paths) = compare_with_llama_cpp(&mut ctx, &mut Sampler::greedy(), &mut Sampler::greedy(), n, 64);
    assert!(paths.iter().all(|&p| p == SamplePath::Greedy));
    let text = model.vocab().detokenize(&greedy, AddBos::No, Special::Plain).unwrap();
    assert!(!text.trim().is_empty(), "greedy continuation: {text:?}");

    let chain = |seed| SamplerChain::new().top_k(40).top_p(0.9, 1).temp(0.8).dist(seed).build().unwrap();
    let mut runs = Vec::new();
    for seed in [77, 1, 2024] {
        ctx.clear_kv();
        decode_seq(&mut ctx, &toks, 0, 0);
        let (sampled, paths) = compare_with_llama_cpp(&mut ctx, &mut chain(seed), &mut chain(seed), n, 64);
        assert!(paths.iter().all(|&p| p == SamplePath::TopK), "seed {seed}: {paths:?}");
        assert_ne!(sampled, greedy, "seed {seed}: a random chain should not be greedy");
        runs.push(sampled);
    }
    assert!(runs[0] != runs[1] && runs[1] != runs[2], "the seeds should give different runs");
}

/// A context of the real model with a prompt decoded, and the prompt.
fn gemma_ctx(model: &Model) -> (Context<'_>, Vec<Token>) {
    let params = llamacpp::ContextParams::default().n_ctx(512).n_batch(64).n_ubatch(64).n_threads(1);
    let toks = tokens(model.vocab(), "The capital of France is");
    let mut ctx = model.new_context(&params).unwrap();
    decode_seq(&mut ctx, &toks, 0, 0);
    (ctx, toks)
}

/// Top-k above 128 has its own branch in llama.cpp (a bucket sort) and in
/// the shortcut (a guard against the buckets' overflow): k = 200 and
/// k = 1000 on Gemma's logits take the shortcut and pick what llama.cpp
/// picks.
#[test]
fn large_top_k_shortcut_picks_what_llama_cpp_picks_on_gemma() {
    let model = real_model();
    let (mut ctx, toks) = gemma_ctx(&model);
    let n = toks.len() as i32;
    for (k, seed) in [(200, 5), (1000, 6)] {
        for temp in [0.8, 1.5] {
            let chain = || SamplerChain::new().top_k(k).temp(temp).dist(seed).build().unwrap();
            ctx.clear_kv();
            decode_seq(&mut ctx, &toks, 0, 0);
            let (sampled, paths) = compare_with_llama_cpp(&mut ctx, &mut chain(), &mut chain(), n, 64);
            let shortcut = paths.iter().filter(|&&p| p == SamplePath::TopK).count();
            eprintln!("k {k}, temp {temp}: {shortcut}/64 steps on the shortcut, {} distinct", distinct(&sampled));
            // Ties among the k + 1 best send a step to the full path (on
            // Gemma's logits about one step in ten for k = 1000 with the
            // native kernels, up to one in five with the portable ones):
            // the shortcut must still carry most steps.
            assert!(shortcut >= 32, "k {k}: only {shortcut} of 64 steps took the shortcut: {paths:?}");
            assert!(distinct(&sampled) > 5, "k {k}: {sampled:?}");
        }
        // A greedy selector behind top-k: the same as the argmax.
        let chain = || SamplerChain::new().top_k(k).greedy().build().unwrap();
        ctx.clear_kv();
        let logits = decode_seq(&mut ctx, &toks, 0, 0);
        let (picked, paths) = compare_with_llama_cpp(&mut ctx, &mut chain(), &mut chain(), n, 16);
        assert_eq!(picked[0], Token(argmax(&logits) as i32));
        assert!(paths.iter().filter(|&&p| p == SamplePath::TopK).count() >= 8, "{paths:?}");
    }
}

/// A row with a logit >= 3e8: llama.cpp's bucket index for k > 128,
/// `int(6.4 * x + 64)`, overflows there, so the shortcut leaves such rows
/// to llama.cpp's own top-k (the full path) to pick the same token. The
/// shortcut reads the context's logits, so the row comes from a copy of the
/// tiny model whose output rows of two tokens are 2^33 times one row and
/// minus that: one of the two logits is then 2^33 |x| for the original
/// logit x.
#[test]
fn large_top_k_agrees_on_huge_logits() {
    let mut bytes = std::fs::read(tiny_path()).unwrap();
    let lay = layout(&bytes);
    let data_start = lay.info.1.div_ceil(32) * 32; // general.alignment defaults to 32
    let (_, _, _, offset_field) = lay.tensors.iter().find(|t| t.0 == "output.weight").unwrap().clone();
    let offset = u64::from_le_bytes(bytes[offset_field..offset_field + 8].try_into().unwrap()) as usize;
    let n_embd = TinyModelSpec::default().n_embd as usize;
    let (up, down) = (500usize, 501usize);
    let row = |t: usize| data_start + offset + t * n_embd * 4;
    for i in 0..n_embd {
        let at = row(up) + 4 * i;
        let w = f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let scaled = w * 2f32.powi(33); // a power of two: exact
        bytes[at..at + 4].copy_from_slice(&scaled.to_le_bytes());
        let at = row(down) + 4 * i;
        bytes[at..at + 4].copy_from_slice(&(-scaled).to_le_bytes());
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let model = Model::load(&path, &llamacpp::ModelParams::default()).unwrap();
    let n_vocab = model.vocab().n_tokens();

    type MakeChain = fn() -> Sampler<'static>;
    let chains: [(&str, MakeChain); 3] = [
        ("top_k(200) greedy", || SamplerChain::new().top_k(200).greedy().build().unwrap()),
        ("top_k(200) dist", || SamplerChain::new().top_k(200).temp(0.8).dist(21).build().unwrap()),
        ("top_k(129) min_p dist", || SamplerChain::new().top_k(129).min_p(0.01, 1).dist(22).build().unwrap()),
    ];
    for (name, make) in chains {
        let (mut ours, mut theirs) = (make(), make());
        let (mut ctx, n) = prompt_ctx(&model, "the quick brown fox");
        let mut batch = Batch::new(1, 1);
        let mut huge_steps = 0;
        for step in 0..40 {
            let logits = ctx.logits(Output::Last).unwrap().to_vec();
            assert_eq!(logits.len(), n_vocab);
            assert_eq!(logits[up], -logits[down]);
            let best = argmax(&logits);
            let huge = logits[best] >= 3.0e8;
            let (t, path) = ours.sample_with_path(&mut ctx, Output::Last).unwrap();
            // SAFETY: as in `compare_with_llama_cpp`.
            let reference = unsafe { sys::llama_sampler_sample(theirs.as_ptr(), ctx.as_ptr(), -1) };
            assert_eq!(t, Token(reference), "{name}, step {step}: {path:?} path picked {t}, llama.cpp {reference}");
            if huge {
                huge_steps += 1;
                assert!(best == up || best == down);
                assert_eq!(
                    path,
                    SamplePath::Full,
                    "{name}, step {step}: a logit of {} must leave the shortcut",
                    logits[best]
                );
                // On x86-64 the overflowing conversion gives INT_MIN: the
                // best token lands in the lowest bucket and llama.cpp's top-k
                // drops it, which a plain top-k (the shortcut without its
                // guard) would not. That is what the guard is for.
                #[cfg(target_arch = "x86_64")]
                if logits[best] > 3.4e8 {
                    assert_ne!(t.0 as usize, best, "{name}, step {step}: llama.cpp kept the overflowing logit");
                }
            } else {
                assert_eq!(path, SamplePath::TopK, "{name}, step {step}");
            }
            batch.clear();
            batch.push(t, n + step, &[0], Logits::Yes).unwrap();
            ctx.decode(&batch).unwrap();
        }
        eprintln!("{name}: {huge_steps}/40 steps with a logit >= 3e8");
        assert!(huge_steps >= 30, "{name}: only {huge_steps} of 40 steps had a huge logit");
    }
}

/// The built-in samplers not covered above, each in a chain run by the
/// crate and by `llama_sampler_sample`: alone before its selector (the full
/// path) or behind a top-k (the shortcut). `seed` seeds every RNG of the
/// chain; `bias` lists the tokens logit bias raises or bans.
fn built_in_chain<'m>(
    vocab: &'m Vocab,
    name: &str,
    seed: u32,
    top_k: Option<i32>,
    bias: &[(Token, f32)],
) -> Sampler<'m> {
    let chain = match top_k {
        Some(k) => SamplerChain::new().top_k(k),
        None => SamplerChain::new(),
    };
    let chain = match name {
        "typical" => chain.typical(0.5, 1).dist(seed),
        "temp_ext" => chain.temp_ext(1.2, 0.8, 1.5).dist(seed),
        "xtc" => chain.xtc(0.7, 0.02, 1, seed.wrapping_add(1)).dist(seed),
        "top_n_sigma" => chain.top_n_sigma(0.5).dist(seed),
        "mirostat" => chain.mirostat(vocab, seed, 3.0, 0.2, 100),
        "mirostat_v2" => chain.mirostat_v2(seed, 3.0, 0.2),
        "adaptive_p" => chain.min_p(0.01, 1).adaptive_p(0.3, 0.8, seed),
        "dry" => chain.dry(vocab, 1.5, 1.75, 1, 64, &["\n", "."]).dist(seed),
        "min_p" => chain.min_p(0.2, 1).dist(seed),
        "top_p" => chain.top_p(0.5, 1).dist(seed),
        "penalties" => chain.penalties(32, 1.5, 0.5, 0.5).dist(seed),
        "logit_bias" => chain.logit_bias(vocab, bias).dist(seed),
        // The baseline the filters are measured against: the selector alone.
        "none" => chain.dist(seed),
        _ => unreachable!("{name}"),
    };
    chain.build().unwrap()
}

/// Every sampler of [`built_in_chain`]: the filters, then the selectors.
const BUILT_INS: [&str; 12] = [
    "typical",
    "temp_ext",
    "xtc",
    "top_n_sigma",
    "dry",
    "min_p",
    "top_p",
    "penalties",
    "logit_bias",
    "mirostat",
    "mirostat_v2",
    "adaptive_p",
];

/// Runs every sampler of [`BUILT_INS`] with each seed for `steps` steps
/// from `prompt` (accepted into both chains first, as history), behind
/// `top_k` or without one, comparing every token with llama.cpp's. Returns
/// the samplers whose tokens never differed from the selector alone's (a
/// comparison of two no-ops would prove little).
fn compare_built_ins(
    model: &Model,
    prompt: &str,
    seeds: &[u32],
    steps: usize,
    top_k: Option<i32>,
) -> Vec<&'static str> {
    let vocab = model.vocab();
    let mut ctx = model.new_context(&small_params().n_ctx(512)).unwrap();
    let prompt = tokens(vocab, prompt);
    let n = prompt.len() as i32;
    // Logit bias bans the prompt's best next token and raises two others.
    let logits = decode_seq(&mut ctx, &prompt, 0, 0);
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let bias = [(Token(order[0] as i32), -100.0), (Token(order[1] as i32), 1.0), (Token(order[4] as i32), 2.0)];
    let mut run = |name: &str, seed: u32| {
        ctx.clear_kv();
        decode_seq(&mut ctx, &prompt, 0, 0);
        let mut ours = built_in_chain(vocab, name, seed, top_k, &bias);
        let mut theirs = built_in_chain(vocab, name, seed, top_k, &bias);
        for &t in &prompt {
            ours.accept(t).unwrap();
            // SAFETY: a live chain we own and a token of its vocabulary;
            // none of these samplers throws in accept.
            unsafe { sys::llama_sampler_accept(theirs.as_ptr(), t.0) };
        }
        let (toks, paths) = compare_with_llama_cpp(&mut ctx, &mut ours, &mut theirs, n, steps);
        let want = if top_k.is_some() { SamplePath::TopK } else { SamplePath::Full };
        // Ties at the k-th place may send a step to the full path.
        let on_path = paths.iter().filter(|&&p| p == want).count();
        assert!(on_path * 10 >= steps * 9, "{name}, seed {seed}, top-k {top_k:?}: {paths:?}");
        toks
    };
    let baseline: Vec<Vec<Token>> = seeds.iter().map(|&seed| run("none", seed)).collect();
    let mut inert = Vec::new();
    for name in BUILT_INS {
        let changed = seeds.iter().zip(&baseline).filter(|&(&seed, base)| run(name, seed) != *base).count();
        eprintln!(
            "{name} (top-k {top_k:?}): {} seeds x {steps} steps equal to llama.cpp's; {changed} runs differ from the selector alone",
            seeds.len()
        );
        if changed == 0 {
            inert.push(name);
        }
    }
    inert
}

#[test]
fn every_built_in_sampler_picks_what_llama_cpp_picks() {
    let model = tiny_model();
    let prompt = "the the quick brown fox. the the quick";
    for top_k in [None, Some(60)] {
        let inert = compare_built_ins(&model, prompt, &[3, 17, 4242], 64, top_k);
        assert!(inert.is_empty(), "top-k {top_k:?}: {inert:?} never changed a token against the selector alone");
    }
}

/// The same on Gemma's logits, behind a top-k (the shortcut that makes its
/// 262,144 candidates cheap); without one only a few steps, since every
/// step then sorts all 262,144 candidates, twice.
#[test]
fn every_built_in_sampler_picks_what_llama_cpp_picks_on_gemma() {
    let model = real_model();
    let prompt = "The capital of France is Paris. The capital of France is";
    let inert = compare_built_ins(&model, prompt, &[8, 99], 16, Some(64));
    assert!(inert.is_empty(), "{inert:?} never changed a token against the selector alone");
    let inert = compare_built_ins(&model, prompt, &[8], 3, None);
    eprintln!("full path, 3 steps: unchanged against the selector alone: {inert:?}");
}
