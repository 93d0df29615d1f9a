//! Abort and crash paths found by review, each driven from safe code and
//! answered with an `Err` (see also `never_abort/`). Each case runs in a
//! child process (`safe_api::isolated`), so one that aborts fails alone.

use llama_suite::safe_api::{isolated, layout, real_model, small_params, tiny_model, tiny_path};
use llamacpp::{
    AddBos, Batch, Candidates, CustomSampler, Error, Logits, MetadataValue, Model, ModelParams, Output, SamplerChain,
    Special, Token,
};

/// A context of `model` that decoded "Hello world": its last row has logits.
fn hello_world_context(model: &Model) -> llamacpp::Context<'_> {
    let mut ctx = model.new_context(&small_params()).unwrap();
    let tokens = model.vocab().tokenize("Hello world", AddBos::Yes).unwrap();
    ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
    ctx
}

/// Removes every candidate.
struct BanAll;
impl CustomSampler for BanAll {
    fn apply(&mut self, candidates: &mut Candidates<'_>) {
        candidates.truncate(0);
    }
    fn clone_sampler(&self) -> Box<dyn CustomSampler> {
        Box::new(BanAll)
    }
}

/// Sorts the candidates by ascending logit and claims they are sorted
/// (descending); records what `set_sorted` answered.
struct LyingSort {
    accepted_claim: std::sync::Arc<std::sync::Mutex<Option<bool>>>,
}
impl CustomSampler for LyingSort {
    fn apply(&mut self, candidates: &mut Candidates<'_>) {
        candidates.data_mut().sort_by(|a, b| a.logit.total_cmp(&b.logit));
        *self.accepted_claim.lock().unwrap() = Some(candidates.set_sorted(true));
    }
    fn clone_sampler(&self) -> Box<dyn CustomSampler> {
        Box::new(LyingSort { accepted_claim: self.accepted_claim.clone() })
    }
}

#[test]
fn a_sampler_that_removes_every_candidate_is_an_error() {
    isolated(|| {
        let model = tiny_model();
        let mut ctx = hello_world_context(&model);
        // top_p would run softmax on zero candidates: GGML_ASSERT in llama.cpp.
        let mut sampler = SamplerChain::new().custom(BanAll).top_p(0.9, 1).dist(1).build().unwrap();
        assert!(matches!(sampler.sample(&mut ctx, Output::Last), Err(Error::NoCandidates)));
        let mut sampler = SamplerChain::new().custom(BanAll).greedy().build().unwrap();
        assert!(matches!(sampler.sample(&mut ctx, Output::Last), Err(Error::NoCandidates)));
        // The context still works.
        let best = llama_suite::safe_api::argmax(ctx.logits(Output::Last).unwrap()) as i32;
        let mut greedy = llamacpp::Sampler::greedy();
        assert_eq!(greedy.sample(&mut ctx, Output::Last).unwrap(), Token(best));
    });
}

#[test]
fn a_false_sorted_claim_is_refused() {
    isolated(|| {
        let model = tiny_model();
        let mut ctx = model.new_context(&small_params()).unwrap();
        let tokens = model.vocab().tokenize("Hello world", AddBos::Yes).unwrap();
        ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
        let claim = std::sync::Arc::new(std::sync::Mutex::new(None));
        let lying = LyingSort { accepted_claim: claim.clone() };
        let mut sampler = SamplerChain::new().custom(lying).top_k(5).greedy().build().unwrap();
        // top_k trusts `sorted` and would keep the five *worst* tokens.
        let token = sampler.sample(&mut ctx, Output::Last).unwrap();
        let row = ctx.logits(Output::Last).unwrap();
        let best = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(row[token.0 as usize], best, "the chain kept the worst tokens");
        assert_eq!(*claim.lock().unwrap(), Some(false), "set_sorted accepted a false claim");
    });
}

/// Forces the end-of-sequence token to win, whatever came before.
struct ForceEos;
impl CustomSampler for ForceEos {
    fn apply(&mut self, candidates: &mut Candidates<'_>) {
        for c in candidates.data_mut() {
            if c.id == llama_suite::synthetic::TINY_EOS_ID {
                c.logit = f32::MAX;
            }
        }
    }
    fn clone_sampler(&self) -> Box<dyn CustomSampler> {
        Box::new(ForceEos)
    }
}

