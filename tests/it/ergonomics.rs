//! The one-call and convenience layer of the safe API, checked against the
//! low-level calls it is built on, on the tiny synthetic model (exact
//! equality: same CPU, same kernels, same batch shapes):
//! `Model::complete`/`chat` against a `Session` run, `Context::eval`
//! against hand-made `n_batch` chunks, `Vocab::decode` as the inverse of
//! `tokenize`, the per-generation re-arm of an `AbortHandle`,
//! the sampler builder that reports its first error at `build`, and
//! `SamplingParams::sampler`.

use std::ops::ControlFlow;

use llama_suite::safe_api::{small_params, tiny_model};
use llama_suite::synthetic::{TinyModelSpec, tiny_llama_path};
use llamacpp::chat::{ChatMessage, RenderOptions};
use llamacpp::generate::{CompleteOptions, FinishReason, GenerateOptions, Session};
use llamacpp::{
    AddBos, Batch, ContextParams, Detokenizer, Error, Logits, Model, ModelParams, Output, Sampler, SamplerChain,
    SamplingParams, Special, Token,
};

/// The text a `Session` run gives for `prompt` with `sampling`, exactly
/// `max_tokens` tokens (end-of-generation tokens do not stop it: the tiny
/// model's random weights may pick one), in a context of `n_ctx`.
fn session_text(model: &Model, prompt: &[Token], sampling: &SamplingParams, max_tokens: usize, n_ctx: u32) -> String {
    let mut ctx = model.new_context(&ContextParams::default().n_ctx(n_ctx)).unwrap();
    let mut sampler = sampling.sampler(model).unwrap();
    let mut session = Session::new();
    let options = GenerateOptions::default().max_tokens(max_tokens).stop_at_eog(false);
    let mut text = String::new();
    let mut generation = session.generate(&mut ctx, &mut sampler, prompt, &options).unwrap();
    generation
        .stream(|piece| {
            text.push_str(piece);
            ControlFlow::Continue(())
        })
        .unwrap();
    text
}

fn no_eog() -> GenerateOptions {
    GenerateOptions::default().stop_at_eog(false)
}

#[test]
fn complete_gives_the_text_of_the_equivalent_session_run() {
    let model = tiny_model();
    let prompt = "Hello world, the quick brown fox";
    let tokens = model.vocab().tokenize(prompt, AddBos::Yes).unwrap();
    for sampling in [SamplingParams::greedy(), SamplingParams::greedy().temperature(0.9).seed(7)] {
        let options = CompleteOptions::default().max_tokens(24).sampling(sampling.clone()).generate(no_eog());
        let done = model.complete(prompt, &options).unwrap();
        assert_eq!(done.finish_reason, FinishReason::Length);
        assert_eq!(done.stats.generated_tokens, 24);
        assert_eq!(done.stats.prompt_tokens, tokens.len());
        assert!(!done.text.is_empty());
        // `complete` sizes its context to 256 tokens here.
        assert_eq!(done.text, session_text(&model, &tokens, &sampling, 24, 256), "{sampling:?}");
    }
    // Tokens in, the same text out.
    let from_tokens =
        model.complete_tokens(&tokens, &CompleteOptions::default().max_tokens(24).generate(no_eog())).unwrap();
    assert_eq!(from_tokens.text, session_text(&model, &tokens, &SamplingParams::greedy(), 24, 256));
}

