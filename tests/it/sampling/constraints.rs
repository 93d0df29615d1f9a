//! The built-in constraints: penalties, logit bias, grammars; the greedy
//! shortcut on NaN logits; the chain's clone and reset.

use super::*;

#[test]
fn penalties_stop_repetition() {
    let model = tiny_model();
    let generate = |s: &mut Sampler<'_>| {
        let (mut ctx, n) = prompt_ctx(&model, "the the the the");
        let mut b = Batch::new(1, 1);
        (0..30)
            .map(|i| {
                let t = s.sample(&mut ctx, Output::Last).unwrap();
                b.clear();
                b.push(t, n + i, &[0], Logits::Yes).unwrap();
                ctx.decode(&b).unwrap();
                t
            })
            .collect::<Vec<_>>()
    };
    let plain = generate(&mut Sampler::greedy());
    assert!(distinct(&plain) < plain.len(), "greedy alone repeats itself: {plain:?}");
    let penalized = generate(&mut SamplerChain::new().penalties(64, 1.0, 0.0, 1e6).greedy().build().unwrap());
    assert_eq!(distinct(&penalized), penalized.len(), "a huge presence penalty forbids repeats: {penalized:?}");
    // Disabled penalties leave greedy as it is.
    let neutral = generate(&mut SamplerChain::new().penalties(64, 1.0, 0.0, 0.0).greedy().build().unwrap());
    assert_eq!(neutral, plain);
    let off = generate(&mut SamplerChain::new().penalties(0, 2.0, 1.0, 1.0).greedy().build().unwrap());
    assert_eq!(off, plain, "last_n 0 disables penalties");
    // -1 is every token, as documented (it used to turn them off).
    let all = generate(&mut SamplerChain::new().penalties(-1, 1.0, 0.0, 1e6).greedy().build().unwrap());
    assert_eq!(distinct(&all), all.len(), "-1 penalizes every earlier token: {all:?}");
    let chain_all = generate(&mut SamplerChain::new().penalties(-1, 1.0, 0.0, 2.0).greedy().build().unwrap());
    let params = llamacpp::SamplingParams::greedy().penalties(-1, 1.0, 0.0, 2.0);
    let params_all = generate(&mut params.sampler(&model).unwrap());
    assert_eq!(params_all, chain_all, "SamplingParams' -1 is the chain's");
    assert_ne!(params_all, plain, "SamplingParams' -1 penalizes");
}

#[test]
fn logit_bias_moves_the_choice() {
    let model = tiny_model();
    let vocab = model.vocab();
    let (mut ctx, _) = prompt_ctx(&model, "Hello world");
    let best = Sampler::greedy().sample(&mut ctx, Output::Last).unwrap();
    let target = Token(333);
    assert_ne!(best, target);
    let mut s = SamplerChain::new().logit_bias(vocab, &[(target, 1000.0)]).greedy().build().unwrap();
    assert_eq!(s.sample(&mut ctx, Output::Last).unwrap(), target);
    let mut s = SamplerChain::new().logit_bias(vocab, &[(best, f32::NEG_INFINITY)]).greedy().build().unwrap();
    assert_ne!(s.sample(&mut ctx, Output::Last).unwrap(), best);
    for bad in [Token(-1), Token(vocab.n_tokens() as i32), Token(i32::MAX)] {
        let r = SamplerChain::new().logit_bias(vocab, &[(target, 1.0), (bad, 1.0)]).build();
        assert!(matches!(r, Err(Error::InvalidToken { .. })), "{bad}");
    }
}

