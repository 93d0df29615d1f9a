//! Inference contexts: the KV cache, decoding and outputs.

use std::fmt;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::llama::model::Model;
use crate::llama::types::SeqId;
use crate::sys;

mod create;
mod kv_cache;
mod kv_state;
#[cfg(feature = "mtmd")]
mod media;
mod outputs;
mod params;
#[cfg(feature = "mtmd")]
pub(crate) use media::EncodedChunk;
mod pass;
mod remote;
mod validate;

pub use outputs::Output;

pub(crate) use params::MAX_TOKENS;
pub(crate) use params::check_threads;
#[cfg(feature = "mtmd")]
pub(crate) use params::default_threads;
pub use params::{Attention, ContextParams, FlashAttention, KvType, Pooling, max_sequences};
use remote::Calls;

/// Identifies each context ever created in this process (see
/// [`Context::id`]): a session remembers which context holds its cache.
static NEXT_CONTEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Performance counters of a context.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PerfCounters {
    /// Milliseconds spent on prompt (multi-token) batches.
    pub prompt_ms: f64,
    /// Milliseconds spent on single-token decodes.
    pub eval_ms: f64,
    /// Prompt tokens evaluated (llama.cpp reports at least 1).
    pub prompt_tokens: i32,
    /// Single-token decodes.
    pub eval_tokens: i32,
    /// Compute graphs reused.
    pub graphs_reused: i32,
}

/// A handle that stops a running [`Context::decode`] from another thread.
/// The decode then returns [`Error::Aborted`].
///
/// The request stays set, so every later decode is aborted too, until
/// [`AbortHandle::reset`] — except that a
/// `Generation` it cancels consumes it: the
/// generation ends as `FinishReason::Cancelled`
/// and clears the request, so the next generation (after the next Ctrl-C,
/// say) starts un-aborted. One request ends one generation; a generation
/// that ends otherwise (`Generation::cancel`,
/// a stream callback that breaks) leaves a request made meanwhile set.
#[derive(Clone, Debug)]
pub struct AbortHandle(Arc<AtomicBool>);

