//! Samplers and grammars: chains that cannot select a token, grammar
//! misuse, grammars that do not parse.

use super::*;

#[test]
fn chains_without_a_selecting_sampler_are_rejected() {
    isolated(|| {
        assert!(matches!(SamplerChain::new().top_k(5).build(), Err(Error::NoSelector)));
        assert!(matches!(SamplerChain::new().build(), Err(Error::NoSelector)));
        assert!(matches!(SamplerChain::new().top_k(5).top_p(0.9, 1).temp(0.7).build(), Err(Error::NoSelector)));
        assert!(matches!(SamplerChain::new().greedy().top_k(5).build(), Err(Error::NoSelector)));
        assert!(matches!(SamplerChain::new().dist(1).temp(0.5).build(), Err(Error::NoSelector)));
        for (chain, len) in [
            (SamplerChain::new().top_k(5).greedy(), 2),
            (SamplerChain::new().top_k(5).dist(3), 2),
            (SamplerChain::new().mirostat_v2(1, 5.0, 0.1), 1),
            (SamplerChain::new().temp(0.8).adaptive_p(0.5, 0.9, 4), 2),
        ] {
            assert_eq!(chain.build().unwrap().len(), len);
        }
    });
}

#[test]
fn grammar_misuse_is_an_error() {
    isolated(|| {
        let model = tiny_model();
        let vocab = model.vocab();
        let (a, b) = (token_for_piece(vocab, "a"), token_for_piece(vocab, "b"));
        let eos = Token(TINY_EOS_ID);
        assert!(vocab.is_eog(eos));
        let mut s = SamplerChain::new().grammar(vocab, r#"root ::= "a" "b""#, "root").greedy().build().unwrap();
        // A forbidden token, and EOG before the grammar is complete: llama.cpp
        // would throw / GGML_ABORT in llama_grammar_accept_impl.
        assert!(matches!(s.accept(b), Err(Error::Grammar(_))));
        assert!(matches!(s.accept(eos), Err(Error::Grammar(_))));
        s.accept(a).unwrap();
        assert!(matches!(s.accept(a), Err(Error::Grammar(_))));
        assert!(matches!(s.accept(eos), Err(Error::Grammar(_))));
        assert!(matches!(s.accept(Token(-1)), Err(Error::InvalidToken { token: -1, .. })));
        s.accept(b).unwrap();
        assert!(matches!(s.accept(a), Err(Error::Grammar(_))));
        s.accept(eos).unwrap(); // complete now

        // Sampling under the grammar works and honours it.
        let mut ctx = model.new_context(&small_params()).unwrap();
        let prompt = tokens(vocab, "Hello world");
        decode_seq(&mut ctx, &prompt, 0, 0);
        s.reset();
        assert_eq!(vocab.token_to_piece(s.sample(&mut ctx, Output::Last).unwrap(), Special::Plain).unwrap(), b"a");

        // A lazy grammar whose trigger token it then rejects: llama.cpp throws
        // after emptying the grammar's stacks, and the next apply would abort
        // (GGML_ASSERT(!stacks.empty())). The chain refuses until reset.
        let trigger = token_for_piece(vocab, "b");
        let mut lazy = SamplerChain::new()
            .grammar_lazy(vocab, r#"root ::= "a""#, "root", &[], &[trigger])
            .greedy()
            .build()
            .unwrap();
        lazy.accept(Token(300)).unwrap(); // not a trigger: no constraint yet
        assert!(matches!(lazy.accept(trigger), Err(Error::Grammar(_))));
        assert!(matches!(lazy.sample(&mut ctx, Output::Last), Err(Error::Grammar(ref m)) if m.contains("reset")));
        assert!(matches!(lazy.accept(a), Err(Error::Grammar(_))));
        let copy = lazy.try_clone().unwrap();
        let mut copy = copy;
        assert!(
            matches!(copy.sample(&mut ctx, Output::Last), Err(Error::Grammar(_))),
            "a copy of a failed chain fails too"
        );
        lazy.reset();
        lazy.sample(&mut ctx, Output::Last).unwrap();
        // The same with a trigger pattern whose replayed text the grammar rejects.
        let mut lazy =
            SamplerChain::new().grammar_lazy(vocab, r#"root ::= "a""#, "root", &["x.*"], &[]).greedy().build().unwrap();
        let results: Vec<bool> =
            vocab.tokenize("xyz", AddBos::No).unwrap().into_iter().map(|t| lazy.accept(t).is_ok()).collect();
        assert!(results.contains(&false), "{results:?}");
        assert!(matches!(lazy.sample(&mut ctx, Output::Last), Err(Error::Grammar(ref m)) if m.contains("reset")));
        lazy.reset();
        lazy.sample(&mut ctx, Output::Last).unwrap();
    });
}

#[test]
fn grammars_that_do_not_parse_are_rejected() {
    isolated(|| {
        let model = tiny_model();
        let vocab = model.vocab();
        for gbnf in [
            r#"root ::= "a"#,
            "root ::= undefined-rule",
            "root ::= [a-",
            "root ::= root \"a\"",
            r#"root ::= "a"{5,2"#,
            "root = \"a\"",
            r#"root ::= "\q""#,
            "root ::= (\"a\"",
            "::= \"a\"",
        ] {
            let r = SamplerChain::new().grammar(vocab, gbnf, "root").greedy().build();
            assert!(matches!(r, Err(Error::Grammar(_))), "{gbnf:?} was accepted");
        }
        assert!(matches!(
            SamplerChain::new().grammar(vocab, r#"start ::= "a""#, "root").greedy().build(),
            Err(Error::Grammar(_))
        ));
        assert!(matches!(
            SamplerChain::new().grammar(vocab, "root ::= \"a\0\"", "root").greedy().build(),
            Err(Error::Nul(_))
        ));
        let bad_regex =
            SamplerChain::new().grammar_lazy(vocab, r#"root ::= "a""#, "root", &["(unclosed"], &[]).greedy().build();
        assert!(matches!(bad_regex, Err(Error::Grammar(_))), "invalid trigger regex");
        assert!(SamplerChain::new().grammar(vocab, r#"root ::= "a" | "b""#, "root").greedy().build().is_ok());
    });
}

// ---------------------------------------------------------------- files
