//! The thread-safety promises of the safe API, the positive side of
//! `llamacpp/tests/compile_fail.rs` (where the compiler refuses what these
//! types must not allow): `Model: Send + Sync`, `Context: Send`,
//! `Sampler: Send`, and the smaller types a server moves between threads
//! (`AbortHandle`, `Batch`, `Detokenizer`, `Session`, `Generation`,
//! `Error`), checked as trait bounds and by moving the values to other
//! threads.

use std::sync::Arc;

use llama_suite::synthetic::{TinyModelSpec, tiny_llama_path};
use llamacpp::generate::{GenerateOptions, Generation, Session};
use llamacpp::{
    AbortHandle, AddBos, Batch, Context, ContextParams, Detokenizer, Error, LoraAdapter, Model, ModelParams, Output,
    OwnedContext, Sampler, SamplerChain, Special, Vocab,
};

fn assert_send<T: Send>() {}
fn assert_sync<T: Sync>() {}

#[test]
fn send_and_sync_promises() {
    // As trait bounds.
    assert_send::<Model>();
    assert_sync::<Model>();
    assert_sync::<Vocab>();
    assert_send::<Context<'static>>();
    assert_send::<Sampler<'static>>();
    assert_send::<SamplerChain<'static>>();
    assert_send::<LoraAdapter<'static>>();
    assert_sync::<LoraAdapter<'static>>();
    // The abort handle exists to be used from another thread.
    assert_send::<AbortHandle>();
    assert_sync::<AbortHandle>();
    assert_send::<Batch>();
    assert_sync::<Batch>();
    // A detokenizer only reads the (Sync) vocabulary.
    assert_send::<Detokenizer<'static>>();
    assert_sync::<Detokenizer<'static>>();
    // A session, and a generation in progress, can move to a worker thread
    // with the context and sampler they use.
    assert_send::<Session>();
    assert_send::<Generation<'static, 'static, 'static>>();
    // Errors travel across threads (`JoinHandle`, channels, `anyhow`).
    assert_send::<Error>();
    assert_sync::<Error>();

    // In use: one model shared by threads that each create and decode a
    // context; a context and a grammar sampler created on this thread and
    // moved to another one.
    let path = tiny_llama_path(&TinyModelSpec::default()).expect("write the tiny model");
    let model = Arc::new(Model::load(&path, &ModelParams::default()).expect("load the tiny model"));
    let params = ContextParams::default().n_ctx(256).n_batch(64).n_ubatch(64).n_threads(1);
    let prompt = model.vocab().tokenize("Hello world", AddBos::Yes).expect("tokenize");

    let tokens: Vec<_> = (0..2)
        .map(|_| {
            let (model, params, prompt) = (Arc::clone(&model), params.clone(), prompt.clone());
            std::thread::spawn(move || {
                let mut ctx = model.new_context(&params).expect("context");
                ctx.decode(&Batch::from_tokens(&prompt, 0)).expect("decode");
                Sampler::greedy().sample(&mut ctx, Output::Last).expect("sample")
            })
        })
        .map(|handle| handle.join().expect("worker thread"))
        .collect();
    assert_eq!(tokens[0], tokens[1], "same model, same prompt, greedy: same token");

    let mut ctx = model.new_context(&params).expect("context");
    let mut sampler =
        SamplerChain::new().grammar(model.vocab(), r#"root ::= [a-z]+"#, "root").greedy().build().expect("sampler");
    let token = std::thread::scope(|s| {
        s.spawn(move || {
            ctx.decode(&Batch::from_tokens(&prompt, 0)).expect("decode");
            sampler.sample(&mut ctx, Output::Last).expect("sample")
        })
        .join()
        .expect("scoped thread")
    });
    let piece = model.vocab().token_to_piece(token, Special::Plain).expect("piece");
    assert!(!piece.is_empty() && piece.iter().all(u8::is_ascii_lowercase), "grammar allows [a-z]+, got {piece:?}");

    // A generation started on this thread and driven to its end on another.
    let prompt = model.vocab().tokenize("Hello world", AddBos::Yes).expect("tokenize");
    let mut ctx = model.new_context(&params).expect("context");
    let mut greedy = Sampler::greedy();
    let mut session = Session::new();
    let options = GenerateOptions::default().max_tokens(4);
    let mut generation = session.generate(&mut ctx, &mut greedy, &prompt, &options).expect("generate");
    let stats = std::thread::scope(|s| {
        s.spawn(move || generation.stream(|_| std::ops::ControlFlow::Continue(())).expect("stream"))
            .join()
            .expect("scoped thread")
    });
    assert!((1..=4).contains(&stats.generated_tokens), "tokens generated on the other thread: {stats:?}");
    assert!(session.tokens().starts_with(&prompt), "the session records the cache the other thread filled");
}

/// A service that owns its model and context in one struct, with no
/// lifetime parameter: what `Context::new_owned` is for.
struct Service {
    ctx: OwnedContext,
    sampler: Sampler<'static>,
}

impl Service {
    fn next_token(&mut self, prompt: &[llamacpp::Token]) -> llamacpp::Token {
        self.ctx.clear_kv();
        self.ctx.eval(prompt, 0).expect("eval");
        self.sampler.sample(&mut self.ctx, Output::Last).expect("sample")
    }
}

fn assert_static<T: 'static>() {}

#[test]
fn an_owned_context_moves_into_a_spawned_thread() {
    assert_send::<OwnedContext>();
    assert_static::<OwnedContext>();
    assert_send::<Service>();
    assert_static::<Service>();

    let path = tiny_llama_path(&TinyModelSpec::default()).expect("write the tiny model");
    let model = Arc::new(Model::load(&path, &ModelParams::default()).expect("load the tiny model"));
    let params = ContextParams::default().n_ctx(256).n_batch(64).n_ubatch(64).n_threads(1);
    let prompt = model.vocab().tokenize("Hello world", AddBos::Yes).expect("tokenize");

    // The reference: a borrowed context on this thread.
    let mut borrowed = model.new_context(&params).expect("context");
    borrowed.eval(&prompt, 0).expect("eval");
    let want = borrowed.logits(Output::Last).expect("logits").to_vec();
    let want_token = Sampler::greedy().sample(&mut borrowed, Output::Last).expect("sample");
    drop(borrowed);

    // `std::thread::spawn` needs 'static: the owned context qualifies, and
    // the model lives on in it after this thread drops its `Arc`.
    let ctx = Context::new_owned(Arc::clone(&model), &params).expect("owned context");
    let weak = Arc::downgrade(&model);
    drop(model);
    let mut service = Service { ctx, sampler: Sampler::greedy() };
    let (got, token, service) = std::thread::spawn(move || {
        service.ctx.eval(&prompt, 0).expect("eval");
        let got = service.ctx.logits(Output::Last).expect("logits").to_vec();
        let token = service.next_token(&prompt);
        (got, token, service)
    })
    .join()
    .expect("worker thread");
    assert_eq!(got, want, "the owned context computes what a borrowed one does");
    assert_eq!(token, want_token);
    assert!(weak.upgrade().is_some(), "the context keeps the model alive");
    assert_eq!(service.ctx.model().vocab().n_tokens(), weak.upgrade().unwrap().vocab().n_tokens());
    drop(service);
    assert!(weak.upgrade().is_none(), "dropping the last context frees the model");
}
