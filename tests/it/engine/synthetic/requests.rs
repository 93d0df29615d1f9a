//! What a request may ask and gets: bad input refused at submit, stop
//! strings, context limits and priorities, a piece per token, models that
//! cannot generate, log-probabilities.

use super::*;

#[test]
fn bad_requests_are_refused_at_submit_and_the_engine_keeps_serving() {
    let engine = Engine::start(model(), config().n_ctx(512)).unwrap();
    let bad = |r: Request| engine.submit(r).expect_err("refused");
    assert!(matches!(bad(Request::tokens(vec![])), Error::EmptyPrompt));
    assert!(matches!(bad(Request::tokens(vec![Token(1), Token(-5)])), Error::InvalidToken { token: -5, .. }));
    assert!(matches!(bad(Request::tokens(vec![Token(1), Token(1 << 20)])), Error::InvalidToken { .. }));
    assert!(matches!(bad(greedy(prompt(600, 1), 4)), Error::PromptTooLong { tokens: 600, limit: 512 }));
    assert!(matches!(bad(greedy(prompt(60, 1), 4).max_context(50)), Error::PromptTooLong { tokens: 60, limit: 50 }));
    assert!(matches!(
        bad(greedy(prompt(6, 1), 4).max_context(100_000)),
        Error::InvalidParameter { name: "max_context", .. }
    ));
    assert!(matches!(bad(greedy(prompt(6, 1), 0)), Error::InvalidParameter { name: "max_tokens", .. }));
    let sampled = |s: SamplingParams| greedy(prompt(6, 1), 4).sampling(s);
    assert!(matches!(
        bad(sampled(SamplingParams::greedy().temperature(f32::NAN))),
        Error::InvalidParameter { name: "temperature", .. }
    ));
    assert!(matches!(
        bad(sampled(SamplingParams::greedy().temperature(-1.0))),
        Error::InvalidParameter { name: "temperature", .. }
    ));
    assert!(matches!(bad(sampled(SamplingParams::greedy().top_p(0.0))), Error::InvalidParameter { name: "top_p", .. }));
    assert!(matches!(bad(sampled(SamplingParams::greedy().min_p(2.0))), Error::InvalidParameter { name: "min_p", .. }));
    assert!(matches!(bad(sampled(SamplingParams::greedy().top_k(-1))), Error::InvalidParameter { name: "top_k", .. }));
    assert!(matches!(
        bad(sampled(SamplingParams::greedy().penalties(64, 0.0, 0.0, 0.0))),
        Error::InvalidParameter { name: "repeat_penalty", .. }
    ));
    assert!(matches!(
        bad(sampled(SamplingParams::greedy().penalties(64, 1.0, 5.0, 0.0))),
        Error::InvalidParameter { name: "frequency_penalty", .. }
    ));
    assert!(matches!(
        bad(sampled(SamplingParams::greedy().logit_bias(vec![(Token(99_999), 1.0)]))),
        Error::InvalidToken { .. }
    ));
    assert!(matches!(
        bad(sampled(SamplingParams::greedy().logit_bias(vec![(Token(300), f32::NAN)]))),
        Error::InvalidParameter { name: "logit_bias", .. }
    ));
    assert!(matches!(bad(sampled(SamplingParams::greedy().grammar("root ::= ("))), Error::Grammar(_)));
    assert!(matches!(bad(sampled(SamplingParams::greedy().grammar("start ::= \"a\""))), Error::Grammar(_)));
    // Bad engine settings.
    for (config, setting) in [
        (config().max_running(0), "max_running"),
        (config().max_running(200).max_cached_prefixes(100), "max_cached_prefixes"),
        (config().n_batch(8).max_running(16), "max_running"),
        (config().prefix_cache_share(1.5), "prefix_cache_share"),
    ] {
        let err = Engine::start(model(), config).unwrap_err();
        assert!(matches!(err, Error::InvalidParameter { name, .. } if name == setting), "{setting}: {err:?}");
    }
    // And a good request still runs.
    let out = engine.submit(greedy(prompt(6, 1), 4)).unwrap().wait();
    assert_eq!(out.finish.reason, FinishReason::Length);
    assert_eq!(out.tokens.len(), 4);
    // A grammar that parses constrains the output.
    let gbnf = r#"root ::= " the"+"#;
    let vocab = engine.model().vocab();
    let out = engine.submit(sampled(SamplingParams::greedy().grammar(gbnf))).unwrap().wait();
    assert_eq!(out.finish.reason, FinishReason::Length);
    let text = vocab.detokenize(&out.tokens, AddBos::No, Special::Plain).unwrap();
    // " the" repeated and cut anywhere (the detokenizer drops the first
    // token's leading space, as SentencePiece does).
    let repeated = " the".repeat(text.len() + 1);
    assert!(!text.is_empty() && repeated[1..].starts_with(&text), "{text:?}");
}

