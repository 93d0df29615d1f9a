//! What the engine measures: counters, gauges and latency histograms,
//! each kept in [`EngineStats`] and reported to the `metrics` facade under
//! a series name defined here once. The series are listed in the `engine`
//! module's docs.

use std::sync::Mutex;
use std::time::Duration;

use super::{EngineStats, lock};
use crate::llama::context::PerfCounters;

/// A count that only grows: a field of [`EngineStats`] and, for most, a
/// `metrics` counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counter {
    PromptTokens,
    PromptTokensEvaluated,
    PrefixLookups,
    PrefixHitTokens,
    CompletionTokens,
    Preemptions,
    Steps,
    DraftTokens,
    DraftTokensAccepted,
}

impl Counter {
    /// The `metrics` series (`None`: a field of [`EngineStats`] only).
    fn series(self) -> Option<&'static str> {
        Some(match self {
            Counter::PromptTokens => "llama_engine_prompt_tokens_total",
            Counter::PromptTokensEvaluated => "llama_engine_prompt_tokens_evaluated_total",
            Counter::PrefixLookups => return None,
            Counter::PrefixHitTokens => "llama_engine_prefix_hit_tokens_total",
            Counter::CompletionTokens => "llama_engine_completion_tokens_total",
            Counter::Preemptions => "llama_engine_preemptions_total",
            Counter::Steps => "llama_engine_steps_total",
            Counter::DraftTokens => "llama_engine_draft_tokens_total",
            Counter::DraftTokensAccepted => "llama_engine_draft_tokens_accepted_total",
        })
    }

    fn field(self, stats: &mut EngineStats) -> &mut u64 {
        match self {
            Counter::PromptTokens => &mut stats.prompt_tokens,
            Counter::PromptTokensEvaluated => &mut stats.prompt_tokens_evaluated,
            Counter::PrefixLookups => &mut stats.prefix_lookups,
            Counter::PrefixHitTokens => &mut stats.prefix_hit_tokens,
            Counter::CompletionTokens => &mut stats.completion_tokens,
            Counter::Preemptions => &mut stats.preemptions,
            Counter::Steps => &mut stats.steps,
            Counter::DraftTokens => &mut stats.draft_tokens,
            Counter::DraftTokensAccepted => &mut stats.draft_tokens_accepted,
        }
    }
}

/// Finished requests: [`EngineStats::requests_finished`], and this series
/// labelled with the finish reason.
const REQUESTS_FINISHED: &str = "llama_engine_requests_total";

/// A level, set once per step: a field of [`EngineStats`] and, for most, a
/// `metrics` gauge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gauge {
    Running,
    Waiting,
    KvCellsUsed,
    KvCellsTotal,
    CachedPrefixCells,
    CachedPrefixes,
}

impl Gauge {
    fn series(self) -> Option<&'static str> {
        Some(match self {
            Gauge::Running => "llama_engine_running",
            Gauge::Waiting => "llama_engine_waiting",
            Gauge::KvCellsUsed => "llama_engine_kv_cells_used",
            Gauge::KvCellsTotal => "llama_engine_kv_cells_total",
            Gauge::CachedPrefixCells => "llama_engine_cached_prefix_cells",
            Gauge::CachedPrefixes => return None,
        })
    }

    fn field(self, stats: &mut EngineStats) -> &mut usize {
        match self {
            Gauge::Running => &mut stats.running,
            Gauge::Waiting => &mut stats.waiting,
            Gauge::KvCellsUsed => &mut stats.kv_cells_used,
            Gauge::KvCellsTotal => &mut stats.kv_cells_total,
            Gauge::CachedPrefixCells => &mut stats.cached_prefix_cells,
            Gauge::CachedPrefixes => &mut stats.cached_prefixes,
        }
    }
}

/// A latency distribution: a [`Latency`] of [`EngineStats`] and a
/// `metrics` histogram in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LatencySeries {
    TimeToFirstToken,
    InterToken,
    EndToEnd,
    Queue,
}

impl LatencySeries {
    const ALL: [LatencySeries; 4] =
        [LatencySeries::TimeToFirstToken, LatencySeries::InterToken, LatencySeries::EndToEnd, LatencySeries::Queue];

    fn series(self) -> &'static str {
        match self {
            LatencySeries::TimeToFirstToken => "llama_engine_ttft_seconds",
            LatencySeries::InterToken => "llama_engine_inter_token_seconds",
            LatencySeries::EndToEnd => "llama_engine_e2e_seconds",
            LatencySeries::Queue => "llama_engine_queue_seconds",
        }
    }

    fn field(self, stats: &mut EngineStats) -> &mut Latency {
        match self {
            LatencySeries::TimeToFirstToken => &mut stats.time_to_first_token,
            LatencySeries::InterToken => &mut stats.inter_token,
            LatencySeries::EndToEnd => &mut stats.end_to_end,
            LatencySeries::Queue => &mut stats.queue,
        }
    }
}

