//! Greedy generation that says which CPU variant ran it: the program
//! `tests/it/cpu_dispatch.rs` runs under emulated CPUs (qemu-user) and with
//! each variant forced through `LLAMA_CPU_VARIANT`.
//!
//! ```text
//! cargo run --example cpu_dispatch -- MODEL.gguf N PROMPT...
//! ```
//!
//! `cargo run --example cpu_dispatch -- --avx2-probe` runs one AVX2
//! instruction and nothing else: on a CPU without AVX2 (an emulated
//! Nehalem) it dies with SIGILL, which shows that the emulation enforces
//! the instruction set the dispatch tests rely on.
//!
//! Each PROMPT is a comma-separated list of token ids. Prints
//! `variant NAME score S forced F built B` (`none` and 0 without runtime
//! dispatch; F is `unset`, `yes` or `ignored`; B the number of variants
//! built in), then for each prompt the N token ids
//! greedy decoding generates, space-separated, one context per prompt on
//! one thread.

use std::process::ExitCode;

use llamacpp::{ContextParams, Model, ModelParams, Output, Sampler, Token};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cpu_dispatch: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--avx2-probe") {
        avx2_probe();
        println!("avx2 ran");
        return Ok(());
    }
    let [model, n, prompts @ ..] = args.as_slice() else {
        return Err("usage: cpu_dispatch MODEL.gguf N PROMPT... (token ids, comma-separated)".to_owned());
    };
    let n: usize = n.parse().map_err(|_| format!("N must be a count, not {n:?}"))?;
    let prompts = prompts
        .iter()
        .map(|p| {
            p.split(',')
                .map(|t| t.trim().parse::<i32>().map(Token).map_err(|_| format!("bad token id in {p:?}")))
                .collect()
        })
        .collect::<Result<Vec<Vec<Token>>, String>>()?;

    let model = Model::load(model, &ModelParams::default()).map_err(|e| e.to_string())?;
    let forced = match llamacpp_sys::cpu_variant_forced() {
        None => "unset",
        Some(true) => "yes",
        Some(false) => "ignored",
    };
    println!(
        "variant {} score {} forced {forced} built {}",
        llamacpp::cpu_variant().unwrap_or("none"),
        llamacpp_sys::cpu_variant_score(),
        llamacpp::cpu_variants().len()
    );
    let params = ContextParams::default().n_ctx(256).n_batch(256).n_ubatch(256).n_threads(1);
    for prompt in &prompts {
        let mut ctx = model.new_context(&params).map_err(|e| e.to_string())?;
        ctx.eval(prompt, 0).map_err(|e| e.to_string())?;
        let mut greedy = Sampler::greedy();
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let token = greedy.sample(&mut ctx, Output::Last).map_err(|e| e.to_string())?;
            out.push(token.0.to_string());
            ctx.eval(&[token], 0).map_err(|e| e.to_string())?;
        }
        println!("{}", out.join(" "));
    }
    Ok(())
}

/// Executes one AVX2 instruction. A CPU without AVX2 raises #UD on it and
/// the kernel ends the process with SIGILL: the probe's purpose.
fn avx2_probe() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `vpaddd` reads and writes only ymm0 (xmm0, declared
    // clobbered, is its low half; this function has no AVX code whose
    // upper halves it could disturb, and `vzeroupper` clears them); no
    // memory or flags are touched. Where the CPU lacks AVX2 the
    // instruction traps (SIGILL) instead of executing: a defined outcome
    // of the hardware, which the test expects.
    unsafe {
        std::arch::asm!("vpaddd ymm0, ymm0, ymm0", "vzeroupper", out("xmm0") _, options(nomem, nostack, preserves_flags));
    }
}
