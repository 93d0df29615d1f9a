//! Criterion benchmarks of `llamacpp::embed` on the default model (Gemma 3
//! 270M Q4_K_M, or `LLAMA_MODEL`), threads from `LLAMA_BENCH_THREADS`
//! (default 2), mean pooling:
//!
//! - `embed_texts/{batched,one_at_a_time}`: 256 short texts (10 to 30
//!   tokens each; `LLAMA_BENCH_EMBED_TEXTS` changes the count) embedded in
//!   one `Embedder::embed` call, packed into 512-token passes, vs one call
//!   per text; throughput in texts.
//! - `embed_tokens/*`, throughput in tokens: `packed` (64 of those texts,
//!   about 1,300 tokens in three passes; `packed_unaligned` without the
//!   padding of `EmbedParams::align`), against one 512-token sequence
//!   as a single pass with embeddings on (`embed_512`, the best a pass can
//!   do) and as a plain prefill with logits for its last token only
//!   (`prefill_512`, as `benches/inference.rs`). With embeddings on,
//!   llama.cpp makes every token an output and runs Gemma's LM head
//!   (262,144 rows) on each, so a pass of embeddings costs more per token
//!   than a prefill, whatever the packing.
//!
//! `LLAMA_BENCH_EMBED_QUICK=N` skips criterion and times each variant
//! once per round, interleaved, for N rounds (for a machine too loaded or
//! too slow for criterion's ten samples of each), printing rates per round
//! and the best of the rounds.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use llama_suite::bench::{model, threads};
use llamacpp::embed::{EmbedParams, Embedder};
use llamacpp::{AddBos, Batch, Context, ContextParams, Pooling, Token};

fn embed_params() -> EmbedParams {
    EmbedParams::default()
        .pooling(Pooling::Mean)
        .n_ubatch(512)
        .n_seq_max(64)
        .n_threads(threads())
        .n_threads_batch(threads())
}

/// `n` deterministic English sentences of 10 to 30 tokens (BOS included).
fn texts(n: usize) -> Vec<String> {
    const WORDS: [&str; 24] = [
        "river", "quietly", "mountain", "the", "engineer", "builds", "a", "bridge", "over", "blue", "cold", "water",
        "while", "children", "watch", "from", "old", "stone", "walls", "and", "birds", "sing", "at", "dawn",
    ];
    let vocab = model().vocab();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..n)
        .map(|i| {
            let target = 10 + (next() % 21) as usize;
            let mut text = format!("Note {i}:");
            while vocab.tokenize(&text, AddBos::Yes).unwrap().len() < target {
                text.push(' ');
                text.push_str(WORDS[(next() % WORDS.len() as u64) as usize]);
            }
            text.push('.');
            let len = vocab.tokenize(&text, AddBos::Yes).unwrap().len();
            assert!((10..=32).contains(&len), "text {i}: {len} tokens");
            text
        })
        .collect()
}

fn n_texts() -> usize {
    std::env::var("LLAMA_BENCH_EMBED_TEXTS").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

fn embed_texts(c: &mut Criterion) {
    let texts = texts(n_texts());
    let mut embedder = Embedder::new(model(), &embed_params()).unwrap();
    let tokens: usize = texts.iter().map(|t| embedder.tokenize(t).unwrap().len()).sum();
    let before = embedder.passes();
    embedder.embed(&texts).unwrap();
    eprintln!(
        "embed_texts: {} texts, {tokens} tokens ({:.1} per text), {} passes batched",
        texts.len(),
        tokens as f64 / texts.len() as f64,
        embedder.passes() - before
    );

    let mut group = c.benchmark_group("embed_texts");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(20));
    group.sampling_mode(criterion::SamplingMode::Flat);
    group.throughput(Throughput::Elements(texts.len() as u64));
    group.bench_function("batched", |b| b.iter(|| black_box(embedder.embed(&texts).unwrap())));
    group.bench_function("one_at_a_time", |b| {
        b.iter(|| {
            for text in &texts {
                black_box(embedder.embed_one(text).unwrap());
            }
        })
    });
    group.finish();
}

/// A 512-token sequence: BOS and then varied text tokens.
fn long_tokens(len: usize) -> Vec<Token> {
    let vocab = model().vocab();
    let mut text = String::new();
    let mut i = 0;
    loop {
        let tokens = vocab.tokenize(&text, AddBos::Yes).unwrap();
        if tokens.len() >= len {
            return tokens[..len].to_vec();
        }
        text.push_str(&format!("On day {i} the heron crossed the marsh and counted {} reeds. ", i * 37 % 101));
        i += 1;
    }
}

/// A plain generation context for the 512-token prefill the packed
/// passes are compared with (logits of the last token only).
fn prefill_context() -> Context<'static> {
    let params =
        ContextParams::default().n_ctx(512).n_batch(512).n_ubatch(512).n_threads(threads()).n_threads_batch(threads());
    model().new_context(&params).unwrap()
}

