//! The memory of a model explained from its GGUF metadata alone: the
//! formulas behind [`Planner::plan`](super::Planner::plan)'s figures.
//!
//! # Weights
//!
//! A tensor of `n` elements of ggml type `t` takes
//! `n / block_size(t) × type_size(t)` bytes: F32 4 bytes per weight, F16 2,
//! Q8_0 34 bytes per block of 32 (8.5 bits per weight), Q4_K 144 bytes per
//! 256 (4.5 bits). The weights are the sum over the file's tensors
//! ([`ModelShape::weights`] groups them by type). A "Q4_K_M" file is a
//! mix: most matrices in Q4_K, some (attention V, feed-forward down, the
//! embeddings) in Q6_K or Q8_0, the norms in F32, so it is larger than
//! 4.5 bits × parameters; [`ModelShape::weights_as`] gives the size of the
//! same parameter count stored in one type, which shows what quantization
//! saves. llama.cpp's figure can differ from the file's sum: tensors are
//! padded to their buffer's alignment (32 bytes on a CPU), a tied output
//! matrix is not duplicated, and tensors of parts llama.cpp does not run
//! (e.g. multi-token-prediction heads it skips) are not loaded.
//!
//! # KV cache
//!
//! Each attention layer `l` keeps, per cell, a K row of
//! `n_embd_k_gqa(l) = key_length × head_count_kv(l)` elements of `type_k`
//! and a V row of `n_embd_v_gqa(l) = value_length × head_count_kv(l)`
//! elements of `type_v`:
//!
//! ```text
//! KV = Σ_l cells(l) × streams × (row(type_k, n_embd_k_gqa(l)) + row(type_v, n_embd_v_gqa(l)))
//! ```
//!
//! where `row(t, n) = n / block_size(t) × type_size(t)` (q8_0 is
//! 34/64 = 0.53125 of f16 per element). The cells, as llama.cpp sizes them
//! (`llama_context::llama_context`, `llama_kv_cache_iswa`):
//!
//! * `n_ctx` (0: the training length) is padded up to a multiple of 256;
//! * with `kv_unified` one stream holds `n_ctx` cells; otherwise each of
//!   the `n_seq_max` sequences has its own stream of
//!   `n_ctx_seq = pad256(n_ctx / n_seq_max)` cells;
//! * a sliding-window layer (window `n_swa`) needs only
//!   `pad256(min(n_ctx_seq, n_swa × (n_seq_max if unified, else 1) + n_ubatch))`
//!   cells, unless `swa_full` gives it the full `n_ctx_seq` (this crate's
//!   default, so that prefixes can be shared and positions shifted);
//! * without flash attention (and always for Grok, for which llama.cpp
//!   turns it off) V is stored transposed, and every layer's V row is then
//!   as wide as the widest.
//!
//! Which layers slide is in the metadata (`attention.sliding_window_pattern`)
//! or, for some architectures, fixed by llama.cpp: Gemma 3 slides in 5 of
//! every 6 layers, Gemma 2 in every other one with a 4096-token window by
//! default, Llama 4 in 3 of 4 with 8192-token chunks. The formulas know
//! Gemma 2 and 3, Cohere 2, OLMo 2, Llama 4 and gpt-oss; other
//! architectures with a sliding window need the pattern in the metadata.
//! Multi-token-prediction layers (`nextn_predict_layers`, after the trunk)
//! have no cells in the main cache, and encoders and diffusion models
//! (BERT and its kin, Gemma embedding, Dream, LLaDA) have no cache at all.
//!
//! A recurrent model (Mamba) has no cells: each layer keeps a fixed state
//! per sequence, in f32: a convolution state of
//! `(conv_kernel − 1) × (inner_size + 2 × group_count × state_size)` and an
//! SSM state of `state_size × inner_size` elements.
//!
//! Each tensor is rounded up to its buffer's 32-byte alignment; for the
//! shapes of real models (rows of whole 32-byte multiples) that adds
//! nothing, and [`ModelShape::kv_bytes`] applies it.
//!
//! Not covered (→ [`Error::Unsupported`]): hybrid models (attention plus
//! recurrent layers), RWKV and other non-Mamba recurrent layers,
//! multi-head latent attention (DeepSeek's `kv_lora_rank`), layers that
//! share another layer's cache, and sliding-window layouts of
//! architectures not listed in [`ModelShape::read`].