#[test]
fn a_grammar_constrains_sampled_text() {
    let model = tiny_model();
    let vocab = model.vocab();
    let eos = Token(TINY_EOS_ID);
    // Free sampling under `[ab]+`: every piece is made of a and b.
    let mut s = SamplerChain::new().grammar(vocab, "root ::= [ab]+", "root").temp(3.0).dist(11).build().unwrap();
    let (mut ctx, n) = prompt_ctx(&model, "the quick brown fox");
    let mut text = Vec::new();
    let mut b = Batch::new(1, 1);
    for i in 0..20 {
        let t = s.sample(&mut ctx, Output::Last).unwrap();
        if t == eos {
            break;
        }
        let piece = vocab.token_to_piece(t, Special::Plain).unwrap();
        assert!(!piece.is_empty() && piece.iter().all(|&c| c == b'a' || c == b'b'), "token {t} = {piece:?}");
        text.extend(piece);
        b.clear();
        b.push(t, n + i, &[0], Logits::Yes).unwrap();
        ctx.decode(&b).unwrap();
    }
    assert!(!text.is_empty());

    // An exact grammar: the only text it allows, then the end.
    let mut s = SamplerChain::new().grammar(vocab, r#"root ::= "ab" ("a" | "b")"#, "root").greedy().build().unwrap();
    let (mut ctx, n) = prompt_ctx(&model, "Hello world");
    let mut out = Vec::new();
    for i in 0..10 {
        let t = s.sample(&mut ctx, Output::Last).unwrap();
        out.push(t);
        if t == eos {
            break;
        }
        b.clear();
        b.push(t, n + i, &[0], Logits::Yes).unwrap();
        ctx.decode(&b).unwrap();
    }
    assert_eq!(out.last(), Some(&eos), "{out:?}");
    let text = vocab.detokenize(&out, AddBos::Yes, Special::Plain).unwrap();
    assert!(text == "aba" || text == "abb", "{text:?}");
    // After the end, nothing else is allowed.
    assert!(s.accept(token_for_piece(vocab, "a")).is_err());
}

/// The default chain picks without the grammar and checks the pick, the
/// masking one (`grammar_first(true)`) masks first: greedy, they write the
/// same tokens, also where the unconstrained favourite is forbidden (here
/// on nearly every step: the tiny model knows nothing of the grammar), and
/// a random chain still writes only allowed text.
#[test]
fn checking_the_pick_first_samples_what_masking_first_does() {
    let model = tiny_model();
    let vocab = model.vocab();
    let eos = Token(TINY_EOS_ID);
    let gbnf = r#"root ::= "{" ("\"" [a-e]{1,4} "\": " [0-9]{1,3} ", "){2,5} "}""#;
    let run = |chain: SamplerChain<'_>, n: usize| {
        let mut s = chain.grammar(vocab, gbnf, "root").greedy().build().unwrap();
        let (mut ctx, start) = prompt_ctx(&model, "a record");
        let mut b = Batch::new(1, 1);
        let mut out = Vec::new();
        for i in 0..n {
            let t = s.sample(&mut ctx, Output::Last).unwrap();
            out.push(t);
            if t == eos {
                break;
            }
            b.clear();
            b.push(t, start + i as i32, &[0], Logits::Yes).unwrap();
            ctx.decode(&b).unwrap();
        }
        out
    };
    let checked = run(SamplerChain::new(), 40);
    let masked = run(SamplerChain::new().grammar_first(true), 40);
    assert_eq!(checked, masked);
    assert!(checked.len() >= 10, "{checked:?}");
    let text = vocab.detokenize(&checked, AddBos::Yes, Special::Plain).unwrap();
    assert!(text.starts_with("{\""), "{text:?}");
    // A random pick, checked first: only allowed text.
    let mut s = SamplerChain::new().grammar(vocab, gbnf, "root").temp(2.0).dist(5).build().unwrap();
    let (mut ctx, start) = prompt_ctx(&model, "a record");
    let mut b = Batch::new(1, 1);
    let mut text = Vec::new();
    for i in 0..30 {
        let t = s.sample(&mut ctx, Output::Last).unwrap();
        if t == eos {
            break;
        }
        text.extend(vocab.token_to_piece(t, Special::Plain).unwrap());
        b.clear();
        b.push(t, start + i, &[0], Logits::Yes).unwrap();
        ctx.decode(&b).unwrap();
    }
    let text = String::from_utf8(text).unwrap();
    assert!(text.starts_with('{') && text.chars().all(|c| "{}\": ,abcde0123456789".contains(c)), "{text:?}");
}

