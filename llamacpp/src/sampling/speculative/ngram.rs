//! The n-gram drafter: pure logic over a token history.

use std::collections::HashMap;

use super::{MAX_PAUSE, Speculation};
use crate::llama::types::Token;

/// Drafts the continuation of a history from where its last n tokens
/// occurred before, and adapts the draft length to how much is accepted.
///
/// The history is the caller's (prompt, generated tokens, the token about
/// to be decoded last); it may only grow between calls, except through
/// [`NgramDrafter::reset`].
#[derive(Debug)]
pub(crate) struct NgramDrafter {
    spec: Speculation,
    /// Per n-gram length (`ngram_min + i`): a hash of the `n` tokens
    /// before position `p` → the latest such `p` (the token that followed).
    tables: Vec<HashMap<u64, u32>>,
    /// History positions indexed so far: every `p < indexed` is in the
    /// tables.
    indexed: usize,
    /// The longest next draft.
    limit: usize,
    /// Drafts in a row of which nothing was accepted.
    misses: u32,
    /// Steps left without drafting.
    pause: usize,
    /// Draft tokens accepted, and tokens tried (accepted ones plus the
    /// first rejected one of each draft), both fading with each draft:
    /// their ratio estimates the chance that a draft token is accepted
    /// after the ones before it were.
    accepted: f64,
    tried: f64,
    /// How long a stretch matched at the last draft (0: no draft).
    matched: usize,
}

/// How much of the acceptance estimate each further draft keeps.
const ACCEPTANCE_DECAY: f64 = 0.9;
/// The estimate before any draft, as accepted and tried counts: 0.8, worth
/// five tokens.
const ACCEPTANCE_PRIOR: (f64, f64) = (4.0, 5.0);

/// How far back a match is measured (a draft is at most as long as the
/// text before it that matched the history's end: a long match is a copy
/// in progress, a short one often a common phrase that goes on otherwise).
const MATCH_LIMIT: usize = 64;

/// A match at least this long is a copy in progress: its draft takes the
/// whole `draft_max` at once instead of growing toward it (through
/// llama-serve, two runs of 3 rounds: copy 1.11–1.26×, code 1.09–1.17×
/// the tokens/s of growing toward it).
const COPY_MATCH: usize = 16;

