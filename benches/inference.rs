//! Criterion benchmarks on the default model (Gemma 3 270M Q4_K_M, or
//! `LLAMA_MODEL`), threads from `LLAMA_BENCH_THREADS` (default 2):
//!
//! - `prefill/N`: one N-token prompt from an empty cache (throughput in tokens);
//! - `decode/depth-D`: one single-token step with D tokens already cached;
//! - `batched_decode/N`: one step of N sequences together (aggregate tokens);
//! - `kv_type/T`: a single-token step at depth 1024 with a T (f16, q8_0) KV cache;
//! - `prompt_cache/{cold,reused}`: time to first token for a 1,024-token
//!   shared prefix + 16 new tokens, decoding everything vs reusing the prefix;
//! - `sampling/*`: one sample from Gemma's 262,144-entry logits row, our
//!   `Sampler::sample` (greedy and top-k shortcuts) vs llama.cpp's
//!   `llama_sampler_sample` on the same chain;
//! - `engine/N`: N concurrent requests through `llamacpp::engine` (distinct
//!   32-token prompts, 32 new tokens each, greedy), submit to last token;
//!   throughput in generated tokens (`llama-serve/examples/serve_bench` measures the
//!   engine's latencies and compares it with llama-server);
//! - `engine_mix/{plain,mixed}`: 8 concurrent requests as `engine/8`, all
//!   plain or half of them constrained by llguidance (a JSON array of at
//!   least 50 strings, so none completes within the 32 tokens);
//! - `validation/N`: what `Context::decode` checks in Rust before calling
//!   llama.cpp, for an N-token batch (the batch fails the check at its last
//!   token, so llama.cpp never runs).
//!
//! Each measurement times only the decode (and the sampling for the prompt
//! cache); restoring the cache between iterations is excluded.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use llama_suite::bench::{model, threads};
use llamacpp::{Batch, Context, ContextParams, KvType, Logits, Model, ModelParams, Output, Sampler, Token};

fn params(n_ctx: u32) -> ContextParams {
    ContextParams::default().n_ctx(n_ctx).n_batch(2048).n_ubatch(512).n_threads(threads()).n_threads_batch(threads())
}

/// Deterministic, non-repetitive prompt tokens (BOS first).
fn prompt(len: usize, salt: u64) -> Vec<Token> {
    let vocab = model().vocab();
    let n = vocab.n_tokens() as u64;
    let mut state = 0x2545_F491_4F6C_DD1D ^ salt;
    let mut tokens: Vec<Token> = (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Stay clear of the control tokens at the start of Gemma's vocab.
            Token((1000 + state % (n - 1000)) as i32)
        })
        .collect();
    if let (Some(first), Some(bos)) = (tokens.first_mut(), vocab.bos()) {
        *first = bos;
    }
    tokens
}

fn decode_prompt(ctx: &mut Context<'_>, tokens: &[Token], start: i32, seq: i32) {
    let mut batch = Batch::new(ctx.n_batch() as usize, 1);
    for (i, chunk) in tokens.chunks(ctx.n_batch() as usize).enumerate() {
        batch.clear();
        let pos = start + (i * ctx.n_batch() as usize) as i32;
        batch.push_sequence(chunk, pos, seq, Logits::Yes).expect("chunk fits");
        ctx.decode(&batch).expect("decode");
    }
    ctx.synchronize();
}

fn prefill(c: &mut Criterion) {
    let mut group = c.benchmark_group("prefill");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    let mut ctx = model().new_context(&params(1024)).expect("context");
    for n in [32usize, 128, 512, 1024] {
        let tokens = prompt(n, n as u64);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &tokens, |b, tokens| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    ctx.clear_kv();
                    let start = Instant::now();
                    decode_prompt(&mut ctx, tokens, 0, 0);
                    total += start.elapsed();
                }
                total
            })
        });
    }
    group.finish();
}

/// Times one single-token decode at `depth`, then removes it again.
fn step_at_depth(ctx: &mut Context<'_>, batch: &mut Batch, depth: usize, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for i in 0..iters {
        batch.clear();
        batch.push(Token(1000 + (i % 5000) as i32), depth as i32, &[0], Logits::Yes).expect("fits");
        let start = Instant::now();
        ctx.decode(batch).expect("decode");
        ctx.synchronize();
        total += start.elapsed();
        ctx.seq_rm(Some(0), Some(depth as i32), None).expect("seq 0");
    }
    total
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode");
    group.sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(1));
    for depth in [0usize, 256, 1024] {
        let mut ctx = model().new_context(&params(2048)).expect("context");
        if depth > 0 {
            decode_prompt(&mut ctx, &prompt(depth, 7), 0, 0);
        }
        let mut batch = Batch::new(1, 1);
        group.bench_function(BenchmarkId::new("depth", depth), |b| {
            b.iter_custom(|iters| step_at_depth(&mut ctx, &mut batch, depth, iters))
        });
    }
    group.finish();
}

