//! Runtime CPU dispatch, run: `examples/cpu_dispatch` (greedy generation on
//! the synthetic model that prints the variant it ran on) with each
//! variant this CPU supports forced, and under CPUs emulated by qemu-user
//! (`qemu-x86_64 -cpu Nehalem`: SSE4.2, no AVX; `-cpu Haswell`: AVX2 and
//! FMA, no AVX-512). Tokens are compared with the unforced native run on
//! prompts whose greedy choices are decisive (margins of at least
//! `DECISIVE`), since each variant rounds in its own way.
//!
//! That the emulation enforces the instruction set, so that the dispatch
//! case proves something, is shown by the example's AVX2 probe, which the
//! emulated Nehalem kills with SIGILL; a `native` build (`--features
//! native`) does not dispatch, and there the emulated Nehalem must kill the
//! program itself.
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Output};

use llama_suite::synthetic::{TinyModelSpec, tiny_llama_path};
use llama_suite::teacher::rescore;
use llamacpp::{AddBos, Model, ModelParams, Token};

/// Top-two logit margin below which rounding may flip a greedy choice.
const DECISIVE: f32 = 2e-2;
/// Tokens generated per prompt.
const N: usize = 12;
/// The signal of an illegal instruction on Linux.
const SIGILL: i32 = 4;

fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join("examples").join("cpu_dispatch");
    assert!(path.exists(), "{} is built by `cargo test`", path.display());
    path
}

/// What one run printed.
#[derive(Debug)]
struct Run {
    variant: String,
    forced: String,
    tokens: Vec<Vec<Token>>,
}

fn parse(out: &Output, what: &str) -> Run {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: {} \n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    let head: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert!(matches!(head.as_slice(), ["variant", _, "score", _, "forced", _, "built", _]), "{what}: {stdout}");
    assert_eq!(
        head[7].parse::<usize>().ok(),
        Some(llamacpp::cpu_variants().len()),
        "{what}: the example was built with other features than this test (`cargo test --test it` builds no \
         examples): build it with the same ones, e.g. `cargo build --example cpu_dispatch --no-default-features`"
    );
    let tokens = lines.map(|l| l.split_whitespace().map(|t| Token(t.parse().unwrap())).collect()).collect();
    Run { variant: head[1].to_owned(), forced: head[5].to_owned(), tokens }
}

/// The synthetic model (loaded here for re-scoring), the prompts, and the
/// arguments that make the example generate their `N`-token greedy
/// continuations.
struct Cases {
    model: Model,
    prompts: Vec<Vec<Token>>,
    args: Vec<String>,
}

fn cases() -> Cases {
    let model_path = tiny_llama_path(&TinyModelSpec::default()).expect("write the tiny model");
    let model = Model::load(&model_path, &ModelParams::default()).unwrap();
    let prompts: Vec<Vec<Token>> =
        ["Hello world", "The quick brown fox", "one two three four", "abc abc abc", "zebra", "42 is", "x y z"]
            .iter()
            .map(|text| model.vocab().tokenize(text, AddBos::Yes).unwrap())
            .collect();
    let mut args = vec![model_path.display().to_string(), N.to_string()];
    args.extend(prompts.iter().map(|p| p.iter().map(|t| t.0.to_string()).collect::<Vec<_>>().join(",")));
    Cases { model, prompts, args }
}

/// The prompts of `reference` whose continuations are decisive.
fn decisive(cases: &Cases, reference: &Run) -> Vec<usize> {
    let picked: Vec<usize> = (0..cases.prompts.len())
        .filter(|&i| {
            let check = rescore(&cases.model, &cases.prompts[i], &reference.tokens[i]).unwrap();
            check.worst() == 0.0 && check.first_near_tie(DECISIVE).is_none()
        })
        .collect();
    assert!(picked.len() >= 3, "only {} of {} prompts are decisive", picked.len(), cases.prompts.len());
    picked
}

fn assert_same_tokens(what: &str, run: &Run, reference: &Run, picked: &[usize]) {
    assert_eq!(run.tokens.len(), reference.tokens.len(), "{what}");
    for &i in picked {
        assert_eq!(
            run.tokens[i], reference.tokens[i],
            "{what}: prompt {i} ({} ran, {} is the reference)",
            run.variant, reference.variant
        );
    }
}

fn native_run(cases: &Cases, env: Option<(&str, &str)>) -> Run {
    let mut command = Command::new(example());
    command.args(&cases.args).env_remove("LLAMA_CPU_VARIANT");
    if let Some((k, v)) = env {
        command.env(k, v);
    }
    parse(&command.output().unwrap(), &format!("{command:?}"))
}