#[test]
fn a_sampler_after_the_grammar_cannot_force_a_forbidden_end() {
    isolated(|| {
        // The grammar masks EOS (it needs two more characters), the custom
        // sampler unmasks it, greedy picks it: accepting it would make
        // llama.cpp abort ("fatal error" in llama_grammar_accept_impl).
        let model = tiny_model();
        let mut ctx = hello_world_context(&model);
        let mut sampler = SamplerChain::new()
            .grammar(model.vocab(), r#"root ::= "ab""#, "root")
            .custom(ForceEos)
            .greedy()
            .build()
            .unwrap();
        assert!(matches!(sampler.sample(&mut ctx, Output::Last), Err(Error::Grammar(_))));
        // temp(inf) turns masked logits into NaN, which llama.cpp's greedy may pick.
        let mut sampler = SamplerChain::new()
            .grammar(model.vocab(), r#"root ::= "ab""#, "root")
            .temp(f32::INFINITY)
            .greedy()
            .build()
            .unwrap();
        // Ok with a token the grammar allows (only "a" can start), or Err.
        match sampler.sample(&mut ctx, Output::Last) {
            Ok(token) => assert_eq!(model.vocab().token_to_piece(token, Special::Plain).unwrap(), b"a"),
            Err(Error::Grammar(_)) => {}
            Err(other) => panic!("{other:?}"),
        }
    });
}

#[test]
fn mirostat_parameters_that_give_nan_are_refused() {
    isolated(|| {
        let model = tiny_model();
        let vocab = model.vocab();
        let mirostat = |err| matches!(err, Err(Error::InvalidParameter { name: "mirostat", .. }));
        assert!(mirostat(SamplerChain::new().mirostat(vocab, 1, 5.0, 0.1, 1).build()));
        assert!(mirostat(SamplerChain::new().mirostat(vocab, 1, f32::NAN, 0.1, 100).build()));
        assert!(mirostat(SamplerChain::new().mirostat(vocab, 1, 5.0, f32::INFINITY, 100).build()));
        let mut ctx = model.new_context(&small_params()).unwrap();
        let tokens = vocab.tokenize("Hello world", AddBos::Yes).unwrap();
        ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
        let mut ok = SamplerChain::new().mirostat(vocab, 1, 5.0, 0.1, 100).build().unwrap();
        assert!(ok.sample(&mut ctx, Output::Last).unwrap().0 < vocab.n_tokens() as i32);
    });
}

#[test]
fn huge_penalty_windows_are_capped_not_allocated() {
    isolated(|| {
        // llama.cpp would allocate i32::MAX ints and throw bad_alloc through C.
        let model = tiny_model();
        let mut ctx = hello_world_context(&model);
        let mut sampler = SamplerChain::new()
            .penalties(i32::MAX, 1.1, 0.0, 0.0)
            .dry(model.vocab(), 0.8, 1.75, 2, i32::MAX, &["\n"])
            .greedy()
            .build()
            .unwrap();
        // Nothing accepted yet: the penalties change nothing and greedy picks
        // the row's best token.
        let best = llama_suite::safe_api::argmax(ctx.logits(Output::Last).unwrap()) as i32;
        assert_eq!(sampler.sample(&mut ctx, Output::Last).unwrap(), Token(best));
    });
}

#[test]
fn a_model_without_a_tokenizer_cannot_tokenize_or_build_grammars() {
    isolated(|| {
        let params = ModelParams::default()
            .vocab_only(true)
            .metadata_override("tokenizer.ggml.model", MetadataValue::Str("none".into()));
        let model = Model::load(tiny_path(), &params).unwrap();
        let vocab = model.vocab();
        assert!(matches!(vocab.tokenize("hi", AddBos::No), Err(Error::InvalidArgument(_))));
        assert!(matches!(vocab.tokenize_special("hi", AddBos::Yes), Err(Error::InvalidArgument(_))));
        assert!(matches!(vocab.token_to_piece(Token(3), Special::Plain), Err(Error::InvalidArgument(_))));
        assert!(matches!(
            SamplerChain::new().grammar(vocab, "root ::= <[3]>", "root").build(),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            SamplerChain::new().grammar_lazy(vocab, "root ::= \"a\"", "root", &["x"], &[]).build(),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(SamplerChain::new().infill(vocab).build(), Err(Error::InvalidArgument(_))));
    });
}

#[test]
fn batches_take_memory_as_they_fill_and_reject_overflowing_positions() {
    isolated(|| {
        // No up-front allocation: a huge capacity is only a limit.
        let mut batch = Batch::new(usize::MAX, 1);
        assert_eq!(batch.capacity(), i32::MAX as usize);
        batch.push(Token(5), 0, &[0], Logits::Yes).unwrap();
        assert_eq!(batch.len(), 1);
        let tokens = [Token(5), Token(6), Token(7)];
        assert!(matches!(batch.push_sequence(&tokens, i32::MAX - 1, 0, Logits::Yes), Err(Error::InvalidArgument(_))));
        assert_eq!(batch.len(), 1, "nothing was added");
        batch.push_sequence(&tokens, i32::MAX - 2, 0, Logits::Yes).unwrap();
        assert_eq!(batch.positions(), &[0, i32::MAX - 2, i32::MAX - 1, i32::MAX]);
        // Sequence ids survive the vectors growing.
        let mut multi = Batch::new(1000, 3);
        for i in 0..1000 {
            multi.push(Token(i % 50), i, &[0, 1, 2][..(i as usize % 3) + 1], Logits::from(false)).unwrap();
        }
        for i in 0..1000usize {
            assert_eq!(multi.seq_ids(i), &[0, 1, 2][..(i % 3) + 1]);
        }
        assert!(matches!(multi.push(Token(1), 0, &[0], Logits::No), Err(Error::BatchFull { capacity: 1000 })));
    });
}

#[test]
fn non_finite_rope_scaling_is_refused_at_load() {
    isolated(|| {
        for (key, value) in [
            ("llama.rope.scaling.factor", f64::NAN),
            ("llama.rope.scaling.factor", -2.0),
            ("llama.rope.scale_linear", f64::INFINITY),
        ] {
            let params = ModelParams::default()
                .metadata_override("llama.rope.scaling.type", MetadataValue::Str("yarn".into()))
                .metadata_override(key, MetadataValue::Float(value));
            let result = Model::load(tiny_path(), &params);
            assert!(matches!(result, Err(Error::ModelLoad { .. })), "{key} = {value}: {result:?}");
        }
    });
}

#[test]
fn saving_needs_readable_weights() {
    isolated(|| {
        let dir = tempfile::tempdir().unwrap();
        // The default model file is Q4_K_M: with repacking (the default) its
        // CPU weights cannot be read back, and llama.cpp would crash.
        let repacked = real_model();
        let out = dir.path().join("copy.gguf");
        assert!(matches!(repacked.save(&out), Err(Error::InvalidArgument(_))));
        assert!(!out.exists());
        let vocab_only = Model::load(tiny_path(), &ModelParams::default().vocab_only(true)).unwrap();
        assert!(matches!(vocab_only.save(&out), Err(Error::InvalidArgument(_))));

        let path = llama_suite::model_cache::model_path().unwrap();
        let plain = Model::load(&path, &ModelParams::default().repack_weights(false)).unwrap();
        plain.save(&out).unwrap();
        let copy = Model::load(&out, &ModelParams::default()).unwrap();
        assert_eq!(copy.n_params(), repacked.n_params());
        let tokens = repacked.vocab().tokenize("The capital of France is", AddBos::Yes).unwrap();
        let mut rows = Vec::new();
        for model in [&repacked, &copy] {
            let mut ctx = model.new_context(&small_params().n_ctx(512).n_threads(2)).unwrap();
            ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
            rows.push(ctx.logits(Output::Last).unwrap().to_vec());
        }
        // Repacked and plain kernels may round differently.
        let error = llama_suite::safe_api::nmse(&rows[0], &rows[1]);
        assert!(error < 1e-6, "the saved copy computes other logits: nmse {error}");
        assert_eq!(llama_suite::safe_api::argmax(&rows[0]), llama_suite::safe_api::argmax(&rows[1]));
    });
}

/// Writes a chosen token id into the candidates and selects it.
struct SelectId(i32);
impl CustomSampler for SelectId {
    fn apply(&mut self, candidates: &mut Candidates<'_>) {
        candidates.data_mut()[0].id = self.0;
        candidates.select(0).unwrap();
    }
    fn selects(&self) -> bool {
        true
    }
    fn clone_sampler(&self) -> Box<dyn CustomSampler> {
        Box::new(SelectId(self.0))
    }
}

/// Writes a chosen token id into the first candidate, for a later sampler.
struct WriteId(i32);
impl CustomSampler for WriteId {
    fn apply(&mut self, candidates: &mut Candidates<'_>) {
        for c in candidates.data_mut() {
            c.logit = f32::MIN;
        }
        candidates.data_mut()[0] = llamacpp::TokenData { id: self.0, logit: 10.0, p: 0.0 };
    }
    fn clone_sampler(&self) -> Box<dyn CustomSampler> {
        Box::new(WriteId(self.0))
    }
}

#[test]
fn accepting_an_id_outside_the_vocabulary_is_an_error() {
    isolated(|| {
        // adaptive-p asserts its pending token is not LLAMA_TOKEN_NULL (-1)
        // when accepting -1 (GGML_ASSERT in llama-sampler.cpp).
        let mut adaptive = SamplerChain::new().adaptive_p(0.5, 0.9, 1).build().unwrap();
        for bad in [-1, -2, i32::MIN] {
            let err = adaptive.accept(Token(bad)).unwrap_err();
            assert!(matches!(err, Error::InvalidToken { token, .. } if token == bad), "{bad}: {err:?}");
        }
        adaptive.accept(Token(5)).unwrap();
        // A chain built with a vocabulary knows its size.
        let model = tiny_model();
        let vocab = model.vocab();
        let n_vocab = vocab.n_tokens() as i32;
        let mut bound = SamplerChain::new().dry(vocab, 0.8, 1.75, 2, 64, &["\n"]).dist(1).build().unwrap();
        let err = bound.accept(Token(n_vocab)).unwrap_err();
        assert!(
            matches!(err, Error::InvalidToken { token, n_vocab: n } if token == n_vocab && n == n_vocab),
            "{err:?}"
        );
        bound.accept(Token(n_vocab - 1)).unwrap();
    });
}

#[test]
fn a_custom_sampler_cannot_select_an_id_outside_the_vocabulary() {
    isolated(|| {
        let model = tiny_model();
        let n_vocab = model.vocab().n_tokens() as i32;
        let mut ctx = hello_world_context(&model);
        for bad in [-1, n_vocab, i32::MAX] {
            // Selected by the custom sampler itself...
            let mut own = SamplerChain::new().custom(SelectId(bad)).build().unwrap();
            let err = own.sample(&mut ctx, Output::Last).unwrap_err();
            assert!(matches!(err, Error::InvalidToken { token, .. } if token == bad), "{bad}: {err:?}");
            // ...or written for a later selecting sampler to pick (adaptive-p's
            // accept would assert on -1).
            let mut later = SamplerChain::new().custom(WriteId(bad)).top_k(1).adaptive_p(0.5, 0.9, 1).build().unwrap();
            let err = later.sample(&mut ctx, Output::Last).unwrap_err();
            assert!(matches!(err, Error::InvalidToken { token, .. } if token == bad), "{bad}: {err:?}");
            let mut dist = SamplerChain::new().custom(WriteId(bad)).dist(1).build().unwrap();
            let err = dist.sample(&mut ctx, Output::Last).unwrap_err();
            assert!(matches!(err, Error::InvalidToken { token, .. } if token == bad), "{bad}: {err:?}");
        }
        // A valid id goes through.
        let mut fine = SamplerChain::new().custom(SelectId(7)).build().unwrap();
        assert_eq!(fine.sample(&mut ctx, Output::Last).unwrap(), Token(7));
    });
}

#[test]
fn a_sampler_built_for_one_model_refuses_another_models_context() {
    isolated(|| {
        let model_a = tiny_model();
        let model_b = tiny_model();
        let mut ctx_b = model_b.new_context(&small_params()).unwrap();
        let tokens = model_b.vocab().tokenize("Hello world", AddBos::Yes).unwrap();
        ctx_b.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
        let mut grammar_a =
            SamplerChain::new().grammar(model_a.vocab(), r#"root ::= "ab""#, "root").greedy().build().unwrap();
        assert!(matches!(grammar_a.sample(&mut ctx_b, Output::Last), Err(Error::WrongModel(_))));
        let mut bias_a = SamplerChain::new().logit_bias(model_a.vocab(), &[(Token(3), 1.0)]).greedy().build().unwrap();
        assert!(matches!(bias_a.sample(&mut ctx_b, Output::Last), Err(Error::WrongModel(_))));
        // A chain cannot mix two models' vocabularies either.
        let mixed =
            SamplerChain::new().logit_bias(model_a.vocab(), &[]).dry(model_b.vocab(), 0.8, 1.75, 2, 64, &[]).build();
        assert!(matches!(mixed, Err(Error::WrongModel(_))));
        // The same chains work with their own model's contexts, and chains
        // without a vocabulary with any.
        let mut grammar_b =
            SamplerChain::new().grammar(model_b.vocab(), r#"root ::= "ab""#, "root").greedy().build().unwrap();
        grammar_b.sample(&mut ctx_b, Output::Last).unwrap();
        llamacpp::Sampler::greedy().sample(&mut ctx_b, Output::Last).unwrap();
    });
}

#[test]
fn context_sizes_llama_cpp_cannot_represent_are_refused() {
    isolated(|| {
        let model = tiny_model();
        for params in [
            small_params().n_ctx(u32::MAX),
            small_params().n_ctx(u32::MAX - 100),
            small_params().n_ctx(i32::MAX as u32),
            small_params().n_batch(u32::MAX),
            small_params().n_ubatch(u32::MAX),
        ] {
            let err = model.new_context(&params).unwrap_err();
            assert!(
                matches!(err, Error::InvalidParameter { name: "n_ctx" | "n_batch" | "n_ubatch", ref message } if message.contains("at most")),
                "{params:?}: {err:?}"
            );
        }
    });
}

#[test]
fn a_context_whose_decode_threw_refuses_to_run_again() {
    isolated(|| {
        let model = tiny_model();
        let mut ctx = model.new_context(&small_params()).unwrap();
        let tokens = model.vocab().tokenize("Hello world", AddBos::Yes).unwrap();
        let batch = Batch::from_tokens(&tokens, 0);
        // SAFETY: only sets a thread-local flag of the shim: the next guarded
        // call on this thread throws inside its try block.
        unsafe { llamacpp::sys::shim::llama_rs_shim_inject_exception() };
        let err = ctx.decode(&batch).unwrap_err();
        assert!(matches!(err, Error::Exception { function: "llama_decode", .. }), "{err:?}");
        for _ in 0..2 {
            let err = ctx.decode(&batch).unwrap_err();
            assert!(matches!(err, Error::Poisoned { function: "llama_decode", .. }), "{err:?}");
        }
        // A new context works.
        let mut fresh = model.new_context(&small_params()).unwrap();
        fresh.decode(&batch).unwrap();
    });
}

#[test]
fn a_session_does_not_trust_a_cache_changed_behind_its_back() {
    isolated(|| {
        use llamacpp::generate::{GenerateOptions, Session};
        let model = tiny_model();
        let vocab = model.vocab();
        let prompt = vocab.tokenize("Hello world, the quick brown fox", AddBos::Yes).unwrap();
        let other = vocab.tokenize("Lorem ipsum dolor sit amet, consectetur", AddBos::Yes).unwrap();
        assert!(other.len() >= prompt.len());
        let options = GenerateOptions::default().max_tokens(4);
        let run = |session: &mut Session, ctx: &mut llamacpp::Context<'_>| {
            let mut sampler = llamacpp::Sampler::greedy();
            let mut generation = session.generate(ctx, &mut sampler, &prompt, &options).unwrap();
            let mut text = String::new();
            while let Some(piece) = generation.next_piece() {
                text.push_str(piece.unwrap());
            }
            (text, generation.stats().prompt_evaluated)
        };
        let mut ctx = model.new_context(&small_params()).unwrap();
        let mut session = Session::new();
        let (first, evaluated) = run(&mut session, &mut ctx);
        assert_eq!(evaluated, prompt.len());
        // Unchanged cache: only the last prompt token is decoded again.
        let (again, evaluated) = run(&mut session, &mut ctx);
        assert_eq!((again.as_str(), evaluated), (first.as_str(), 1));

        // Cleared and refilled, to the same length, with other tokens: the
        // session's record says the prompt is cached, but it is not.
        let cached = session.tokens().len();
        ctx.clear_kv();
        ctx.decode(&Batch::from_tokens(&other[..cached], 0)).unwrap();
        let (after_refill, evaluated) = run(&mut session, &mut ctx);
        assert_eq!(evaluated, prompt.len(), "the whole prompt is decoded again");
        assert_eq!(after_refill, first);

        // Another context with the same layout, holding other tokens.
        let mut ctx2 = model.new_context(&small_params()).unwrap();
        ctx2.decode(&Batch::from_tokens(&other[..session.tokens().len()], 0)).unwrap();
        let (elsewhere, evaluated) = run(&mut session, &mut ctx2);
        assert_eq!(evaluated, prompt.len());
        assert_eq!(elsewhere, first);
    });
}

#[test]
fn a_vocabulary_with_a_repeated_token_text_is_refused() {
    isolated(|| {
        // Found by fuzzing (fuzz/fuzz_targets/gguf_load.rs): two tokens
        // with the same text make llama.cpp's vocabulary load assert
        // (GGML_ASSERT(id_to_token.size() == token_to_id.size())).
        let good = std::fs::read(tiny_path()).unwrap();
        let at = good.windows(6).position(|w| w == b"<0x01>").unwrap();
        let mut bad = good.clone();
        bad[at..at + 6].copy_from_slice(b"<0x00>");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("repeated-token.gguf");
        std::fs::write(&path, &bad).unwrap();
        for vocab_only in [false, true] {
            let err = Model::load(&path, &ModelParams::default().vocab_only(vocab_only)).unwrap_err();
            assert!(matches!(err, Error::ModelLoad { ref reason, .. } if reason.contains("same text")), "{err:?}");
        }
    });
}

#[test]
fn grammars_whose_repetitions_hang_llama_cpp_are_refused() {
    isolated(|| {
        // Found by fuzzing (fuzz/regressions/grammar): llama.cpp's parser
        // never returns for a maximum below the minimum, and stacked
        // repetition operators multiply the parse stacks it advances on
        // every token (16 `+` ran for minutes).
        let model = tiny_model();
        let vocab = model.vocab();
        for gbnf in [r#"root ::= "a"{9,3}"#, r#"root ::= ("a" | [^a])++++++++++++++++"#, r#"root ::= "a"*?"#] {
            let err = SamplerChain::new().grammar(vocab, gbnf, "root").greedy().build().unwrap_err();
            assert!(matches!(err, Error::Grammar(ref m) if m.contains("repetition")), "{gbnf}: {err:?}");
            let err =
                SamplerChain::new().grammar_lazy(vocab, gbnf, "root", &[], &[Token(300)]).greedy().build().unwrap_err();
            assert!(matches!(err, Error::Grammar(ref m) if m.contains("repetition")), "{gbnf}: {err:?}");
        }
        // A trigger pattern that repeats a repetition backtracks
        // exponentially in libstdc++'s matcher on every token.
        for pattern in [r"[\s\S]+*?(<tool>)", r"([\s\S]+)*?(<tool>)"] {
            let err =
                SamplerChain::new().grammar_lazy(vocab, r#"root ::= "a""#, "root", &[pattern], &[]).greedy().build();
            assert!(matches!(err, Err(Error::Grammar(ref m)) if m.contains("repeats a")), "{pattern}: {err:?}");
        }
        // The same repetitions written as llama.cpp handles them.
        for gbnf in [r#"root ::= "a"{3,9}"#, r#"root ::= ("a" | [^a])+"#, r#"root ::= "a"*"#] {
            SamplerChain::new().grammar(vocab, gbnf, "root").greedy().build().unwrap();
        }
    });
}

#[test]
fn a_wordpiece_vocabulary_with_a_byte_token_is_refused() {
    isolated(|| {
        // Found by fuzzing (fuzz/regressions/gguf_load): llama.cpp renders a
        // WordPiece byte token through its byte lookup, which aborts for
        // WordPiece (GGML_ABORT in token_to_byte) while it builds the piece
        // cache at load time.
        let fixture = std::path::Path::new(llamacpp_sys::SOURCE_DIR).join("models/ggml-vocab-bert-bge.gguf");
        let mut bytes = std::fs::read(&fixture).unwrap();
        let lay = layout(&bytes);
        let (_, value, _) = lay.kv.iter().find(|(k, ..)| k == "tokenizer.ggml.token_type").unwrap();
        // Array header: element type (u32) and count (u64), then i32 types.
        let at = value + 12 + 4 * 1000;
        bytes[at..at + 4].copy_from_slice(&6i32.to_le_bytes()); // LLAMA_TOKEN_TYPE_BYTE
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wpm-byte-token.gguf");
        std::fs::write(&path, &bytes).unwrap();
        let err = Model::load(&path, &ModelParams::default().vocab_only(true)).unwrap_err();
        assert!(matches!(err, Error::ModelLoad { ref reason, .. } if reason.contains("byte token")), "{err:?}");
        // The fixture itself loads.
        Model::load(&fixture, &ModelParams::default().vocab_only(true)).unwrap();
    });
}
