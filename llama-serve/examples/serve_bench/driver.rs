//! Runs the scenarios of `workload` against a [`Backend`]: every request on
//! a thread of its own, arrival time of every token recorded.

use std::sync::{Barrier, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::backend::{Backend, Completion};
use super::report::{median, ms};
use super::workload::{LongShort, Prefix, Request};

/// What happened to one request.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub label: String,
    pub prompt_tokens: usize,
    pub n_predict: usize,
    /// Just before the backend was called.
    pub send: Instant,
    /// The arrival time of each generated token, in order.
    pub tokens: Vec<Instant>,
    pub completion: Completion,
}

impl RequestRecord {
    pub fn first_token(&self) -> Option<Instant> {
        self.tokens.first().copied()
    }

    pub fn last_token(&self) -> Option<Instant> {
        self.tokens.last().copied()
    }

    /// Time to first token.
    pub fn ttft(&self) -> Option<Duration> {
        self.first_token().map(|t| t - self.send)
    }

    /// The gaps between consecutive tokens.
    pub fn gaps(&self) -> Vec<Duration> {
        self.tokens.windows(2).map(|w| w[1] - w[0]).collect()
    }
}

/// One measured scenario level: its requests and the numbers that only
/// this scenario has.
#[derive(Debug)]
pub struct ScenarioRun {
    pub scenario: &'static str,
    /// `n=4`, `shorts=6 gap=50ms`, `prefix=1000`.
    pub level: String,
    /// How many requests were in flight at most.
    pub concurrency: usize,
    pub records: Vec<RequestRecord>,
    pub extras: Vec<(&'static str, Value)>,
}

/// Runs one request on this thread; `first` gets the first token's time.
pub fn run_one(
    backend: &dyn Backend,
    req: &Request,
    first: Option<mpsc::Sender<Instant>>,
) -> Result<RequestRecord, String> {
    let mut tokens = Vec::with_capacity(req.n_predict);
    let mut first = first;
    let send = Instant::now();
    let completion = backend
        .run(&req.prompt, req.n_predict, &mut |t| {
            tokens.push(t);
            if let Some(tx) = first.take() {
                let _ = tx.send(t);
            }
        })
        .map_err(|e| format!("request {}: {e}", req.label))?;
    if tokens.len() != req.n_predict {
        return Err(format!(
            "request {}: {} tokens arrived, {} were asked for (generation must not stop at end-of-generation)",
            req.label,
            tokens.len(),
            req.n_predict
        ));
    }
    if let Some(reported) = completion.reported_tokens
        && reported != tokens.len()
    {
        return Err(format!(
            "request {}: {} tokens arrived but {} says it generated {reported}",
            req.label,
            tokens.len(),
            backend.name()
        ));
    }
    Ok(RequestRecord {
        label: req.label.clone(),
        prompt_tokens: req.prompt.len(),
        n_predict: req.n_predict,
        send,
        tokens,
        completion,
    })
}

fn join<T>(h: thread::ScopedJoinHandle<'_, Result<T, String>>) -> Result<T, String> {
    h.join().unwrap_or_else(|_| Err("a request thread panicked".to_owned()))
}

/// (a) All streams sent at once (released together by a barrier).
pub fn throughput(backend: &dyn Backend, streams: &[Request]) -> Result<ScenarioRun, String> {
    let barrier = Barrier::new(streams.len());
    let records = thread::scope(|s| {
        let handles: Vec<_> = streams
            .iter()
            .map(|req| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    run_one(backend, req, None)
                })
            })
            .collect();
        handles.into_iter().map(join).collect::<Result<Vec<_>, String>>()
    })?;
    Ok(ScenarioRun {
        scenario: "throughput",
        level: format!("n={}", streams.len()),
        concurrency: streams.len(),
        records,
        extras: Vec::new(),
    })
}

/// (b) The running stream; at its first token the long prompt; the shorts
/// at `(i + 1) * gap` after that. `timeout` bounds the wait for the first
/// token (the requests themselves are bounded by the backend).
pub fn long_short(backend: &dyn Backend, w: &LongShort, timeout: Duration) -> Result<ScenarioRun, String> {
    let (running, long, shorts) = thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        let running = s.spawn(move || run_one(backend, &w.running, Some(tx)));
        if rx.recv_timeout(timeout).is_err() {
            // Disconnected: the running request failed before its first
            // token; or it did not come in time. Either way, no measurement.
            let why = match join(running) {
                Err(e) => e,
                Ok(_) => format!("the running stream's first token took over {} s", timeout.as_secs()),
            };
            return Err(why);
        }
        let t0 = Instant::now();
        let long = s.spawn(move || run_one(backend, &w.long, None));
        let shorts: Vec<_> = w
            .shorts
            .iter()
            .enumerate()
            .map(|(i, req)| {
                let at = t0 + w.gap * (i as u32 + 1);
                s.spawn(move || {
                    thread::sleep(at.saturating_duration_since(Instant::now()));
                    run_one(backend, req, None)
                })
            })
            .collect();
        let running = join(running);
        let long = join(long);
        let shorts = shorts.into_iter().map(join).collect::<Result<Vec<_>, String>>();
        Ok((running?, long?, shorts?))
    })?;

    let short_ttfts: Vec<Duration> = shorts.iter().filter_map(RequestRecord::ttft).collect();
    let running_gaps = running.gaps();
    let mut extras = vec![
        ("short_ttft_p50_ms", json!(ms(median(&short_ttfts)))),
        ("short_ttft_max_ms", json!(ms(short_ttfts.iter().max().copied().unwrap_or_default()))),
        ("long_ttft_ms", json!(ms(long.ttft().unwrap_or_default()))),
        ("running_itl_p50_ms", json!(ms(median(&running_gaps)))),
        ("running_itl_max_ms", json!(ms(running_gaps.iter().max().copied().unwrap_or_default()))),
    ];
    // Did the long prompt's prefill fall inside the running stream's life?
    if let (Some(end), Some(long_first)) = (running.last_token(), long.first_token()) {
        extras.push(("long_prefill_within_running", json!(long_first <= end)));
    }
    let n_shorts = shorts.len();
    let mut records = vec![running, long];
    records.extend(shorts);
    Ok(ScenarioRun {
        scenario: "long-short",
        level: format!("shorts={n_shorts} gap={}ms", w.gap.as_millis()),
        concurrency: records.len(),
        records,
        extras,
    })
}

/// (c) A, then B (same prefix), then the cold C, one after the other.
pub fn prefix(backend: &dyn Backend, w: &Prefix, prefix_len: usize) -> Result<ScenarioRun, String> {
    let a = run_one(backend, &w.a, None)?;
    let b = run_one(backend, &w.b, None)?;
    let c = run_one(backend, &w.c, None)?;
    let ttft = |r: &RequestRecord| json!(ms(r.ttft().unwrap_or_default()));
    let mut extras = vec![("ttft_a_ms", ttft(&a)), ("ttft_b_ms", ttft(&b)), ("ttft_c_ms", ttft(&c))];
    for (name, r) in [("cached_b", &b), ("cached_c", &c)] {
        if let Some(n) = r.completion.cached_prompt_tokens {
            extras.push((name, json!(n)));
        }
    }
    Ok(ScenarioRun {
        scenario: "prefix",
        level: format!("prefix={prefix_len}"),
        concurrency: 1,
        records: vec![a, b, c],
        extras,
    })
}
