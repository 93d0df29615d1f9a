//! The continuous-batching engine on the tiny synthetic model (fast, no
//! download): concurrent streams equal their single-sequence runs token for
//! token, a short prompt is served while a long one prefills, preempted
//! requests finish as they would have, prefixes are shared, cancellation
//! frees cells, random concurrent use neither deadlocks nor leaks, async
//! streams wake up, bad input is refused at submit. The helpers are here,
//! the tests in one module per subject.

mod lifecycle;
mod requests;
mod scheduling;
mod sharing;
mod speculative;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use llama_suite::synthetic::{TINY_BOS_ID, TINY_VOCAB_SIZE, TinyModelSpec, tiny_llama_path};
use llama_suite::teacher::rescore_with_kv;
use llamacpp::engine::{Answer, Completion, Engine, EngineConfig, EngineStats, Event, Finish, Request, SamplingParams};
use llamacpp::generate::{FinishReason, GenerateOptions, Session};
use llamacpp::{
    AddBos, ContextParams, Error, KvType, Logits, Model, ModelParams, Sampler, SamplerChain, Special, Token,
};

fn model() -> Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let spec = TinyModelSpec { n_ctx_train: 16_384, ..TinyModelSpec::default() };
            let path = tiny_llama_path(&spec).expect("write the tiny model");
            Arc::new(Model::load(&path, &ModelParams::default()).expect("load the tiny model"))
        })
        .clone()
}

/// BOS and `n - 1` ordinary tokens of a pattern chosen by `salt`.
fn prompt(n: usize, salt: usize) -> Vec<Token> {
    let first_normal = 260;
    let span = TINY_VOCAB_SIZE - first_normal;
    let mut tokens = vec![Token(TINY_BOS_ID)];
    tokens.extend((1..n).map(|i| Token((first_normal + (i * 7 + salt * 131 + i * i * salt) % span) as i32)));
    tokens
}

/// F32 KV cells: batched and single-sequence runs then differ only by the
/// summation order of f32 sums, not by F16 rounding of the cached K and V.
fn config() -> EngineConfig {
    EngineConfig::default().n_ctx(4096).n_batch(512).n_threads(2).kv_type(KvType::F32)
}

fn rescore(
    model: &Model,
    prompt: &[Token],
    generated: &[Token],
) -> llamacpp::Result<llama_suite::teacher::TeacherForced> {
    rescore_with_kv(model, KvType::F32, prompt, generated)
}

fn greedy(prompt: Vec<Token>, n: usize) -> Request {
    Request::tokens(prompt).max_tokens(n).stop_at_eog(false)
}

/// A grammar that allows any text: a request with it is sampled off the
/// step (on the engine's helper thread).
const ANY_TEXT: &str = r#"root ::= [^\x00]*"#;

fn greedy_off_step(prompt: Vec<Token>, n: usize) -> Request {
    greedy(prompt, n).sampling(SamplingParams::greedy().grammar(ANY_TEXT))
}

/// The tokens a single-sequence greedy run through `generate::Session`
/// produces.
fn sequential(model: &Model, prompt: &[Token], n: usize) -> Vec<Token> {
    let params = ContextParams::default().n_ctx(2048).n_batch(512).n_threads(2).kv_type(KvType::F32);
    let mut ctx = model.new_context(&params).unwrap();
    let mut sampler = Sampler::greedy();
    let mut session = Session::new();
    // The session's record ends with the last decoded token: sample one
    // more than needed.
    let options = GenerateOptions::default().max_tokens(n + 1).stop_at_eog(false);
    let mut generation = session.generate(&mut ctx, &mut sampler, prompt, &options).unwrap();
    while let Some(piece) = generation.next_piece() {
        piece.unwrap();
    }
    drop(generation);
    session.tokens()[prompt.len()..prompt.len() + n].to_vec()
}

/// Batched decoding, single-token decoding and a one-batch prefill of the
/// same tokens round differently (up to 3e-3 in this model's logits,
/// measured where two runs parted), so two correct runs may part where the
/// best two tokens are that close. The exact-equality tests use prompts
/// whose greedy continuation keeps the best token at least this far ahead
/// of the second (found at run time, so on any CPU's kernels).
const DECISIVE: f32 = 2e-2;

/// `count` prompts (lengths from `len`, patterns from `salt` on) whose
/// `n`-token greedy continuation is decisive at every position, with that
/// continuation (a single-sequence run through `generate::Session`).
fn decisive(count: usize, len: impl Fn(usize) -> usize, n: usize) -> Vec<(Vec<Token>, Vec<Token>)> {
    let model = model();
    let mut found = Vec::new();
    for salt in 1..2000 {
        let p = prompt(len(found.len()), salt);
        let expected = sequential(&model, &p, n);
        let check = rescore(&model, &p, &expected).unwrap();
        if check.worst() == 0.0 && check.first_near_tie(DECISIVE).is_none() {
            found.push((p, expected));
            if found.len() == count {
                return found;
            }
        }
    }
    panic!("fewer than {count} decisive prompts");
}

/// Waits (bounded) until the stats, published after every step, satisfy
/// `ready`.
fn wait_for(engine: &Engine, ready: impl Fn(&EngineStats) -> bool) -> EngineStats {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats = engine.stats();
        if ready(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "the engine did not get there: {stats:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until nothing runs or waits.
fn idle(engine: &Engine) -> EngineStats {
    wait_for(engine, |s| s.running == 0 && s.waiting == 0)
}

/// What a completion delivered, counted without trusting `wait`.
#[derive(Debug)]
struct Drained {
    tokens: Vec<Token>,
    finish: Finish,
    finals: usize,
}

fn drain(completion: Completion) -> Drained {
    let mut tokens = Vec::new();
    let mut finish = None;
    let mut finals = 0;
    for event in completion {
        match event {
            Event::Piece(p) => tokens.extend(p.token),
            Event::Done(f) => {
                finals += 1;
                finish = Some(f);
            }
        }
    }
    Drained { tokens, finish: finish.expect("a final event"), finals }
}
