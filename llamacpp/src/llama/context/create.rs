//! Creating a context: parameters llama.cpp would abort on are refused
//! first, and what the context settled on is recorded.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{Attention, Calls, Context, ContextParams, ModelRef, NEXT_CONTEXT_ID, OwnedContext, Produced};
use crate::error::{Error, Result};
use crate::llama::backend;
use crate::llama::model::Model;
use crate::sys;

unsafe extern "C" fn abort_trampoline(data: *mut std::ffi::c_void) -> bool {
    // SAFETY: `data` is the `AtomicBool` inside the `Arc` that the context
    // keeps alive for as long as the callback is installed.
    unsafe { &*data.cast::<AtomicBool>() }.load(Ordering::Relaxed)
}

impl<'m> Context<'m> {
    /// Creates a context over `model`.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a setting llama.cpp would abort on
    /// (`n_seq_max` above 256 or above `n_batch`, `n_batch` 0, sizes above
    /// `i32::MAX`, thread counts outside `1..=512`, ggml's
    /// `GGML_MAX_N_THREADS`); [`Error::InvalidArgument`] for combinations
    /// it would abort on (mean-pooled embeddings with sizes
    /// [`Context::set_embeddings`] refuses, an encoder-decoder model with
    /// several sequences but no `kv_unified`);
    /// [`Error::ContextCreate`] for a model loaded with
    /// [`vocab_only`](field@crate::ModelParams::vocab_only), and when llama.cpp
    /// refuses the parameters (e.g. a quantized V cache without flash
    /// attention, out of memory).
    #[doc(alias = "llama_init_from_model")]
    pub fn new(model: &'m Model, params: &ContextParams) -> Result<Context<'m>> {
        Context::create(ModelRef::Borrowed(model), params)
    }

    fn create(holder: ModelRef<'m>, params: &ContextParams) -> Result<Context<'m>> {
        backend::init();
        let model: &Model = &holder;
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
        // Creating it allocates buffers on the workers of a remote model:
        // then on the context's call thread, guarded.
        let mut calls = Calls::start(model.remote())?;
        let call = crate::llama::thread::SendPtr((model.as_ptr(), raw));
        // SAFETY: a live model and parameters built from the defaults with
        // valid enum values; the abort flag lives in `abort`, which the
        // context keeps. llama_init_from_model catches its exceptions. It
        // reads the model's LoRA set (graph size), which the read lock
        // keeps from changing meanwhile (the caller waits for the call; a
        // remote model, whose call may be abandoned, has no adapters:
        // `load_lora` refuses them).
        let created = calls.run(model.remote(), "creating a context", true, move || unsafe {
            let call = call;
            sys::llama_init_from_model(call.0.0, call.0.1) as usize
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
        let n_vocab = model.vocab().n_tokens() as i32;
        // Of the models with an encoder, only those with a decoder too
        // (T5) cross-attend; an encoder-only T5 decodes without it.
        let needs_encoder_output = model.has_encoder() && model.has_decoder();
        let mut ctx = Context {
            ptr,
            model: holder,
            n_ctx,
            n_batch,
            n_ubatch,
            n_seq_max,
            n_vocab,
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
            swa_full: p.swa_full,
            needs_encoder_output,
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
            calls,
        };
        if p.embeddings {
            ctx.set_embeddings(true)?;
        }
        Ok(ctx)
    }
}

impl Context<'static> {
    /// Creates a context that keeps `model` alive through its `Arc`: a
    /// `Context<'static>` ([`OwnedContext`]), `Send`, for a struct or a
    /// thread that must own both. Otherwise as [`Context::new`].
    ///
    /// ```no_run
    /// # fn main() -> Result<(), llamacpp::Error> {
    /// use std::sync::Arc;
    /// use llamacpp::{AddBos, Context, ContextParams, Model, ModelParams};
    /// let model = Arc::new(Model::load("model.gguf", &ModelParams::default())?);
    /// let mut ctx = Context::new_owned(Arc::clone(&model), &ContextParams::default())?;
    /// let worker = std::thread::spawn(move || {
    ///     let prompt = ctx.model().vocab().tokenize("Hello", AddBos::Yes)?;
    ///     ctx.eval(&prompt, 0)
    /// });
    /// worker.join().unwrap()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Context::new`].
    pub fn new_owned(model: Arc<Model>, params: &ContextParams) -> Result<OwnedContext> {
        Context::create(ModelRef::Shared(model), params)
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
