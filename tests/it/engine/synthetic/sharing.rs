//! Prefix sharing: a shared prefix is prefilled once, also by requests
//! arriving together, and a prompt shares a running sequence's cells.

use super::*;

#[test]
fn a_shared_prefix_is_prefilled_once() {
    let model = model();
    let prefix = prompt(1000, 4);
    let with_suffix = |salt| {
        let mut p = prefix.clone();
        p.extend(prompt(17, salt)[1..].iter().copied());
        p
    };
    // A suffix whose continuation after the shared prefix is decisive.
    let (a, b) = (with_suffix(5), {
        let mut salt = 6;
        loop {
            let b = with_suffix(salt);
            let expected = sequential(&model, &b, 16);
            if rescore(&model, &b, &expected).unwrap().first_near_tie(DECISIVE).is_none() {
                break b;
            }
            salt += 1;
        }
    });
    let cold = Engine::start(model.clone(), config()).unwrap().submit(greedy(b.clone(), 16)).unwrap().wait();
    assert_eq!(cold.finish.usage.cached_tokens, 0);

    let engine = Engine::start(model, config()).unwrap();
    let first = engine.submit(greedy(a, 16)).unwrap().wait();
    assert_eq!(first.finish.usage.cached_tokens, 0);
    let before = idle(&engine);
    assert_eq!(before.cached_prefixes, 1);
    assert_eq!(before.kv_cells_used, 1016 + 15);
    let second = engine.submit(greedy(b.clone(), 16)).unwrap().wait();
    let after = idle(&engine);
    let cached = second.finish.usage.cached_tokens;
    assert!(cached >= 1000, "only {cached} tokens shared");
    assert_eq!(after.prefix_hit_tokens - before.prefix_hit_tokens, cached as u64);
    // Only the suffix was prefilled: the engine's count and llama.cpp's own.
    let evaluated = after.prompt_tokens_evaluated - before.prompt_tokens_evaluated;
    assert_eq!(evaluated as usize, b.len() - cached);
    assert_eq!((after.perf.prompt_tokens - before.perf.prompt_tokens) as usize, b.len() - cached);
    assert_eq!(second.tokens, cold.tokens, "sharing the prefix changed the output");
    // The shared 1000 cells are counted once.
    assert_eq!(after.kv_cells_used, 1016 + 15 + (b.len() - cached) + 15);
}

#[test]
fn requests_arriving_together_with_one_system_prompt_prefill_it_once() {
    let model = model();
    let system = prompt(1000, 9);
    // Four suffixes whose continuations after the shared prompt are decisive.
    let mut cases = Vec::new();
    for salt in 10..400 {
        let mut p = system.clone();
        p.extend(prompt(17, salt)[1..].iter().copied());
        let expected = sequential(&model, &p, 16);
        if rescore(&model, &p, &expected).unwrap().first_near_tie(DECISIVE).is_none() {
            cases.push((p, expected));
            if cases.len() == 4 {
                break;
            }
        }
    }
    assert_eq!(cases.len(), 4, "four decisive suffixes");
    let engine = Engine::start(model, config()).unwrap();
    // A long unrelated prompt keeps the worker busy, so the four arrive
    // while one step runs and are admitted together.
    let plug = engine.submit(greedy(prompt(1500, 99), 1)).unwrap();
    wait_for(&engine, |s| s.steps >= 1);
    let before = engine.stats();
    let completions: Vec<Completion> =
        cases.iter().map(|(p, _)| engine.submit(greedy(p.clone(), 16)).unwrap()).collect();
    let outs: Vec<Answer> = completions.into_iter().map(Completion::wait).collect();
    drop(plug.wait());
    let after = idle(&engine);
    let evaluated = (after.prompt_tokens_evaluated - before.prompt_tokens_evaluated) as usize;
    let plug_rest = 1500 - before.prompt_tokens_evaluated as usize;
    // The system prompt went through the model once, each suffix once.
    assert_eq!(evaluated - plug_rest, 1016 + 3 * 16, "prompt tokens evaluated");
    let cached: Vec<usize> = outs.iter().map(|o| o.finish.usage.cached_tokens).collect();
    assert_eq!(cached.iter().filter(|&&c| c >= 1000).count(), 3, "cached tokens per request: {cached:?}");
    assert_eq!(cached.iter().sum::<usize>() as u64, after.prefix_hit_tokens - before.prefix_hit_tokens);
    for (i, (out, (_, expected))) in outs.iter().zip(&cases).enumerate() {
        assert_eq!(out.finish.reason, FinishReason::Length);
        assert_eq!(&out.tokens, expected, "request {i} differs from its single-sequence run");
    }
    // The system prompt's cells are held once: 1000 + 4 × (16 + 15). (The
    // plug's 1500 were evicted: cached prefixes hold at most half the pool.)
    assert_eq!((after.cached_prefixes, after.kv_cells_used), (4, 1000 + 4 * 31));
}

#[test]
fn a_prompt_shares_the_cells_of_a_running_sequence() {
    let base = prompt(200, 7);
    // A continuation of `base` whose greedy answer is decisive, so the run
    // that shares the running sequence's cells must equal an unshared one.
    let (longer, unshared) = (8..2000)
        .find_map(|salt| {
            let mut longer = base.clone();
            longer.extend(prompt(9, salt)[1..].iter().copied());
            let expected = sequential(&model(), &longer, 4);
            let check = rescore(&model(), &longer, &expected).unwrap();
            (check.worst() == 0.0 && check.first_near_tie(DECISIVE).is_none()).then_some((longer, expected))
        })
        .expect("a decisive continuation of the base prompt");
    // No cached prefixes: the running sequence is the only source of shared
    // cells. It runs until cancelled (3,500 tokens would take thousands of
    // steps), so it is still running when the longer prompt arrives however
    // late this thread submits it.
    let engine = Engine::start(model(), config().max_cached_prefixes(0)).unwrap();
    let mut running = engine.submit(greedy(base.clone(), 3_500)).unwrap();
    assert!(matches!(running.next(), Some(Event::Piece(_))));
    let out = engine.submit(greedy(longer, 4)).unwrap().wait();
    assert!(out.finish.usage.cached_tokens >= 192, "{:?}", out.finish.usage);
    assert_eq!(out.tokens, unshared, "sharing the running sequence's cells changed the answer");
    running.cancel();
    assert_eq!(drain(running).finish.reason, FinishReason::Cancelled);
}
