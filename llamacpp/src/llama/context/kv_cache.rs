//! KV cache (memory) operations on a [`Context`]: removing, copying and
//! shifting the positions of sequences.
//!
//! Position ranges are half-open `p0..p1`; `None` for an end means
//! "from the start" or "to the end".

use crate::error::{Error, Result};
use crate::llama::context::Context;
use crate::llama::types::{Pos, SeqId};
use crate::sys;

fn bounds(p0: Option<Pos>, p1: Option<Pos>) -> (Pos, Pos) {
    (p0.unwrap_or(-1), p1.unwrap_or(-1))
}

impl Context<'_> {
    /// Empties the KV cache of every sequence (its cells are marked free;
    /// their data stays until overwritten).
    #[doc(alias = "llama_memory_clear")]
    pub fn clear_kv(&mut self) {
        self.clear_memory(false);
    }

    /// [`Context::clear_kv`], and zeroes the cache's buffers too (for
    /// contexts whose memory is handed to another tenant).
    #[doc(alias = "llama_memory_clear")]
    pub fn clear_kv_zeroed(&mut self) {
        self.clear_memory(true);
    }

    fn clear_memory(&mut self, zero_data: bool) {
        if self.check_reachable().is_err() {
            return;
        }
        // SAFETY: the context's own memory handle (NULL-safe).
        unsafe { sys::llama_memory_clear(self.memory(), zero_data) };
        self.invalidate_outputs();
        self.bump_epoch(None);
    }

    /// Removes positions `p0..p1` of `seq` (every sequence if `seq` is
    /// `None`). Returns `false` when the cache cannot remove part of a
    /// sequence (recurrent models): then clear the sequence and decode again.
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`].
    #[doc(alias = "llama_memory_seq_rm")]
    pub fn seq_rm(&mut self, seq: Option<SeqId>, p0: Option<Pos>, p1: Option<Pos>) -> Result<bool> {
        self.check_reachable()?;
        if let Some(s) = seq {
            self.check_seq(s)?;
        }
        let (p0, p1) = bounds(p0, p1);
        self.bump_epoch(seq);
        // SAFETY: the sequence id is -1 (all) or below n_seq_max, the only
        // precondition llama.cpp asserts on.
        Ok(unsafe { sys::llama_memory_seq_rm(self.memory(), seq.unwrap_or(-1), p0, p1) })
    }

    /// Copies positions `p0..p1` of `src` into `dst` (sharing the cells).
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`]; [`Error::InvalidArgument`] for a partial
    /// copy between sequences of a context without `kv_unified` (each
    /// sequence then has its own buffer and only whole copies work).
    #[doc(alias = "llama_memory_seq_cp")]
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: Option<Pos>, p1: Option<Pos>) -> Result<()> {
        self.check_reachable()?;
        self.check_seq(src)?;
        self.check_seq(dst)?;
        let partial = p0.is_some_and(|p| p > 0) || p1.is_some_and(|p| p >= 0);
        if src != dst && partial && !self.is_kv_unified() {
            return Err(Error::InvalidArgument(
                "a partial seq_cp between sequences needs a context with kv_unified".into(),
            ));
        }
        let (p0, p1) = bounds(p0, p1);
        // SAFETY: both ids are below n_seq_max and a cross-stream copy is
        // whole, the two conditions llama.cpp asserts on.
        unsafe { sys::llama_memory_seq_cp(self.memory(), src, dst, p0, p1) };
        self.bump_epoch(Some(dst));
        Ok(())
    }

    /// Removes every sequence but `seq`.
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`].
    #[doc(alias = "llama_memory_seq_keep")]
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<()> {
        self.check_reachable()?;
        self.check_seq(seq)?;
        // SAFETY: a valid sequence id.
        unsafe { sys::llama_memory_seq_keep(self.memory(), seq) };
        self.bump_epoch(None);
        Ok(())
    }

    /// Adds `delta` to the positions `p0..p1` of `seq` (context shift).
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`]; [`Error::CannotShift`] when the cache cannot
    /// shift ([`Context::can_shift`] is false), where llama.cpp would abort
    /// at the next decode; [`Error::InvalidArgument`] when a shifted
    /// position would not fit below `i32::MAX` (signed overflow in C++).
    #[doc(alias = "llama_memory_seq_add")]
    pub fn seq_add(&mut self, seq: SeqId, p0: Option<Pos>, p1: Option<Pos>, delta: Pos) -> Result<()> {
        self.check_reachable()?;
        self.check_seq(seq)?;
        if !self.can_shift() {
            return Err(Error::CannotShift);
        }
        let (p0, p1) = bounds(p0, p1);
        if delta > 0 {
            // SAFETY: a valid sequence id.
            let last = unsafe { sys::llama_memory_seq_pos_max(self.memory(), seq) };
            // The largest position that moves: the last one inside p0..p1.
            let top = if p1 >= 0 { last.min(p1.saturating_sub(1)) } else { last };
            if top >= 0 && top >= p0 && top.checked_add(delta).is_none_or(|p| p == Pos::MAX) {
                return Err(Error::InvalidArgument(format!(
                    "seq_add: position {top} + {delta} does not fit below {}",
                    Pos::MAX
                )));
            }
        }
        // SAFETY: a valid sequence id on a cache that supports shifting.
        unsafe { sys::llama_memory_seq_add(self.memory(), seq, p0, p1, delta) };
        self.bump_epoch(Some(seq));
        Ok(())
    }

    /// Divides the positions `p0..p1` of `seq` by `divisor` (self-extend).
    ///
    /// # Errors
    /// As [`Context::seq_add`]; [`Error::InvalidParameter`] for a divisor
    /// below 1.
    #[doc(alias = "llama_memory_seq_div")]
    pub fn seq_div(&mut self, seq: SeqId, p0: Option<Pos>, p1: Option<Pos>, divisor: i32) -> Result<()> {
        self.check_reachable()?;
        self.check_seq(seq)?;
        if divisor < 1 {
            return Err(Error::InvalidParameter {
                name: "divisor",
                message: format!("must be at least 1, got {divisor}"),
            });
        }
        if !self.can_shift() {
            return Err(Error::CannotShift);
        }
        let (p0, p1) = bounds(p0, p1);
        // SAFETY: a valid id, a positive divisor, a cache that can shift.
        unsafe { sys::llama_memory_seq_div(self.memory(), seq, p0, p1, divisor) };
        self.bump_epoch(Some(seq));
        Ok(())
    }

    /// The smallest position of `seq` in the cache, `None` if it is empty.
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`].
    #[doc(alias = "llama_memory_seq_pos_min")]
    pub fn seq_pos_min(&mut self, seq: SeqId) -> Result<Option<Pos>> {
        self.check_reachable()?;
        self.check_seq(seq)?;
        // SAFETY: a valid sequence id.
        let p = unsafe { sys::llama_memory_seq_pos_min(self.memory(), seq) };
        Ok((p >= 0).then_some(p))
    }

    /// The largest position of `seq` in the cache, `None` if it is empty.
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`].
    #[doc(alias = "llama_memory_seq_pos_max")]
    pub fn seq_pos_max(&mut self, seq: SeqId) -> Result<Option<Pos>> {
        self.check_reachable()?;
        self.check_seq(seq)?;
        // SAFETY: a valid sequence id.
        let p = unsafe { sys::llama_memory_seq_pos_max(self.memory(), seq) };
        Ok((p >= 0).then_some(p))
    }

    /// Whether positions can be shifted ([`Context::seq_add`],
    /// [`Context::seq_div`]). False for M-RoPE models and for
    /// sliding-window models without `swa_full`.
    #[doc(alias = "llama_memory_can_shift")]
    pub fn can_shift(&self) -> bool {
        let mem = self.memory();
        // SAFETY: a read of the context's memory handle, checked for NULL.
        !mem.is_null() && unsafe { sys::llama_memory_can_shift(mem) }
    }
}