#[test]
fn complete_stops_at_a_stop_string_and_reports_a_full_context() {
    let model = tiny_model();
    let prompt = "Hello world, the quick brown fox";
    let full = model.complete(prompt, &CompleteOptions::default().max_tokens(24).generate(no_eog())).unwrap();
    // Stop at the text of the third generated character onwards: what is
    // before it comes back, the stop string does not.
    let cut = full.text.char_indices().nth(2).map(|(i, _)| i).unwrap();
    let stop: String = full.text[cut..].chars().take(3).collect();
    let first = full.text.find(&stop).unwrap();
    let options = CompleteOptions::default().max_tokens(24).generate(no_eog()).stop([stop.clone()]);
    let stopped = model.complete(prompt, &options).unwrap();
    assert_eq!(stopped.finish_reason, FinishReason::Stop(stop));
    assert_eq!(stopped.text, full.text[..first]);

    // A context (256 cells) with room for 4 tokens after the prompt: the
    // text so far and the reason, instead of an error.
    let long = model.vocab().tokenize(&prompt.repeat(40), AddBos::Yes).unwrap();
    let tokens = &long[..252];
    let tight = CompleteOptions::default().max_tokens(100).generate(no_eog()).context(small_params());
    let done = model.complete_tokens(tokens, &tight).unwrap();
    assert_eq!(done.finish_reason, FinishReason::ContextFull);
    assert_eq!(done.stats.generated_tokens, 5, "4 decoded after the prompt, the 5th sampled with no room");
    let unbounded = CompleteOptions::default().max_tokens(5).generate(no_eog());
    assert_eq!(done.text, model.complete_tokens(tokens, &unbounded).unwrap().text);
}

#[test]
fn chat_renders_the_template_once_with_one_bos_and_generates_as_a_session() {
    let model = tiny_model();
    let messages = [ChatMessage::system("Be brief."), ChatMessage::user("Hello world")];
    let done = model.chat(&messages, &CompleteOptions::default().max_tokens(16)).unwrap();

    // What `chat` does, by hand: the model's format (chatml for the tiny
    // model, which has no template), the generation prompt, special
    // tokens parsed, the BOS the model asks for added once.
    let format = model.chat_format(None).unwrap();
    let rendered = format.render(&messages, &RenderOptions::default().add_generation_prompt(true)).unwrap();
    // ChatML, written out: what `chat` must have rendered.
    let chatml =
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(rendered, chatml);
    // The tokens of the literal text (markup parsed, one BOS), not of the
    // same calls `chat` makes.
    let tokens = model.vocab().tokenize_special(chatml, AddBos::Yes).unwrap();
    assert_eq!(model.vocab().tokenize_chat(&rendered).unwrap(), tokens, "no BOS in the text: add it");
    assert_eq!(done.stats.prompt_tokens, tokens.len());
    assert_eq!(done.text, session_text(&model, &tokens, &SamplingParams::greedy(), 16, 256));

    // A rendering that starts with the BOS text gets no second BOS.
    let bos = model.vocab().bos().unwrap();
    let bos_text = model.vocab().text(bos).unwrap().to_owned();
    let with_bos = format!("{bos_text}{rendered}");
    let tokens = model.vocab().tokenize_chat(&with_bos).unwrap();
    assert_eq!(tokens.iter().filter(|&&t| t == bos).count(), 1, "{tokens:?}");
    assert_eq!(tokens, model.vocab().tokenize_special(&with_bos, AddBos::No).unwrap());
}

#[test]
fn eval_of_5000_tokens_equals_decoding_the_same_n_batch_chunks() {
    let spec = TinyModelSpec { n_ctx_train: 8192, ..TinyModelSpec::default() };
    let model = Model::load(tiny_llama_path(&spec).unwrap(), &ModelParams::default()).unwrap();
    let vocab = model.vocab();
    let tokens: Vec<Token> = (0..5000).map(|i| Token(260 + i * 7919 % 400)).collect();
    let params = ContextParams::default().n_ctx(8192).n_batch(512).n_ubatch(512).n_threads(1);

    let mut by_eval = model.new_context(&params).unwrap();
    by_eval.eval(&tokens, 0).unwrap();
    assert_eq!(by_eval.seq_pos_max(0).unwrap(), Some(4999));
    let eval_logits = by_eval.logits(Output::Last).unwrap().to_vec();
    assert_eq!(eval_logits.len(), vocab.n_tokens());

    let mut by_hand = model.new_context(&params).unwrap();
    let mut batch = Batch::new(512, 1);
    for (k, chunk) in tokens.chunks(512).enumerate() {
        batch.clear();
        let last = if k == tokens.len().div_ceil(512) - 1 { Logits::Yes } else { Logits::No };
        batch.push_sequence(chunk, (k * 512) as i32, 0, last).unwrap();
        by_hand.decode(&batch).unwrap();
    }
    // The last chunk has 5000 - 9 * 512 = 392 tokens; its last one has the logits.
    assert_eq!(by_hand.logits(391).unwrap(), &eval_logits[..]);
    assert!(matches!(by_hand.logits(390), Err(Error::NoOutput(Output::Index(390)))));

    // Another eval appends at the next position and matches a decode there.
    let more = [Token(300), Token(301)];
    by_eval.eval(&more, 0).unwrap();
    by_hand.decode(&Batch::from_tokens(&more, 5000)).unwrap();
    assert_eq!(by_eval.seq_pos_max(0).unwrap(), Some(5001));
    assert_eq!(by_eval.logits(Output::Last).unwrap(), by_hand.logits(Output::Last).unwrap());
    // Greedy sampling reads the same row.
    let a = Sampler::greedy().sample(&mut by_eval, Output::Last).unwrap();
    let b = Sampler::greedy().sample(&mut by_hand, 1usize).unwrap();
    assert_eq!(a, b);
}

