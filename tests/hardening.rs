//! Abort and crash paths found by review, each driven from safe code and
//! answered with an `Err` (see also `never_abort.rs`).

mod safe_api;

use llama::{Batch, Candidates, CustomSampler, Error, MetadataValue, Model, ModelParams, SamplerChain, Token};
use safe_api::{real_model, small_params, tiny_model, tiny_path};

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

/// Reverses the candidates and claims they are sorted.
struct LyingSort {
    accepted_claim: Option<bool>,
}
impl CustomSampler for LyingSort {
    fn apply(&mut self, candidates: &mut Candidates<'_>) {
        candidates.data_mut().sort_by(|a, b| a.logit.total_cmp(&b.logit));
        self.accepted_claim = Some(candidates.set_sorted(true));
    }
    fn clone_sampler(&self) -> Box<dyn CustomSampler> {
        Box::new(LyingSort { accepted_claim: None })
    }
}

#[test]
fn a_sampler_that_removes_every_candidate_is_an_error() {
    let model = tiny_model();
    let mut ctx = model.new_context(&small_params()).unwrap();
    let tokens = model.vocab().tokenize("Hello world", true).unwrap();
    ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
    // top_p would run softmax on zero candidates: GGML_ASSERT in llama.cpp.
    let mut sampler = SamplerChain::new().custom(BanAll).top_p(0.9, 1).dist(1).build().unwrap();
    assert!(matches!(sampler.sample(&mut ctx, -1), Err(Error::NoCandidates)));
    let mut sampler = SamplerChain::new().custom(BanAll).greedy().build().unwrap();
    assert!(matches!(sampler.sample(&mut ctx, -1), Err(Error::NoCandidates)));
    // The context still works.
    let mut greedy = llama::Sampler::greedy();
    assert!(greedy.sample(&mut ctx, -1).is_ok());
}

