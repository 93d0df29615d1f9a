//! [`ContextParams`] and the checks and conversion that turn them into
//! llama.cpp's `llama_context_params`.

#[cfg(doc)]
use super::Context;
use crate::error::{Error, Result};
use crate::llama::model::Model;
use crate::sys;
// Defined in the leaf module `types` (batches use it too); kept here at
// its old path.
pub use crate::llama::types::max_sequences;

/// The element type of the KV cache. Quantized types save memory at some
/// cost in accuracy; a quantized V cache needs flash attention.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    /// 32-bit float.
    F32,
    /// 16-bit float (llama.cpp's default).
    #[default]
    F16,
    /// bfloat16.
    Bf16,
    /// 8-bit blocks: about half the memory of F16.
    Q8_0,
    /// 4-bit blocks.
    Q4_0,
    /// 4-bit blocks with offset.
    Q4_1,
    /// 4-bit non-linear.
    Iq4Nl,
    /// 5-bit blocks.
    Q5_0,
    /// 5-bit blocks with offset.
    Q5_1,
}

impl KvType {
    pub(crate) fn raw(self) -> sys::ggml_type::Type {
        use sys::ggml_type as t;
        match self {
            KvType::F32 => t::GGML_TYPE_F32,
            KvType::F16 => t::GGML_TYPE_F16,
            KvType::Bf16 => t::GGML_TYPE_BF16,
            KvType::Q8_0 => t::GGML_TYPE_Q8_0,
            KvType::Q4_0 => t::GGML_TYPE_Q4_0,
            KvType::Q4_1 => t::GGML_TYPE_Q4_1,
            KvType::Iq4Nl => t::GGML_TYPE_IQ4_NL,
            KvType::Q5_0 => t::GGML_TYPE_Q5_0,
            KvType::Q5_1 => t::GGML_TYPE_Q5_1,
        }
    }
}

/// Whether to use flash attention.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlashAttention {
    /// Let llama.cpp decide per device.
    #[default]
    Auto,
    /// Always.
    On,
    /// Never (a quantized V cache then fails).
    Off,
}

/// How embeddings are pooled per sequence.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The model's default.
    #[default]
    Model,
    /// No pooling: one embedding per token.
    None,
    /// Mean over the sequence.
    Mean,
    /// The first (CLS) token.
    Cls,
    /// The last token.
    Last,
    /// Reranking score.
    Rank,
}

/// Causal (generation) or non-causal (embedding) attention.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Attention {
    /// The model's default.
    #[default]
    Model,
    /// Each token sees only earlier tokens.
    Causal,
    /// Each token sees the whole sequence; a batch must fit in one micro-batch.
    NonCausal,
}

/// Parameters for [`Context::new`], as a builder.
///
/// Defaults: `n_ctx` 4096, `n_batch` 2048, `n_ubatch` 512, one sequence,
/// as many threads as the machine has (llama.cpp's own default is 4), F16 KV
/// cache, flash attention auto, no embeddings.
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct ContextParams {
    pub(crate) n_ctx: u32,
    pub(crate) n_batch: u32,
    pub(crate) n_ubatch: u32,
    pub(crate) n_seq_max: u32,
    pub(crate) n_threads: Option<i32>,
    pub(crate) n_threads_batch: Option<i32>,
    pub(crate) type_k: KvType,
    pub(crate) type_v: KvType,
    pub(crate) flash_attention: FlashAttention,
    pub(crate) embeddings: bool,
    pub(crate) pooling: Pooling,
    pub(crate) attention: Attention,
    pub(crate) kv_unified: bool,
    pub(crate) swa_full: bool,
    pub(crate) offload_kqv: bool,
    pub(crate) perf: bool,
}

impl Default for ContextParams {
    fn default() -> Self {
        ContextParams {
            n_ctx: 4096,
            n_batch: 2048,
            n_ubatch: 512,
            n_seq_max: 1,
            n_threads: None,
            n_threads_batch: None,
            type_k: KvType::F16,
            type_v: KvType::F16,
            flash_attention: FlashAttention::Auto,
            embeddings: false,
            pooling: Pooling::Model,
            attention: Attention::Model,
            kv_unified: false,
            swa_full: true,
            offload_kqv: true,
            perf: true,
        }
    }
}