#[test]
fn eval_refuses_what_does_not_fit_before_decoding_anything() {
    let model = tiny_model();
    let mut ctx = model.new_context(&small_params()).unwrap();
    assert!(matches!(ctx.eval(&[], 0), Err(Error::InvalidBatch(_))));
    // A prompt longer than a sequence holds, to a generation: typed.
    let mut session = Session::new();
    let mut greedy = Sampler::greedy();
    let long = vec![Token(300); ctx.n_ctx_seq() as usize + 1];
    let err = session.generate(&mut ctx, &mut greedy, &long, &GenerateOptions::default()).unwrap_err();
    assert!(matches!(err, Error::PromptTooLong { tokens, limit } if tokens == long.len() && limit == long.len() - 1));
    let err = session.generate(&mut ctx, &mut greedy, &[], &GenerateOptions::default()).unwrap_err();
    assert!(matches!(err, Error::EmptyPrompt));
    assert!(matches!(ctx.eval(&[Token(300)], 1), Err(Error::InvalidSeqId { seq: 1, .. })));
    let n_ctx = ctx.n_ctx_seq() as usize;
    let too_many = vec![Token(300); n_ctx + 1];
    assert!(matches!(ctx.eval(&too_many, 0), Err(Error::ContextFull { .. })));
    assert_eq!(ctx.seq_pos_max(0).unwrap(), None, "nothing was decoded");
    ctx.eval(&too_many[..n_ctx - 1], 0).unwrap();
    assert!(matches!(ctx.eval(&[Token(300), Token(301)], 0), Err(Error::ContextFull { .. })));
    ctx.eval(&[Token(300)], 0).unwrap();
    assert_eq!(ctx.seq_pos_max(0).unwrap(), Some(n_ctx as i32 - 1));
    assert!(matches!(ctx.eval(&[Token(-3)], 0), Err(Error::ContextFull { .. })));
}

#[test]
fn decode_is_the_text_a_detokenizer_streams() {
    let model = tiny_model();
    let vocab = model.vocab();
    for text in ["Hello world", "the quick brown fox, jumps.", "ünïcödé ✓ 日本"] {
        let tokens = vocab.tokenize(text, AddBos::No).unwrap();
        assert_eq!(vocab.decode(&tokens).unwrap(), text, "decode inverts tokenize");
        let with_bos = vocab.tokenize(text, AddBos::Yes).unwrap();
        assert_eq!(vocab.decode(&with_bos).unwrap(), text, "the BOS renders as nothing");
        // Streaming renders each token's piece: the tiny SentencePiece
        // vocabulary's first piece keeps the space the tokenizer added.
        let mut detokenizer = Detokenizer::new(vocab, Special::Plain);
        let mut streamed = String::new();
        let mut bytes = Vec::new();
        for &t in &tokens {
            streamed.push_str(detokenizer.piece(t).unwrap());
            bytes.extend(vocab.token_to_piece(t, Special::Plain).unwrap());
        }
        streamed.push_str(&detokenizer.finish());
        assert_eq!(streamed.as_bytes(), &bytes[..], "{text:?}");
        assert_eq!(streamed, format!(" {text}"), "{text:?}");
    }
    // llama.cpp's detokenizer itself: with markup the BOS renders as its
    // text, unless it is stripped as the token `AddBos::Yes` added; either
    // way it keeps the space before the first word (only a first token
    // that is a word loses it, which `decode` relies on).
    let with_bos = vocab.tokenize("Hello world", AddBos::Yes).unwrap();
    assert_eq!(vocab.detokenize(&with_bos, AddBos::No, Special::Markup).unwrap(), "<s> Hello world");
    assert_eq!(vocab.detokenize(&with_bos, AddBos::Yes, Special::Markup).unwrap(), " Hello world");
    assert_eq!(vocab.detokenize(&with_bos[1..], AddBos::No, Special::Markup).unwrap(), "Hello world");
    assert!(matches!(vocab.decode(&[Token(-1)]), Err(Error::InvalidToken { token: -1, .. })));
}