use std::path::Path;

use crate::error::{Error, Result};
use crate::llama::context::{ContextParams, FlashAttention, KvType};
use crate::llama::gguf::Gguf;
use crate::sys;

/// The alignment of a CPU buffer's tensors (`TENSOR_ALIGNMENT`).
const TENSOR_ALIGNMENT: u64 = 32;

/// The weights of one ggml type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeWeights {
    /// The ggml type's name (`q4_K`, `f32`, …).
    pub ggml_type: String,
    /// Tensors of this type.
    pub tensors: usize,
    /// Their elements (parameters).
    pub params: u64,
    /// Their bytes in the file.
    pub bytes: u64,
}

/// One layer's KV shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerShape {
    /// K elements per cell: key length × KV heads.
    pub n_embd_k_gqa: u32,
    /// V elements per cell: value length × KV heads.
    pub n_embd_v_gqa: u32,
    /// The layer attends over a sliding window.
    pub sliding_window: bool,
}

/// A recurrent (Mamba) layer's state per sequence, in f32 elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecurrentShape {
    /// Recurrent layers.
    pub n_layer: u32,
    /// Convolution state elements per sequence and layer (llama.cpp's `n_embd_r`).
    pub conv: u32,
    /// SSM state elements per sequence and layer (`n_embd_s`).
    pub ssm: u32,
}

/// What the memory of a model depends on, read from its GGUF metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelShape {
    /// `general.architecture`.
    pub architecture: String,
    /// Training context length (what `n_ctx` 0 means).
    pub n_ctx_train: u32,
    /// The weights, by ggml type, largest first.
    pub weights: Vec<TypeWeights>,
    /// The layers with a KV cache (none for a recurrent model or an
    /// architecture llama.cpp runs without a cache, such as BERT).
    pub layers: Vec<LayerShape>,
    /// The sliding window, in tokens (0: none).
    pub n_swa: u32,
    /// The recurrent state, for a recurrent model.
    pub recurrent: Option<RecurrentShape>,
    /// llama.cpp turns flash attention off for this architecture (Grok),
    /// so V is always stored transposed.
    pub v_transposed_always: bool,
}

/// A storage type for [`ModelShape::weights_as`].
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// 8-bit blocks (8.5 bits per weight).
    Q8_0,
    /// 4-bit k-quant blocks (4.5 bits per weight): the bulk of a Q4_K_M file.
    Q4K,
}

impl WeightType {
    fn raw(self) -> sys::ggml_type::Type {
        match self {
            WeightType::F32 => sys::ggml_type::GGML_TYPE_F32,
            WeightType::F16 => sys::ggml_type::GGML_TYPE_F16,
            WeightType::Q8_0 => sys::ggml_type::GGML_TYPE_Q8_0,
            WeightType::Q4K => sys::ggml_type::GGML_TYPE_Q4_K,
        }
    }
}

/// Bytes of `n` elements of ggml type `t`.
fn row_size(t: sys::ggml_type::Type, n: u64) -> u64 {
    // SAFETY: plain lookups in ggml's type table for a valid type.
    let (size, block) = unsafe { (sys::ggml_type_size(t) as u64, sys::ggml_blck_size(t) as u64) };
    n.div_ceil(block.max(1)) * size
}

