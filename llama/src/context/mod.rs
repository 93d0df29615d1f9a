//! Inference contexts: the KV cache, decoding and outputs.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::backend;
use crate::batch::{Batch, Pos, SeqId};
use crate::error::{Error, Result, check_decode, check_shim};
use crate::model::Model;
use crate::sys;

mod params;

pub(crate) use params::MAX_TOKENS;
use params::check_threads;
pub use params::{Attention, ContextParams, FlashAttention, KvType, Pooling, max_sequences};

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
#[derive(Clone, Debug)]
pub struct AbortHandle(Arc<AtomicBool>);

impl AbortHandle {
    /// Asks the current and every later decode to stop, until [`AbortHandle::reset`].
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
}

unsafe extern "C" fn abort_trampoline(data: *mut std::ffi::c_void) -> bool {
    // SAFETY: `data` is the `AtomicBool` inside the `Arc` that the context
    // keeps alive for as long as the callback is installed.
    unsafe { &*data.cast::<AtomicBool>() }.load(Ordering::Relaxed)
}

/// An inference context: a KV cache of `n_ctx` tokens over a borrowed
/// [`Model`], and the buffers for one batch of outputs.
///
/// `Send` but not `Sync`: every llama.cpp call on a context mutates it, so
/// every method takes `&mut self`. Contexts over the same model can run on
/// different threads at once.
pub struct Context<'m> {
    ptr: NonNull<sys::llama_context>,
    model: &'m Model,
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
    /// The thread that makes this context's calls while its model has
    /// layers on RPC workers (feature `rpc`; see `llama::rpc`).
    #[cfg(feature = "rpc")]
    rpc: Option<crate::rpc::Runner>,
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
    /// Creates a context over `model`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for parameters llama.cpp would abort on
    /// (`n_seq_max` above 256 or above `n_batch`, thread counts outside
    /// `1..=512` (ggml's `GGML_MAX_N_THREADS`), mean-pooled embeddings with sizes
    /// [`Context::set_embeddings`] refuses, an encoder-decoder model with
    /// several sequences but no `kv_unified`);
    /// [`Error::ContextCreate`] for a model loaded with
    /// [`vocab_only`](crate::ModelParams::vocab_only), and when llama.cpp
    /// refuses the parameters (e.g. a quantized V cache without flash
    /// attention, out of memory).
    #[doc(alias = "llama_init_from_model")]
    pub fn new(model: &'m Model, params: &ContextParams) -> Result<Context<'m>> {
        backend::init();
        let p = params;
        if model.is_vocab_only() {
            // llama.cpp builds such a context without backends and aborts
            // on its first decode (GGML_ASSERT(n_backends > 0)).
            return Err(Error::ContextCreate("the model was loaded with vocab_only: it has no weights to run".into()));
        }
        if model.is_simulated() {
            // Its tensors have no data: a decode would read unallocated memory.
            return Err(Error::ContextCreate("the model was loaded for the memory plan only (no_alloc)".into()));
        }
        let mut raw = p.to_raw(model)?;
        let abort = Arc::new(AtomicBool::new(false));
        raw.abort_callback = Some(abort_trampoline);
        raw.abort_callback_data = Arc::as_ptr(&abort).cast_mut().cast();

        backend::clear_last_error();
        let adapters = model.adapters_read();
        #[cfg(feature = "rpc")]
        let mut rpc = None;
        #[cfg(feature = "rpc")]
        let ptr = match model.rpc_lease() {
            Some(lease) => {
                // Creating it allocates buffers on the workers: guarded.
                let mut runner = crate::rpc::Runner::start()?;
                let call = crate::rpc::SendPtr((model.as_ptr(), raw));
                let created = runner.run(lease, "creating a context", true, move || {
                    let call = call;
                    // SAFETY: as below, on the context's call thread.
                    unsafe { sys::llama_init_from_model(call.0.0, call.0.1) as usize }
                });
                let ptr = match created {
                    Ok(ptr) => ptr as *mut sys::llama_context,
                    Err(e) => {
                        // The abandoned call may still create a context that
                        // points to the abort flag: it is leaked with it.
                        std::mem::forget(Arc::clone(&abort));
                        return Err(e);
                    }
                };
                rpc = Some(runner);
                ptr
            }
            // SAFETY: as below.
            None => unsafe { sys::llama_init_from_model(model.as_ptr(), raw) },
        };
        #[cfg(not(feature = "rpc"))]
        // SAFETY: a live model and parameters built from the defaults with
        // valid enum values; the abort flag lives in `abort`, which the
        // context keeps. llama_init_from_model catches its exceptions. It
        // reads the model's LoRA set (graph size), which the read lock
        // keeps from changing meanwhile.
        let ptr = unsafe { sys::llama_init_from_model(model.as_ptr(), raw) };
        drop(adapters);
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| Error::ContextCreate(backend::last_error_or("llama_init_from_model returned NULL")))?;
        // SAFETY: `ptr` is a live context; these are reads of its settings.
        let (n_ctx, n_batch, n_ubatch, n_seq_max, has_memory, pooling) = unsafe {
            let c = ptr.as_ptr();
            (
                sys::llama_n_ctx(c),
                sys::llama_n_batch(c),
                sys::llama_n_ubatch(c),
                sys::llama_n_seq_max(c),
                !sys::llama_get_memory(c).is_null(),
                sys::llama_pooling_type(c),
            )
        };
        let non_causal = p.attention == Attention::NonCausal || !has_memory || model.has_encoder();
        let mean_pooling = pooling == sys::llama_pooling_type::LLAMA_POOLING_TYPE_MEAN;
        let mut ctx = Context {
            ptr,
            model,
            n_ctx,
            n_batch,
            n_ubatch,
            n_seq_max,
            n_vocab: model.vocab().n_tokens() as i32,
            kv_unified: p.kv_unified || n_seq_max == 1,
            non_causal,
            embeddings: false,
            per_token_embeddings: pooling == sys::llama_pooling_type::LLAMA_POOLING_TYPE_NONE,
            // llama.cpp reserves its worst-case graph for min(n_ctx, n_ubatch)
            // tokens rounded up to a multiple of n_seq_max, but with only
            // min(n_ctx, n_ubatch) outputs; mean pooling multiplies the two
            // and GGML_ASSERT(ggml_can_mul_mat) aborts when they differ.
            mean_pooling_blocked: mean_pooling && n_seq_max > 0 && n_ctx.min(n_ubatch) % n_seq_max != 0,
            has_memory,
            // Of the models with an encoder, only those with a decoder too
            // (T5) cross-attend; an encoder-only T5 decodes without it.
            needs_encoder_output: model.has_encoder() && model.has_decoder(),
            encoded: false,
            // Grown by the first decode to that batch's size: n_batch
            // itself can be huge (it is not clamped for a model without a
            // KV cache).
            output_rows: Vec::new(),
            n_outputs: 0,
            produced: Produced::default(),
            next_pos: vec![0; n_seq_max as usize],
            seq_tokens: vec![0; n_seq_max as usize],
            abort,
            id: NEXT_CONTEXT_ID.fetch_add(1, Ordering::Relaxed),
            epochs: vec![0; n_seq_max as usize],
            poisoned: None,
            #[cfg(feature = "rpc")]
            rpc,
        };
        if p.embeddings {
            ctx.set_embeddings(true)?;
        }
        Ok(ctx)
    }

    /// The raw pointer, for calls this crate does not wrap. Calls through it
    /// must not free the context or invalidate what this wrapper tracks.
    pub fn as_ptr(&mut self) -> *mut sys::llama_context {
        self.ptr.as_ptr()
    }

    /// The model this context runs.
    pub fn model(&self) -> &'m Model {
        self.model
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
    /// [`Error::InvalidArgument`] for a count outside `1..=512` (ggml's `GGML_MAX_N_THREADS`).
    #[doc(alias = "llama_set_n_threads")]
    pub fn set_n_threads(&mut self, n_threads: i32, n_threads_batch: i32) -> Result<()> {
        check_threads(n_threads, n_threads_batch)?;
        self.check_rpc()?;
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
        self.check_rpc()?;
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
        if self.rpc_lost() {
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
    /// holds (like [`generate::Session`](crate::generate::Session)) can
    /// trust its record only while this number is unchanged.
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`].
    pub fn seq_epoch(&self, seq: SeqId) -> Result<u64> {
        self.check_seq(seq)?;
        Ok(self.epochs[seq as usize])
    }

    /// Records a change to the cache of `seq` (every sequence for `None`).
    pub(crate) fn bump_epoch(&mut self, seq: Option<SeqId>) {
        match seq {
            Some(s) if s >= 0 && (s as usize) < self.epochs.len() => self.epochs[s as usize] += 1,
            _ => self.epochs.iter_mut().for_each(|e| *e += 1),
        }
    }

    /// Runs llama_decode (or, `encode`, llama_encode) on `batch` through
    /// the shim: here, or on the RPC call thread when the model has layers
    /// on workers (then a worker lost during the call is [`Error::Rpc`] and
    /// the context is unusable).
    ///
    /// # Safety
    /// `batch` must be valid for this context (see `decode`).
    unsafe fn call_pass(&mut self, batch: &Batch, code: &mut i32, encode: bool) -> Result<std::os::raw::c_int> {
        #[cfg(feature = "rpc")]
        if let (Some(runner), Some(lease)) = (self.rpc.as_mut(), self.model.rpc_lease()) {
            let call = crate::rpc::SendPtr((self.ptr.as_ptr(), batch.raw()));
            let (shim, result) = runner.run(lease, if encode { "encoding" } else { "decoding" }, true, move || {
                let call = call;
                let mut code = 0;
                // SAFETY: as for the direct call below; the batch's arrays
                // outlive the call (the caller waits for it, and once it is
                // abandoned it never reads them again: it is blocked in
                // llama.cpp for good).
                let shim = unsafe {
                    if encode {
                        sys::shim::llama_rs_rpc_encode(call.0.0, call.0.1, &mut code)
                    } else {
                        sys::shim::llama_rs_rpc_decode(call.0.0, call.0.1, &mut code)
                    }
                };
                (shim, code)
            })?;
            *code = result;
            return Ok(shim);
        }
        // SAFETY: the caller's contract (see `decode`, `encode`).
        Ok(unsafe {
            if encode {
                sys::shim::llama_rs_encode(self.ptr.as_ptr(), batch.raw(), code)
            } else {
                sys::shim::llama_rs_decode(self.ptr.as_ptr(), batch.raw(), code)
            }
        })
    }

    /// A pass that did not run (its RPC worker was lost) leaves no outputs:
    /// the last pass's rows must not be read through a dead connection.
    fn forget_outputs_on_err<T>(&mut self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            self.invalidate_outputs();
        }
        result
    }

    /// Whether [`Context::check_rpc`] fails: every call into llama.cpp that
    /// can reach a worker is refused then (synchronizing would wait for a
    /// dead connection for good, and an abandoned call may still hold the
    /// context).
    fn rpc_lost(&self) -> bool {
        self.check_rpc().is_err()
    }

    /// `Err` when the context's model lost an RPC worker (every call into
    /// llama.cpp would reach the dead connection).
    pub(crate) fn check_rpc(&self) -> Result<()> {
        #[cfg(feature = "rpc")]
        if let Some(lease) = self.model.rpc_lease() {
            lease.check()?;
            if self.rpc.as_ref().is_some_and(crate::rpc::Runner::is_lost) {
                return Err(Error::Rpc { endpoint: String::new(), message: "a call of this context was lost".into() });
            }
        }
        Ok(())
    }

    /// Refuses to run a context whose last decode or encode threw.
    fn check_not_poisoned(&self) -> Result<()> {
        match &self.poisoned {
            None => Ok(()),
            Some((function, message)) => Err(Error::Poisoned { function, message: message.clone() }),
        }
    }

    /// Poisons the context if `result` is a caught C++ exception.
    fn poison_on_exception(&mut self, result: &Result<()>) {
        if let Err(Error::Exception { function, message }) = result {
            self.poisoned = Some((function, message.clone()));
        }
    }

    /// Checks everything llama.cpp would abort on, or reject with a less
    /// helpful message, before it sees the batch.
    fn validate(&mut self, batch: &Batch) -> Result<()> {
        let n = batch.len();
        if n == 0 {
            return Err(Error::BatchInvalid("the batch is empty".into()));
        }
        if n > self.n_batch as usize {
            return Err(Error::BatchInvalid(format!(
                "{n} tokens exceed the context's n_batch of {}; split the batch",
                self.n_batch
            )));
        }
        // SAFETY: a read of a setting of the live context.
        let causal = unsafe { sys::llama_get_causal_attn(self.ptr.as_ptr()) };
        if (self.non_causal || !causal || self.embeddings && self.model.has_encoder()) && n > self.n_ubatch as usize {
            return Err(Error::BatchInvalid(format!(
                "a non-causal batch must fit in one micro-batch: {n} tokens > n_ubatch {}",
                self.n_ubatch
            )));
        }
        let mem = self.memory();
        const UNSEEN: i32 = i32::MIN;
        self.next_pos.fill(UNSEEN);
        self.seq_tokens.fill(0);
        let positions = batch.positions();
        for (i, &token) in batch.tokens().iter().enumerate() {
            if token.0 < 0 || token.0 >= self.n_vocab {
                return Err(Error::InvalidToken { token: token.0, n_vocab: self.n_vocab });
            }
            let seqs = batch.seq_ids(i);
            if seqs.len() > 1 && !self.kv_unified {
                return Err(Error::BatchInvalid(format!(
                    "token {i} belongs to {} sequences; that needs a context with kv_unified",
                    seqs.len()
                )));
            }
            let pos = positions[i];
            // Negative positions mark free cells in llama.cpp's KV cache, and
            // the next position after each one must still fit in an i32.
            if !(0..Pos::MAX).contains(&pos) {
                return Err(Error::BatchInvalid(format!(
                    "position {pos} at batch index {i} is outside 0..{}",
                    Pos::MAX
                )));
            }
            for &seq in seqs {
                self.check_seq(seq)?;
                let slot = &mut self.next_pos[seq as usize];
                if *slot == UNSEEN {
                    // SAFETY: `seq` is below n_seq_max, which is all
                    // pos_max asserts on; NULL memory is accepted.
                    let last = unsafe { sys::llama_memory_seq_pos_max(mem, seq) };
                    if last >= 0 && Some(pos) != last.checked_add(1) {
                        return Err(Error::BatchInvalid(format!(
                            "sequence {seq} ends at position {last} in the cache, so its next token must be at {} (got {pos})",
                            i64::from(last) + 1
                        )));
                    }
                } else if pos != *slot {
                    return Err(Error::BatchInvalid(format!(
                        "positions of sequence {seq} must be consecutive: expected {}, got {pos} at batch index {i}",
                        *slot
                    )));
                }
                *slot = pos + 1;
                self.seq_tokens[seq as usize] += 1;
            }
        }
        if self.embeddings && !self.per_token_embeddings {
            self.check_pooled_batch(n)?;
        }
        Ok(())
    }

    /// llama.cpp pools each sequence over the tokens of one micro-batch and
    /// keeps the last micro-batch's result, so a sequence split over several
    /// micro-batches gets a silently wrong pooled embedding. Splits happen
    /// when the batch exceeds `n_ubatch` or, with one cache stream per
    /// sequence (no `kv_unified`), when sequences have different lengths
    /// (llama.cpp then cuts equal-length slices).
    fn check_pooled_batch(&self, n: usize) -> Result<()> {
        if n > self.n_ubatch as usize {
            return Err(Error::BatchInvalid(format!(
                "pooled embeddings need the batch in one micro-batch: {n} tokens > n_ubatch {}",
                self.n_ubatch
            )));
        }
        if !self.kv_unified {
            let mut lengths = self.seq_tokens.iter().filter(|&&c| c > 0);
            if let Some(first) = lengths.next()
                && lengths.any(|c| c != first)
            {
                return Err(Error::BatchInvalid(
                    "pooled embeddings of sequences of different lengths in one batch need kv_unified \
                     (or one batch per sequence)"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// Records the outputs of a decode through the KV cache: the tokens
    /// that asked for logits, or every token while embeddings are on. An
    /// encoder-only model (T5 encoder) runs its encoder graph there, which
    /// computes no logits.
    fn record_outputs(&mut self, batch: &Batch, ok: bool) {
        self.invalidate_outputs();
        if !ok {
            return;
        }
        let all = self.embeddings;
        for i in 0..batch.len() {
            if all || batch.has_logits(i) {
                self.output_rows.push(self.n_outputs);
                self.n_outputs += 1;
            } else {
                self.output_rows.push(-1);
            }
        }
        self.produced = Produced {
            logits: self.model.has_decoder(),
            token_embeddings: self.embeddings && self.per_token_embeddings,
            pooled: self.embeddings && !self.per_token_embeddings,
        };
    }

    /// Records the outputs of llama.cpp's encoder path (`encode`, or
    /// `decode` on a context without memory, which llama.cpp forwards to
    /// it): every token is an output, whatever the batch asked for. Its
    /// graph computes logits only for the memory-less diffusion models
    /// (an encoder's or an embedding model's graph ends at the hidden
    /// state); embeddings only while they are on.
    fn record_encoder_outputs(&mut self, batch: &Batch, ok: bool) {
        self.invalidate_outputs();
        if !ok {
            return;
        }
        self.output_rows.extend(0..batch.len() as i32);
        self.n_outputs = batch.len() as i32;
        self.produced = Produced {
            logits: !self.model.has_encoder() && self.model.is_diffusion(),
            token_embeddings: self.embeddings && self.per_token_embeddings,
            pooled: self.embeddings && !self.per_token_embeddings,
        };
    }

    /// Runs the model on a batch, adding its tokens to the KV cache and
    /// computing the outputs it asks for.
    ///
    /// # Errors
    /// Before llama.cpp runs: [`Error::BatchInvalid`] (empty, larger than
    /// `n_batch`, non-causal and larger than `n_ubatch`, a position outside
    /// `0..i32::MAX` or one that does not continue its sequence, several
    /// sequences per token without
    /// `kv_unified`, pooled embeddings of a sequence that llama.cpp would
    /// split over micro-batches), [`Error::InvalidToken`],
    /// [`Error::InvalidSeqId`].
    /// From llama.cpp's return code: [`Error::NoKvSlot`] (1),
    /// [`Error::Aborted`] (2), [`Error::InvalidBatch`] (-1),
    /// [`Error::AllocationFailed`] (-2), [`Error::ComputeFailed`] (-3);
    /// [`Error::Exception`] if it threw.
    /// [`Error::InvalidArgument`] for an encoder-decoder model (T5) before
    /// the first successful [`Context::encode`]: its decoder attends to the
    /// encoder output, and llama.cpp aborts without one.
    ///
    /// A context without a KV cache (BERT-like models) runs the batch
    /// through the encoder instead: every token is then an output, and
    /// only diffusion models compute logits.
    #[doc(alias = "llama_decode")]
    pub fn decode(&mut self, batch: &Batch) -> Result<()> {
        self.check_not_poisoned()?;
        self.check_rpc()?;
        if self.needs_encoder_output && !self.encoded {
            return Err(Error::InvalidArgument(
                "this encoder-decoder model decodes against the encoder output: call encode first".into(),
            ));
        }
        self.validate(batch)?;
        let mut code = 0;
        let adapters = self.model.adapters_read();
        // SAFETY: the batch was validated against this context above (sizes,
        // token and sequence ids, positions), its arrays hold `len` entries,
        // an encoder-decoder model has an encoder output to attend to, and
        // the shim catches exceptions. A graph re-reserve reads the model's
        // LoRA set, which the read lock keeps from changing meanwhile.
        let shim = unsafe { self.call_pass(batch, &mut code, false) };
        drop(adapters);
        let shim = self.forget_outputs_on_err(shim)?;
        let result = check_shim(shim, "llama_decode").and_then(|()| check_decode(code));
        self.poison_on_exception(&result);
        if self.has_memory {
            self.record_outputs(batch, result.is_ok());
        } else {
            self.record_encoder_outputs(batch, result.is_ok());
        }
        result
    }

    /// Runs the encoder of an encoder-decoder model (or of an embedding
    /// model without a KV cache, such as BERT) on a batch.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a decoder-only model (use
    /// [`Context::decode`]: llama.cpp's encoder path builds a graph that
    /// reads the KV cache without preparing it, and crashes); otherwise as
    /// [`Context::decode`], and the batch must fit in one micro-batch.
    ///
    /// Every token of the batch is an output. The encoder computes no
    /// logits (except a diffusion model's); its per-token output is
    /// readable through [`Context::embeddings`] while embeddings are on.
    /// llama.cpp checks the batch's positions against the KV cache even
    /// here: clear the decoder's sequences before encoding a new input.
    #[doc(alias = "llama_encode")]
    pub fn encode(&mut self, batch: &Batch) -> Result<()> {
        self.check_not_poisoned()?;
        self.check_rpc()?;
        if !self.model.has_encoder() && self.has_memory {
            return Err(Error::InvalidArgument(
                "encode needs a model with an encoder (T5-like) or without a KV cache (BERT-like); \
                 decoder-only models use decode"
                    .into(),
            ));
        }
        self.validate(batch)?;
        if batch.len() > self.n_ubatch as usize {
            return Err(Error::BatchInvalid(format!(
                "an encoder batch must fit in one micro-batch: {} tokens > n_ubatch {}",
                batch.len(),
                self.n_ubatch
            )));
        }
        let mut code = 0;
        let adapters = self.model.adapters_read();
        // SAFETY: as in `decode`, plus the micro-batch bound checked above.
        let shim = unsafe { self.call_pass(batch, &mut code, true) };
        drop(adapters);
        let shim = self.forget_outputs_on_err(shim)?;
        let result = check_shim(shim, "llama_encode").and_then(|()| check_decode(code));
        self.poison_on_exception(&result);
        self.record_encoder_outputs(batch, result.is_ok());
        // llama.cpp stores the encoder output only at the very end of a
        // successful encode; a failed one keeps the previous output.
        self.encoded |= result.is_ok();
        result
    }

    /// Maps a batch index (or a negative index counting outputs from the
    /// end, -1 being the last) to a valid argument for the `_ith` getters.
    pub(crate) fn output_index(&self, i: i32) -> Result<i32> {
        let ok = if i >= 0 {
            self.output_rows.get(i as usize).is_some_and(|&row| row >= 0)
        } else {
            i.unsigned_abs() <= self.n_outputs.unsigned_abs()
        };
        if ok { Ok(i) } else { Err(Error::NoOutput(i)) }
    }

    /// The logits (one per vocabulary token) of batch token `i` of the last
    /// decode, or of the `-i`-th output from the end for negative `i`.
    /// The slice borrows the context, so it cannot outlive the next decode.
    ///
    /// # Errors
    /// [`Error::NoOutput`] if that token did not request logits, or the
    /// last pass computed none (an [`Context::encode`], or a decode of a
    /// context without a KV cache, of a model other than a diffusion one).
    #[doc(alias = "llama_get_logits_ith")]
    pub fn logits(&mut self, i: i32) -> Result<&[f32]> {
        self.check_rpc()?;
        let i = self.output_index(i)?;
        if !self.produced.logits {
            return Err(Error::NoOutput(i));
        }
        // SAFETY: `i` names an output of the last pass, which wrote logits,
        // so llama.cpp returns a row of n_vocab floats that stays valid
        // until the next call that takes `&mut self`, which the returned
        // borrow prevents.
        let ptr = unsafe { sys::llama_get_logits_ith(self.ptr.as_ptr(), i) };
        if ptr.is_null() {
            return Err(Error::NoOutput(i));
        }
        // SAFETY: see above.
        Ok(unsafe { std::slice::from_raw_parts(ptr, self.n_vocab as usize) })
    }

    /// The embedding of batch token `i` of the last decode (negative: from
    /// the end), `n_embd_out` floats. Needs embeddings on during that
    /// decode and [`Pooling::None`] (or a model whose default is no
    /// pooling): with pooling, llama.cpp computes only the per-sequence
    /// embeddings of [`Context::sequence_embeddings`].
    ///
    /// # Errors
    /// [`Error::NoOutput`] if there is no such output, embeddings were off
    /// during the last decode (turning them on afterwards does not compute
    /// any), or the context pools them.
    #[doc(alias = "llama_get_embeddings_ith")]
    pub fn embeddings(&mut self, i: i32) -> Result<&[f32]> {
        self.check_rpc()?;
        let i = self.output_index(i)?;
        if !self.produced.token_embeddings {
            return Err(Error::NoOutput(i));
        }
        // SAFETY: as in `logits`: the last pass ran with embeddings on, so
        // the buffer exists and holds a row of n_embd_out floats for `i`.
        let ptr = unsafe { sys::llama_get_embeddings_ith(self.ptr.as_ptr(), i) };
        if ptr.is_null() {
            return Err(Error::NoOutput(i));
        }
        // SAFETY: see above.
        Ok(unsafe { std::slice::from_raw_parts(ptr, self.model.n_embd_out()) })
    }

    /// The pooled embedding of a sequence after the last decode (pooling
    /// other than `None`): `n_embd_out` floats, or `n_cls_out` for `Rank`.
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`]; [`Error::NoOutput`] without pooled output
    /// of `seq` from the last decode (embeddings off during it, the
    /// sequence not in it, or the cache cleared or loaded since).
    #[doc(alias = "llama_get_embeddings_seq")]
    pub fn sequence_embeddings(&mut self, seq: SeqId) -> Result<&[f32]> {
        self.check_rpc()?;
        self.check_seq(seq)?;
        if !self.produced.pooled {
            return Err(Error::NoOutput(seq));
        }
        // SAFETY: a valid sequence id; the result is NULL or a row valid
        // until the next decode, which the borrow prevents.
        let (ptr, rank) = unsafe {
            (
                sys::llama_get_embeddings_seq(self.ptr.as_ptr(), seq),
                sys::llama_pooling_type(self.ptr.as_ptr()) == sys::llama_pooling_type::LLAMA_POOLING_TYPE_RANK,
            )
        };
        if ptr.is_null() {
            return Err(Error::NoOutput(seq));
        }
        let len = if rank {
            // SAFETY: a pure read; only reached for RANK pooling, i.e. a
            // classifier model.
            unsafe { sys::llama_model_n_cls_out(self.model.as_ptr()) as usize }
        } else {
            self.model.n_embd_out()
        };
        // SAFETY: see above.
        Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
    }

    /// Timing and token counters (zeros once the context's RPC worker was
    /// lost).
    #[doc(alias = "llama_perf_context")]
    pub fn perf(&mut self) -> PerfCounters {
        if self.rpc_lost() {
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
        if self.rpc_lost() {
            return;
        }
        // SAFETY: a live context we hold exclusively.
        unsafe { sys::llama_perf_context_reset(self.ptr.as_ptr()) }
    }

    /// Forgets the outputs of the last pass (after anything that makes
    /// them stale: a failed pass, a cache clear or state load).
    pub(crate) fn invalidate_outputs(&mut self) {
        self.output_rows.clear();
        self.n_outputs = 0;
        self.produced = Produced::default();
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        #[cfg(feature = "rpc")]
        if let (Some(runner), Some(lease)) = (self.rpc.as_mut(), self.model.rpc_lease()) {
            // Freeing sends to the workers: guarded. A context whose worker
            // was lost is leaked (with its abort flag, which it points to).
            if lease.is_lost() || runner.is_lost() {
                std::mem::forget(self.abort.clone());
                return;
            }
            let call = crate::rpc::SendPtr(self.ptr.as_ptr());
            // SAFETY: as below, on the context's call thread.
            let freed = runner.run(lease, "freeing a context", false, move || unsafe {
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

impl Model {
    /// Creates a [`Context`] over this model; see [`Context::new`].
    ///
    /// # Errors
    /// As [`Context::new`].
    pub fn new_context(&self, params: &ContextParams) -> Result<Context<'_>> {
        Context::new(self, params)
    }
}