#[test]
fn an_abort_cancels_one_generation_and_the_next_one_runs() {
    let model = tiny_model();
    let mut ctx = model.new_context(&small_params()).unwrap();
    let mut sampler = Sampler::greedy();
    let mut session = Session::new();
    let prompt = model.vocab().tokenize("Hello world", AddBos::Yes).unwrap();
    let options = GenerateOptions::default().max_tokens(8);

    let abort = ctx.abort_handle();
    abort.abort();
    let mut cancelled = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    assert!(cancelled.next_piece().is_none());
    assert_eq!(cancelled.finish_reason(), Some(&FinishReason::Cancelled));
    assert_eq!(cancelled.stats().generated_tokens, 0);
    drop(cancelled);
    assert!(!abort.is_aborted(), "the cancelled generation consumed the abort");

    let mut next = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    let stats = next.stream(|_| ControlFlow::Continue(())).unwrap();
    assert_eq!(stats.finish_reason, Some(FinishReason::Length));
    assert_eq!(stats.generated_tokens, 8);
    drop(next);

    // A generation that ends otherwise (here a stream callback breaking)
    // leaves a request made meanwhile set: only an abort that ended a
    // generation is consumed.
    let handle = abort.clone();
    let mut broken = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
    let stats = broken
        .stream(|_| {
            handle.abort();
            ControlFlow::Break(())
        })
        .unwrap();
    assert_eq!(stats.finish_reason, Some(FinishReason::Cancelled));
    drop(broken);
    assert!(abort.is_aborted(), "a stream that broke does not consume an abort");
    abort.reset();

    // A plain decode still sees an abort until it is reset.
    ctx.clear_kv();
    abort.abort();
    assert!(matches!(ctx.decode(&Batch::from_tokens(&prompt, 0)), Err(Error::Aborted)));
    assert!(matches!(ctx.decode(&Batch::from_tokens(&prompt, 0)), Err(Error::Aborted)));
    abort.reset();
    ctx.clear_kv();
    ctx.decode(&Batch::from_tokens(&prompt, 0)).unwrap();
}

#[test]
fn the_sampler_builder_reports_its_first_error_at_build() {
    let model = tiny_model();
    let vocab = model.vocab();
    // No `?` after each step; the failing step is not added.
    let err = SamplerChain::new().top_k(5).grammar(vocab, "root ::= (", "root").temp(0.5).dist(1).build().unwrap_err();
    assert!(matches!(err, Error::Grammar(_)), "{err:?}");
    // The first error wins over later ones and over a missing selector.
    let err = SamplerChain::new()
        .logit_bias(vocab, &[(Token(-5), 1.0)])
        .grammar(vocab, "root ::= (", "root")
        .top_k(5)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidToken { token: -5, .. }), "{err:?}");
    assert!(matches!(SamplerChain::new().top_k(5).build(), Err(Error::NoSelector)));
    // The steps that succeed make a working chain.
    let mut sampler = SamplerChain::new().logit_bias(vocab, &[(Token(300), 1.0)]).greedy().build().unwrap();
    assert_eq!(sampler.len(), 2);
    let mut ctx = model.new_context(&small_params()).unwrap();
    ctx.eval(&vocab.tokenize("Hello", AddBos::Yes).unwrap(), 0).unwrap();
    sampler.sample(&mut ctx, Output::Last).unwrap();
}