fn pad(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// Where an architecture's sliding window comes from.
#[derive(Clone, Copy)]
enum Window {
    /// `attention.sliding_window`; 0 or absent: no sliding window.
    Metadata,
    /// `attention.sliding_window`, else this default (Gemma 2: 4096).
    MetadataOr(u32),
    /// Fixed by llama.cpp unless the metadata says 0 (Llama 4's chunks: 8192).
    FixedUnlessZero(u32),
}

/// The architectures whose sliding-window layout the formulas know, as
/// llama.cpp sets it (`src/models/<arch>.cpp`): (name, window, period,
/// dense first). A scalar `sliding_window_pattern` in the metadata
/// replaces the period. With dense first, layer `l` slides unless
/// `l % period == 0`; otherwise the last layer of each period is the
/// global one (`llama_hparams::set_swa_pattern`).
const SWA_ARCHITECTURES: &[(&str, Window, u32, bool)] = &[
    ("gemma2", Window::MetadataOr(4096), 2, false),
    ("gemma3", Window::Metadata, 6, false),
    ("cohere2", Window::Metadata, 4, false),
    ("olmo2", Window::Metadata, 4, false),
    ("llama4", Window::FixedUnlessZero(8192), 4, false),
    ("gpt-oss", Window::Metadata, 2, false),
];

/// Architectures for which llama.cpp creates no KV cache at all
/// (`llama_model::create_memory` returns none: encoders and diffusion
/// models, which attend over the whole batch).
const NO_CACHE: &[&str] = &[
    "bert",
    "jina-bert-v2",
    "jina-bert-v3",
    "nomic-bert",
    "nomic-bert-moe",
    "neo-bert",
    "eurobert",
    "wavtokenizer-dec",
    "modern-bert",
    "gemma-embedding",
    "dream",
    "llada",
    "llada-moe",
    "rnd1",
];

impl ModelShape {
    /// Reads the shape of the model at `path` from its GGUF metadata.
    ///
    /// # Errors
    /// [`Error::Io`] / [`Error::ModelLoad`] for a missing or unreadable
    /// file; [`Error::Unsupported`] for the architectures the formulas do
    /// not cover (see the module documentation).
    pub fn read(path: &Path) -> Result<ModelShape> {
        let c_path = crate::llama::model::check_gguf_file(path)?;
        let gguf = Gguf::open(&c_path).ok_or_else(|| Error::ModelLoad {
            path: path.to_owned(),
            reason: "ggml's GGUF parser rejected the file".into(),
        })?;
        let arch = gguf.string("general.architecture").unwrap_or_default();
        let key = |k: &str| format!("{arch}.{k}");
        let unsupported = |why: &str| Err(Error::Unsupported(format!("memory formulas for `{arch}`: {why}")));
        let u32_key = |k: &str| gguf.scalar_u32(&key(k));

        let mut weights: Vec<TypeWeights> = Vec::new();
        for t in gguf.tensors() {
            // SAFETY: a lookup in ggml's type table; the type was
            // validated by the GGUF parser.
            let name = unsafe { crate::llama::ffi::owned_lossy(sys::ggml_type_name(t.ggml_type)) };
            // SAFETY: as above.
            let (size, block) =
                unsafe { (sys::ggml_type_size(t.ggml_type) as u64, sys::ggml_blck_size(t.ggml_type) as u64) };
            let params = t.bytes / size.max(1) * block;
            match weights.iter_mut().find(|w| w.ggml_type == name) {
                Some(w) => {
                    w.tensors += 1;
                    w.params += params;
                    w.bytes += t.bytes;
                }
                None => weights.push(TypeWeights { ggml_type: name, tensors: 1, params, bytes: t.bytes }),
            }
        }
        weights.sort_by_key(|w| std::cmp::Reverse(w.bytes));

        let n_ctx_train = u32_key("context_length").unwrap_or(0);
        let Some(n_layer) = u32_key("block_count") else {
            return unsupported("no block_count in the metadata");
        };
        let ssm_keys = ["ssm.conv_kernel", "ssm.inner_size", "ssm.state_size"];
        let has_ssm = ssm_keys.iter().any(|k| gguf.find(&key(k)).is_some());
        let other_state = ["wkv.head_size", "shortconv.l_cache"].iter().any(|k| gguf.find(&key(k)).is_some());
        if has_ssm || other_state {
            if !matches!(arch.as_str(), "mamba" | "mamba2") || other_state {
                return unsupported("recurrent or hybrid layers other than Mamba's are not modelled");
            }
            let get = |k: &str| u32_key(k).unwrap_or(0);
            let (d_conv, d_inner, d_state, n_group) =
                (get("ssm.conv_kernel"), get("ssm.inner_size"), get("ssm.state_size"), get("ssm.group_count"));
            // Checked: the sizes come from the file.
            let conv = n_group
                .checked_mul(d_state)
                .and_then(|g| g.checked_mul(2))
                .and_then(|g| g.checked_add(d_inner))
                .and_then(|w| w.checked_mul(d_conv.saturating_sub(1)));
            let (Some(conv), Some(ssm)) = (conv, d_state.checked_mul(d_inner)) else {
                return unsupported("recurrent state sizes that overflow 32 bits");
            };
            return Ok(ModelShape {
                architecture: arch.clone(),
                n_ctx_train,
                weights,
                layers: Vec::new(),
                n_swa: 0,
                recurrent: Some(RecurrentShape { n_layer, conv, ssm }),
                v_transposed_always: false,
            });
        }
        if NO_CACHE.contains(&arch.as_str()) {
            return Ok(ModelShape {
                architecture: arch.clone(),
                n_ctx_train,
                weights,
                layers: Vec::new(),
                n_swa: 0,
                recurrent: None,
                v_transposed_always: false,
            });
        }
        for k in ["attention.kv_lora_rank", "attention.shared_kv_layers", "attention.key_length_swa"] {
            if gguf.find(&key(k)).is_some() {
                return unsupported(&format!("`{k}` (a KV layout the formulas do not model)"));
            }
        }
        let Some(n_embd) = u32_key("embedding_length") else {
            return unsupported("no embedding_length in the metadata");
        };
        let n_head = gguf.per_layer_u32(&key("attention.head_count"), n_layer).unwrap_or_default();
        let head0 = n_head.first().copied().unwrap_or(0);
        if head0 == 0 {
            return unsupported("no attention.head_count in the metadata");
        }
        let n_head_kv = gguf.per_layer_u32(&key("attention.head_count_kv"), n_layer).unwrap_or_else(|| n_head.clone());
        let head_k = u32_key("attention.key_length").unwrap_or(n_embd / head0);
        let head_v = u32_key("attention.value_length").unwrap_or(n_embd / head0);
        let metadata_window = u32_key("attention.sliding_window");
        let known = SWA_ARCHITECTURES.iter().find(|(a, ..)| *a == arch);
        let n_swa = match known.map(|k| k.1) {
            Some(Window::Metadata) | None => metadata_window.unwrap_or(0),
            Some(Window::MetadataOr(default)) => metadata_window.unwrap_or(default),
            Some(Window::FixedUnlessZero(fixed)) => {
                if metadata_window == Some(0) {
                    0
                } else {
                    fixed
                }
            }
        };
        let pattern_key = key("attention.sliding_window_pattern");
        let pattern_is_array = gguf.find(&pattern_key).is_some_and(|(_, t)| t == sys::gguf_type::GGUF_TYPE_ARRAY);
        let sliding: Vec<bool> = if n_swa == 0 {
            vec![false; n_layer as usize]
        } else if let Some(flags) = gguf.per_layer_u32(&pattern_key, n_layer).filter(|_| pattern_is_array) {
            flags.iter().map(|&f| f != 0).collect()
        } else {
            let Some(&(_, _, default_period, dense_first)) = known else {
                return unsupported(
                    "a sliding window whose layer layout llama.cpp sets in code these formulas do not know",
                );
            };
            let period = gguf.scalar_u32(&pattern_key).unwrap_or(default_period);
            (0..n_layer)
                .map(|l| period == 0 || if dense_first { l % period != 0 } else { l % period < period - 1 })
                .collect()
        };
        // The main cache leaves out multi-token-prediction layers (they
        // are counted in block_count, after the trunk).
        let n_trunk = n_layer.saturating_sub(u32_key("nextn_predict_layers").unwrap_or(0)) as usize;
        let mut layers = Vec::with_capacity(n_trunk);
        for l in 0..n_trunk {
            // Checked: the sizes come from the file.
            let (Some(k), Some(v)) = (head_k.checked_mul(n_head_kv[l]), head_v.checked_mul(n_head_kv[l])) else {
                return unsupported("KV widths that overflow 32 bits");
            };
            if k > 0 {
                layers.push(LayerShape { n_embd_k_gqa: k, n_embd_v_gqa: v, sliding_window: sliding[l] });
            }
        }
        let v_transposed_always = arch == "grok";
        Ok(ModelShape {
            architecture: arch.clone(),
            n_ctx_train,
            weights,
            layers,
            n_swa,
            recurrent: None,
            v_transposed_always,
        })
    }

    /// Parameters (elements) over all tensors.
    pub fn n_params(&self) -> u64 {
        self.weights.iter().map(|w| w.params).sum()
    }

    /// Bytes of all tensors in the file.
    pub fn weights_bytes(&self) -> u64 {
        self.weights.iter().map(|w| w.bytes).sum()
    }

    /// The bytes the same parameters would take all stored as `kind`.
    pub fn weights_as(&self, kind: WeightType) -> u64 {
        row_size(kind.raw(), self.n_params())
    }

    /// The cells each attention layer gets with `params`: (full-attention
    /// cells, sliding-window cells), per stream, and the streams.
    pub fn cells(&self, params: &ContextParams) -> KvCells {
        let p = params;
        let requested = if p.n_ctx == 0 { self.n_ctx_train } else { p.n_ctx };
        let n_batch = requested.min(p.n_batch);
        let n_ubatch = n_batch.min(if p.n_ubatch == 0 { n_batch } else { p.n_ubatch });
        let n_ctx = pad(u64::from(requested), 256) as u32;
        let n_seq = p.n_seq_max.max(1);
        let (n_ctx_seq, streams) =
            if p.kv_unified { (n_ctx, 1) } else { (pad(u64::from(n_ctx / n_seq), 256) as u32, n_seq) };
        let window = u64::from(self.n_swa) * u64::from(if p.kv_unified { n_seq } else { 1 }) + u64::from(n_ubatch);
        let swa = if p.swa_full { n_ctx_seq } else { pad(window.min(u64::from(n_ctx_seq)), 256) as u32 };
        KvCells { n_ctx_seq, streams, full: n_ctx_seq, sliding: swa }
    }

    /// The KV cache (or recurrent state) bytes of a context with `params`,
    /// by the formula of the module documentation. llama.cpp lays V out
    /// transposed only when flash attention is [`Off`](FlashAttention::Off)
    /// (it decides `v_trans = !flash_attn` before resolving
    /// [`Auto`](FlashAttention::Auto)), or always for Grok.
    pub fn kv_bytes(&self, params: &ContextParams) -> u64 {
        let p = params;
        if let Some(r) = self.recurrent {
            let cells = u64::from(p.n_seq_max.max(1));
            let f32 = sys::ggml_type::GGML_TYPE_F32;
            let per_layer = pad(row_size(f32, u64::from(r.conv)) * cells, TENSOR_ALIGNMENT)
                + pad(row_size(f32, u64::from(r.ssm)) * cells, TENSOR_ALIGNMENT);
            return u64::from(r.n_layer) * per_layer;
        }
        let cells = self.cells(p);
        let v_transposed = p.flash_attention == FlashAttention::Off || self.v_transposed_always;
        let widest_v = self.layers.iter().map(|l| l.n_embd_v_gqa).max().unwrap_or(0);
        let (k_type, v_type) = (kv_raw(p.type_k), kv_raw(p.type_v));
        self.layers
            .iter()
            .map(|l| {
                let n = u64::from(if l.sliding_window { cells.sliding } else { cells.full }) * u64::from(cells.streams);
                let v_width = if v_transposed { widest_v } else { l.n_embd_v_gqa };
                pad(row_size(k_type, u64::from(l.n_embd_k_gqa)) * n, TENSOR_ALIGNMENT)
                    + pad(row_size(v_type, u64::from(v_width)) * n, TENSOR_ALIGNMENT)
            })
            .sum()
    }
}

/// The KV cells of a context, from [`ModelShape::cells`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCells {
    /// Cells per sequence (`llama_n_ctx_seq`).
    pub n_ctx_seq: u32,
    /// Streams: 1 with `kv_unified`, otherwise one per sequence.
    pub streams: u32,
    /// Cells per stream of a full-attention layer.
    pub full: u32,
    /// Cells per stream of a sliding-window layer.
    pub sliding: u32,
}

fn kv_raw(t: KvType) -> sys::ggml_type::Type {
    t.raw()
}
