//! Deterministic token-id prompts for load drivers (`llama-serve/examples/serve_bench`,
//! `llama-serve/examples/loadgen`), so that every backend gets exactly the same tokens.
//!
//! Prompts are BOS (id 2, Gemma's) followed by ids drawn uniformly from
//! `1000..100000` (inside Gemma 3's 262,144-token vocabulary, clear of its
//! control and special tokens) by a xorshift64* generator. Each named
//! stream ([`XorShift::new`]'s `tag`) is independent, so two requests share
//! more than the BOS token only where a workload makes them.

/// Gemma's beginning-of-sequence token.
pub const BOS: i32 = 2;
/// Lowest token id drawn (inclusive).
pub const TOKEN_MIN: i32 = 1000;
/// Highest token id drawn (exclusive).
pub const TOKEN_MAX: i32 = 100_000;

/// xorshift64* (Vigna): tiny, deterministic, good enough for token ids.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator for one named stream of one run: `seed` mixed with `tag`
    /// (splitmix64), never the all-zero state xorshift cannot leave.
    pub fn new(seed: u64, tag: &str) -> XorShift {
        let mut x = seed ^ 0x9e37_79b9_7f4a_7c15;
        for b in tag.bytes() {
            x = splitmix(x ^ u64::from(b));
        }
        XorShift(if x == 0 { 0x2545_f491_4f6c_dd1d } else { x })
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A token id in `TOKEN_MIN..TOKEN_MAX`.
    pub fn token(&mut self) -> i32 {
        let span = (TOKEN_MAX - TOKEN_MIN) as u64;
        TOKEN_MIN + (self.next_u64() % span) as i32
    }

    /// `len` random tokens (no BOS).
    pub fn tokens(&mut self, len: usize) -> Vec<i32> {
        (0..len).map(|_| self.token()).collect()
    }

    /// A prompt of `len` tokens in all: BOS, then `len - 1` random tokens.
    pub fn prompt(&mut self, len: usize) -> Vec<i32> {
        let mut p = Vec::with_capacity(len.max(1));
        p.push(BOS);
        p.extend(self.tokens(len.saturating_sub(1)));
        p
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