fn embed_tokens(c: &mut Criterion) {
    let texts = texts(64);
    let mut embedder = Embedder::new(model(), &embed_params()).unwrap();
    let packed: Vec<Vec<Token>> = texts.iter().map(|t| embedder.tokenize(t).unwrap()).collect();
    let packed_tokens: usize = packed.iter().map(Vec::len).sum();
    let long = long_tokens(512);
    let mut prefill_ctx = prefill_context();
    let prefill_batch = Batch::from_tokens(&long, 0);

    let mut group = c.benchmark_group("embed_tokens");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(10));
    group.sampling_mode(criterion::SamplingMode::Flat);
    group.throughput(Throughput::Elements(packed_tokens as u64));
    group.bench_function(format!("packed/{}-texts-{packed_tokens}-tokens", texts.len()), |b| {
        b.iter(|| black_box(embedder.embed_tokens(&packed).unwrap()))
    });
    let mut unaligned = Embedder::new(model(), &embed_params().align(1)).unwrap();
    group.bench_function(format!("packed_unaligned/{}-texts-{packed_tokens}-tokens", texts.len()), |b| {
        b.iter(|| black_box(unaligned.embed_tokens(&packed).unwrap()))
    });
    group.throughput(Throughput::Elements(512));
    group.bench_function("embed_512", |b| b.iter(|| black_box(embedder.embed_tokens(&[&long]).unwrap())));
    group.bench_function("prefill_512", |b| {
        b.iter(|| {
            prefill_ctx.clear_kv();
            prefill_ctx.decode(&prefill_batch).unwrap();
            prefill_ctx.synchronize();
        })
    });
    group.finish();
}

/// The `LLAMA_BENCH_EMBED_QUICK` mode: every variant once per round.
fn quick(rounds: usize) {
    let timed = |f: &mut dyn FnMut()| {
        let t0 = Instant::now();
        f();
        t0.elapsed().as_secs_f64()
    };
    let texts = texts(n_texts());
    let mut embedder = Embedder::new(model(), &embed_params()).unwrap();
    let mut unaligned = Embedder::new(model(), &embed_params().align(1)).unwrap();
    let tokens: Vec<Vec<Token>> = texts.iter().map(|t| embedder.tokenize(t).unwrap()).collect();
    let n_tokens: usize = tokens.iter().map(Vec::len).sum();
    let long = long_tokens(512);
    let mut prefill_ctx = prefill_context();
    let prefill_batch = Batch::from_tokens(&long, 0);
    // Warm up (first-pass allocations, page cache).
    embedder.embed(&texts[..texts.len().min(8)]).unwrap();
    eprintln!("quick: {} texts, {n_tokens} tokens, {rounds} rounds, {} threads", texts.len(), threads());
    let mut best = [0.0f64; 6];
    let names = [
        "texts/s batched",
        "texts/s one_at_a_time",
        "tokens/s packed",
        "tokens/s packed_unaligned",
        "tokens/s embed_512",
        "tokens/s prefill_512",
    ];
    for round in 0..rounds {
        let rates = [
            texts.len() as f64 / timed(&mut || drop(black_box(embedder.embed(&texts).unwrap()))),
            texts.len() as f64
                / timed(&mut || {
                    for text in &texts {
                        black_box(embedder.embed_one(text).unwrap());
                    }
                }),
            n_tokens as f64 / timed(&mut || drop(black_box(embedder.embed_tokens(&tokens).unwrap()))),
            n_tokens as f64 / timed(&mut || drop(black_box(unaligned.embed_tokens(&tokens).unwrap()))),
            512.0 / timed(&mut || drop(black_box(embedder.embed_tokens(&[&long]).unwrap()))),
            512.0
                / timed(&mut || {
                    prefill_ctx.clear_kv();
                    prefill_ctx.decode(&prefill_batch).unwrap();
                    prefill_ctx.synchronize();
                }),
        ];
        let line: Vec<String> = names.iter().zip(&rates).map(|(n, r)| format!("{n} {r:.1}")).collect();
        eprintln!("round {round}: {}", line.join(", "));
        for (b, r) in best.iter_mut().zip(rates) {
            *b = b.max(r);
        }
    }
    let line: Vec<String> = names.iter().zip(&best).map(|(n, r)| format!("{n} {r:.1}")).collect();
    eprintln!("best: {}", line.join(", "));
    eprintln!(
        "batched / one_at_a_time {:.2}x; packed / embed_512 {:.3}; packed / prefill_512 {:.3}; packed / unaligned {:.3}",
        best[0] / best[1],
        best[2] / best[4],
        best[2] / best[5],
        best[2] / best[3]
    );
}

fn benches(c: &mut Criterion) {
    if let Some(rounds) = std::env::var("LLAMA_BENCH_EMBED_QUICK").ok().and_then(|v| v.parse().ok()) {
        quick(rounds);
        return;
    }
    embed_texts(c);
    embed_tokens(c);
}

criterion_group!(embed, benches);
criterion_main!(embed);