fn batched_decode(c: &mut Criterion) {
    const PROMPT: usize = 64;
    let mut group = c.benchmark_group("batched_decode");
    group.sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    for n_seq in [1usize, 4, 8] {
        let p = params(2048).n_seq_max(8).kv_unified(true);
        let mut ctx = model().new_context(&p).expect("context");
        for seq in 0..n_seq {
            decode_prompt(&mut ctx, &prompt(PROMPT, seq as u64), 0, seq as i32);
        }
        let mut batch = Batch::new(n_seq, 1);
        group.throughput(Throughput::Elements(n_seq as u64));
        group.bench_function(BenchmarkId::from_parameter(n_seq), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for i in 0..iters {
                    batch.clear();
                    for seq in 0..n_seq {
                        let token = Token(2000 + ((i as usize * 8 + seq) % 5000) as i32);
                        batch.push(token, PROMPT as i32, &[seq as i32], Logits::Yes).expect("fits");
                    }
                    let start = Instant::now();
                    ctx.decode(&batch).expect("decode");
                    ctx.synchronize();
                    total += start.elapsed();
                    ctx.seq_rm(None, Some(PROMPT as i32), None).expect("all sequences");
                }
                total
            })
        });
    }
    group.finish();
}

fn kv_type(c: &mut Criterion) {
    const DEPTH: usize = 1024;
    let mut group = c.benchmark_group("kv_type");
    group.sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(1));
    for (name, kind) in [("f16", KvType::F16), ("q8_0", KvType::Q8_0)] {
        let mut ctx = model().new_context(&params(2048).kv_type(kind)).expect("context");
        decode_prompt(&mut ctx, &prompt(DEPTH, 11), 0, 0);
        let kv_bytes = ctx.save_seq_state(0).expect("state").len();
        eprintln!("kv_type/{name}: KV cache of sequence 0 at depth {DEPTH}: {kv_bytes} bytes");
        let mut batch = Batch::new(1, 1);
        group.bench_function(name, |b| b.iter_custom(|iters| step_at_depth(&mut ctx, &mut batch, DEPTH, iters)));
    }
    group.finish();
}

fn prompt_cache(c: &mut Criterion) {
    const PREFIX: usize = 1024;
    const SUFFIX: usize = 16;
    let mut group = c.benchmark_group("prompt_cache");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    let full = prompt(PREFIX + SUFFIX, 13);
    let mut ctx = model().new_context(&params(2048)).expect("context");
    let mut sampler = Sampler::greedy();
    let mut first_token = |ctx: &mut Context<'_>, from: usize| {
        decode_prompt(ctx, &full[from..], from as i32, 0);
        black_box(sampler.sample(ctx, Output::Last).expect("sample"))
    };
    group.bench_function("cold", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                ctx.clear_kv();
                let start = Instant::now();
                first_token(&mut ctx, 0);
                total += start.elapsed();
            }
            total
        })
    });
    ctx.clear_kv();
    decode_prompt(&mut ctx, &full[..PREFIX], 0, 0);
    group.bench_function("reused", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                ctx.seq_rm(Some(0), Some(PREFIX as i32), None).expect("seq 0");
                let start = Instant::now();
                first_token(&mut ctx, PREFIX);
                total += start.elapsed();
            }
            total
        })
    });
    group.finish();
}

fn sampling(c: &mut Criterion) {
    let mut group = c.benchmark_group("sampling");
    group.sample_size(30).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let mut ctx = model().new_context(&params(512)).expect("context");
    decode_prompt(&mut ctx, &prompt(32, 17), 0, 0);
    let top_k = || llamacpp::SamplerChain::new().top_k(40).top_p(0.95, 1).temp(0.8).dist(1234).build().expect("chain");
    for (name, mut ours, mut upstream) in
        [("greedy", Sampler::greedy(), Sampler::greedy()), ("top-k-p-temp", top_k(), top_k())]
    {
        group.bench_function(BenchmarkId::new(name, "ours"), |b| {
            b.iter(|| ours.sample(&mut ctx, Output::Last).expect("sample"))
        });
        group.bench_function(BenchmarkId::new(name, "llama.cpp"), |b| {
            b.iter(|| {
                // SAFETY: a chain ending in a selecting sampler; the last
                // decode requested logits for its last token.
                unsafe { llamacpp::sys::llama_sampler_sample(upstream.as_ptr(), ctx.as_ptr(), -1) }
            })
        });
    }
    group.finish();
}

