//! Prints llama-bench-shaped rows (pp N, tg N: mean ± sd tokens/s over `-r`
//! repetitions), measured through the safe `llamacpp` API, so they can be put
//! beside `llama-bench -m MODEL -t T` built from the same llama.cpp source.
//!
//! The method follows llama-bench: random tokens (BOS first), prompts in
//! chunks of n_batch with only the last token requesting logits, one
//! synchronize per test; generation as single-token decodes with a
//! synchronize after each; a warmup run first; the KV cache cleared before
//! every repetition; `n_ctx = p + n`, F16 KV cache, flash attention auto,
//! `swa_full` off.
//!
//! Extra rows (`--sampling`) time the same generation with a sampler in the
//! loop: our greedy and top-k fast paths, and llama.cpp's own
//! `llama_sampler_sample`, to show what sampling adds per token; and the
//! whole streaming generator (`llamacpp::generate`: sampling, detokenizing,
//! stop-string checks) from a one-token prompt.
//!
//! ```sh
//! cargo run --release --example bench -- -p 512 -n 128 -r 5 -t 2 --sampling
//! ```

use std::ops::ControlFlow;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use llamacpp::generate::{GenerateOptions, Session};
use llamacpp::{Batch, Context, ContextParams, Logits, Model, ModelParams, Output, Sampler, SamplerChain, Token};

#[derive(Parser, Debug)]
#[command(about = "llama-bench-shaped prefill/decode numbers through the llamacpp crate")]
struct Args {
    /// GGUF model (default: LLAMA_MODEL or the cached default model).
    #[arg(short, long)]
    model: Option<std::path::PathBuf>,
    /// Prompt lengths to test (pp rows), comma-separated.
    #[arg(short = 'p', long, value_delimiter = ',', default_value = "512")]
    n_prompt: Vec<usize>,
    /// Generation lengths to test (tg rows), comma-separated.
    #[arg(short = 'n', long, value_delimiter = ',', default_value = "128")]
    n_gen: Vec<usize>,
    /// Repetitions per test.
    #[arg(short = 'r', long, default_value_t = 5)]
    reps: usize,
    /// Threads (default: LLAMA_BENCH_THREADS, else 2).
    #[arg(short = 't', long)]
    threads: Option<i32>,
    /// Logical batch size.
    #[arg(short = 'b', long, default_value_t = 2048)]
    batch: u32,
    /// Physical batch size.
    #[arg(long, default_value_t = 512)]
    ubatch: u32,
    /// Skip the warmup run.
    #[arg(long)]
    no_warmup: bool,
    /// Also time generation with sampling in the loop, and the generator.
    #[arg(long)]
    sampling: bool,
    /// Layers to offload to GPUs or RPC workers (llama-bench's -ngl).
    /// Default: as many as fit each device's free memory less 1 GiB (none
    /// in a CPU-only build).
    #[arg(long = "gpu-layers", alias = "ngl", allow_negative_numbers = true)]
    gpu_layers: Option<i32>,
    /// RPC workers, `host:port,...` (llama-bench's --rpc; feature `rpc`).
    #[arg(long, value_delimiter = ',')]
    rpc: Vec<String>,
}

/// llama-bench uses `std::rand() % n_vocab`; any cheap generator will do.
struct Rng(u64);

impl Rng {
    fn token(&mut self, n_vocab: usize) -> Token {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Token((self.0 % n_vocab as u64) as i32)
    }
}

/// How the generation loop picks the next token.
enum Picker<'a> {
    /// A random token, as llama-bench does (no sampling cost).
    Random,
    /// Our `Sampler::sample` (fast paths where the chain allows).
    Ours(&'a mut Sampler<'static>),
    /// llama.cpp's `llama_sampler_sample` on the same kind of chain.
    Upstream(&'a mut Sampler<'static>),
}

fn first_token(model: &Model, rng: &mut Rng, processed: usize) -> Token {
    match model.vocab().bos() {
        Some(bos) if processed == 0 && model.vocab().adds_bos() => bos,
        _ => rng.token(model.vocab().n_tokens()),
    }
}

