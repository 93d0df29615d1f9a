//! The workloads: closed-loop clients, a shared system prompt, and a long
//! prompt among short requests. Every request runs on its own thread, so
//! a slow stream never delays another's send.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use llama_suite::token_prompts::XorShift;

use crate::client::{Client, Record, Spec};

/// How long each client keeps sending.
#[derive(Debug, Clone, Copy)]
pub enum Length {
    /// This many requests per client.
    Requests(usize),
    /// New requests until this much time has passed (a soak).
    For(Duration),
}

/// Sizes of the closed-loop workloads.
#[derive(Debug, Clone, Copy)]
pub struct Closed {
    pub clients: usize,
    pub length: Length,
    /// Tokens of the prompt every request shares (0: none).
    pub shared_tokens: usize,
    /// Tokens of each request's own part of the prompt.
    pub prompt_tokens: usize,
    pub max_tokens: usize,
}

/// `clients` threads, each sending its requests one after the other (the
/// next as soon as the previous one's stream ended). With `shared_tokens`,
/// every prompt is the same BOS-led system prompt followed by its own
/// tokens; without, each prompt is BOS and its own tokens.
pub fn closed(client: &Client, seed: u64, c: Closed) -> Vec<Record> {
    let shared = match c.shared_tokens {
        0 => vec![llama_suite::token_prompts::BOS],
        n => XorShift::new(seed, &format!("shared/{n}")).prompt(n),
    };
    let start = Instant::now();
    let records = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for i in 0..c.clients {
            let (shared, records) = (&shared, &records);
            s.spawn(move || {
                let mut rng = XorShift::new(seed, &format!("closed/{}/{}/{i}", c.clients, c.shared_tokens));
                for j in 0.. {
                    let more = match c.length {
                        Length::Requests(m) => j < m,
                        Length::For(d) => start.elapsed() < d,
                    };
                    if !more {
                        break;
                    }
                    let mut prompt = shared.clone();
                    prompt.extend(rng.tokens(c.prompt_tokens));
                    let record = client.run(&Spec { group: "req", prompt, max_tokens: c.max_tokens });
                    records.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(record);
                }
            });
        }
    });
    records.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sizes of the long/short mix.
#[derive(Debug, Clone, Copy)]
pub struct LongShort {
    pub long_tokens: usize,
    pub long_max_tokens: usize,
    pub shorts: usize,
    pub short_tokens: usize,
    pub short_max_tokens: usize,
    /// Short request i (from 0) is sent `(i + 1) * gap` after the long one.
    pub gap: Duration,
}

/// One long prompt, then short requests `gap` apart while it is prefilled.
pub fn long_short(client: &Client, seed: u64, l: LongShort) -> Vec<Record> {
    let mut rng = XorShift::new(seed, &format!("long-short/{}/{}", l.long_tokens, l.shorts));
    let long = Spec { group: "long", prompt: rng.prompt(l.long_tokens), max_tokens: l.long_max_tokens };
    let shorts: Vec<Spec> = (0..l.shorts)
        .map(|_| Spec { group: "short", prompt: rng.prompt(l.short_tokens), max_tokens: l.short_max_tokens })
        .collect();
    let start = Instant::now();
    std::thread::scope(|s| {
        let long = s.spawn(|| client.run(&long));
        let shorts: Vec<_> = shorts
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                s.spawn(move || {
                    let at = start + l.gap * (i as u32 + 1);
                    std::thread::sleep(at.saturating_duration_since(Instant::now()));
                    client.run(spec)
                })
            })
            .collect();
        let mut records = vec![join(long)];
        records.extend(shorts.into_iter().map(join));
        records
    })
}

fn join(handle: std::thread::ScopedJoinHandle<'_, Record>) -> Record {
    handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// One short request, not measured: the first request pays for work later
/// ones do not (the compute graph's first run, page faults).
pub fn warmup(client: &Client, seed: u64) -> Result<(), String> {
    let r = client.run(&Spec { group: "warmup", prompt: XorShift::new(seed, "warmup").prompt(8), max_tokens: 4 });
    match (r.error, r.incomplete) {
        (None, None) => Ok(()),
        (Some(e), _) | (None, Some(e)) => Err(format!("the warm-up request failed: {e}")),
    }
}
