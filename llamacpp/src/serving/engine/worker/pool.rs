//! The KV pool's sequences: which slot holds what, where a prompt's
//! prefix can be shared from, and the cached prefixes that finished
//! requests leave behind (evicted least recently used first).

use super::seq::{Follow, Saved, Seq};
use crate::llama::context::Context;
use crate::llama::types::{Pos, SeqId, Token};
use crate::serving::engine::EngineConfig;
use crate::serving::engine::kv::{Cells, PrefixIndex, cells_in_use};
use crate::serving::engine::media::media_boundary;
use crate::text::generate::session::swa_window_present;

/// A follower must gain at least this many positions over what it can
/// share at once, or it prefills them itself instead of waiting.
const MIN_FOLLOW: usize = 16;

/// A finished sequence whose cells stay in the pool for later prompts.
struct Cached {
    slot: SeqId,
    tokens: Vec<Token>,
    cells: Cells,
    last_used: u64,
}

/// What a slot holds: the tokens in its cells, and the cells.
struct Holder<'a> {
    tokens: &'a [Token],
    cells: &'a Cells,
    /// Its index among the cached prefixes (`None`: a running sequence).
    cached: Option<usize>,
}

/// A prefix of a prompt that the sequence in `slot` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Share {
    pub slot: SeqId,
    pub len: usize,
}

/// The context's sequences (slots) and their cells: it places admitted
/// requests in free slots, shares prefixes between them, vacates
/// preempted ones, and keeps finished ones as cached prefixes. The running
/// requests themselves are the worker's; methods that need them take them.
pub(super) struct Pool {
    /// Cells in the pool.
    capacity: usize,
    cached: Vec<Cached>,
    free_slots: Vec<SeqId>,
    index: PrefixIndex,
    /// Uses of cached prefixes so far, for LRU (a counter, not a clock).
    lru_tick: u64,
    /// The id of the next run of cells a sequence decodes itself.
    next_run: u64,
    max_cached: usize,
    cached_cell_limit: usize,
    /// Whether prompts share cells at all (a recurrent state cannot be
    /// shared in part).
    sharing: bool,
}

impl Pool {
    /// A pool of `capacity` cells and `n_seq` sequences, all free.
    pub fn new(config: &EngineConfig, capacity: usize, n_seq: usize, sharing: bool) -> Self {
        Pool {
            capacity,
            cached: Vec::new(),
            free_slots: (0..n_seq as SeqId).rev().collect(),
            index: PrefixIndex::new(config.prefix_block),
            lru_tick: 0,
            next_run: 0,
            max_cached: config.max_cached_prefixes as usize,
            cached_cell_limit: (capacity as f64 * f64::from(config.prefix_cache_share)) as usize,
            sharing,
        }
    }