#[test]
fn stop_strings_max_context_and_priorities() {
    let model = model();
    let engine = Engine::start(model.clone(), config().n_ctx(16_384).max_running(1)).unwrap();
    // A stop string taken from the greedy continuation itself.
    let p = prompt(12, 77);
    let full = engine.submit(greedy(p.clone(), 24)).unwrap().wait();
    let piece = model.vocab().detokenize(&full.tokens[5..7], AddBos::No, Special::Plain).unwrap();
    let stopped = engine.submit(greedy(p.clone(), 24).stop([piece.clone()])).unwrap().wait();
    assert_eq!(stopped.finish.reason, FinishReason::Stop(piece.clone()));
    let at = full.text.find(&piece).unwrap();
    assert_eq!(stopped.text, full.text[..at]);
    // max_context caps prompt + generated tokens.
    let capped = engine.submit(greedy(p.clone(), 24).max_context(20)).unwrap().wait();
    assert_eq!(capped.finish.reason, FinishReason::ContextFull);
    assert_eq!(capped.tokens.len(), 20 - 12 + 1);
    assert_eq!(capped.tokens, full.tokens[..9]);
    // With one running slot, a high-priority request overtakes queued ones.
    let mut blocker = engine.submit(greedy(prompt(8, 1), 100_000)).unwrap();
    assert!(matches!(blocker.next(), Some(Event::Piece(_))));
    let low = engine.submit(greedy(prompt(8, 2), 2)).unwrap();
    let high = engine.submit(greedy(prompt(8, 3), 2).priority(5)).unwrap();
    blocker.cancel();
    drop(blocker);
    let (low, high) = (low.wait(), high.wait());
    assert!(high.finish.timings.queued < low.finish.timings.queued, "{:?} {:?}", high.finish, low.finish);
}

#[test]
fn every_token_arrives_in_its_own_piece_and_the_text_is_whole() {
    let model = model();
    let engine = Engine::start(model.clone(), config()).unwrap();
    let p = prompt(9, 5);
    let completion = engine.submit(greedy(p.clone(), 12)).unwrap();
    let events: Vec<Event> = completion.collect();
    assert_eq!(events.len(), 12 + 1, "{events:?}");
    let mut text = String::new();
    let mut tokens = Vec::new();
    for event in &events[..12] {
        let Event::Piece(piece) = event else { panic!("{event:?}") };
        tokens.push(piece.token.expect("a token per piece"));
        text.push_str(&piece.text);
    }
    assert!(matches!(&events[12], Event::Done(f) if f.usage.completion_tokens == 12));
    assert_eq!(text, model.vocab().detokenize(&tokens, AddBos::No, Special::Plain).unwrap());
}

#[test]
fn models_that_cannot_generate_are_refused_at_start() {
    let path = tiny_llama_path(&TinyModelSpec::default()).unwrap();
    let vocab_only = Model::load(&path, &ModelParams::default().vocab_only(true)).unwrap();
    let err = Engine::start(Arc::new(vocab_only), config()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(ref m) if m.contains("vocabulary-only")), "{err}");
}

