//! A small program for valgrind's memcheck: loads the synthetic tiny model
//! (written to a temporary folder), creates a context, decodes a prompt,
//! samples a few tokens greedily and with a sampler chain, runs a short
//! generation, loads a vocab-only model, and drops everything. Every
//! allocation of the safe crate and of llama.cpp made on the way must be
//! freed by the end.
//!
//! ```text
//! cargo build --example memcheck
//! valgrind --leak-check=full --error-exitcode=1 target/debug/examples/memcheck      # 1 thread
//! valgrind --leak-check=full --error-exitcode=1 target/debug/examples/memcheck 2    # 2 threads (OpenMP)
//! ```
//!
//! The optional argument is the number of decode threads (default 1).
//!
//! Results (2026-12-01, valgrind 3.19.0, x86-64 Linux, llama.cpp built
//! Release with OpenMP, this crate in the dev profile; 7 s with 1 thread, 13 s with 2):
//!
//! - 1 thread: exit status 0.
//!   `definitely lost: 0 bytes in 0 blocks`,
//!   `indirectly lost: 0 bytes in 0 blocks`,
//!   `possibly lost: 0 bytes in 0 blocks`,
//!   `still reachable: 560 bytes in 3 blocks`,
//!   `ERROR SUMMARY: 0 errors from 0 contexts`; 171,586 allocations,
//!   171,583 frees, 88 MB allocated. The three reachable blocks are
//!   process-lifetime singletons: libgomp's initialisation (8 bytes, from
//!   `_dl_init`), ggml's CPU repack buffer type (8 bytes, a static in
//!   `ggml_backend_cpu_repack_buffer_type`), and std's main-thread
//!   stack-overflow guard record (544 bytes).
//! - 2 threads: exit status 1, only because of OpenMP's worker pool,
//!   which libgomp keeps alive until exit:
//!   `definitely lost: 0 bytes in 0 blocks`,
//!   `indirectly lost: 0 bytes in 0 blocks`,
//!   `possibly lost: 320 bytes in 1 blocks` (the worker thread's TLS,
//!   `pthread_create` in `GOMP_parallel` from `ggml_graph_compute`),
//!   `still reachable: 2,568 bytes in 6 blocks` (the above plus libgomp's
//!   team and pool, also from `GOMP_parallel`),
//!   `ERROR SUMMARY: 1 errors from 1 contexts` (that possibly-lost block).
//!   With 4 threads: 960 bytes possibly lost in 3 blocks (one per extra
//!   worker), still 0 definitely or indirectly lost. Add
//!   `--errors-for-leak-kinds=definite` to make only definite leaks fail.
//! - No invalid reads or writes, no use of uninitialised values, no
//!   mismatched frees in any run.
//! - The check can fail: forgetting (`std::mem::forget`) the vocab-only
//!   model at the end makes memcheck report 12,255,393 bytes possibly lost
//!   in 101,052 blocks and exit 1.
//!
//! The temporary folder is made by hand, not with `tempfile`: `tempfile`
//! seeds its random names from `std::thread::current()`, whose handle std
//! keeps in a thread-local that memcheck reports as 48 bytes "possibly
//! lost" at exit, which would fail the 1-thread run for no leak of ours.
//!
//! Without valgrind it prints the sampled text and exits 0.

use std::path::{Path, PathBuf};

use llama_suite::synthetic::{TinyModelSpec, write_tiny_llama};
use llamacpp::generate::{GenerateOptions, Session};
use llamacpp::{AddBos, Batch, ContextParams, Detokenizer, Model, ModelParams, Output, Sampler, SamplerChain, Special};

/// A folder of this process under the system's temporary folder, removed
/// on drop (not `tempfile`: see the top of this file).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<TempDir> {
        let path = std::env::temp_dir().join(format!("llama-rs-memcheck-{}", std::process::id()));
        std::fs::create_dir_all(&path)?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n_threads: i32 = match std::env::args().nth(1) {
        Some(arg) => arg.parse()?,
        None => 1,
    };
    let dir = TempDir::new()?;
    let path = dir.0.join("tiny.gguf");
    write_tiny_llama(&path, &TinyModelSpec::default())?;

    {
        let model = Model::load(&path, &ModelParams::default())?;
        let params = ContextParams::default()
            .n_ctx(256)
            .n_batch(32)
            .n_ubatch(32)
            .n_threads(n_threads)
            .n_threads_batch(n_threads);
        let mut ctx = model.new_context(&params)?;
        let vocab = model.vocab();
        let prompt = vocab.tokenize("Hello world, the quick brown llama", AddBos::Yes)?;

        // Decode the prompt, then a few tokens one at a time, greedily.
        ctx.decode(&Batch::from_tokens(&prompt, 0))?;
        let mut greedy = Sampler::greedy();
        let mut detokenizer = Detokenizer::new(vocab, Special::Plain);
        let mut text = String::new();
        let n_prompt = prompt.len() as i32;
        for pos in n_prompt..n_prompt + 4 {
            let token = greedy.sample(&mut ctx, Output::Last)?;
            detokenizer.push(token, &mut text)?;
            ctx.decode(&Batch::from_tokens(&[token], pos))?;
        }
        text.push_str(&detokenizer.finish());
        println!("greedy: {text:?}");

        // A chain that keeps a pointer to the vocabulary (grammar) and one
        // with RNG state.
        let mut chain =
            SamplerChain::new().grammar(vocab, r#"root ::= [a-z ]+"#, "root").top_k(8).temp(0.8).dist(7).build()?;
        let token = chain.sample(&mut ctx, Output::Last)?;
        println!("chain: {:?}", vocab.detokenize(&[token], AddBos::No, Special::Plain)?);
        drop(chain);

        // A short generation through the high-level API, on a fresh context.
        drop(ctx);
        let mut ctx = model.new_context(&params)?;
        let mut session = Session::new();
        let mut generation =
            session.generate(&mut ctx, &mut greedy, &prompt, &GenerateOptions::default().max_tokens(4))?;
        let mut generated = String::new();
        while let Some(piece) = generation.next_piece() {
            generated.push_str(piece?);
        }
        println!("generated: {generated:?}");
    }

    // A vocab-only model with a real tokenizer.
    let vocab_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf");
    if vocab_path.exists() {
        let model = Model::load(&vocab_path, &ModelParams::default().vocab_only(true))?;
        let tokens = model.vocab().tokenize("Hello world", AddBos::No)?;
        println!("gpt-2 tokens: {}", tokens.len());
    }
    Ok(())
}