impl AbortHandle {
    /// Asks the current and every later decode to stop, until
    /// [`AbortHandle::reset`] (or a generation ended by it).
    pub fn abort(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
    /// Lets decodes run again.
    pub fn reset(&self) {
        self.0.store(false, Ordering::Relaxed);
    }
    /// Whether an abort is requested.
    pub fn is_aborted(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    /// Consumes a pending request: whether there was one (atomically, so
    /// a request made meanwhile is not lost).
    pub(crate) fn take(&self) -> bool {
        self.0.swap(false, Ordering::Relaxed)
    }
}

/// An inference context: a KV cache of `n_ctx` tokens over a [`Model`],
/// and the buffers for one batch of outputs.
///
/// [`Model::new_context`] borrows the model (`Context<'m>`);
/// [`Context::new_owned`] shares an `Arc<Model>` instead, giving a
/// `Context<'static>` ([`OwnedContext`]) that can live in a struct next to
/// nothing else, or move into a spawned thread.
///
/// `Send` but not `Sync`: every llama.cpp call on a context mutates it, so
/// every method takes `&mut self`. Contexts over the same model can run on
/// different threads at once.
pub struct Context<'m> {
    ptr: NonNull<sys::llama_context>,
    /// Dropped after `Drop::drop` has freed the context, so a shared model
    /// outlives it.
    model: ModelRef<'m>,
    n_ctx: u32,
    n_batch: u32,
    n_ubatch: u32,
    n_seq_max: u32,
    n_vocab: i32,
    kv_unified: bool,
    non_causal: bool,
    embeddings: bool,
    /// Pooling is `NONE`: only then are per-token embeddings extracted.
    per_token_embeddings: bool,
    /// Mean pooling with sizes that make llama.cpp abort (see `new`).
    mean_pooling_blocked: bool,
    /// The context has a memory module (KV cache); without one llama.cpp
    /// runs `decode` as `encode`.
    has_memory: bool,
    /// Created with `swa_full`: a sliding-window cache keeps every position.
    swa_full: bool,
    /// An encoder-decoder model whose decoder reads the encoder output
    /// (cross-attention): decoding needs a successful `encode` first.
    needs_encoder_output: bool,
    /// A successful `encode` stored its output in the context (llama.cpp's
    /// `cross` state, which lives in the context, not the KV cache: clearing
    /// or loading the cache keeps it, and a later failed encode leaves it).
    encoded: bool,
    /// For each token of the last decoded batch: its output row, or -1.
    output_rows: Vec<i32>,
    n_outputs: i32,
    /// What the last pass wrote, decided when it ran (the settings may have
    /// changed since): the outputs are checked against this.
    produced: Produced,
    /// Per-sequence scratch for position checks (no allocation per decode).
    next_pos: Vec<i32>,
    /// Per-sequence token counts of the batch being validated (scratch).
    seq_tokens: Vec<u32>,
    abort: Arc<AtomicBool>,
    /// Unique in this process: see [`Context::id`].
    id: u64,
    /// Per sequence, bumped by every change to its cached tokens other
    /// than appending (remove, copy into, shift, clear, state load): see
    /// [`Context::seq_epoch`].
    epochs: Vec<u64>,
    /// Set when a decode or encode threw inside llama.cpp: its scheduler
    /// may be half-reserved (`sched_reserve` clears its "needs reserve"
    /// flag before the allocations that throw), so the context refuses to
    /// run again.
    poisoned: Option<(&'static str, String)>,
    /// Where its calls into llama.cpp run: a call thread of their own
    /// while its model has layers on RPC workers, here otherwise.
    calls: Calls,
}

/// A context that keeps its model alive through an `Arc`: see
/// [`Context::new_owned`].
pub type OwnedContext = Context<'static>;

/// The model a context runs: borrowed, or shared (an owned context).
enum ModelRef<'m> {
    Borrowed(&'m Model),
    Shared(Arc<Model>),
}

impl Deref for ModelRef<'_> {
    type Target = Model;
    fn deref(&self) -> &Model {
        match self {
            ModelRef::Borrowed(model) => model,
            ModelRef::Shared(model) => model,
        }
    }
}

// SAFETY: a llama_context may be moved between threads: it has no thread
// affinity (llama-cpp-c-api.md §1.17, "a ctx may be moved between threads";
// the server runs all context work on one thread of its choosing). It is not
// Sync: all access goes through `&mut self`.
unsafe impl Send for Context<'_> {}

/// The kinds of output the last decode or encode wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Produced {
    /// Logits rows, one per output.
    logits: bool,
    /// Per-token embedding rows, one per output.
    token_embeddings: bool,
    /// Pooled per-sequence embeddings.
    pooled: bool,
}

impl fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("n_ctx", &self.n_ctx)
            .field("n_batch", &self.n_batch)
            .field("n_ubatch", &self.n_ubatch)
            .field("n_seq_max", &self.n_seq_max)
            .finish()
    }
}

impl<'m> Context<'m> {
    /// The raw pointer, for calls this crate does not wrap. Calls through it
    /// must not free the context or invalidate what this wrapper tracks.
    pub fn as_ptr(&mut self) -> *mut sys::llama_context {
        self.ptr.as_ptr()
    }