/// Log-softmax of the logits after each prefix of `prompt + generated`,
/// in f64, from one single-sequence decode: the reference for the
/// engine's per-token log-probabilities.
fn reference_logprobs(model: &Model, prompt: &[Token], generated: &[Token]) -> Vec<Vec<f64>> {
    let total = prompt.len() + generated.len();
    let params = ContextParams::default().n_ctx(2048).n_batch(512).n_threads(2).kv_type(KvType::F32);
    let mut ctx = model.new_context(&params).unwrap();
    let mut batch = llamacpp::Batch::new(total, 1);
    let all: Vec<Token> = prompt.iter().chain(generated).copied().collect();
    for (i, &t) in all.iter().enumerate().take(total - 1) {
        batch.push(t, i as i32, &[0], Logits::from(i + 1 >= prompt.len())).unwrap();
    }
    ctx.decode(&batch).unwrap();
    (0..generated.len())
        .map(|k| {
            let logits = ctx.logits(prompt.len() - 1 + k).unwrap();
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let log_z = max + logits.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
            logits.iter().map(|&l| l as f64 - log_z).collect()
        })
        .collect()
}

#[test]
fn log_probabilities_are_the_models_and_rank_the_top_tokens() {
    let model = model();
    let engine = Engine::start(model.clone(), config()).unwrap();
    let requests: Vec<(Vec<Token>, Request)> = (0..4)
        .map(|i| {
            let p = prompt(12 + 5 * i, 40 + i);
            // Two greedy, two sampled at temperature 1.5: the sampled token
            // is then often not the most likely one.
            let sampling =
                if i < 2 { SamplingParams::greedy() } else { SamplingParams::greedy().temperature(1.5).seed(i as u32) };
            (p.clone(), greedy(p, 10).sampling(sampling.logprobs(5)))
        })
        .collect();
    let completions: Vec<Completion> = requests.iter().map(|(_, r)| engine.submit(r.clone()).unwrap()).collect();
    let plain = engine.submit(greedy(prompt(8, 3), 3)).unwrap();
    let mut worst = 0f64;
    let mut not_top = 0;
    for ((p, _), completion) in requests.iter().zip(completions) {
        let pieces: Vec<llamacpp::engine::Piece> =
            completion.filter_map(|e| if let Event::Piece(p) = e { Some(p) } else { None }).collect();
        let tokens: Vec<Token> = pieces.iter().filter_map(|p| p.token).collect();
        assert_eq!(tokens.len(), 10);
        let reference = reference_logprobs(&model, p, &tokens);
        for (k, piece) in pieces.iter().enumerate() {
            let lp = piece.logprob.as_ref().expect("asked for log-probabilities");
            assert_eq!(Some(lp.token), piece.token);
            assert_eq!(lp.top.len(), 5);
            assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1), "most likely first: {:?}", lp.top);
            assert!(lp.logprob <= 0.0 && lp.top.iter().map(|&(_, l)| (l as f64).exp()).sum::<f64>() <= 1.0 + 1e-6);
            let row = &reference[k];
            worst = worst.max((lp.logprob as f64 - row[lp.token.0 as usize]).abs());
            for &(t, l) in &lp.top {
                worst = worst.max((l as f64 - row[t.0 as usize]).abs());
            }
            // The top list is the reference's five best (up to near-ties).
            let mut ranked: Vec<usize> = (0..row.len()).collect();
            ranked.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            let fifth = row[ranked[4]];
            assert!(
                lp.top.iter().all(|&(t, _)| row[t.0 as usize] >= fifth - 1e-2),
                "{:?} vs {:?}",
                lp.top,
                &ranked[..5]
            );
            if lp.top[0].0 != lp.token {
                not_top += 1;
            }
        }
    }
    eprintln!(
        "engine log-probabilities: worst difference from a single-sequence f64 log-softmax {worst:.2e}; {not_top} sampled tokens were not the most likely"
    );
    // Batched and single-sequence logits differ by up to 3e-3 here.
    assert!(worst < 1e-2, "worst {worst}");
    assert!(not_top > 0, "temperature 1.5 should sample below the top token sometimes");
    for event in plain {
        if let Event::Piece(p) = event {
            assert_eq!(p.logprob, None, "not asked for");
        }
    }
    assert!(matches!(
        engine.submit(greedy(prompt(6, 1), 2).sampling(SamplingParams::greedy().logprobs(21))),
        Err(Error::InvalidParameter { name: "logprobs", .. })
    ));
}
