//! Issue 3: one model shared by several threads, each with its own
//! context, decodes concurrently with the same results as one thread.

use std::sync::{Arc, Barrier};

use llama_suite::safe_api::*;
use llamacpp::{AddBos, Context, Logits, Model, Output, Sampler, SamplerChain, Special, Token};

const PROMPTS: [&str; 4] = ["Hello world", "the quick brown fox", "你好，世界", "Rust is fast and small"];
const STEPS: usize = 12;

/// What one worker computes: the greedy tokens, the logits after the
/// prompt and after the last step, and tokens from a seeded random chain.
#[derive(Debug, PartialEq)]
struct Run {
    greedy: Vec<Token>,
    first_logits: Vec<f32>,
    last_logits: Vec<f32>,
    sampled: Vec<Token>,
}

fn run(model: &Model, prompt: &str, seed: u32) -> Run {
    let toks = tokens(model.vocab(), prompt);
    let mut ctx: Context<'_> = model.new_context(&small_params()).unwrap();
    let first_logits = decode_seq(&mut ctx, &toks, 0, 0);
    let (greedy, rows) = greedy_continue(&mut ctx, first_logits.clone(), toks.len() as i32, STEPS);
    // A second pass with a seeded random chain, through the safe sampler.
    ctx.clear_kv();
    decode_seq(&mut ctx, &toks, 0, 0);
    let mut sampler: Sampler<'_> = SamplerChain::new().top_k(40).temp(1.5).dist(seed).build().unwrap();
    let mut sampled = Vec::new();
    let mut batch = llamacpp::Batch::new(1, 1);
    for i in 0..STEPS {
        let t = sampler.sample(&mut ctx, Output::Last).unwrap();
        sampled.push(t);
        batch.clear();
        batch.push(t, (toks.len() + i) as i32, &[0], Logits::Yes).unwrap();
        ctx.decode(&batch).unwrap();
    }
    Run { greedy, first_logits, last_logits: rows.last().unwrap().clone(), sampled }
}

/// One-thread contexts decoding the same batches compute bit-identical
/// logits, whichever thread drives them: equality, not a tolerance.
fn assert_same_run(expected: &Run, got: &Run, what: &str) {
    assert_eq!(expected.greedy, got.greedy, "{what}: greedy tokens");
    assert_eq!(expected.sampled, got.sampled, "{what}: sampled tokens");
    assert!(expected.first_logits == got.first_logits, "{what}: first logits differ");
    assert!(expected.last_logits == got.last_logits, "{what}: last logits differ");
}

#[test]
fn four_threads_share_one_model() {
    let model = Arc::new(tiny_model());
    let reference: Vec<Run> = PROMPTS.iter().enumerate().map(|(i, p)| run(&model, p, i as u32)).collect();
    // The runs differ from each other, so equality below means something.
    assert!(reference.windows(2).all(|w| w[0].greedy != w[1].greedy || w[0].sampled != w[1].sampled));

    let start = Arc::new(Barrier::new(PROMPTS.len()));
    let handles: Vec<_> = PROMPTS
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            let (model, start) = (Arc::clone(&model), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait(); // decode at the same time
                (0..3).map(|_| run(&model, prompt, i as u32)).collect::<Vec<_>>()
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        for (k, got) in h.join().expect("worker thread").iter().enumerate() {
            assert_same_run(&reference[i], got, &format!("thread {i}, run {k}"));
        }
    }
    assert_eq!(Arc::strong_count(&model), 1);
}

#[test]
fn scoped_threads_borrow_the_model_and_move_contexts() {
    let model = tiny_model();
    let reference: Vec<Run> = PROMPTS.iter().enumerate().map(|(i, p)| run(&model, p, 10 + i as u32)).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = PROMPTS
            .iter()
            .enumerate()
            .map(|(i, p)| {
                s.spawn({
                    let model = &model;
                    move || run(model, p, 10 + i as u32)
                })
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            assert_same_run(&reference[i], &h.join().unwrap(), &format!("scoped thread {i}"));
        }
    });

    // A context (and a sampler) created on one thread can be used on another.
    let toks = tokens(model.vocab(), PROMPTS[1]);
    let mut ctx = model.new_context(&small_params()).unwrap();
    let mut sampler = Sampler::greedy();
    let first = std::thread::scope(|s| {
        s.spawn(|| {
            decode_seq(&mut ctx, &toks, 0, 0);
            sampler.sample(&mut ctx, Output::Last).unwrap()
        })
        .join()
        .unwrap()
    });
    assert_eq!(first, reference[1].greedy[0]);

    // Tokenizing from many threads at once gives the same tokens.
    let vocab = model.vocab();
    let expected: Vec<Vec<Token>> = PROMPTS.iter().map(|p| tokens(vocab, p)).collect();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..50 {
                    for (p, e) in PROMPTS.iter().zip(&expected) {
                        assert_eq!(&tokens(vocab, p), e);
                        assert_eq!(vocab.detokenize(&e[1..], AddBos::No, Special::Plain).unwrap(), *p);
                    }
                }
            });
        }
    });
}
