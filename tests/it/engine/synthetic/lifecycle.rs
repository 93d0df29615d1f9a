//! Requests' lives: cancel and drop free cells, random concurrent use
//! neither deadlocks nor leaks, async streams wake up, a full queue refuses,
//! shutdown ends what is in flight.

use super::*;

#[test]
fn cancel_and_drop_free_the_cells() {
    let engine = Engine::start(model(), config().n_ctx(16_384).max_cached_prefixes(0)).unwrap();
    let mut a = engine.submit(greedy(prompt(50, 1), 10_000)).unwrap();
    let mut b = engine.submit(greedy(prompt(60, 2), 10_000)).unwrap();
    assert!(matches!(a.next(), Some(Event::Piece(_))));
    assert!(matches!(b.next(), Some(Event::Piece(_))));
    wait_for(&engine, |s| s.kv_cells_used >= 110);
    a.cancel();
    let a = drain(a);
    assert_eq!(a.finals, 1);
    assert_eq!(a.finish.reason, FinishReason::Cancelled);
    drop(b);
    let stats = wait_for(&engine, |s| s.requests_finished == 2 && s.running == 0);
    assert_eq!(stats.kv_cells_used, 0);
    assert_eq!(stats.cached_prefix_cells, 0);

    // With the prefix cache on, cells go back to the cached-prefix level.
    let engine = Engine::start(model(), config()).unwrap();
    let c = engine.submit(greedy(prompt(50, 3), 10_000)).unwrap();
    let mut c = c;
    assert!(matches!(c.next(), Some(Event::Piece(_))));
    drop(c);
    let stats = wait_for(&engine, |s| s.requests_finished == 1 && s.running == 0);
    assert_eq!(stats.cached_prefixes, 1);
    assert_eq!(stats.kv_cells_used, stats.cached_prefix_cells);
    assert!(stats.cached_prefix_cells >= 50);
}

#[test]
fn random_submit_cancel_and_drop_from_eight_threads() {
    // A watchdog: a deadlock fails the test instead of hanging it.
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let finished = finished.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(300));
            if !finished.load(std::sync::atomic::Ordering::Relaxed) {
                eprintln!("random_submit_cancel_and_drop_from_eight_threads: deadlock (300 s)");
                std::process::exit(1);
            }
        });
    }
    let engine =
        Engine::start(model(), config().n_ctx(1024).max_running(6).max_queue(64).draft_by_cost(false)).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
                let mut next = move |m: u64| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state % m
                };
                let mut ended = 0;
                // Half the prompts start with one 100-token system prompt, so
                // requests share cells, follow each other's prefills and lose
                // their leaders to cancellation and drops.
                let system = prompt(100, 4242);
                for op in 0..38 {
                    let len = next(120) as usize + 1;
                    let mut tokens = prompt(len, (t * 100 + op) as usize);
                    if next(2) == 0 {
                        tokens.splice(..1, system.iter().copied());
                    }
                    let mut request = greedy(tokens, next(24) as usize + 1);
                    // A quarter are sampled off the step, and so cancelled
                    // and dropped while their sampler is out too.
                    if next(4) == 0 {
                        request = request.sampling(SamplingParams::greedy().grammar(ANY_TEXT));
                    }
                    // Half draft (speculative decoding), so requests are
                    // cancelled and dropped with drafts in flight.
                    if next(2) == 0 {
                        request = request.speculation(llamacpp::speculative::Speculation::ngram());
                    }
                    let completion = match engine.submit(request) {
                        Ok(c) => c,
                        Err(Error::QueueFull { .. }) => continue,
                        Err(e) => panic!("{e}"),
                    };
                    match next(3) {
                        0 => drop(completion),
                        1 => {
                            let mut completion = completion;
                            let _ = completion.next();
                            completion.cancel();
                            assert_eq!(drain(completion).finals, 1);
                            ended += 1;
                        }
                        _ => {
                            let out = drain(completion);
                            assert_eq!(out.finals, 1);
                            assert!(
                                matches!(out.finish.reason, FinishReason::Length | FinishReason::ContextFull),
                                "{:?}",
                                out.finish.reason
                            );
                            ended += 1;
                        }
                    }
                }
                ended
            })
        })
        .collect();
    let ended: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(ended > 100, "{ended}");
    let stats = idle(&engine);
    finished.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(stats.kv_cells_used, stats.cached_prefix_cells, "{stats:?}");
    assert!(stats.cached_prefixes <= 16);
    assert!(stats.prefix_hit_tokens >= 100, "the system prompt was never shared: {stats:?}");
    assert!(stats.draft_tokens_accepted > 0, "no draft was ever accepted: {stats:?}");
    // Everything still works afterwards.
    let out = engine.submit(greedy(prompt(10, 999), 3)).unwrap().wait();
    assert_eq!(out.finish.usage.completion_tokens, 3);
}

