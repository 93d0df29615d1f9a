//! GBNF grammar strings: `SamplerChain::grammar` on the tiny model's vocab;
//! when the grammar builds, accept the tokens of a text and sample a few.
//!
//! Input: byte 0 = flags (bit 0: pick root `expr` instead of `root`), then
//! `grammar \0 text \0 raw token ids (i32 LE)`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llamacpp::SamplerChain;
use llama_fuzz::{drive_sampler, raw_tokens, split_nul, text, tiny_model};

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else { return };
    let parts = split_nul(rest, 3);
    let gbnf = text(parts[0]);
    let sample_text = parts.get(1).map(|p| text(p)).unwrap_or_default();
    let extra = parts.get(2).map(|p| raw_tokens(p, 8)).unwrap_or_default();
    let root = if head & 1 != 0 { "expr" } else { "root" };
    let vocab = tiny_model().vocab();
    let chain = SamplerChain::new().grammar(vocab, &gbnf, root);
    let chain = if head & 2 != 0 { chain.top_k(8).dist(u32::from(head)) } else { chain.greedy() };
    let Ok(mut sampler) = chain.build() else { return };
    drive_sampler(&mut sampler, &sample_text, &extra, usize::from(head >> 4));
});
