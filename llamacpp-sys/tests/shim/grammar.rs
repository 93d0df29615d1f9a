//! The grammar sampler's entry points through the shim: parse errors,
//! lazy-trigger patterns, forbidden tokens and bad candidates.

use super::*;

#[test]
fn sampler_init_grammar_normal_and_injected() {
    init();
    let model = VocabModel::spm();
    let vocab = model.vocab();

    let (code, smpl) = grammar(vocab, HELLO_WORLD);
    assert_eq!(code, OK);
    assert!(!smpl.0.is_null());
    // A grammar that does not parse is a normal NULL: llama.cpp catches
    // its parser's exceptions itself.
    let (code, bad) = grammar(vocab, "root ::= (");
    assert_eq!(code, OK);
    assert!(bad.0.is_null());

    inject();
    let (code, smpl) = grammar(vocab, HELLO_WORLD);
    assert_threw(code, INJECTED);
    assert!(smpl.0.is_null(), "no sampler on an exception");
    let (code, smpl) = grammar(vocab, HELLO_WORLD);
    assert_eq!(code, OK);
    assert!(!smpl.0.is_null());
}

#[test]
fn sampler_init_grammar_lazy_patterns_invalid_regex_throws() {
    init();
    let model = VocabModel::spm();
    let vocab = model.vocab();
    let lazy = |pattern: &str, trigger_tokens: &[i32]| {
        let (g, root, p) = (CString::new(HELLO_WORLD).unwrap(), CString::new("root").unwrap(), CString::new(pattern));
        let p = p.unwrap();
        let mut patterns = [p.as_ptr()];
        let mut smpl = ptr::null_mut();
        // SAFETY: NUL-terminated strings and arrays of the given lengths,
        // all copied by llama.cpp; an invalid regex throws inside the shim.
        let code = unsafe {
            shim::llama_rs_sampler_init_grammar_lazy_patterns(
                vocab,
                g.as_ptr(),
                root.as_ptr(),
                patterns.as_mut_ptr(),
                patterns.len(),
                trigger_tokens.as_ptr(),
                trigger_tokens.len(),
                &mut smpl,
            )
        };
        (code, Sampler(smpl))
    };

    let (code, smpl) = lazy("[\\s\\S]*?(Hello)[\\s\\S]*", &[HELLO]);
    assert_eq!(code, OK);
    assert!(!smpl.0.is_null());
    // Lazy: before the trigger it constrains nothing.
    let (code, logits) = apply(&smpl, &[WORLD, HELLO]);
    assert_eq!((code, logits), (OK, vec![1.0, 1.0]));

    // std::regex rejects an unclosed group with std::regex_error.
    let (code, smpl) = lazy("(unclosed", &[]);
    let message = assert_threw(code, "");
    assert!(!message.is_empty());
    assert!(smpl.0.is_null(), "no sampler on an exception");

    inject();
    assert_threw(lazy("Hello", &[]).0, INJECTED);
    let (code, smpl) = lazy("Hello", &[]);
    assert_eq!(code, OK);
    assert!(!smpl.0.is_null());
}

#[test]
fn sampler_accept_forbidden_token_throws_runtime_error() {
    init();
    let model = VocabModel::spm();
    let vocab = model.vocab();

    let (_, smpl) = grammar(vocab, HELLO_WORLD);
    assert_eq!(accept(&smpl, HELLO), OK);
    assert_eq!(accept(&smpl, WORLD), OK);

    let (_, smpl) = grammar(vocab, HELLO_WORLD);
    let message = assert_threw(accept(&smpl, WORLD), "Unexpected empty grammar stack after accepting piece");
    assert!(message.contains(&format!("({WORLD})")), "{message:?}");

    // A token id outside the vocabulary: out_of_range from the piece cache.
    let (_, smpl) = grammar(vocab, HELLO_WORLD);
    assert_out_of_range(accept(&smpl, N_VOCAB + 1), N_VOCAB + 1);

    let (_, smpl) = grammar(vocab, HELLO_WORLD);
    inject();
    assert_threw(accept(&smpl, HELLO), INJECTED);
    // The injected throw happened before llama.cpp ran: the grammar state is
    // unchanged and accepts the sentence from the start.
    assert_eq!(accept(&smpl, HELLO), OK);
    assert_eq!(accept(&smpl, WORLD), OK);
}

#[test]
fn sampler_apply_bad_candidate_throws_out_of_range() {
    init();
    let model = VocabModel::spm();
    let vocab = model.vocab();
    let (_, smpl) = grammar(vocab, HELLO_WORLD);

    // The grammar allows HELLO first and masks everything else.
    let (code, logits) = apply(&smpl, &[WORLD, HELLO, BOS]);
    assert_eq!(code, OK);
    assert_eq!(logits, [f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY]);

    // A candidate id outside the vocabulary: out_of_range.
    let (code, _) = apply(&smpl, &[HELLO, N_VOCAB + 9]);
    assert_out_of_range(code, N_VOCAB + 9);

    inject();
    assert_threw(apply(&smpl, &[HELLO]).0, INJECTED);
    assert_eq!(accept(&smpl, HELLO), OK);
    let (code, logits) = apply(&smpl, &[WORLD, HELLO]);
    assert_eq!((code, logits), (OK, vec![1.0, f32::NEG_INFINITY]));
}