fn qemu() -> PathBuf {
    let found = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|d| d.join("qemu-x86_64")).find(|p| p.is_file()));
    found.unwrap_or_else(|| {
        panic!(
            "qemu-x86_64 is not installed, so CPUs without AVX and without AVX-512 cannot be emulated: install \
             qemu-user (Debian/Ubuntu: apt-get install qemu-user; CI's setup stage does)"
        )
    })
}

fn emulated(cpu: &str, cases: &Cases) -> Output {
    Command::new(qemu())
        .args(["-cpu", cpu])
        .arg(example())
        .args(&cases.args)
        .env_remove("LLAMA_CPU_VARIANT")
        .output()
        .unwrap()
}

/// That `what` on an emulated CPU without AVX died with SIGILL: else the
/// emulation does not enforce the instruction set and proves nothing.
fn assert_died_of_sigill(out: &Output, what: &str) {
    assert_eq!(
        out.status.signal(),
        Some(SIGILL),
        "{what} on an emulated CPU without AVX must die with SIGILL, or the emulation proves nothing: {} {} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The best of `ladder` (variants in increasing score, each needing a
/// subset of the emulated CPU's features) that this build has.
fn expected(ladder: &[&'static str]) -> &'static str {
    ladder.iter().rev().copied().find(|v| llamacpp::cpu_variants().contains(v)).expect("the baseline is always built")
}

#[test]
#[cfg_attr(feature = "native", ignore = "a `native` build has one CPU backend: run the suite without it")]
fn every_variant_this_cpu_runs_generates_the_same_tokens() {
    let built = llamacpp::cpu_variants();
    assert!(
        built.len() >= 2 && built[0] == "x64",
        "a build without `native` on x86-64 Linux dispatches between ggml's CPU variants (unless \
         LLAMA_SYS_CPU_VARIANTS=none): {built:?}"
    );
    let cases = cases();
    let reference = native_run(&cases, None);
    assert_eq!(reference.forced, "unset");
    assert_eq!(Some(reference.variant.as_str()), llamacpp::cpu_variant(), "the example and this process agree");
    let picked = decisive(&cases, &reference);

    let mut ran = Vec::new();
    for variant in built {
        let run = native_run(&cases, Some(("LLAMA_CPU_VARIANT", variant)));
        match run.forced.as_str() {
            "yes" => {
                assert_eq!(run.variant, *variant);
                assert_same_tokens(&format!("LLAMA_CPU_VARIANT={variant}"), &run, &reference, &picked);
                ran.push(*variant);
            }
            "ignored" => assert_eq!(run.variant, reference.variant, "an unsupported variant falls back to the best"),
            other => panic!("LLAMA_CPU_VARIANT={variant}: forced {other}"),
        }
    }
    assert!(ran.contains(&"x64") && ran.contains(&reference.variant.as_str()), "ran {ran:?}");
    eprintln!("variants run here: {ran:?} of {built:?}; the best is {}", reference.variant);
    let bogus = native_run(&cases, Some(("LLAMA_CPU_VARIANT", "pentium3")));
    assert_eq!((bogus.forced.as_str(), bogus.variant.as_str()), ("ignored", reference.variant.as_str()));
}

#[test]
#[ignore = "opt-in: needs qemu-user (apt-get install qemu-user), which the README does not require; run it with \
            `cargo test --test it -- --ignored cpu_dispatch::emulated` (CI does)"]
fn emulated_cpus_pick_their_variant_or_a_native_build_dies() {
    let cases = cases();
    if cfg!(feature = "native") {
        let out = emulated("Nehalem", &cases);
        if out.status.success() {
            // Names a copy of the example built with other features.
            parse(&out, "qemu-x86_64 -cpu Nehalem");
        }
        assert_died_of_sigill(&out, "a native build");
        return;
    }
    // The control: an AVX2 instruction on the emulated Nehalem traps.
    let probe = Command::new(qemu()).args(["-cpu", "Nehalem"]).arg(example()).arg("--avx2-probe").output().unwrap();
    assert_died_of_sigill(&probe, "an AVX2 instruction");
    let reference = native_run(&cases, None);
    let picked = decisive(&cases, &reference);
    for (cpu, ladder) in [
        ("Nehalem", &["x64", "sse42"][..]),
        ("Haswell", &["x64", "sse42", "sandybridge", "ivybridge", "piledriver", "haswell"][..]),
    ] {
        let run = parse(&emulated(cpu, &cases), &format!("qemu-x86_64 -cpu {cpu}"));
        let want = if llamacpp::cpu_variants().is_empty() { "none" } else { expected(ladder) };
        assert_eq!(run.variant, want, "-cpu {cpu}");
        assert_same_tokens(&format!("-cpu {cpu}"), &run, &reference, &picked);
    }
}
