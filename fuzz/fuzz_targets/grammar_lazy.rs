//! Lazy grammars: `SamplerChain::grammar_lazy` with trigger patterns (regexes
//! over the generated text) and trigger tokens; when it builds, accept the
//! tokens of a text (which may fire a trigger) and sample a few.
//!
//! Input: byte 0 = flags, then `grammar \0 patterns (one per line) \0 text
//! \0 trigger token ids (i32 LE)`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llamacpp::SamplerChain;
use llama_fuzz::{drive_sampler, raw_tokens, split_nul, text, tiny_model};

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else { return };
    let parts = split_nul(rest, 4);
    let gbnf = text(parts[0]);
    let patterns_text = parts.get(1).map(|p| text(p)).unwrap_or_default();
    let patterns: Vec<&str> = patterns_text.lines().filter(|l| !l.is_empty()).take(8).collect();
    let sample_text = parts.get(2).map(|p| text(p)).unwrap_or_default();
    let trigger_tokens = parts.get(3).map(|p| raw_tokens(p, 8)).unwrap_or_default();
    let vocab = tiny_model().vocab();
    let chain = SamplerChain::new().grammar_lazy(vocab, &gbnf, "root", &patterns, &trigger_tokens);
    let chain = if head & 2 != 0 { chain.top_k(8).dist(u32::from(head)) } else { chain.greedy() };
    let Ok(mut sampler) = chain.build() else { return };
    drive_sampler(&mut sampler, &sample_text, &trigger_tokens, usize::from(head >> 4));
});
