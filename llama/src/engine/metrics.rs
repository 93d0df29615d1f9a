//! Latency histograms for [`EngineStats`](super::EngineStats).
//!
//! The series are listed in the `engine` module's docs.

use std::time::Duration;

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