    pub fn sharing(&self) -> bool {
        self.sharing
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The running sequence or cached prefix in `slot`.
    fn holder<'a>(&'a self, running: &'a [Seq<'_>], slot: SeqId) -> Option<Holder<'a>> {
        if let Some(s) = running.iter().find(|s| s.placement.slot == Some(slot)) {
            return Some(Holder { tokens: s.held(), cells: &s.placement.cells, cached: None });
        }
        let i = self.cached.iter().position(|c| c.slot == slot)?;
        Some(Holder { tokens: &self.cached[i].tokens, cells: &self.cached[i].cells, cached: Some(i) })
    }

    /// Cells in use, by running sequences and cached prefixes.
    pub fn cells_used(&self, running: &[Seq<'_>]) -> usize {
        cells_in_use(running.iter().map(|s| &s.placement.cells).chain(self.cached.iter().map(|c| &c.cells)))
    }

    /// Cells in use once every cached prefix but the one in `keep` is
    /// evicted.
    fn cells_kept(&self, running: &[Seq<'_>], keep: Option<SeqId>) -> usize {
        let kept = self.cached.iter().filter(|c| Some(c.slot) == keep).map(|c| &c.cells);
        cells_in_use(running.iter().map(|s| &s.placement.cells).chain(kept))
    }

    pub fn cached_cells(&self) -> usize {
        cells_in_use(self.cached.iter().map(|c| &c.cells))
    }

    pub fn cached_prefixes(&self) -> usize {
        self.cached.len()
    }

    /// Whether a sequence that adds `need` cells can be admitted beside
    /// `running` (whose prefills still add theirs): a free slot and the
    /// cells, evicting cached prefixes other than `keep` for them, but only
    /// if evicting all of those would make the room (otherwise the request
    /// waits and the cache stays). With nothing running, the request gets
    /// the whole pool: its prompt fits (checked at submit), only the
    /// reserve in `need` may not.
    pub fn room_for(&mut self, ctx: &mut Context<'_>, running: &[Seq<'_>], need: usize, keep: Option<SeqId>) -> bool {
        let pending: usize = running.iter().map(Seq::pending).sum();
        let capacity = self.capacity;
        let fits = move |used: usize| capacity.saturating_sub(used.saturating_add(pending)) >= need;
        if !running.is_empty() && !fits(self.cells_kept(running, keep)) {
            return false;
        }
        while !self.has_free_slot() || !fits(self.cells_used(running)) {
            if !self.evict_lru(ctx, keep) {
                break;
            }
        }
        self.has_free_slot() && (fits(self.cells_used(running)) || running.is_empty())
    }

    /// Gives an admitted `seq` (the `order`th admission) a free slot
    /// (there is one: see [`Pool::room_for`]) and what it can have without
    /// decoding: its saved cells if it was preempted, else the prefix
    /// `share`, or later what it `follow`s. Returns the positions shared.
    pub fn place(
        &mut self,
        ctx: &mut Context<'_>,
        running: &[Seq<'_>],
        seq: &mut Seq<'_>,
        share: Option<Share>,
        follow: Option<Follow>,
        order: u64,
    ) -> usize {
        let slot = self.free_slots.pop().expect("a free slot");
        seq.placement.slot = Some(slot);
        seq.placement.n_cached = 0;
        seq.placement.cells.clear();
        seq.placement.own_run = self.next_run;
        seq.placement.prefill_to = seq.tokens.len();
        seq.placement.admitted_order = order;
        self.next_run += 1;
        if let Some(saved) = seq.placement.saved.take() {
            self.restore(ctx, seq, slot, saved);
        }
        let shared = match share {
            Some(Share { slot: src, len }) => {
                let src_cells = self.source_cells(running, src).expect("the holder just found");
                self.share(ctx, src, &src_cells, seq, len)
            }
            None => 0,
        };
        seq.placement.follow = follow.filter(|f| f.to > seq.placement.n_cached);
        shared
    }

    /// Records that `n` more of `seq`'s tokens are in its cells (decoded
    /// by itself: its own run).
    pub fn decoded(&mut self, seq: &mut Seq<'_>, n: usize) {
        let placement = &mut seq.placement;
        placement.n_cached += n;
        placement.cells.append(placement.own_run, n);
        let slot = placement.slot.expect("running sequences have a slot");
        self.index.extend(slot, seq.held());
    }

    /// `seq` stops waiting for its leader (it took the cells, or will
    /// prefill them itself).
    pub fn stop_following(&mut self, seq: &mut Seq<'_>) {
        seq.placement.follow = None;
    }

    /// Loads a preempted sequence's saved cells into its new slot, or
    /// leaves the slot empty to recompute them.
    fn restore(&mut self, ctx: &mut Context<'_>, seq: &mut Seq<'_>, slot: SeqId, saved: Saved) {
        let n = saved.positions;
        let restored = ctx.load_seq_state(&saved.state, slot).is_ok()
            && ctx.seq_pos_max(slot).ok().flatten() == Some(n as Pos - 1);
        if restored {
            seq.placement.n_cached = n;
            seq.placement.cells.append(seq.placement.own_run, n);
            self.index.extend(slot, seq.held());
        } else {
            // Removing a whole sequence never fails.
            let _ = ctx.seq_rm(Some(slot), None, None);
        }
    }

    /// Frees a preempted sequence's slot. Its cells are saved to host
    /// memory first (llama.cpp's sequence state), to be restored at
    /// readmission, unless they are mostly shared with others: then it is
    /// recomputed instead, since its readmission shares them again where a
    /// restore would copy them.
    /// The sequence forgets its place (its saved cells, if any, stay): it
    /// is restored or prefills again at readmission.
    pub fn vacate(&mut self, ctx: &mut Context<'_>, seq: &mut Seq<'_>) {
        let Some(slot) = seq.placement.slot.take() else { return };
        let n = seq.placement.n_cached;
        if n > 0
            && seq.placement.cells.own(seq.placement.own_run) * 2 >= n
            && let Ok(state) = ctx.save_seq_state(slot)
        {
            seq.placement.saved = Some(Saved { state, positions: n });
        }
        self.release(ctx, slot);
        seq.placement.cells.clear();
        seq.placement.n_cached = 0;
        seq.placement.follow = None;
    }

    /// Frees the slot of a sequence that failed (nothing of it is kept).
    pub fn drop_failed(&mut self, ctx: &mut Context<'_>, seq: &mut Seq<'_>) {
        if let Some(slot) = seq.placement.slot.take() {
            self.release(ctx, slot);
        }
    }

    /// The longest prefix of `tokens` (short of its last token, whose
    /// logits are needed) that a running sequence or cached prefix holds.
    pub fn longest_prefix(&self, ctx: &mut Context<'_>, running: &[Seq<'_>], tokens: &[Token]) -> Option<Share> {
        if !self.sharing || tokens.len() < 2 {
            return None;
        }
        let limit = tokens.len() - 1;
        let (holders, depth) = self.index.lookup(&tokens[..limit])?;
        let mut found: Vec<Share> = Vec::new();
        for &slot in holders {
            let Some(held) = self.holder(running, slot).map(|h| h.tokens) else { continue };
            if held.len() < depth || held[..depth] != tokens[..depth] {
                continue; // a hash collision
            }
            let len = depth + held[depth..].iter().zip(&tokens[depth..limit]).take_while(|(a, b)| a == b).count();
            let len = media_boundary(tokens, len);
            if len > 0 {
                found.push(Share { slot, len });
            }
        }
        // The longest match whose source still holds every position the
        // new sequence attends to (a sliding-window cache may have dropped
        // old ones; the engine's is full-size, but the check is cheap).
        found.sort_by_key(|s| std::cmp::Reverse(s.len));
        found.into_iter().find(|s| swa_window_present(ctx, s.slot, s.len).unwrap_or(false))
    }

    /// The running sequence still prefilling the longest prefix of `tokens`
    /// (short of its last token), if following it gains at least
    /// [`MIN_FOLLOW`] positions over the `shareable` ones.
    pub fn leader(&self, running: &[Seq<'_>], tokens: &[Token], shareable: usize) -> Option<Follow> {
        if !self.sharing || tokens.len() < 2 {
            return None;
        }
        let limit = tokens.len() - 1;
        running
            .iter()
            .filter(|s| s.placement.slot.is_some() && !s.decoding() && s.placement.follow.is_none())
            .map(|s| {
                let prompt = &s.tokens[..s.placement.prefill_to];
                let common = prompt.iter().zip(&tokens[..limit]).take_while(|(a, b)| a == b).count();
                Follow { leader: s.id, to: media_boundary(tokens, common) }
            })
            .filter(|f| f.to >= shareable + MIN_FOLLOW)
            .max_by_key(|f| f.to)
    }

    /// The cells of the sequence in `slot`, for a sequence about to share
    /// them; a cached prefix counts as used now.
    pub fn source_cells(&mut self, running: &[Seq<'_>], slot: SeqId) -> Option<Cells> {
        let holder = self.holder(running, slot)?;
        let (cells, cached) = (holder.cells.clone(), holder.cached);
        if let Some(i) = cached {
            self.cached[i].last_used = self.lru_tick;
            self.lru_tick += 1;
        }
        Some(cells)
    }

    /// Shares positions `seq.placement.n_cached..to` of the sequence in `src`
    /// (whose cells are `src_cells`) with `seq`: in a unified cache
    /// `seq_cp` shares the cells, nothing is copied. Returns the positions
    /// gained (none when llama.cpp refuses).
    pub fn share(
        &mut self,
        ctx: &mut Context<'_>,
        src: SeqId,
        src_cells: &Cells,
        seq: &mut Seq<'_>,
        to: usize,
    ) -> usize {
        let from = seq.placement.n_cached;
        let Some(slot) = seq.placement.slot else { return 0 };
        if to <= from || ctx.seq_cp(src, slot, Some(from as Pos), Some(to as Pos)).is_err() {
            return 0;
        }
        seq.placement.cells.extend_from(src_cells, from, to);
        seq.placement.n_cached = to;
        self.index.extend(slot, &seq.tokens[..to]);
        to - from
    }

    fn has_free_slot(&self) -> bool {
        !self.free_slots.is_empty()
    }

    /// Frees a slot's cells and index entries and makes it available.
    pub fn release(&mut self, ctx: &mut Context<'_>, slot: SeqId) {
        // Removing a whole sequence never fails.
        let _ = ctx.seq_rm(Some(slot), None, None);
        self.index.remove(slot);
        self.free_slots.push(slot);
    }

    /// Keeps a finished sequence's cells as a cached prefix (trimming the
    /// cache to its limits), or frees them when there is no prefix cache.
    pub fn retire(&mut self, ctx: &mut Context<'_>, seq: &mut Seq<'_>) {
        let Some(slot) = seq.placement.slot.take() else { return };
        if !self.sharing || self.max_cached == 0 || seq.placement.n_cached == 0 {
            self.release(ctx, slot);
            return;
        }
        let mut tokens = std::mem::take(&mut seq.tokens);
        tokens.truncate(seq.placement.n_cached);
        let cells = std::mem::take(&mut seq.placement.cells);
        self.cached.push(Cached { slot, tokens, cells, last_used: self.lru_tick });
        self.lru_tick += 1;
        while self.cached.len() > self.max_cached || self.cached_cells() > self.cached_cell_limit {
            if !self.evict_lru(ctx, None) {
                break;
            }
        }
    }

    /// Removes the least recently used cached prefix other than `keep`.
    pub fn evict_lru(&mut self, ctx: &mut Context<'_>, keep: Option<SeqId>) -> bool {
        let Some(i) = (0..self.cached.len())
            .filter(|&i| Some(self.cached[i].slot) != keep)
            .min_by_key(|&i| self.cached[i].last_used)
        else {
            return false;
        };
        let c = self.cached.swap_remove(i);
        self.release(ctx, c.slot);
        true
    }
}
