//! The shared KV pool's bookkeeping: which cells each sequence holds
//! (shared prefixes counted once) and an index of cached token prefixes.
//!
//! In a unified KV cache, `seq_cp` shares cells instead of copying them,
//! and a cell is freed only when its last sequence is removed. Cells are
//! therefore accounted as *runs*: positions `start..end` that one sequence
//! decoded, identified by a run id. A sequence that starts from another's
//! prefix holds clipped copies of that sequence's runs, and its own
//! decoding appends a run of its own. The cells in use are the union, per
//! run id, of the positions its holders cover.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use crate::llama::types::{SeqId, Token};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    id: u64,
    start: usize,
    end: usize,
}

/// The cells one sequence holds: positions `0..len()`, as runs.
#[derive(Clone, Debug, Default)]
pub(crate) struct Cells {
    runs: Vec<Run>,
}

impl Cells {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.runs.last().map_or(0, |r| r.end)
    }

    /// Records `n` newly decoded positions in the sequence's own run `own`.
    pub fn append(&mut self, own: u64, n: usize) {
        let end = self.len();
        match self.runs.last_mut() {
            Some(last) if last.id == own => last.end += n,
            _ => self.runs.push(Run { id: own, start: end, end: end + n }),
        }
    }

    /// The cells of positions `0..k` of `self` (the worker shares with
    /// [`Cells::extend_from`], which gives the same for `0..k`).
    #[cfg(test)]
    pub fn prefix(&self, k: usize) -> Cells {
        let runs = self.runs.iter().filter(|r| r.start < k).map(|r| Run { end: r.end.min(k), ..*r }).collect();
        Cells { runs }
    }

    /// Appends positions `from..to` of `source` (whose cells a sequence
    /// holding `0..from` `seq_cp`s), as the runs they belong to.
    pub fn extend_from(&mut self, source: &Cells, from: usize, to: usize) {
        debug_assert_eq!(self.len(), from, "cells are appended in position order");
        for r in &source.runs {
            let (start, end) = (r.start.max(from), r.end.min(to));
            if start >= end {
                continue;
            }
            match self.runs.last_mut() {
                Some(last) if last.id == r.id && last.end == start => last.end = end,
                _ => self.runs.push(Run { id: r.id, start, end }),
            }
        }
    }

    /// Positions held in run `id` (the ones a sequence decoded itself).
    pub fn own(&self, id: u64) -> usize {
        self.runs.iter().filter(|r| r.id == id).map(|r| r.end - r.start).sum()
    }

    pub fn clear(&mut self) {
        self.runs.clear();
    }
}

/// The number of distinct cells the given sequences hold together.
pub(crate) fn cells_in_use<'a>(all: impl IntoIterator<Item = &'a Cells>) -> usize {
    let mut extent: HashMap<u64, (usize, usize)> = HashMap::new();
    for cells in all {
        for r in &cells.runs {
            let e = extent.entry(r.id).or_insert((r.start, r.end));
            e.0 = e.0.min(r.start);
            e.1 = e.1.max(r.end);
        }
    }
    extent.values().map(|(start, end)| end - start).sum()
}

/// An index of the token prefixes held in the pool, by chained hashes of
/// fixed-size blocks: the hash of block `i` covers every token before its
/// end, so a lookup walks the prompt block by block, one hash-map probe
/// each, and its cost grows with the prompt, not with the number or length
/// of the cached sequences. Hashes only find a candidate: the caller
/// compares the tokens, and extends the match past the last whole block.
#[derive(Debug)]
pub(crate) struct PrefixIndex {
    block: usize,
    /// Block hash → the sequences holding that prefix.
    holders: HashMap<u64, Vec<SeqId>>,
    /// Per sequence, the hashes of its indexed blocks in order.
    chains: HashMap<SeqId, Vec<u64>>,
}

fn chain(prev: u64, block: &[Token]) -> u64 {
    let mut h = DefaultHasher::new();
    prev.hash(&mut h);
    for t in block {
        t.0.hash(&mut h);
    }
    h.finish()
}

impl PrefixIndex {
    pub fn new(block: usize) -> Self {
        PrefixIndex { block: block.max(1), holders: HashMap::new(), chains: HashMap::new() }
    }

    /// Indexes the whole blocks of `tokens` (the positions `seq` holds) not
    /// indexed yet.
    pub fn extend(&mut self, seq: SeqId, tokens: &[Token]) {
        let hashes = self.chains.entry(seq).or_default();
        let whole = tokens.len() / self.block;
        while hashes.len() < whole {
            let i = hashes.len();
            let prev = hashes.last().copied().unwrap_or(0);
            let h = chain(prev, &tokens[i * self.block..(i + 1) * self.block]);
            hashes.push(h);
            self.holders.entry(h).or_default().push(seq);
        }
    }

