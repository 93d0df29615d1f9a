//! Inputs that make llama.cpp recurse once per character or nesting level
//! (`std::regex` pre-tokenizers, the GBNF parser, lazy-grammar trigger
//! patterns), each run on a thread with a small stack: without the
//! crate's deep-stack helper (`llamacpp/src/llama/stack.rs`) every one of them
//! overflows that stack.
//!
//! A stack overflow kills the whole process, so each case runs in a child
//! process (`safe_api::isolated_with_stack`): a regression fails exactly
//! the case that overflowed, and the other cases still run.

use std::path::PathBuf;

use llama_suite::safe_api::isolated_with_stack;
use llamacpp::{AddBos, Error, Model, ModelParams, SamplerChain, Special, Token};

/// Small enough that each input below overflows it without the helper
/// (measured: deepseek-llm's regex pre-tokenizer needs about 330 bytes of
/// stack per character, the GBNF code about 500 per nesting level).
const SMALL_STACK: usize = 256 << 10;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(llamacpp_sys::SOURCE_DIR).join("models").join(format!("ggml-vocab-{name}.gguf"))
}

fn vocab_only(name: &str) -> Model {
    let params = ModelParams::default().vocab_only(true);
    Model::load(fixture(name), &params).unwrap()
}

#[test]
fn a_long_run_of_one_letter_tokenizes_with_a_regex_pre_tokenizer() {
    isolated_with_stack(SMALL_STACK, || {
        let model = vocab_only("deepseek-llm");
        assert!(model.vocab().splits_with_regex(), "deepseek-llm's pre-tokenizer falls back to std::regex");
        // 30,000 characters: about 10 MB of recursion in std::regex.
        let text = "Z".repeat(30_000);
        let tokens = model.vocab().tokenize(&text, AddBos::No).unwrap();
        assert!(!tokens.is_empty() && tokens.len() < text.len());
        assert_eq!(model.vocab().detokenize(&tokens, AddBos::No, Special::Plain).unwrap(), text);
        // The same text in short pieces (each tokenized on this small
        // stack) gives the same tokens: the helper changes nothing but the
        // stack.
        let short = "Z".repeat(300);
        let piece = model.vocab().tokenize(&short, AddBos::No).unwrap();
        assert_eq!(model.vocab().detokenize(&piece, AddBos::No, Special::Plain).unwrap(), short);
    });
}

#[test]
fn hand_split_pre_tokenizers_need_no_deep_stack() {
    isolated_with_stack(SMALL_STACK, || {
        // The fixtures of the crate's list of hand-split pre-tokenizers:
        // they tokenize 20,000 characters of each class on this 256 KiB
        // stack, inline (std::regex would need about 6.5 MB).
        for name in ["gpt-2", "llama-bpe", "qwen2", "mpt", "starcoder", "refact", "command-r"] {
            let model = vocab_only(name);
            assert!(!model.vocab().splits_with_regex(), "{name} is split by hand");
            for ch in ["Z", "1", " ", "é", "中", "!", "\n"] {
                let text = ch.repeat(20_000);
                let tokens = model.vocab().tokenize(&text, AddBos::No).unwrap();
                assert!(!tokens.is_empty(), "{name} {ch:?}");
            }
        }
        // Regex fallbacks are recognised as such.
        for name in ["deepseek-llm", "deepseek-coder", "falcon"] {
            assert!(vocab_only(name).vocab().splits_with_regex(), "{name}");
        }
    });
}

/// Builds a sampler of `gbnf` (which allows exactly "a") and checks that
/// it refuses "b", accepts "a", and accepts it again after a reset.
fn assert_accepts_only_a(vocab: &llamacpp::Vocab, gbnf: &str) {
    let mut sampler = SamplerChain::new().grammar(vocab, gbnf, "root").greedy().build().unwrap();
    let a = vocab.tokenize("a", AddBos::No).unwrap();
    let b = vocab.tokenize("b", AddBos::No).unwrap();
    assert_eq!(a.len(), 1);
    assert!(matches!(sampler.accept(b[0]), Err(Error::Grammar(_))), "the grammar allows only \"a\"");
    sampler.accept(a[0]).unwrap();
    sampler.reset();
    sampler.accept(a[0]).unwrap();
}

#[test]
fn a_grammar_nested_100_000_deep_parses_and_constrains() {
    isolated_with_stack(SMALL_STACK, || {
        let model = vocab_only("gpt-2");
        let vocab = model.vocab();
        let n = 100_000;
        let gbnf = format!("root ::= {}\"a\"{}", "(".repeat(n), ")".repeat(n));
        assert_accepts_only_a(vocab, &gbnf);
    });
}

#[test]
fn a_chain_of_100_000_rules_parses_and_constrains() {
    isolated_with_stack(SMALL_STACK, || {
        let model = vocab_only("gpt-2");
        let vocab = model.vocab();
        let n = 100_000;
        let mut gbnf = String::from("root ::= r0\n");
        for i in 0..n {
            gbnf.push_str(&format!("r{i} ::= r{}\n", i + 1));
        }
        gbnf.push_str(&format!("r{n} ::= \"a\"\n"));
        assert_accepts_only_a(vocab, &gbnf);
    });
}

#[test]
fn a_lazy_grammar_waits_through_long_text_and_then_triggers() {
    isolated_with_stack(SMALL_STACK, || {
        let model = vocab_only("gpt-2");
        let vocab = model.vocab();
        // The pattern shape llama.cpp's chat formats use: matched against
        // all text since the start, recursing once per byte.
        let pattern = r"^[\s\S]*?(<tool>)[\s\S]*$";
        let mut sampler = SamplerChain::new()
            .grammar_lazy(vocab, r#"root ::= "<tool>" [a-z]+"#, "root", &[pattern], &[])
            .greedy()
            .build()
            .unwrap();
        let filler: Vec<Token> = vocab.tokenize(" the", AddBos::No).unwrap();
        assert_eq!(filler.len(), 1);
        // 4,000 tokens of 4 bytes: 16 KB of text, megabytes of recursion
        // per accept at the end.
        for _ in 0..4_000 {
            sampler.accept(filler[0]).unwrap();
        }
        for token in vocab.tokenize("<tool>", AddBos::No).unwrap() {
            sampler.accept(token).unwrap();
        }
        // Triggered: now the grammar constrains, and a space is not [a-z].
        let space = vocab.tokenize(" ", AddBos::No).unwrap();
        assert!(matches!(sampler.accept(space[0]), Err(Error::Grammar(_))));
    });
}
