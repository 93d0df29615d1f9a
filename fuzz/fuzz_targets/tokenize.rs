//! Tokenize / detokenize on every vocab fixture in vendor/llama.cpp/models.
//!
//! Input: byte 0 = fixture index (low 5 bits) and flags, then the text
//! (lossy UTF-8, at most 4 KiB).
#![no_main]

use libfuzzer_sys::fuzz_target;
use llamacpp::{AddBos, Detokenizer, Special, Token};
use llama_fuzz::{raw_tokens, text, vocab_model};

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else { return };
    let Some(model) = vocab_model(usize::from(head & 0x1f)) else { return };
    let vocab = model.vocab();
    let add_bos = if head & 0x20 != 0 { AddBos::Yes } else { AddBos::No };
    let remove_special = if head & 0x40 != 0 { AddBos::Yes } else { AddBos::No };
    let unparse = if head & 0x80 != 0 { Special::Markup } else { Special::Plain };
    let s = text(rest);

    let plain = vocab.tokenize(&s, add_bos).unwrap_or_default();
    let special = vocab.tokenize_special(&s, add_bos).unwrap_or_default();
    for toks in [&plain, &special] {
        let _ = vocab.detokenize(toks, remove_special, unparse);
        for &t in toks.iter() {
            let _ = vocab.token_to_piece(t, unparse);
            let _ = vocab.text(t);
            let _ = vocab.attrs(t);
            let _ = vocab.score(t);
        }
        let mut de = Detokenizer::new(vocab, unparse);
        let mut out = String::new();
        for &t in toks.iter() {
            let _ = de.push(t, &mut out);
        }
        out.push_str(&de.finish());
    }

    // Ids straight from the input, mostly outside the vocab: must be Err.
    let raw: Vec<Token> = raw_tokens(rest, 16);
    let _ = vocab.detokenize(&raw, remove_special, unparse);
    let flipped = if unparse == Special::Markup { Special::Plain } else { Special::Markup };
    let mut de = Detokenizer::new(vocab, flipped);
    for &t in &raw {
        let _ = vocab.token_to_piece(t, unparse);
        let _ = de.push_str(t);
        let _ = vocab.is_eog(t);
        let _ = vocab.is_control(t);
    }
    let _ = de.finish();
});