    /// Forgets `seq`.
    pub fn remove(&mut self, seq: SeqId) {
        for h in self.chains.remove(&seq).unwrap_or_default() {
            if let Some(list) = self.holders.get_mut(&h) {
                list.retain(|&s| s != seq);
                if list.is_empty() {
                    self.holders.remove(&h);
                }
            }
        }
    }

    /// The sequences holding the most whole blocks of `prompt`, and how
    /// many tokens those blocks cover (a candidate: compare the tokens).
    pub fn lookup(&self, prompt: &[Token]) -> Option<(&[SeqId], usize)> {
        let mut best = None;
        let mut prev = 0;
        for (i, block) in prompt.chunks_exact(self.block).enumerate() {
            prev = chain(prev, block);
            match self.holders.get(&prev) {
                Some(list) => best = Some((list.as_slice(), (i + 1) * self.block)),
                None => break,
            }
        }
        best
    }

    /// Number of sequences indexed.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.chains.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(v: impl IntoIterator<Item = i32>) -> Vec<Token> {
        v.into_iter().map(Token).collect()
    }

    #[test]
    fn shared_prefixes_are_counted_once() {
        let mut a = Cells::default();
        a.append(1, 100);
        a.append(1, 20);
        assert_eq!(a.len(), 120);
        // b shares 80 cells of a and decodes 30 of its own.
        let mut b = a.prefix(80);
        b.append(2, 30);
        assert_eq!(b.len(), 110);
        assert_eq!((b.own(2), b.own(1), a.own(1)), (30, 80, 120));
        assert_eq!(cells_in_use([&a, &b]), 150);
        // c shares 100 of b: 80 of a's run and 20 of b's.
        let mut c = b.prefix(100);
        c.append(3, 5);
        assert_eq!(cells_in_use([&a, &b, &c]), 155);
        // Removing a frees only the 40 cells nobody else holds.
        assert_eq!(cells_in_use([&b, &c]), 115);
        // Removing b too leaves c's 105 cells.
        assert_eq!(cells_in_use([&c]), 105);
        assert_eq!(cells_in_use([] as [&Cells; 0]), 0);
    }

    #[test]
    fn a_follower_appends_the_leaders_runs_it_shares() {
        // a shares 0..40 of x's run 1, then decodes 40..100 itself (run 2).
        let mut x = Cells::default();
        x.append(1, 40);
        let mut a = x.prefix(40);
        a.append(2, 60);
        // f held 0..16 of x, then takes 16..70 from a: 16..40 of run 1, 40..70 of run 2.
        let mut f = x.prefix(16);
        f.extend_from(&a, 16, 70);
        assert_eq!(f.len(), 70);
        assert_eq!((f.own(1), f.own(2)), (40, 30));
        assert_eq!(f.runs.len(), 2, "16..40 joins 0..16 of the same run");
        f.append(3, 5);
        // Listed with the clipped runs first, the extents still start at 0.
        assert_eq!(cells_in_use([&f, &a, &x]), 105);
        assert_eq!(cells_in_use([&f]), 75);
    }

    #[test]
    fn lookup_finds_the_deepest_block_and_its_holders() {
        let mut index = PrefixIndex::new(4);
        let a = toks(0..10); // blocks [0..4), [4..8); 8, 9 not indexed
        let b = toks((0..6).chain(100..110)); // shares the first block with a
        index.extend(1, &a);
        index.extend(2, &b);
        assert_eq!(index.lookup(&toks(0..9)), Some((&[1][..], 8)));
        assert_eq!(index.lookup(&toks((0..4).chain(50..60))), Some((&[1, 2][..], 4)));
        assert_eq!(index.lookup(&toks(5..20)), None);
        assert_eq!(index.lookup(&toks(0..3)), None);
        // Growing a sequence indexes its new whole blocks.
        let mut longer = a.clone();
        longer.extend(toks(10..13));
        index.extend(1, &longer);
        assert_eq!(index.lookup(&toks(0..20)), Some((&[1][..], 12)));
        index.remove(1);
        assert_eq!(index.lookup(&toks(0..20)), Some((&[2][..], 4)));
        index.remove(2);
        assert_eq!(index.lookup(&toks(0..20)), None);
        assert_eq!(index.len(), 0);
        assert!(index.holders.is_empty());
    }
}