#[test]
fn a_false_sorted_claim_is_refused() {
    let model = tiny_model();
    let mut ctx = model.new_context(&small_params()).unwrap();
    let tokens = model.vocab().tokenize("Hello world", true).unwrap();
    ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
    let mut sampler = SamplerChain::new().custom(LyingSort { accepted_claim: None }).top_k(5).greedy().build().unwrap();
    // top_k trusts `sorted` and would keep the five *worst* tokens.
    let token = sampler.sample(&mut ctx, -1).unwrap();
    let row = ctx.logits(-1).unwrap();
    let best = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    assert_eq!(row[token.0 as usize], best, "the chain kept the worst tokens");
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
    // The grammar masks EOS (it needs two more characters), the custom
    // sampler unmasks it, greedy picks it: accepting it would make
    // llama.cpp abort ("fatal error" in llama_grammar_accept_impl).
    let model = tiny_model();
    let mut ctx = model.new_context(&small_params()).unwrap();
    let tokens = model.vocab().tokenize("Hello world", true).unwrap();
    ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
    let mut sampler = SamplerChain::new()
        .grammar(model.vocab(), r#"root ::= "ab""#, "root")
        .unwrap()
        .custom(ForceEos)
        .greedy()
        .build()
        .unwrap();
    assert!(matches!(sampler.sample(&mut ctx, -1), Err(Error::Grammar(_))));
    // temp(inf) turns masked logits into NaN, which llama.cpp's greedy may pick.
    let mut sampler = SamplerChain::new()
        .grammar(model.vocab(), r#"root ::= "ab""#, "root")
        .unwrap()
        .temp(f32::INFINITY)
        .greedy()
        .build()
        .unwrap();
    let _ = sampler.sample(&mut ctx, -1); // Ok or Err, never an abort
}

#[test]
fn mirostat_parameters_that_give_nan_are_refused() {
    let model = tiny_model();
    let vocab = model.vocab();
    assert!(matches!(SamplerChain::new().mirostat(vocab, 1, 5.0, 0.1, 1), Err(Error::InvalidArgument(_))));
    assert!(matches!(SamplerChain::new().mirostat(vocab, 1, f32::NAN, 0.1, 100), Err(Error::InvalidArgument(_))));
    assert!(matches!(SamplerChain::new().mirostat(vocab, 1, 5.0, f32::INFINITY, 100), Err(Error::InvalidArgument(_))));
    let mut ctx = model.new_context(&small_params()).unwrap();
    let tokens = vocab.tokenize("Hello world", true).unwrap();
    ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
    let mut ok = SamplerChain::new().mirostat(vocab, 1, 5.0, 0.1, 100).unwrap().build().unwrap();
    assert!(ok.sample(&mut ctx, -1).unwrap().0 < vocab.n_tokens() as i32);
}

#[test]
fn huge_penalty_windows_are_capped_not_allocated() {
    // llama.cpp would allocate i32::MAX ints and throw bad_alloc through C.
    let model = tiny_model();
    let mut ctx = model.new_context(&small_params()).unwrap();
    let tokens = model.vocab().tokenize("Hello world", true).unwrap();
    ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
    let mut sampler = SamplerChain::new()
        .penalties(i32::MAX, 1.1, 0.0, 0.0)
        .dry(model.vocab(), 0.8, 1.75, 2, i32::MAX, &["\n"])
        .unwrap()
        .greedy()
        .build()
        .unwrap();
    assert!(sampler.sample(&mut ctx, -1).is_ok());
}

#[test]
fn a_model_without_a_tokenizer_cannot_tokenize_or_build_grammars() {
    let params = ModelParams {
        vocab_only: true,
        metadata_overrides: vec![("tokenizer.ggml.model".into(), MetadataValue::Str("none".into()))],
        ..ModelParams::default()
    };
    let model = Model::load(tiny_path(), &params).unwrap();
    let vocab = model.vocab();
    assert!(matches!(vocab.tokenize("hi", false), Err(Error::InvalidArgument(_))));
    assert!(matches!(vocab.tokenize_special("hi", true), Err(Error::InvalidArgument(_))));
    assert!(matches!(vocab.token_to_piece(Token(3), false), Err(Error::InvalidArgument(_))));
    assert!(matches!(SamplerChain::new().grammar(vocab, "root ::= <[3]>", "root"), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        SamplerChain::new().grammar_lazy(vocab, "root ::= \"a\"", "root", &["x"], &[]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(SamplerChain::new().infill(vocab), Err(Error::InvalidArgument(_))));
}

#[test]
fn batches_take_memory_as_they_fill_and_reject_overflowing_positions() {
    // No up-front allocation: a huge capacity is only a limit.
    let mut batch = Batch::new(usize::MAX, 1);
    assert_eq!(batch.capacity(), i32::MAX as usize);
    batch.push(Token(5), 0, &[0], true).unwrap();
    assert_eq!(batch.len(), 1);
    let tokens = [Token(5), Token(6), Token(7)];
    assert!(matches!(batch.push_sequence(&tokens, i32::MAX - 1, 0, true), Err(Error::InvalidArgument(_))));
    assert_eq!(batch.len(), 1, "nothing was added");
    batch.push_sequence(&tokens, i32::MAX - 2, 0, true).unwrap();
    assert_eq!(batch.positions(), &[0, i32::MAX - 2, i32::MAX - 1, i32::MAX]);
    // Sequence ids survive the vectors growing.
    let mut multi = Batch::new(1000, 3);
    for i in 0..1000 {
        multi.push(Token(i % 50), i, &[0, 1, 2][..(i as usize % 3) + 1], false).unwrap();
    }
    for i in 0..1000usize {
        assert_eq!(multi.seq_ids(i), &[0, 1, 2][..(i % 3) + 1]);
    }
    assert!(matches!(multi.push(Token(1), 0, &[0], false), Err(Error::BatchFull { capacity: 1000 })));
}

#[test]
fn non_finite_rope_scaling_is_refused_at_load() {
    for (key, value) in [
        ("llama.rope.scaling.factor", f64::NAN),
        ("llama.rope.scaling.factor", -2.0),
        ("llama.rope.scale_linear", f64::INFINITY),
    ] {
        let params = ModelParams {
            metadata_overrides: vec![
                ("llama.rope.scaling.type".into(), MetadataValue::Str("yarn".into())),
                (key.into(), MetadataValue::Float(value)),
            ],
            ..ModelParams::default()
        };
        let result = Model::load(tiny_path(), &params);
        assert!(matches!(result, Err(Error::ModelLoad { .. })), "{key} = {value}: {result:?}");
    }
}

#[test]
fn saving_needs_readable_weights() {
    let dir = tempfile::tempdir().unwrap();
    // The default model file is Q4_K_M: with repacking (the default) its
    // CPU weights cannot be read back, and llama.cpp would crash.
    let repacked = real_model();
    let out = dir.path().join("copy.gguf");
    assert!(matches!(repacked.save(&out), Err(Error::InvalidArgument(_))));
    assert!(!out.exists());
    let vocab_only = Model::load(tiny_path(), &ModelParams { vocab_only: true, ..ModelParams::default() }).unwrap();
    assert!(matches!(vocab_only.save(&out), Err(Error::InvalidArgument(_))));

    let path = llama_suite::model_cache::model_path().unwrap();
    let plain = Model::load(&path, &ModelParams { repack_weights: false, ..ModelParams::default() }).unwrap();
    plain.save(&out).unwrap();
    let copy = Model::load(&out, &ModelParams::default()).unwrap();
    assert_eq!(copy.n_params(), repacked.n_params());
    let tokens = repacked.vocab().tokenize("The capital of France is", true).unwrap();
    let mut rows = Vec::new();
    for model in [&repacked, &copy] {
        let mut ctx = model.new_context(&small_params().n_ctx(512).n_threads(2)).unwrap();
        ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
        rows.push(ctx.logits(-1).unwrap().to_vec());
    }
    // Repacked and plain kernels may round differently.
    let error = safe_api::nmse(&rows[0], &rows[1]);
    assert!(error < 1e-6, "the saved copy computes other logits: nmse {error}");
    assert_eq!(safe_api::argmax(&rows[0]), safe_api::argmax(&rows[1]));
}