fn run_prompt(
    ctx: &mut Context<'_>,
    model: &Model,
    batch: &mut Batch,
    n_prompt: usize,
    rng: &mut Rng,
) -> llamacpp::Result<()> {
    let n_vocab = model.vocab().n_tokens();
    let n_batch = ctx.n_batch() as usize;
    let mut processed = 0;
    let mut tokens = Vec::with_capacity(n_batch);
    while processed < n_prompt {
        let n = (n_prompt - processed).min(n_batch);
        tokens.clear();
        tokens.push(first_token(model, rng, processed));
        tokens.extend((1..n).map(|_| rng.token(n_vocab)));
        let start = ctx.seq_pos_max(0)?.map_or(0, |p| p + 1);
        batch.clear();
        batch.push_sequence(&tokens, start, 0, Logits::Yes)?;
        ctx.decode(batch)?;
        processed += n;
    }
    ctx.synchronize();
    Ok(())
}

fn run_gen(
    ctx: &mut Context<'_>,
    model: &Model,
    batch: &mut Batch,
    n_gen: usize,
    rng: &mut Rng,
    picker: &mut Picker<'_>,
) -> llamacpp::Result<()> {
    let n_vocab = model.vocab().n_tokens();
    let mut token = first_token(model, rng, 0);
    let start = ctx.seq_pos_max(0)?.map_or(0, |p| p + 1);
    for pos in start..start + n_gen as i32 {
        batch.clear();
        batch.push(token, pos, &[0], Logits::Yes)?;
        ctx.decode(batch)?;
        token = match picker {
            Picker::Random => {
                ctx.synchronize();
                rng.token(n_vocab)
            }
            Picker::Ours(sampler) => sampler.sample(ctx, Output::Last)?,
            Picker::Upstream(sampler) => {
                // SAFETY: a chain that ends in a selecting sampler, and a
                // context whose last batch requested logits for its token.
                let raw = unsafe { llamacpp::sys::llama_sampler_sample(sampler.as_ptr(), ctx.as_ptr(), -1) };
                Token(raw)
            }
        };
    }
    Ok(())
}