impl ContextParams {
    setters! {
        /// Context length in tokens (0: the model's training length).
        /// llama.cpp pads it up to a multiple of 256; read the effective
        /// value back with [`Context::n_ctx`].
        n_ctx: u32 => n_ctx;
        /// Most tokens per [`Context::decode`] call.
        n_batch: u32 => n_batch;
        /// Most tokens per compute pass (micro-batch).
        n_ubatch: u32 => n_ubatch;
        /// Number of independent sequences (1..=256).
        n_seq_max: u32 => n_seq_max;
        /// Threads for single-token decoding (1..=512, ggml's `GGML_MAX_N_THREADS`).
        n_threads: i32 => n_threads (Some);
        /// Threads for prompt (batch) processing (1..=512, ggml's `GGML_MAX_N_THREADS`).
        n_threads_batch: i32 => n_threads_batch (Some);
        /// Element type of the K cache.
        type_k: KvType => type_k;
        /// Element type of the V cache.
        type_v: KvType => type_v;
        /// Flash attention.
        flash_attention: FlashAttention => flash_attention;
        /// Compute embeddings (every token becomes an output).
        embeddings: bool => embeddings;
        /// Pooling of embeddings.
        pooling: Pooling => pooling;
        /// Attention type.
        attention: Attention => attention;
        /// One KV buffer shared by all sequences: needed for tokens that
        /// belong to several sequences and for partial copies between them.
        kv_unified: bool => kv_unified;
        /// Full-size sliding-window cache (needed to shift or partially
        /// remove positions in sliding-window models).
        swa_full: bool => swa_full;
        /// Keep the KV cache and attention on the GPU.
        offload_kqv: bool => offload_kqv;
        /// Record timings for [`Context::perf`].
        perf: bool => perf;
    }

    /// Sets both KV cache types.
    #[must_use]
    pub fn kv_type(self, kind: KvType) -> Self {
        self.type_k(kind).type_v(kind)
    }
}

impl ContextParams {
    /// Checks the parameters for what llama.cpp would abort on with
    /// `model`, and builds llama.cpp's struct from them (without an abort
    /// callback; embeddings off, see [`Context::set_embeddings`]).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`], [`Error::InvalidArgument`], as listed at
    /// [`Context::new`].
    pub(crate) fn to_raw(&self, model: &Model) -> Result<sys::llama_context_params> {
        let p = self;
        if p.n_seq_max == 0 || p.n_seq_max > max_sequences() {
            return Err(Error::InvalidParameter {
                name: "n_seq_max",
                message: format!("must be 1..={}, got {}", max_sequences(), p.n_seq_max),
            });
        }
        if p.n_batch == 0 {
            return Err(Error::InvalidParameter { name: "n_batch", message: "must be at least 1".into() });
        }
        for (what, n) in [("n_ctx", p.n_ctx), ("n_batch", p.n_batch), ("n_ubatch", p.n_ubatch)] {
            if n > MAX_TOKENS {
                return Err(Error::InvalidParameter {
                    name: what,
                    message: format!("must be at most {MAX_TOKENS} (positions are i32), got {n}"),
                });
            }
        }
        let n_ctx = if p.n_ctx == 0 { model.n_ctx_train() } else { p.n_ctx };
        // llama.cpp clamps n_batch to n_ctx and then aborts when
        // n_seq_max > n_batch (the output buffer reserve).
        if p.n_seq_max > p.n_batch.min(n_ctx.max(1)) {
            return Err(Error::InvalidParameter {
                name: "n_seq_max",
                message: format!("{} must not exceed n_batch ({}) or n_ctx ({n_ctx})", p.n_seq_max, p.n_batch),
            });
        }
        let threads = p.n_threads.unwrap_or_else(default_threads);
        let threads_batch = p.n_threads_batch.unwrap_or(threads);
        check_threads(threads, threads_batch)?;
        check_encoder_streams(model.has_encoder(), p.n_seq_max, p.kv_unified)?;

        // SAFETY: returns a plain struct of defaults.
        let mut raw = unsafe { sys::llama_context_default_params() };
        raw.n_ctx = p.n_ctx;
        raw.n_batch = p.n_batch;
        raw.n_ubatch = p.n_ubatch;
        raw.n_seq_max = p.n_seq_max;
        raw.n_threads = threads;
        raw.n_threads_batch = threads_batch;
        raw.type_k = p.type_k.raw();
        raw.type_v = p.type_v.raw();
        raw.flash_attn_type = match p.flash_attention {
            FlashAttention::Auto => sys::llama_flash_attn_type::LLAMA_FLASH_ATTN_TYPE_AUTO,
            FlashAttention::On => sys::llama_flash_attn_type::LLAMA_FLASH_ATTN_TYPE_ENABLED,
            FlashAttention::Off => sys::llama_flash_attn_type::LLAMA_FLASH_ATTN_TYPE_DISABLED,
        };
        // Embeddings are switched on after creation, once the effective
        // sizes are known (see `set_embeddings`): llama.cpp's graph
        // reservation at creation aborts for some mean-pooling sizes.
        raw.embeddings = false;
        raw.pooling_type = match p.pooling {
            Pooling::Model => sys::llama_pooling_type::LLAMA_POOLING_TYPE_UNSPECIFIED,
            Pooling::None => sys::llama_pooling_type::LLAMA_POOLING_TYPE_NONE,
            Pooling::Mean => sys::llama_pooling_type::LLAMA_POOLING_TYPE_MEAN,
            Pooling::Cls => sys::llama_pooling_type::LLAMA_POOLING_TYPE_CLS,
            Pooling::Last => sys::llama_pooling_type::LLAMA_POOLING_TYPE_LAST,
            Pooling::Rank => sys::llama_pooling_type::LLAMA_POOLING_TYPE_RANK,
        };
        raw.attention_type = match p.attention {
            Attention::Model => sys::llama_attention_type::LLAMA_ATTENTION_TYPE_UNSPECIFIED,
            Attention::Causal => sys::llama_attention_type::LLAMA_ATTENTION_TYPE_CAUSAL,
            Attention::NonCausal => sys::llama_attention_type::LLAMA_ATTENTION_TYPE_NON_CAUSAL,
        };
        raw.kv_unified = p.kv_unified;
        raw.swa_full = p.swa_full;
        raw.offload_kqv = p.offload_kqv;
        raw.no_perf = !p.perf;
        Ok(raw)
    }
}

