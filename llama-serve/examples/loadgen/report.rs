//! Request records to one summary row: a table line and a JSON object.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::client::Record;

/// Nearest-rank percentile (`p` in 0..=100) in milliseconds; `None` when empty.
pub fn percentile_ms(values: &[Duration], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1].as_secs_f64() * 1e3)
}

/// The numbers of one run, over all its requests or one group of them.
#[derive(Debug, Clone)]
pub struct Summary {
    pub requests: usize,
    pub errors: usize,
    pub incomplete: usize,
    /// Complete requests whose server reported no usage.
    pub without_usage: usize,
    pub output_tokens: usize,
    /// First send to last byte.
    pub wall: Duration,
    pub ttft: Vec<Duration>,
    pub itl: Vec<Duration>,
    /// Send to the last byte, of complete requests.
    pub e2e: Vec<Duration>,
    pub cached_tokens: Vec<usize>,
    /// The first few failures, for the log.
    pub examples: Vec<String>,
}

impl Summary {
    pub fn new<'a>(records: impl IntoIterator<Item = &'a Record>) -> Summary {
        let mut s = Summary {
            requests: 0,
            errors: 0,
            incomplete: 0,
            without_usage: 0,
            output_tokens: 0,
            wall: Duration::ZERO,
            ttft: Vec::new(),
            itl: Vec::new(),
            e2e: Vec::new(),
            cached_tokens: Vec::new(),
            examples: Vec::new(),
        };
        let (mut first, mut last): (Option<Instant>, Option<Instant>) = (None, None);
        for r in records {
            s.requests += 1;
            first = Some(first.map_or(r.send, |f| f.min(r.send)));
            last = Some(last.map_or(r.end, |l| l.max(r.end)));
            if let Some(e) = &r.error {
                s.errors += 1;
                if s.examples.len() < 5 {
                    s.examples.push(format!("error: {e}"));
                }
                continue;
            }
            if let Some(why) = &r.incomplete {
                s.incomplete += 1;
                if s.examples.len() < 5 {
                    s.examples.push(format!("incomplete: {why}"));
                }
                continue;
            }
            s.without_usage += usize::from(r.completion_tokens.is_none());
            s.output_tokens += r.tokens();
            s.ttft.extend(r.ttft());
            s.e2e.push(r.end.saturating_duration_since(r.send));
            s.itl.extend(r.chunks.windows(2).map(|w| w[1].saturating_duration_since(w[0])));
            s.cached_tokens.extend(r.cached_tokens);
        }
        if let (Some(f), Some(l)) = (first, last) {
            s.wall = l.saturating_duration_since(f);
        }
        s
    }

    pub fn failed(&self) -> usize {
        self.errors + self.incomplete
    }

    fn per_second(&self, n: usize) -> f64 {
        let secs = self.wall.as_secs_f64();
        if secs > 0.0 { n as f64 / secs } else { 0.0 }
    }

    pub fn json(&self) -> Value {
        let mut cached = self.cached_tokens.clone();
        cached.sort_unstable();
        json!({
            "requests": self.requests,
            "errors": self.errors,
            "incomplete": self.incomplete,
            "without_usage": self.without_usage,
            "output_tokens": self.output_tokens,
            "wall_s": round(self.wall.as_secs_f64(), 3),
            "req_s": round(self.per_second(self.requests - self.failed()), 3),
            "tok_s": round(self.per_second(self.output_tokens), 1),
            "ttft_p50_ms": percentile_ms(&self.ttft, 50.0).map(|v| round(v, 1)),
            "ttft_p99_ms": percentile_ms(&self.ttft, 99.0).map(|v| round(v, 1)),
            "ttft_max_ms": percentile_ms(&self.ttft, 100.0).map(|v| round(v, 1)),
            "itl_p50_ms": percentile_ms(&self.itl, 50.0).map(|v| round(v, 2)),
            "itl_p99_ms": percentile_ms(&self.itl, 99.0).map(|v| round(v, 2)),
            "e2e_p50_ms": percentile_ms(&self.e2e, 50.0).map(|v| round(v, 1)),
            "e2e_p99_ms": percentile_ms(&self.e2e, 99.0).map(|v| round(v, 1)),
            "cached_tokens_p50": cached.get(cached.len().saturating_sub(1) / 2),
        })
    }

    /// One line: requests, failures, throughput, TTFT and inter-token gaps.
    pub fn line(&self) -> String {
        let f = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
        let g = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        format!(
            "{:>4} req  {:>2} err  {:>2} incomplete  {:>7.2} req/s  {:>7.1} tok/s  TTFT p50 {:>6} p99 {:>6} ms  ITL p50 {:>5} p99 {:>6} ms",
            self.requests,
            self.errors,
            self.incomplete,
            self.per_second(self.requests - self.failed()),
            self.per_second(self.output_tokens),
            f(percentile_ms(&self.ttft, 50.0)),
            f(percentile_ms(&self.ttft, 99.0)),
            g(percentile_ms(&self.itl, 50.0)),
            g(percentile_ms(&self.itl, 99.0)),
        )
    }
}

fn round(v: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (v * m).round() / m
}

/// The resident set of process `pid` in MiB (Linux `/proc`), if readable.
pub fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 =
        status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib / 1024.0)
}