    /// The model this context runs.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The model, for values that live inside a borrow of this context
    /// (a `Generation` holds `&'a mut` of
    /// the context and a detokenizer over the model's vocabulary).
    pub(crate) fn model_for<'a>(&'a mut self) -> (&'a mut Context<'m>, &'a Model) {
        let model: *const Model = &*self.model;
        // SAFETY: the model outlives `'a`: a borrowed one lives for `'m`,
        // which outlives the context; a shared one is kept alive by the
        // `Arc` in `self.model`, which nothing replaces while the context
        // exists, and the context is borrowed for `'a`. The `Model` is
        // only read through shared references (its mutable state is behind
        // locks), so the `&mut Context` does not alias a `&mut Model`.
        (self, unsafe { &*model })
    }

    /// The effective context length (padded by llama.cpp).
    #[doc(alias = "llama_n_ctx")]
    pub fn n_ctx(&self) -> u32 {
        self.n_ctx
    }

    /// The context length available to each sequence.
    #[doc(alias = "llama_n_ctx_seq")]
    pub fn n_ctx_seq(&self) -> u32 {
        // SAFETY: a read of a setting fixed at creation.
        unsafe { sys::llama_n_ctx_seq(self.ptr.as_ptr()) }
    }

    /// The effective most tokens per decode.
    #[doc(alias = "llama_n_batch")]
    pub fn n_batch(&self) -> u32 {
        self.n_batch
    }

    /// The effective micro-batch size.
    #[doc(alias = "llama_n_ubatch")]
    pub fn n_ubatch(&self) -> u32 {
        self.n_ubatch
    }

    /// The number of sequences.
    #[doc(alias = "llama_n_seq_max")]
    pub fn n_seq_max(&self) -> u32 {
        self.n_seq_max
    }

    /// Threads used for (single-token decode, batch processing).
    #[doc(alias = "llama_n_threads")]
    pub fn n_threads(&mut self) -> (i32, i32) {
        // (Reads of settings no pass writes: safe also beside an abandoned
        // RPC call.)
        // SAFETY: reads of the live context's settings.
        unsafe { (sys::llama_n_threads(self.ptr.as_ptr()), sys::llama_n_threads_batch(self.ptr.as_ptr())) }
    }

    /// Changes the thread counts.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a count outside `1..=512` (ggml's `GGML_MAX_N_THREADS`).
    #[doc(alias = "llama_set_n_threads")]
    pub fn set_n_threads(&mut self, n_threads: i32, n_threads_batch: i32) -> Result<()> {
        check_threads(n_threads, n_threads_batch)?;
        self.check_reachable()?;
        // SAFETY: valid counts on a live context we hold exclusively.
        unsafe { sys::llama_set_n_threads(self.ptr.as_ptr(), n_threads, n_threads_batch) };
        Ok(())
    }

    /// Turns embedding output on or off (every token becomes an output).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when turning on mean-pooled embeddings in
    /// a context whose `min(n_ctx, n_ubatch)` is not a multiple of
    /// `n_seq_max`: llama.cpp would abort when it next sizes its compute
    /// graph. Choose `n_ubatch` (or `n_seq_max`) to divide evenly.
    #[doc(alias = "llama_set_embeddings")]
    pub fn set_embeddings(&mut self, on: bool) -> Result<()> {
        if on && self.mean_pooling_blocked {
            return Err(Error::InvalidArgument(format!(
                "mean pooling needs min(n_ctx {}, n_ubatch {}) to be a multiple of n_seq_max {}",
                self.n_ctx, self.n_ubatch, self.n_seq_max
            )));
        }
        self.check_reachable()?;
        // SAFETY: a setting change on a context we hold exclusively.
        unsafe { sys::llama_set_embeddings(self.ptr.as_ptr(), on) };
        self.embeddings = on;
        Ok(())
    }

    /// A handle that aborts decoding from any thread.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(Arc::clone(&self.abort))
    }

    /// Waits for queued work on the device to finish. (Nothing to wait for,
    /// and no call made, once the context's RPC worker was lost: its passes
    /// synchronize before they return.)
    #[doc(alias = "llama_synchronize")]
    pub fn synchronize(&mut self) {
        if self.is_cut_off() {
            return;
        }
        // SAFETY: a live context we hold exclusively.
        unsafe { sys::llama_synchronize(self.ptr.as_ptr()) }
    }

    pub(crate) fn check_seq(&self, seq: SeqId) -> Result<()> {
        if seq < 0 || seq as u32 >= self.n_seq_max {
            return Err(Error::InvalidSeqId { seq, n_seq_max: self.n_seq_max });
        }
        Ok(())
    }

    pub(crate) fn memory(&self) -> sys::llama_memory_t {
        // SAFETY: returns the context's own memory handle (or NULL); no
        // state changes.
        unsafe { sys::llama_get_memory(self.ptr.as_ptr()) }
    }

    pub(crate) fn is_kv_unified(&self) -> bool {
        self.kv_unified
    }

    /// A number that no other context of this process has: together with
    /// [`Context::seq_epoch`] it tells whether cached tokens are still
    /// what a caller last saw.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// How often the cached tokens of `seq` were changed other than by
    /// appending to them: removed, shifted, overwritten by a copy, cleared
    /// or loaded from saved state. A caller that remembers what the cache
    /// holds (like `generate::Session`) can
    /// trust its record only while this number is unchanged.
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`].
    pub fn seq_epoch(&self, seq: SeqId) -> Result<u64> {
        self.check_seq(seq)?;
        Ok(self.epochs[seq as usize])
    }

    /// Whether the cache can take a draft and drop its rejected tail
    /// exactly, as speculative decoding needs.
    ///
    /// # Errors
    /// [`Error::CannotSpeculate`] for a context without a KV cache, a
    /// recurrent or hybrid model (one state per sequence, no positions to
    /// drop), or a sliding-window model without `swa_full` (decoding a draft
    /// may evict positions that the tokens kept after it still attend to).
    pub(crate) fn check_can_speculate(&self) -> Result<()> {
        let model = self.model();
        if !self.has_memory || self.memory().is_null() {
            return Err(Error::CannotSpeculate("the context has no KV cache"));
        }
        if model.is_recurrent() || model.is_hybrid() {
            return Err(Error::CannotSpeculate("a recurrent or hybrid model's cache cannot drop its last tokens"));
        }
        if model.n_swa() > 0 && !self.swa_full {
            return Err(Error::CannotSpeculate(
                "a sliding-window cache without swa_full can evict positions a rejected draft pushed out",
            ));
        }
        Ok(())
    }

    /// Records a change to the cache of `seq` (every sequence for `None`).
    pub(crate) fn bump_epoch(&mut self, seq: Option<SeqId>) {
        match seq {
            Some(s) if s >= 0 && (s as usize) < self.epochs.len() => self.epochs[s as usize] += 1,
            _ => self.epochs.iter_mut().for_each(|e| *e += 1),
        }
    }

    /// Timing and token counters (zeros once the context's RPC worker was
    /// lost).
    #[doc(alias = "llama_perf_context")]
    pub fn perf(&mut self) -> PerfCounters {
        if self.is_cut_off() {
            // An abandoned call may still be counting.
            return PerfCounters::default();
        }
        // SAFETY: a read of the live context's counters.
        let d = unsafe { sys::llama_perf_context(self.ptr.as_ptr()) };
        PerfCounters {
            prompt_ms: d.t_p_eval_ms,
            eval_ms: d.t_eval_ms,
            prompt_tokens: d.n_p_eval,
            eval_tokens: d.n_eval,
            graphs_reused: d.n_reused,
        }
    }

    /// Resets the counters of [`Context::perf`].
    #[doc(alias = "llama_perf_context_reset")]
    pub fn reset_perf(&mut self) {
        if self.is_cut_off() {
            return;
        }
        // SAFETY: a live context we hold exclusively.
        unsafe { sys::llama_perf_context_reset(self.ptr.as_ptr()) }
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        if self.calls.is_remote() {
            // Freeing sends to the workers: guarded. A context whose worker
            // was lost is leaked (with its abort flag, which it points to).
            if self.calls.is_lost(self.model.remote()) {
                std::mem::forget(self.abort.clone());
                return;
            }
            let call = crate::llama::thread::SendPtr(self.ptr.as_ptr());
            // SAFETY: as below, on the context's call thread.
            let freed = self.calls.run(self.model.remote(), "freeing a context", false, move || unsafe {
                let call = call;
                sys::llama_free(call.0)
            });
            if freed.is_err() {
                std::mem::forget(self.abort.clone());
            }
            return;
        }
        // SAFETY: we own the context; `llama_free` synchronizes first. The
        // abort flag it points to is still alive (dropped after this).
        unsafe { sys::llama_free(self.ptr.as_ptr()) }
    }
}