#[test]
fn sampling_params_build_the_usual_chain_and_refuse_bad_values() {
    let model = tiny_model();
    let vocab = model.vocab();
    let mut ctx = model.new_context(&small_params()).unwrap();
    ctx.eval(&vocab.tokenize("Hello world", AddBos::Yes).unwrap(), 0).unwrap();
    let greedy = SamplingParams::greedy().sampler(&model).unwrap().sample(&mut ctx, Output::Last).unwrap();
    assert_eq!(greedy, Sampler::greedy().sample(&mut ctx, Output::Last).unwrap());
    // A bias that bans the greedy token changes the pick.
    let banned = SamplingParams::greedy().logit_bias(vec![(greedy, f32::NEG_INFINITY)]);
    assert_ne!(banned.sampler(&model).unwrap().sample(&mut ctx, Output::Last).unwrap(), greedy);
    // A grammar allows only its strings' first token.
    let only_a = SamplingParams::greedy().grammar(r#"root ::= "the""#);
    let token = only_a.sampler(&model).unwrap().sample(&mut ctx, Output::Last).unwrap();
    let piece = vocab.decode(&[token]).unwrap();
    assert!(!piece.is_empty() && "the".starts_with(&piece), "{piece:?}");

    for (bad, what) in [
        (SamplingParams::greedy().temperature(-1.0), "temperature"),
        (SamplingParams::greedy().top_p(0.0), "top_p"),
        (SamplingParams::greedy().min_p(1.5), "min_p"),
        (SamplingParams::greedy().penalties(64, 0.0, 0.0, 0.0), "repeat_penalty"),
        (SamplingParams::greedy().logprobs(21), "logprobs"),
    ] {
        let err = bad.sampler(&model).unwrap_err();
        assert!(matches!(err, Error::InvalidParameter { name, .. } if name == what), "{what}: {err:?}");
    }
    let err = SamplingParams::greedy().logit_bias(vec![(Token(-1), 1.0)]).sampler(&model).unwrap_err();
    assert!(matches!(err, Error::InvalidToken { token: -1, .. }));
    let err = SamplingParams::greedy().grammar("root ::= (").sampler(&model).unwrap_err();
    assert!(matches!(err, Error::Grammar(_)));
}

/// One `GenerateOptions` value (most tokens, a stop string, no stop at
/// end-of-generation) gives the same text through `Session::generate`,
/// `Model::complete_tokens` and an engine request.
#[test]
fn one_options_type_drives_session_complete_and_engine_alike() {
    let model = tiny_model();
    let prompt = model.vocab().tokenize("Once upon a time", AddBos::Yes).unwrap();
    let full = session_text(&model, &prompt, &SamplingParams::default(), 20, 256);
    // A stop string from the middle of the unbounded text.
    let chars: Vec<char> = full.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let options = GenerateOptions::default().max_tokens(20).stop([stop.clone()]).stop_at_eog(false);
    let expected = &full[..full.find(&stop).unwrap()];

    let mut ctx = model.new_context(&ContextParams::default().n_ctx(256)).unwrap();
    let mut sampler = SamplingParams::default().sampler(&model).unwrap();
    let mut session = Session::new();
    let text: String =
        session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap().map(Result::unwrap).collect();
    assert_eq!(text, expected);

    let done = model.complete_tokens(&prompt, &CompleteOptions::default().generate(options.clone())).unwrap();
    assert_eq!((done.text.as_str(), &done.finish_reason), (expected, &FinishReason::Stop(stop.clone())));

    let path = tiny_llama_path(&TinyModelSpec::default()).unwrap();
    let shared = std::sync::Arc::new(Model::load(path, &ModelParams::default()).unwrap());
    let engine = llamacpp::engine::Engine::start(shared, llamacpp::engine::EngineConfig::default().n_ctx(512)).unwrap();
    let out = engine.submit(llamacpp::engine::Request::tokens(prompt).generate(options)).unwrap().wait();
    assert_eq!(out.text, expected);
}
