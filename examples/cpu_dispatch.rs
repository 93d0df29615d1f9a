//! Greedy generation that says which CPU variant ran it: the program
//! `tests/it/cpu_dispatch.rs` runs under emulated CPUs (qemu-user) and with
//! each variant forced through `LLAMA_CPU_VARIANT`.
//!
//! ```text
//! cargo run --example cpu_dispatch -- MODEL.gguf N PROMPT...
//! ```
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
