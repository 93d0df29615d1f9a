//! A token-bucket rate limit per client (an API key, or an address).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// A token bucket per client: `rate` requests per second sustained, bursts
/// up to `burst`.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimiter {
    pub fn new(per_second: f64) -> Self {
        RateLimiter { rate: per_second, burst: per_second.max(1.0), buckets: Mutex::new(HashMap::new()) }
    }

    /// Takes a token for `client`, or says how many seconds until one is
    /// available.
    pub(crate) fn take(&self, client: &str) -> Result<(), u64> {
        self.take_at(client, Instant::now())
    }

    /// [`take`](Self::take) at the time `now` (tests pass a later instant
    /// instead of sleeping).
    fn take_at(&self, client: &str, now: Instant) -> Result<(), u64> {
        let mut buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() > 10_000 {
            // Forget full buckets: they hold nothing a new one would not.
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, (tokens, at)| *tokens + rate * now.duration_since(*at).as_secs_f64() < burst);
        }
        let (tokens, at) = buckets.entry(client.to_owned()).or_insert((self.burst, now));
        *tokens = (*tokens + self.rate * now.duration_since(*at).as_secs_f64()).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - *tokens) / self.rate).ceil().max(1.0) as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_bucket_refills_at_its_rate() {
        let limiter = RateLimiter::new(2.0);
        let start = Instant::now();
        assert!(limiter.take_at("a", start).is_ok());
        assert!(limiter.take_at("a", start).is_ok());
        assert_eq!(limiter.take_at("a", start), Err(1));
        assert!(limiter.take_at("b", start).is_ok(), "buckets are per client");
        // 2 per second: one token back after 0.5 s, not before (0.4 s).
        assert_eq!(limiter.take_at("a", start + Duration::from_millis(400)), Err(1));
        assert!(limiter.take_at("a", start + Duration::from_millis(510)).is_ok());
        assert_eq!(limiter.take_at("a", start + Duration::from_millis(510)), Err(1));
        // A long pause refills up to the burst (2), no more.
        let later = start + Duration::from_secs(60);
        assert!(limiter.take_at("a", later).is_ok());
        assert!(limiter.take_at("a", later).is_ok());
        assert_eq!(limiter.take_at("a", later), Err(1));
    }
}