#[test]
fn async_streams_on_one_thread_all_finish_with_the_blocking_outputs() {
    use futures::StreamExt;
    // Decisive prompts: the 8 streams run batched and the references ran
    // one at a time, so only decisive continuations must agree exactly.
    let (prompts, blocking): (Vec<Vec<Token>>, Vec<Vec<Token>>) = decisive(8, |i| 10 + i, 20).into_iter().unzip();
    let engine = Engine::start(model(), config()).unwrap();

    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let engine2 = engine.clone();
    let prompts2 = prompts.clone();
    // Bounded: a lost wakeup would hang the executor; the test then fails
    // on the timeout below instead of hanging.
    std::thread::spawn(move || {
        let streams = prompts2.iter().map(|p| {
            let completion = engine2.submit(greedy(p.clone(), 20)).unwrap();
            async move {
                let mut tokens = Vec::new();
                let mut finals = 0;
                let mut completion = completion;
                while let Some(event) = StreamExt::next(&mut completion).await {
                    match event {
                        Event::Piece(p) => tokens.extend(p.token),
                        Event::Done(_) => finals += 1,
                    }
                }
                (tokens, finals)
            }
        });
        let results = futures::executor::block_on(futures::future::join_all(streams));
        let _ = done_tx.send(results);
    });
    let results = done_rx.recv_timeout(Duration::from_secs(120)).expect("the async streams hung");
    for (i, (tokens, finals)) in results.into_iter().enumerate() {
        assert_eq!(finals, 1);
        assert_eq!(tokens, blocking[i], "stream {i}");
    }
}

#[test]
fn a_full_queue_refuses_at_once() {
    let engine = Engine::start(model(), config().n_ctx(16_384).max_running(1).max_queue(2)).unwrap();
    let mut first = engine.submit(greedy(prompt(8, 1), 100_000)).unwrap();
    assert!(matches!(first.next(), Some(Event::Piece(_))));
    let waiting: Vec<Completion> = (0..2).map(|i| engine.submit(greedy(prompt(8, 2 + i), 2)).unwrap()).collect();
    assert!(matches!(engine.submit(greedy(prompt(8, 9), 2)), Err(Error::QueueFull { capacity: 2 })));
    wait_for(&engine, |s| s.waiting == 2);
    drop(first);
    for c in waiting {
        assert_eq!(c.wait().finish.reason, FinishReason::Length);
    }
    assert!(engine.submit(greedy(prompt(8, 9), 2)).is_ok());
}

#[test]
fn shutdown_ends_requests_in_flight_and_refuses_new_ones() {
    let engine = Engine::start(model(), config().n_ctx(16_384).max_running(1)).unwrap();
    let mut running = engine.submit(greedy(prompt(8, 1), 100_000)).unwrap();
    let queued = engine.submit(greedy(prompt(8, 2), 4)).unwrap();
    assert!(matches!(running.next(), Some(Event::Piece(_))));
    let clone = engine.clone();
    engine.shutdown();
    let out = drain(running);
    assert_eq!((out.finish.reason, out.finals), (FinishReason::Shutdown, 1));
    assert_eq!(queued.wait().finish.reason, FinishReason::Shutdown);
    assert!(matches!(clone.submit(greedy(prompt(8, 3), 4)), Err(Error::EngineStopped(_))));

    // Dropping the last handle does the same.
    let engine = Engine::start(model(), config().n_ctx(16_384)).unwrap();
    let mut c = engine.submit(greedy(prompt(8, 1), 100_000)).unwrap();
    assert!(matches!(c.next(), Some(Event::Piece(_))));
    drop(engine);
    assert_eq!(drain(c).finish.reason, FinishReason::Shutdown);
}