fn mean_sd(samples: &[f64]) -> (f64, f64) {
    let n = samples.len() as f64;
    let mean = samples.iter().sum::<f64>() / n;
    let var = if samples.len() > 1 { samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

struct Bench<'m> {
    model: &'m Model,
    args: &'m Args,
    threads: i32,
}

impl Bench<'_> {
    fn context(&self, n_ctx: usize) -> llamacpp::Result<Context<'_>> {
        let params = ContextParams::default()
            .n_ctx(n_ctx as u32)
            .n_batch(self.args.batch)
            .n_ubatch(self.args.ubatch)
            .n_threads(self.threads)
            .n_threads_batch(self.threads)
            .swa_full(false)
            .perf(false);
        self.model.new_context(&params)
    }

    /// One llama-bench test: warmup, then `reps` timed runs from an empty cache.
    fn test(&self, n_prompt: usize, n_gen: usize, mut picker: Picker<'_>) -> llamacpp::Result<Vec<f64>> {
        let mut ctx = self.context(n_prompt + n_gen)?;
        let mut batch = Batch::new(ctx.n_batch() as usize, 1);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        if !self.args.no_warmup {
            if n_prompt > 0 {
                run_prompt(&mut ctx, self.model, &mut batch, n_prompt, &mut rng)?;
            }
            if n_gen > 0 {
                run_gen(&mut ctx, self.model, &mut batch, 1, &mut rng, &mut picker)?;
            }
        }
        let mut samples = Vec::with_capacity(self.args.reps);
        for _ in 0..self.args.reps {
            ctx.clear_kv();
            let start = Instant::now();
            if n_prompt > 0 {
                run_prompt(&mut ctx, self.model, &mut batch, n_prompt, &mut rng)?;
            }
            if n_gen > 0 {
                run_gen(&mut ctx, self.model, &mut batch, n_gen, &mut rng, &mut picker)?;
            }
            samples.push((n_prompt + n_gen) as f64 / start.elapsed().as_secs_f64());
        }
        Ok(samples)
    }

    /// `reps` runs of the streaming generator producing `n_gen` tokens from
    /// a one-token prompt: n_gen decodes, samples and detokenizations.
    fn generator(&self, n_gen: usize, sampler: &mut Sampler<'static>) -> llamacpp::Result<Vec<f64>> {
        let mut ctx = self.context(n_gen + 1)?;
        let prompt = [first_token(self.model, &mut Rng(1), 0)];
        let options = GenerateOptions::default().max_tokens(n_gen).stop_at_eog(false);
        let mut samples = Vec::with_capacity(self.args.reps);
        for rep in 0..=self.args.reps {
            ctx.clear_kv();
            let mut session = Session::new();
            let start = Instant::now();
            let stats =
                session.generate(&mut ctx, sampler, &prompt, &options)?.stream(|_| ControlFlow::Continue(()))?;
            let elapsed = start.elapsed().as_secs_f64();
            // The first run is the warmup.
            if rep > 0 {
                samples.push(stats.generated_tokens as f64 / elapsed);
            }
        }
        Ok(samples)
    }

    /// The device the layers run on, as llama-bench's column names it:
    /// the first GPU's name (`CUDA0`, `Vulkan0`) when layers are offloaded
    /// to one, else `CPU`.
    fn backend(&self) -> String {
        let gpu = llamacpp::devices()
            .into_iter()
            .find(|d| matches!(d.kind, llamacpp::DeviceKind::Gpu | llamacpp::DeviceKind::IntegratedGpu));
        match gpu {
            Some(d) if self.model.n_gpu_layers() != 0 => d.name,
            _ => "CPU".to_owned(),
        }
    }

    fn row(&self, test: &str, samples: &[f64]) {
        let (mean, sd) = mean_sd(samples);
        println!(
            "| {} | {:.2} MiB | {:.2} M | {} | {} | {test} | {mean:.2} ± {sd:.2} |",
            self.model.description(),
            self.model.size() as f64 / (1024.0 * 1024.0),
            self.model.n_params() as f64 / 1e6,
            self.backend(),
            self.threads
        );
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let path = match &args.model {
        Some(p) => p.clone(),
        None => llama_suite::model_cache::model_path()?,
    };
    let threads = match args.threads {
        Some(t) => t,
        None => std::env::var("LLAMA_BENCH_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(2),
    };
    let mut params = ModelParams::default().rpc_servers(args.rpc.clone());
    if let Some(n) = args.gpu_layers {
        params = params.n_gpu_layers(n);
    }
    let model = Model::load(&path, &params)?;
    let bench = Bench { model: &model, args, threads };
    println!("| model | size | params | backend | threads | test | t/s |");
    println!("| --- | ---: | ---: | --- | ---: | --- | ---: |");
    for &p in &args.n_prompt {
        if p > 0 {
            bench.row(&format!("pp{p}"), &bench.test(p, 0, Picker::Random)?);
        }
    }
    for &n in &args.n_gen {
        if n == 0 {
            continue;
        }
        bench.row(&format!("tg{n}"), &bench.test(0, n, Picker::Random)?);
        if args.sampling {
            let top_k = || SamplerChain::new().top_k(40).top_p(0.95, 1).temp(0.8).dist(1234).build();
            let mut greedy = Sampler::greedy();
            bench.row(&format!("tg{n} +greedy (ours)"), &bench.test(0, n, Picker::Ours(&mut greedy))?);
            let mut greedy = Sampler::greedy();
            bench.row(&format!("tg{n} +greedy (llama.cpp)"), &bench.test(0, n, Picker::Upstream(&mut greedy))?);
            let mut sampler = top_k()?;
            bench.row(&format!("tg{n} +top-k/p/temp (ours)"), &bench.test(0, n, Picker::Ours(&mut sampler))?);
            let mut sampler = top_k()?;
            bench.row(&format!("tg{n} +top-k/p/temp (llama.cpp)"), &bench.test(0, n, Picker::Upstream(&mut sampler))?);
            let mut greedy = Sampler::greedy();
            bench.row(&format!("tg{n} generate, greedy"), &bench.generator(n, &mut greedy)?);
            let mut sampler = top_k()?;
            bench.row(&format!("tg{n} generate, top-k/p/temp"), &bench.generator(n, &mut sampler)?);
        }
    }
    Ok(())
}

pub(crate) fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