/// What [`Engine::stats`](super::Engine::stats) reads: the counters and
/// histograms as of the worker's last step.
#[derive(Debug, Default)]
pub(crate) struct Published {
    stats: EngineStats,
    /// Per [`LatencySeries`], in its order.
    histograms: [Histogram; LatencySeries::ALL.len()],
}

impl Published {
    pub fn snapshot(&self) -> EngineStats {
        let mut stats = self.stats.clone();
        for series in LatencySeries::ALL {
            *series.field(&mut stats) = self.histograms[series as usize].summary();
        }
        stats
    }
}

/// The worker's side: every update goes to [`EngineStats`] and its
/// series in one call; the stats and the step's latency samples become
/// visible to readers at [`Meter::publish`], once per step.
#[derive(Debug, Default)]
pub(crate) struct Meter {
    stats: EngineStats,
    /// Latency samples of this step, per [`LatencySeries`].
    samples: [Vec<Duration>; LatencySeries::ALL.len()],
}

impl Meter {
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    pub fn count(&mut self, counter: Counter, n: u64) {
        *counter.field(&mut self.stats) += n;
        if let Some(name) = counter.series() {
            ::metrics::counter!(name).increment(n);
        }
    }

    /// A request finished, for the reason `label` (`length`, `stop`, ...).
    pub fn finished(&mut self, label: &'static str) {
        self.stats.requests_finished += 1;
        ::metrics::counter!(REQUESTS_FINISHED, "reason" => label).increment(1);
    }

    pub fn set(&mut self, gauge: Gauge, value: usize) {
        *gauge.field(&mut self.stats) = value;
        if let Some(name) = gauge.series() {
            ::metrics::gauge!(name).set(value as f64);
        }
    }

    pub fn set_perf(&mut self, perf: PerfCounters) {
        self.stats.perf = perf;
    }

    pub fn record(&mut self, series: LatencySeries, latency: Duration) {
        self.samples[series as usize].push(latency);
    }

    /// Copies the stats to `to` and records this step's latency samples
    /// there and in their series.
    pub fn publish(&mut self, to: &Mutex<Published>) {
        let mut published = lock(to);
        published.stats.clone_from(&self.stats);
        for series in LatencySeries::ALL {
            let histogram = &mut published.histograms[series as usize];
            for latency in self.samples[series as usize].drain(..) {
                histogram.record(latency);
                ::metrics::histogram!(series.series()).record(latency.as_secs_f64());
            }
        }
    }
}

/// Buckets grow by this factor: a quantile read from the histogram is at
/// most 4% above the true value.
const GROWTH: f64 = 1.04;
/// 1 µs · 1.04^600 ≈ 5.8 hours: longer samples land in the last bucket.
const BUCKETS: usize = 600;

/// A cumulative histogram of durations with logarithmic buckets: constant
/// memory, recording in O(1), quantiles within 4%.
#[derive(Clone, Debug)]
pub(crate) struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum_ns: u128,
    max_ns: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: vec![0; BUCKETS], count: 0, sum_ns: 0, max_ns: 0 }
    }
}

fn bucket(ns: u64) -> usize {
    let us = ns as f64 / 1000.0;
    if us <= 1.0 { 0 } else { ((us.ln() / GROWTH.ln()).ceil() as usize).min(BUCKETS - 1) }
}

fn bucket_upper_ns(i: usize) -> u64 {
    (GROWTH.powi(i as i32) * 1000.0) as u64
}

impl Histogram {
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket(ns)] += 1;
        self.count += 1;
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    fn quantile(&self, q: f64) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Duration::from_nanos(bucket_upper_ns(i).min(self.max_ns));
            }
        }
        Duration::from_nanos(self.max_ns)
    }

    pub fn summary(&self) -> Latency {
        Latency {
            count: self.count,
            mean: if self.count == 0 {
                Duration::ZERO
            } else {
                Duration::from_nanos((self.sum_ns / u128::from(self.count)) as u64)
            },
            p50: self.quantile(0.50),
            p90: self.quantile(0.90),
            p99: self.quantile(0.99),
            max: Duration::from_nanos(self.max_ns),
        }
    }
}

/// A latency distribution since the engine started. Quantiles come from
/// logarithmic buckets and are at most 4% above the exact value (never
/// above the maximum); `count`, `mean` and `max` are exact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Latency {
    /// Samples recorded.
    pub count: u64,
    /// Their mean.
    pub mean: Duration,
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Largest sample.
    pub max: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_four_percent() {
        let mut h = Histogram::default();
        for ms in 1..=1000u64 {
            h.record(Duration::from_millis(ms));
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        assert_eq!(s.max, Duration::from_millis(1000));
        assert_eq!(s.mean, Duration::from_micros(500_500));
        for (got, want) in [(s.p50, 500.0), (s.p90, 900.0), (s.p99, 990.0)] {
            let got = got.as_secs_f64() * 1000.0;
            assert!(got >= want && got <= want * GROWTH, "{got} vs {want}");
        }
        assert_eq!(Histogram::default().summary(), Latency::default());
        let mut one = Histogram::default();
        one.record(Duration::from_nanos(10));
        assert_eq!(one.summary().p99, Duration::from_nanos(10));
    }
}