/// A hash of `tokens` (FNV-1a over the ids, then a final mix): collisions
/// are checked against the history, so it only needs to spread well.
fn hash(tokens: &[Token]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in tokens {
        h ^= u64::from(t.0 as u32);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^ (h >> 29)
}

impl NgramDrafter {
    pub fn new(spec: Speculation) -> NgramDrafter {
        NgramDrafter {
            spec,
            tables: vec![HashMap::new(); spec.ngram_max - spec.ngram_min + 1],
            indexed: 0,
            limit: spec.draft_max.div_ceil(2),
            misses: 0,
            pause: 0,
            accepted: ACCEPTANCE_PRIOR.0,
            tried: ACCEPTANCE_PRIOR.1,
            matched: 0,
        }
    }

    /// Forgets the history (after it changed other than by growing).
    pub fn reset(&mut self) {
        self.tables.iter_mut().for_each(HashMap::clear);
        self.indexed = 0;
    }

    /// Indexes the positions of `history` not indexed yet.
    fn index(&mut self, history: &[Token]) {
        let min = self.spec.ngram_min;
        for p in self.indexed.max(min)..history.len() {
            for (i, table) in self.tables.iter_mut().enumerate() {
                let n = min + i;
                if n > p {
                    break;
                }
                table.insert(hash(&history[p - n..p]), p as u32);
            }
        }
        self.indexed = self.indexed.max(history.len());
    }

    /// Writes into `out` (cleared first) a draft of at most `max` tokens
    /// to follow `history`, or nothing. Every call is one step: a paused
    /// drafter counts it.
    pub fn draft(&mut self, history: &[Token], max: usize, out: &mut Vec<Token>) {
        out.clear();
        self.matched = 0;
        // The key looked up, the n-gram ending the history, would be
        // indexed at position `history.len()`, which never is: whatever is
        // found occurred before.
        self.index(history);
        if self.pause > 0 {
            self.pause -= 1;
        } else {
            if max > 0
                && let Some(from) = self.lookup(history)
            {
                // The text after `from` repeats with period len - from as
                // far as the draft goes: it continues into itself.
                let period = history.len() - from;
                let matched = (1..=MATCH_LIMIT.min(from))
                    .take_while(|&j| history[from - j] == history[history.len() - j])
                    .count();
                self.matched = matched;
                let limit = if matched >= COPY_MATCH { self.spec.draft_max } else { self.limit };
                let max = max.min(limit).min(matched.max(1));
                out.extend((0..max).map(|m| history[from + m % period]));
            }
        }
    }

    /// The position after the latest earlier occurrence of the longest
    /// n-gram that ends `history`.
    fn lookup(&self, history: &[Token]) -> Option<usize> {
        let len = history.len();
        let min = self.spec.ngram_min;
        (min..=self.spec.ngram_max).rev().filter(|&n| n < len).find_map(|n| {
            let key = &history[len - n..];
            let p = *self.tables[n - min].get(&hash(key))? as usize;
            (p < len && &history[p - n..p] == key).then_some(p)
        })
    }

    /// The estimated chance that a draft token is accepted once the ones
    /// before it were (recent drafts count most). The engine's cost cut
    /// reads it, through [`NgramDrafter::confidence`].
    #[cfg_attr(not(feature = "engine"), allow(dead_code))]
    pub fn acceptance(&self) -> f64 {
        self.accepted / self.tried
    }

    /// The chance that a token of the last draft is accepted once the
    /// ones before it were: the recent acceptance, or, if higher, what the
    /// stretch that matched says by Laplace's rule of succession (`m`
    /// tokens in a row matched: the next one with `(m + 1) / (m + 2)`). A
    /// long match is a copy in progress whatever the drafts before it did.
    #[cfg_attr(not(feature = "engine"), allow(dead_code))]
    pub fn confidence(&self) -> f64 {
        let m = self.matched as f64;
        self.acceptance().max((m + 1.0) / (m + 2.0))
    }

    /// Adapts to the last draft: `accepted` of its `drafted` tokens.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.accepted = self.accepted * ACCEPTANCE_DECAY + accepted as f64;
        self.tried = self.tried * ACCEPTANCE_DECAY + (accepted + usize::from(accepted < drafted)) as f64;
        let max = self.spec.draft_max;
        if accepted == drafted {
            self.misses = 0;
            self.limit = (self.limit * 2).min(max);
        } else if accepted > 0 {
            self.misses = 0;
            self.limit = (accepted + 1).min(max);
        } else {
            self.misses += 1;
            self.limit = (self.limit / 2).max(1);
            if self.misses >= 2 {
                self.pause = (1usize << self.misses.min(8)).min(MAX_PAUSE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(ids: &[i32]) -> Vec<Token> {
        ids.iter().map(|&i| Token(i)).collect()
    }

    fn draft(d: &mut NgramDrafter, history: &[i32], max: usize) -> Vec<i32> {
        let mut out = Vec::new();
        d.draft(&tokens(history), max, &mut out);
        out.iter().map(|t| t.0).collect()
    }

    /// `0..n`, then its first `k` tokens again: a copy in progress whose
    /// match is `k` tokens long.
    fn copying(n: i32, k: usize) -> Vec<i32> {
        (0..n).chain(0..n).take(n as usize + k).collect()
    }

    #[test]
    fn drafts_what_followed_the_last_occurrence() {
        let mut d = NgramDrafter::new(Speculation::ngram().draft_max(8).ngram_sizes(2, 3));
        let history = copying(20, 10);
        // The limit starts at half of draft_max.
        assert_eq!(draft(&mut d, &history, 16), [10, 11, 12, 13]);
        // It doubles when a draft is accepted whole.
        d.record(4, 4);
        assert_eq!(draft(&mut d, &history, 16), [10, 11, 12, 13, 14, 15, 16, 17]);
        // The caller's max bounds it too.
        assert_eq!(draft(&mut d, &history, 3), [10, 11, 12]);
    }

    #[test]
    fn a_draft_is_at_most_as_long_as_its_match() {
        let mut d = NgramDrafter::new(Speculation::ngram().draft_max(16).ngram_sizes(2, 3));
        d.record(8, 8);
        // "9 1 2" is preceded by 9, "7 1 2" by 7: a match of 2 tokens.
        assert_eq!(draft(&mut d, &[9, 1, 2, 3, 4, 5, 6, 7, 1, 2], 16), [3, 4]);
        let mut d = NgramDrafter::new(Speculation::ngram().draft_max(16).ngram_sizes(2, 3));
        d.record(8, 8);
        assert_eq!(draft(&mut d, &copying(30, 5), 16).len(), 5);
        assert_eq!(draft(&mut d, &copying(30, 12), 16).len(), 12);
    }

    #[test]
    fn prefers_the_longest_ngram_and_the_latest_occurrence() {
        let mut d = NgramDrafter::new(Speculation::ngram().draft_max(2).ngram_sizes(1, 3));
        // "2" last occurred before 8; "1 2" before 5: the longer wins.
        assert_eq!(draft(&mut d, &[1, 2, 5, 0, 2, 8, 7, 1, 2], 1), [5]);
        let mut d = NgramDrafter::new(Speculation::ngram().draft_max(2).ngram_sizes(2, 2));
        // "1 2" occurred twice: the later one counts.
        assert_eq!(draft(&mut d, &[1, 2, 5, 1, 2, 6, 1, 2], 1), [6]);
    }

    #[test]
    fn a_long_match_drafts_the_whole_limit_at_once() {
        // The limit starts at half of draft_max; a match of COPY_MATCH
        // tokens or more skips growing toward it.
        let mut d = NgramDrafter::new(Speculation::ngram().draft_max(8).ngram_sizes(2, 3));
        assert_eq!(draft(&mut d, &copying(100, COPY_MATCH - 1), 64).len(), 4, "the limit, below COPY_MATCH");
        assert_eq!(draft(&mut d, &copying(100, COPY_MATCH), 64).len(), 8);
        let mut d = NgramDrafter::new(Speculation::ngram().draft_max(64).ngram_sizes(2, 3));
        assert_eq!(draft(&mut d, &copying(100, 40), 64).len(), 40, "still no longer than the match");
        assert_eq!(draft(&mut d, &copying(100, 40), 20).len(), 20, "nor than the caller's max");
    }

    #[test]
    fn confidence_follows_the_match_or_the_acceptance() {
        let mut d = NgramDrafter::new(Speculation::ngram().draft_max(64).ngram_sizes(2, 3));
        assert!((d.confidence() - 0.8).abs() < 1e-9, "the prior before any draft");
        draft(&mut d, &copying(100, 38), 64);
        assert!((d.confidence() - 39.0 / 40.0).abs() < 1e-9, "{}", d.confidence());
        d.record(38, 38);
        draft(&mut d, &[1, 2, 3], 64);
        assert!(d.confidence() > 0.9 && d.confidence() == d.acceptance(), "no draft: the acceptance");
    }

    #[test]
    fn a_draft_past_the_end_continues_the_repetition() {
        let mut d = NgramDrafter::new(Speculation::ngram().draft_max(8).ngram_sizes(2, 2));
        d.record(4, 4);
        // "7 8 9" three times, then "7 8": period 3, a match of 8 tokens,
        // the draft repeats 9 7 8.
        assert_eq!(draft(&mut d, &[7, 8, 9, 7, 8, 9, 7, 8, 9, 7, 8], 8), [9, 7, 8, 9, 7, 8, 9, 7]);
    }

    #[test]
    fn no_draft_without_an_earlier_occurrence() {
        let mut d = NgramDrafter::new(Speculation::ngram());
        assert!(draft(&mut d, &[1, 2, 3, 4, 5, 6], 8).is_empty());
        assert!(draft(&mut d, &[1], 8).is_empty());
        assert!(draft(&mut d, &[], 8).is_empty());
        // The history's own last n-gram is not an earlier occurrence.
        let mut d = NgramDrafter::new(Speculation::ngram());
        assert!(draft(&mut d, &[1, 2, 3, 4, 5, 6, 7], 8).is_empty());
        assert!(draft(&mut d, &[1, 2, 3, 4, 5, 6, 7], 8).is_empty());
    }

    #[test]
    fn grows_incrementally_and_resets() {
        let mut d = NgramDrafter::new(Speculation::ngram().ngram_sizes(2, 2));
        let mut history = vec![1, 2, 3];
        assert!(draft(&mut d, &history, 4).is_empty());
        history.extend([4, 1, 2]);
        assert_eq!(draft(&mut d, &history, 4), [3, 4]);
        d.reset();
        assert!(draft(&mut d, &[4, 1, 2], 4).is_empty());
    }

    #[test]
    fn rejected_drafts_shrink_and_pause() {
        let history = copying(40, COPY_MATCH - 1);
        let mut d = NgramDrafter::new(Speculation::ngram().draft_max(8).ngram_sizes(2, 2));
        assert_eq!(draft(&mut d, &history, 8).len(), 4);
        d.record(4, 2);
        assert_eq!(draft(&mut d, &history, 8).len(), 3);
        d.record(3, 0);
        assert_eq!(draft(&mut d, &history, 8).len(), 1);
        d.record(1, 0);
        // Two misses in a row: 4 steps without a draft, then drafts again.
        for _ in 0..4 {
            assert!(draft(&mut d, &history, 8).is_empty());
        }
        assert_eq!(draft(&mut d, &history, 8).len(), 1);
        d.record(1, 0);
        assert_eq!((0..8).filter(|_| draft(&mut d, &history, 8).is_empty()).count(), 8);
        // Nothing drafted: nothing learned.
        d.record(0, 0);
        assert_eq!(draft(&mut d, &history, 8).len(), 1);
    }

    #[test]
    fn estimates_acceptance_from_recent_drafts() {
        let mut d = NgramDrafter::new(Speculation::ngram());
        assert!((d.acceptance() - 0.8).abs() < 1e-9);
        for _ in 0..20 {
            d.record(8, 8);
        }
        assert!(d.acceptance() > 0.99, "{}", d.acceptance());
        // One token of each draft accepted, then the second rejected.
        for _ in 0..80 {
            d.record(4, 1);
        }
        assert!((d.acceptance() - 0.5).abs() < 0.01, "{}", d.acceptance());
        for _ in 0..80 {
            d.record(4, 0);
        }
        assert!(d.acceptance() < 0.01, "{}", d.acceptance());
    }

    #[test]
    fn validates_its_settings() {
        assert!(Speculation::ngram().validate().is_ok());
        assert!(Speculation::ngram().ngram_sizes(0, 2).validate().is_err());
        assert!(Speculation::ngram().ngram_sizes(3, 2).validate().is_err());
        assert!(Speculation::ngram().ngram_sizes(1, 17).validate().is_err());
        assert!(Speculation::ngram().draft_max(0).validate().is_err());
        assert!(Speculation::ngram().draft_max(65).validate().is_err());
    }
}