fn validation(c: &mut Criterion) {
    let mut group = c.benchmark_group("validation");
    group.sample_size(30).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let mut ctx = model().new_context(&params(1024)).expect("context");
    for n in [1usize, 512] {
        let mut tokens = prompt(n, 19);
        // An id outside the vocabulary at the very end: every check runs,
        // then decode returns Err before llama.cpp is called.
        *tokens.last_mut().expect("n > 0") = Token(i32::MAX);
        let batch = Batch::from_tokens(&tokens, 0);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| assert!(ctx.decode(black_box(&batch)).is_err()))
        });
    }
    group.finish();
}

fn engine(c: &mut Criterion) {
    use llamacpp::engine::{Completion, Engine, EngineConfig, Request};
    const PROMPT: usize = 32;
    const NEW: usize = 32;
    let path = llama_suite::model_cache::model_path().unwrap_or_else(|e| panic!("no model: {e}"));
    let model = std::sync::Arc::new(Model::load(&path, &ModelParams::default()).expect("model"));
    let mut group = c.benchmark_group("engine");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    for n in [1usize, 4, 8, 16] {
        let config = EngineConfig::default().n_ctx(4096).max_running(16).n_threads(threads());
        let engine = Engine::start(model.clone(), config).expect("engine");
        let mut round = 0u64;
        group.throughput(Throughput::Elements((n * NEW) as u64));
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                round += 1;
                // Fresh prompts every round: nothing comes from the prefix cache.
                let completions: Vec<Completion> = (0..n)
                    .map(|i| {
                        let request =
                            Request::tokens(prompt(PROMPT, round * 1000 + i as u64)).max_tokens(NEW).stop_at_eog(false);
                        engine.submit(request).expect("submit")
                    })
                    .collect();
                for completion in completions {
                    black_box(completion.wait());
                }
            })
        });
    }
    group.finish();
}

fn engine_mix(c: &mut Criterion) {
    use llamacpp::SamplingParams;
    use llamacpp::constraint::{Constraint, JsonOptions};
    use llamacpp::engine::{Completion, Engine, EngineConfig, Request};
    const PROMPT: usize = 32;
    const NEW: usize = 32;
    const STREAMS: usize = 8;
    let path = llama_suite::model_cache::model_path().unwrap_or_else(|e| panic!("no model: {e}"));
    let model = std::sync::Arc::new(Model::load(&path, &ModelParams::default()).expect("model"));
    let schema = serde_json::json!({"type": "array", "items": {"type": "string"}, "minItems": 50});
    let constrained =
        SamplingParams::greedy().constraint(Constraint::json_schema(schema).with_json_options(JsonOptions::tight()));
    let mut group = c.benchmark_group("engine_mix");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(8));
    group.throughput(Throughput::Elements((STREAMS * NEW) as u64));
    let config = EngineConfig::default().n_ctx(4096).max_running(16).n_threads(threads());
    let engine = Engine::start(model.clone(), config).expect("engine");
    let mut round = 0u64;
    for mixed in [false, true] {
        group.bench_function(if mixed { "mixed" } else { "plain" }, |b| {
            b.iter(|| {
                round += 1;
                let completions: Vec<Completion> = (0..STREAMS)
                    .map(|i| {
                        let mut request =
                            Request::tokens(prompt(PROMPT, round * 1000 + i as u64)).max_tokens(NEW).stop_at_eog(false);
                        if mixed && i % 2 == 0 {
                            request = request.sampling(constrained.clone());
                        }
                        engine.submit(request).expect("submit")
                    })
                    .collect();
                for completion in completions {
                    let out = completion.wait();
                    assert_eq!(out.tokens.len(), NEW, "{:?}", out.finish.reason);
                }
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    prefill,
    decode,
    batched_decode,
    kv_type,
    prompt_cache,
    sampling,
    validation,
    engine,
    engine_mix
);
criterion_main!(benches);