#[test]
fn a_clone_continues_exactly_like_the_original() {
    let model = tiny_model();
    let (mut ctx, n) = prompt_ctx(&model, "the quick brown fox");
    let mut s = SamplerChain::new().penalties(32, 1.2, 0.1, 0.1).top_k(50).temp(1.2).dist(99).build().unwrap();
    assert_eq!(s.seed(), 99);
    let mut b = Batch::new(1, 1);
    let mut pos = n;
    let mut step = |ctx: &mut Context<'_>, t: Token| {
        b.clear();
        b.push(t, pos, &[0], Logits::Yes).unwrap();
        ctx.decode(&b).unwrap();
        pos += 1;
    };
    for _ in 0..5 {
        let t = s.sample(&mut ctx, Output::Last).unwrap();
        step(&mut ctx, t);
    }
    let mut copy = s.try_clone().unwrap();
    let mut seen = Vec::new();
    for _ in 0..30 {
        let t = s.sample(&mut ctx, Output::Last).unwrap();
        assert_eq!(copy.sample(&mut ctx, Output::Last).unwrap(), t);
        seen.push(t);
        step(&mut ctx, t);
    }
    assert!(distinct(&seen) > 3);
}

#[test]
fn reset_starts_the_chain_over() {
    let model = tiny_model();
    let vocab = model.vocab();
    let (mut ctx, _) = prompt_ctx(&model, "Hello world");
    // The same logits sampled repeatedly: the RNG sequence restarts on reset.
    let mut s = SamplerChain::new().temp(5.0).dist(123).build().unwrap();
    let first: Vec<Token> = (0..20).map(|_| s.sample(&mut ctx, Output::Last).unwrap()).collect();
    assert!(distinct(&first) > 3, "{first:?}");
    s.reset();
    let again: Vec<Token> = (0..20).map(|_| s.sample(&mut ctx, Output::Last).unwrap()).collect();
    assert_eq!(first, again);
    // A grammar starts over too.
    let (a, b) = (token_for_piece(vocab, "a"), token_for_piece(vocab, "b"));
    let mut g = SamplerChain::new().grammar(vocab, r#"root ::= "ab""#, "root").greedy().build().unwrap();
    g.accept(a).unwrap();
    g.accept(b).unwrap();
    assert!(g.accept(a).is_err());
    g.reset();
    g.accept(a).unwrap();
}

/// llama.cpp's greedy sampler scans from index 0 and never moves off a NaN
/// there; the argmax shortcut must pick the same. A copy of the tiny model
/// with NaN in the output row of token 0 gives such logits.
#[test]
fn greedy_shortcut_agrees_on_nan_logits() {
    let mut bytes = std::fs::read(tiny_path()).unwrap();
    let lay = layout(&bytes);
    let data_start = lay.info.1.div_ceil(32) * 32; // general.alignment defaults to 32
    let (_, _, _, offset_field) = lay.tensors.iter().find(|t| t.0 == "output.weight").unwrap().clone();
    let offset = u64::from_le_bytes(bytes[offset_field..offset_field + 8].try_into().unwrap()) as usize;
    let row0 = data_start + offset; // token 0's output row comes first
    bytes[row0..row0 + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nan.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let model = Model::load(&path, &llamacpp::ModelParams::default()).unwrap();

    let (mut ctx, n) = prompt_ctx(&model, "Hello world");
    let logits = ctx.logits(Output::Last).unwrap();
    assert!(logits[0].is_nan() && logits[1..].iter().all(|x| x.is_finite()));
    let (toks, paths) = compare_with_llama_cpp(&mut ctx, &mut Sampler::greedy(), &mut Sampler::greedy(), n, 3);
    assert_eq!(toks[0], Token(0));
    assert!(paths.iter().all(|&p| p == SamplePath::Greedy));
}