/// The largest `n_ctx`, `n_batch` and `n_ubatch` accepted: positions are
/// `i32`, and llama.cpp pads the context size up to a multiple of 256 in a
/// `u32`, which wraps above `u32::MAX - 255`.
pub(crate) const MAX_TOKENS: u32 = (i32::MAX as u32) & !255;

/// The most threads a context may use: ggml's `GGML_MAX_N_THREADS`. More
/// crash ggml's thread pool (OpenMP exits the process, a division by zero
/// from 65536 on, a NULL memset near `i32::MAX`).
pub(crate) const MAX_THREADS: i32 = 512;

/// The machine's available parallelism, llama.cpp's thread-count default
/// replaced by what the OS reports.
pub(crate) fn default_threads() -> i32 {
    std::thread::available_parallelism().map_or(4, |n| n.get().min(MAX_THREADS as usize) as i32)
}

/// Checks thread counts against `1..=MAX_THREADS`.
pub(crate) fn check_threads(n_threads: i32, n_threads_batch: i32) -> Result<()> {
    for (what, n) in [("n_threads", n_threads), ("n_threads_batch", n_threads_batch)] {
        if !(1..=MAX_THREADS).contains(&n) {
            return Err(Error::InvalidParameter { name: what, message: format!("must be 1..={MAX_THREADS}, got {n}") });
        }
    }
    Ok(())
}

/// An encoder-decoder model's (T5's) cross-attention aborts
/// (`GGML_ASSERT(!ubatch->equal_seqs())`) on the equal-length micro-batches
/// that a cache with one stream per sequence makes, so such models need
/// one sequence or a unified cache.
fn check_encoder_streams(has_encoder: bool, n_seq_max: u32, kv_unified: bool) -> Result<()> {
    if has_encoder && n_seq_max > 1 && !kv_unified {
        return Err(Error::InvalidArgument(format!(
            "an encoder-decoder model with n_seq_max {n_seq_max} needs kv_unified \
             (llama.cpp's cross-attention cannot run on one cache stream per sequence)"
        )));
    }
    Ok(())
}
