//! Speculative decoding in the engine: concurrent drafting streams equal
//! their sequential runs without speculation (decisive prompts), land
//! `max_tokens` and stop strings exactly, count their drafts in usage, the
//! stats and per request; a request can opt out; refusals at start and
//! submit. (Random submit/cancel with drafts in flight: lifecycle.rs.)

use llamacpp::speculative::Speculation;

use super::*;

/// Every request drafts as long as the budget allows (not cut by the
/// fitted step cost, which depends on the machine's timing): these tests
/// check what drafts do, not when they pay.
fn drafting() -> EngineConfig {
    config().speculation(Speculation::ngram()).draft_by_cost(false)
}

#[test]
fn drafting_streams_equal_their_sequential_runs() {
    let cases = decisive(6, |i| 20 + 11 * i, 48);
    let engine = Engine::start(model(), drafting()).unwrap();
    // The last one opts out.
    let completions: Vec<Completion> = cases
        .iter()
        .enumerate()
        .map(|(i, (p, _))| {
            let request = greedy(p.clone(), 48);
            engine.submit(if i == 5 { request.speculation(None) } else { request }).unwrap()
        })
        .collect();
    let mut accepted = 0;
    for (i, completion) in completions.into_iter().enumerate() {
        let out = completion.wait();
        assert_eq!(out.finish.reason, FinishReason::Length);
        assert_eq!(out.finish.usage.completion_tokens, 48);
        assert_eq!(out.tokens, cases[i].1, "stream {i} differs from its sequential run");
        let usage = out.finish.usage;
        if i == 5 {
            assert_eq!((usage.accepted_draft_tokens, usage.rejected_draft_tokens), (0, 0));
        }
        accepted += usage.accepted_draft_tokens;
    }
    let stats = idle(&engine);
    assert_eq!(stats.draft_tokens_accepted as usize, accepted);
    // Drafts were both confirmed and refused, so both paths ran.
    assert!(accepted > 0 && stats.draft_tokens > stats.draft_tokens_accepted, "{stats:?}");
    assert_eq!(stats.completion_tokens, 6 * 48);
    assert_eq!(stats.kv_cells_used, stats.cached_prefix_cells, "{stats:?}");
}

#[test]
fn max_tokens_and_stop_strings_land_exactly_with_drafts() {
    let (prompt, expected) = decisive(1, |_| 30, 64).remove(0);
    let engine = Engine::start(model(), drafting()).unwrap();
    let mut accepted = 0;
    for max in [1, 2, 5, 9, 17, 33, 64] {
        let out = engine.submit(greedy(prompt.clone(), max)).unwrap().wait();
        assert_eq!(out.finish.reason, FinishReason::Length);
        assert_eq!(out.tokens, expected[..max], "max_tokens {max}");
        accepted += out.finish.usage.accepted_draft_tokens;
    }
    assert!(accepted > 0);
    let text = engine.model().vocab().detokenize(&expected, AddBos::No, Special::Plain).unwrap();
    let chars: Vec<char> = text.chars().collect();
    let mut stopped = 0;
    for at in [chars.len() / 4, chars.len() / 2, 3 * chars.len() / 4] {
        let stop: String = chars[at..at + 2].iter().collect();
        let out = engine.submit(greedy(prompt.clone(), 64).stop([stop.clone()])).unwrap().wait();
        let before = &text[..text.find(&stop).unwrap()];
        assert_eq!(out.text, before, "stop {stop:?}");
        assert_eq!(out.finish.reason, FinishReason::Stop(stop.clone()));
        stopped += 1;
    }
    assert_eq!(stopped, 3);
    let stats = idle(&engine);
    assert_eq!(stats.kv_cells_used, stats.cached_prefix_cells, "{stats:?}");
}

#[test]
fn bad_speculation_settings_are_refused() {
    let err = Engine::start(model(), config().speculation(Speculation::ngram().draft_max(0))).unwrap_err();
    assert!(matches!(err, Error::InvalidParameter { name: "draft_max", .. }), "{err}");
    let engine = Engine::start(model(), config()).unwrap();
    let err = engine.submit(greedy(prompt(8, 1), 4).speculation(Speculation::ngram().ngram_sizes(0, 3))).unwrap_err();
    assert!(matches!(err, Error::InvalidParameter { name: "ngram_sizes", .. }), "{err}");
    let path = llama_suite::synthetic::tiny_mamba_path(&TinyModelSpec::default()).unwrap();
    let mamba = Arc::new(Model::load(&path, &ModelParams::default()).unwrap());
    let err = Engine::start(mamba.clone(), drafting()).unwrap_err();
    assert!(matches!(err, Error::CannotSpeculate(_)), "{err}");
    let engine = Engine::start(mamba, config()).unwrap();
    let err = engine.submit(greedy(prompt(8, 1), 4).speculation(Speculation::ngram())).unwrap_err();
    assert!(matches!(err, Error::CannotSpeculate(_)), "{err}");
    assert_eq!(engine.submit(greedy(prompt(8, 1), 4)).unwrap().wait().finish.usage.completion_tokens, 4);
}
