//! Turning request records into rows: a table, or JSON lines.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use super::driver::ScenarioRun;

/// Milliseconds, as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nearest-rank percentile (`p` in 0..=100) of unsorted values; zero when empty.
pub fn percentile(values: &[Duration], p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

pub fn median(values: &[Duration]) -> Duration {
    percentile(values, 50.0)
}

/// One output row: a scenario level, its aggregate numbers and its extras.
#[derive(Debug)]
pub struct Row {
    pub backend: String,
    pub scenario: &'static str,
    pub level: String,
    pub concurrency: usize,
    pub requests: usize,
    pub tokens: usize,
    pub wall_s: f64,
    pub tok_s: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
    pub extras: Vec<(&'static str, Value)>,
}

impl Row {
    /// Aggregates: tokens/s is all generated tokens over the time from the
    /// first send to the last token; TTFT over requests; inter-token gaps
    /// over every request's consecutive tokens.
    pub fn new(backend: &str, run: &ScenarioRun) -> Row {
        let tokens: usize = run.records.iter().map(|r| r.tokens.len()).sum();
        let start = run.records.iter().map(|r| r.send).min();
        let end = run.records.iter().filter_map(|r| r.last_token()).max();
        let wall = match (start, end) {
            (Some(s), Some(e)) => e.saturating_duration_since(s),
            _ => Duration::ZERO,
        };
        let ttfts: Vec<Duration> = run.records.iter().filter_map(|r| r.ttft()).collect();
        let gaps: Vec<Duration> = run.records.iter().flat_map(|r| r.gaps()).collect();
        let wall_s = wall.as_secs_f64();
        Row {
            backend: backend.to_owned(),
            scenario: run.scenario,
            level: run.level.clone(),
            concurrency: run.concurrency,
            requests: run.records.len(),
            tokens,
            wall_s,
            tok_s: if wall_s > 0.0 { tokens as f64 / wall_s } else { 0.0 },
            ttft_p50_ms: ms(median(&ttfts)),
            ttft_p99_ms: ms(percentile(&ttfts, 99.0)),
            itl_p50_ms: ms(median(&gaps)),
            itl_p99_ms: ms(percentile(&gaps, 99.0)),
            extras: run.extras.clone(),
        }
    }

    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("backend".into(), json!(self.backend));
        m.insert("scenario".into(), json!(self.scenario));
        m.insert("level".into(), json!(self.level));
        m.insert("concurrency".into(), json!(self.concurrency));
        m.insert("requests".into(), json!(self.requests));
        m.insert("tokens".into(), json!(self.tokens));
        m.insert("wall_s".into(), json!(round(self.wall_s, 4)));
        m.insert("tok_s".into(), json!(round(self.tok_s, 2)));
        m.insert("ttft_p50_ms".into(), json!(round(self.ttft_p50_ms, 2)));
        m.insert("ttft_p99_ms".into(), json!(round(self.ttft_p99_ms, 2)));
        m.insert("itl_p50_ms".into(), json!(round(self.itl_p50_ms, 2)));
        m.insert("itl_p99_ms".into(), json!(round(self.itl_p99_ms, 2)));
        for (k, v) in &self.extras {
            m.insert((*k).into(), float(v).map_or_else(|| v.clone(), |f| json!(round(f, 2))));
        }
        Value::Object(m)
    }

    pub fn table_header() -> String {
        format!(
            "{:<12} {:<12} {:<20} {:>4} {:>6} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8}  extras",
            "backend",
            "scenario",
            "level",
            "reqs",
            "tokens",
            "wall s",
            "tok/s",
            "TTFT p50",
            "TTFT p99",
            "ITL p50",
            "ITL p99"
        )
    }

    pub fn table_line(&self) -> String {
        let mut s = format!(
            "{:<12} {:<12} {:<20} {:>4} {:>6} {:>8.2} {:>8.1} {:>9.1} {:>9.1} {:>8.1} {:>8.1}",
            self.backend,
            self.scenario,
            self.level,
            self.requests,
            self.tokens,
            self.wall_s,
            self.tok_s,
            self.ttft_p50_ms,
            self.ttft_p99_ms,
            self.itl_p50_ms,
            self.itl_p99_ms
        );
        s.push(' ');
        for (k, v) in &self.extras {
            match float(v) {
                Some(f) => write!(s, " {k}={f:.1}").unwrap(),
                None => write!(s, " {k}={v}").unwrap(),
            }
        }
        s
    }
}

/// A float extra (milliseconds), as opposed to counts and flags.
fn float(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) if n.is_f64() => n.as_f64(),
        _ => None,
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// The requests of one run as JSON lines, times in ms from the run's first
/// send: send, first token, every token.
pub fn records_json(backend: &str, run: &ScenarioRun) -> Vec<Value> {
    let Some(t0) = run.records.iter().map(|r| r.send).min() else {
        return Vec::new();
    };
    let rel = |t: Instant| round(ms(t - t0), 3);
    run.records
        .iter()
        .map(|r| {
            json!({
                "backend": backend,
                "scenario": run.scenario,
                "level": run.level,
                "label": r.label,
                "prompt_tokens": r.prompt_tokens,
                "n_predict": r.n_predict,
                "tokens": r.tokens.len(),
                "send_ms": rel(r.send),
                "first_token_ms": r.first_token().map(rel),
                "token_ms": r.tokens.iter().map(|&t| rel(t)).collect::<Vec<_>>(),
                "reported_tokens": r.completion.reported_tokens,
                "cached_prompt_tokens": r.completion.cached_prompt_tokens,
            })
        })
        .collect()
}
