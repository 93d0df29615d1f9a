//! Batched embeddings: one pooled vector per text, many texts per decode.
//!
//! An [`Embedder`] owns a [`Context`] set up for pooled embeddings and
//! packs as many whole texts as fit into each `llama_decode`, in input
//! order: at most [`EmbedParams::n_seq_max`]` - 1` texts, and at most
//! [`EmbedParams::n_ubatch`] tokens in all, because llama.cpp pools each
//! sequence over one micro-batch (a sequence split over two gets a silently
//! wrong vector, which [`Context::decode`] refuses). The sequences share
//! one KV cache stream (`kv_unified`), so texts of different lengths go in
//! one pass, and the cache is cleared before every pass.
//!
//! # Results that do not depend on the packing
//! A text's vector is the same whether it is embedded alone or beside
//! others. On this crate's test machine (x86-64 with AVX-512, Gemma 3 270M
//! Q4_K_M): bit for bit with last-token pooling, within 4e-6 per element
//! with mean pooling (its sum over the pass runs in another order), cosine
//! 1 to nine digits, where a plain packing differs by up to 1.5e-3 in
//! cosine. Two settings make it so:
//! - every text starts at a multiple of [`EmbedParams::align`] (8) tokens
//!   in its pass, and the pass ends at one, with padding tokens of a
//!   sequence of their own (whose output is not read). On the CPU,
//!   llama.cpp multiplies repacked K-quant weights (Q4_K) in groups of
//!   rows, with the last `n % 4` rows of a pass through another kernel that
//!   rounds differently, and a token's result also changes with its row's
//!   offset modulo 8;
//! - flash attention is off by default ([`EmbedParams::flash_attention`]):
//!   its CPU kernel changes at 64 tokens per pass (cosine down to 0.9986
//!   with it on, even aligned).
//!
//! The padding costs up to `align - 1` tokens of compute per text (3.5 on
//! average for texts of 10 to 30 tokens); `align(1)` turns it off.
//!
//! ```no_run
//! use llamacpp::embed::{EmbedParams, Embedder, cosine_similarity};
//! use llamacpp::{Model, ModelParams, Pooling};
//!
//! # fn main() -> Result<(), llamacpp::Error> {
//! let model = Model::load("model.gguf", &ModelParams::default())?;
//! let mut embedder = Embedder::new(&model, &EmbedParams::default().pooling(Pooling::Mean).normalize(true))?;
//! let vectors = embedder.embed(&["a cat sat on the mat", "a kitten on a rug", "stock prices fell"])?;
//! println!("{:.3}", cosine_similarity(&vectors[0], &vectors[1]));
//! # Ok(())
//! # }
//! ```
//!
//! What a pass costs: with embeddings on, llama.cpp makes every token an
//! output, and a generative model's graph still ends in its LM head, so
//! each token pays for a row of logits too (for Gemma 3 270M, with its
//! 262,144-entry vocabulary, more than the transformer itself). Packing
//! removes the per-pass overhead of short texts, not that cost.

use crate::error::{Error, Result, try_reserve};
use crate::llama::batch::{Batch, Logits};
use crate::llama::context::{Attention, Context, ContextParams, FlashAttention, KvType, Pooling};
use crate::llama::model::Model;
use crate::llama::types::{SeqId, Token};
use crate::llama::vocab::AddBos;
use crate::sys;

/// Parameters of an [`Embedder`], as a builder.
///
/// Defaults: the model's pooling, no normalisation, over-long texts are an
/// error, 512 tokens and 64 texts per pass, the tokenizer's special tokens
/// added (BOS for most models), texts aligned to 8 tokens and flash
/// attention off (for results that do not depend on the packing), an F16
/// KV cache, threads as [`ContextParams`].
#[derive(Clone, Debug)]
pub struct EmbedParams {
    /// The context's settings (pooling, passes, attention, KV cache,
    /// threads); its `n_ctx` and `n_batch` follow `n_ubatch` (one pass
    /// holds a whole text), and embeddings and the unified KV cache are on.
    context: ContextParams,
    normalize: bool,
    truncate: bool,
    add_special: AddBos,
    align: u32,
}

impl Default for EmbedParams {
    fn default() -> Self {
        EmbedParams {
            context: ContextParams::default().n_ubatch(512).n_seq_max(64).flash_attention(FlashAttention::Off),
            normalize: false,
            truncate: false,
            add_special: AddBos::Yes,
            align: 8,
        }
    }
}

/// Setters of `EmbedParams` that write its context's settings.
macro_rules! context_setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty;)*) => {$(
        $(#[$doc])*
        #[must_use]
        pub fn $name(mut self, value: $ty) -> Self {
            self.context = self.context.$name(value);
            self
        }
    )*};
}

impl EmbedParams {
    context_setters! {
        /// How each text's token embeddings become one vector: the model's
        /// own pooling ([`Pooling::Model`], an error for a model that
        /// defines none, like most generative models), or [`Pooling::Mean`],
        /// [`Pooling::Cls`] (the first token) or [`Pooling::Last`].
        /// [`Pooling::None`] and [`Pooling::Rank`] give no embedding and
        /// are refused.
        pooling: Pooling;
        /// Most tokens per pass, which is also the longest text (the
        /// context's `n_ubatch`, `n_batch` and `n_ctx`: one pass must
        /// hold a whole text). With mean pooling it must be a multiple of
        /// `n_seq_max` (llama.cpp aborts otherwise; the context refuses).
        n_ubatch: u32;
        /// The context's sequences (1..=256, at most `n_ubatch`): the
        /// most texts per pass is one less, the last sequence padding the
        /// pass (see the [module documentation](self)), or all of them
        /// with `align(1)`; with 1, each text has a pass to itself,
        /// unpadded.
        n_seq_max: u32;
        /// Causal or non-causal attention (default: the model's).
        attention: Attention;
        /// Flash attention (default off). On the CPU, llama.cpp's flash
        /// attention switches kernels at 64 tokens per pass (a tiled one
        /// from there, a one-row one below), so a short text alone and the
        /// same text in a full pass come out measurably different (cosine
        /// down to 0.9986 on Gemma 3 270M).
        flash_attention: FlashAttention;
        /// Element type of the KV cache (default F16; it holds one pass).
        kv_type: KvType;
        /// Threads for single-token passes (see [`ContextParams::n_threads`]).
        n_threads: i32;
        /// Threads for multi-token passes (see [`ContextParams::n_threads_batch`]).
        n_threads_batch: i32;
    }

    setters! {
        /// Scale every vector to unit Euclidean (L2) length. An all-zero
        /// vector stays zero.
        normalize: bool => normalize;
        /// What to do with a text longer than [`Embedder::max_tokens`]:
        /// `false` (the default) fails the whole call with
        /// [`Error::InputTooLarge`]; `true` embeds its first
        /// `max_tokens` tokens (the special tokens the tokenizer puts at
        /// the start, like BOS, are kept; one it puts at the end, like
        /// BERT's SEP, is cut with the rest of the tail).
        truncate: bool => truncate;
        /// Let the tokenizer add the model's special tokens (BOS, and EOS
        /// or SEP where the model asks for them). Applies to texts, not to
        /// [`Embedder::embed_tokens`].
        add_special: AddBos => add_special;
        /// Start every text at a multiple of this many tokens in its pass,
        /// and end the pass at one (default 8; 0 and 1: no padding). See
        /// the [module documentation](self) for why.
        align: u32 => align;
    }

    /// The context parameters an [`Embedder`] with these settings creates.
    #[must_use]
    pub fn context_params(&self) -> ContextParams {
        let n = self.context.n_ubatch;
        self.context.clone().n_ctx(n).n_batch(n).kv_unified(true).embeddings(true)
    }
}

/// Embeds many texts at once over one [`Context`] of its own; see the
/// [module documentation](self).
///
/// Every call returns one vector per input, in input order, each
/// [`Embedder::dim`] floats, the same (to rounding) whether the input is
/// embedded alone or beside others. A call either embeds every input or
/// returns an error; a failed call leaves the embedder usable (except after
/// [`Error::Poisoned`]).
#[derive(Debug)]
pub struct Embedder<'m> {
    ctx: Context<'m>,
    pooling: Pooling,
    normalize: bool,
    truncate: bool,
    add_special: AddBos,
    /// The longest input: one pass, `min(n_ubatch, n_ctx)` tokens.
    max_tokens: usize,
    /// Most inputs per pass.
    n_seq_max: usize,
    /// The sequence that pads the texts of a pass to multiples of `align`
    /// tokens, if the context has a sequence to spare and `align > 1`.
    pad_seq: Option<SeqId>,
    align: usize,
    dim: usize,
    batch: Batch,
    passes: u64,
}

impl<'m> Embedder<'m> {
    /// Creates an embedder and its context over `model`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a pooling that gives no embedding
    /// ([`Pooling::None`], [`Pooling::Rank`], or [`Pooling::Model`] on a
    /// model whose pooling is none or rank), `n_ubatch` 0, or sizes the
    /// context refuses (see [`Context::new`]: `n_seq_max` outside
    /// `1..=256` or above `n_ubatch`, mean pooling with `n_ubatch` not a
    /// multiple of `n_seq_max`, an encoder-decoder model with several
    /// sequences); [`Error::ContextCreate`] as [`Context::new`].
    #[doc(alias = "llama_pooling_type")]
    pub fn new(model: &'m Model, params: &EmbedParams) -> Result<Embedder<'m>> {
        if matches!(params.context.pooling, Pooling::None | Pooling::Rank) {
            return Err(Error::InvalidArgument(format!(
                "pooling {:?} gives no embedding vector: choose Mean, Cls, Last or the model's",
                params.context.pooling
            )));
        }
        if params.context.n_ubatch == 0 {
            return Err(Error::InvalidParameter { name: "n_ubatch", message: "must be at least 1".into() });
        }
        let mut ctx = Context::new(model, &params.context_params())?;
        // SAFETY: a pure read of a setting of the live context we own.
        let raw = unsafe { sys::llama_pooling_type(ctx.as_ptr()) };
        use sys::llama_pooling_type as t;
        let pooling = match raw {
            t::LLAMA_POOLING_TYPE_MEAN => Pooling::Mean,
            t::LLAMA_POOLING_TYPE_CLS => Pooling::Cls,
            t::LLAMA_POOLING_TYPE_LAST => Pooling::Last,
            _ => {
                return Err(Error::InvalidArgument(
                    "the model defines no pooling that gives an embedding vector (its pooling type is none \
                     or rank): choose Pooling::Mean, Cls or Last"
                        .into(),
                ));
            }
        };
        let max_tokens = ctx.n_ubatch().min(ctx.n_ctx()).min(ctx.n_batch()) as usize;
        let n_seq = ctx.n_seq_max() as usize;
        let align = (params.align as usize).max(1);
        let (n_seq_max, pad_seq) =
            if n_seq > 1 && align > 1 { (n_seq - 1, Some(n_seq as SeqId - 1)) } else { (n_seq, None) };
        Ok(Embedder {
            ctx,
            pooling,
            normalize: params.normalize,
            truncate: params.truncate,
            add_special: params.add_special,
            max_tokens,
            n_seq_max,
            pad_seq,
            align,
            dim: model.n_embd_out(),
            batch: Batch::new(max_tokens, 1),
            passes: 0,
        })
    }

    /// The pooling in effect ([`Pooling::Model`] resolved to the model's).
    #[must_use]
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// The length of every vector (the model's `n_embd_out`).
    #[doc(alias = "llama_model_n_embd_out")]
    #[must_use]
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The longest input in tokens (special tokens included): longer ones
    /// are an error or truncated, see [`EmbedParams::truncate`].
    #[must_use]
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The most inputs embedded in one pass (one less than the context's
    /// sequences when passes are padded, see [`EmbedParams::n_seq_max`]).
    #[must_use]
    pub fn n_seq_max(&self) -> usize {
        self.n_seq_max
    }

    /// How many passes (`llama_decode` calls) this embedder has run.
    #[must_use]
    pub fn passes(&self) -> u64 {
        self.passes
    }

    /// The context, e.g. for [`Context::perf`] or thread settings. Embedding
    /// clears its KV cache before every pass.
    pub fn context_mut(&mut self) -> &mut Context<'m> {
        &mut self.ctx
    }

    /// Gives the context back.
    #[must_use]
    pub fn into_context(self) -> Context<'m> {
        self.ctx
    }

    /// The tokens [`Embedder::embed`] feeds the model for `text` (before
    /// any truncation).
    ///
    /// # Errors
    /// As [`Vocab::tokenize`](crate::Vocab::tokenize).
    #[doc(alias = "llama_tokenize")]
    pub fn tokenize(&self, text: &str) -> Result<Vec<Token>> {
        self.ctx.model().vocab().tokenize(text, self.add_special)
    }

    /// Embeds `texts`: one vector per text, in order. An empty list gives
    /// an empty result without running the model.
    ///
    /// The empty string is tokenized like any text: with a model that adds
    /// BOS (Gemma, Llama) it is the BOS token alone and gets that token's
    /// vector; with one that adds no special tokens it has no tokens, and
    /// the call fails with [`Error::InvalidArgument`].
    ///
    /// # Errors
    /// [`Error::InputTooLarge`] for a text longer than
    /// [`Embedder::max_tokens`] unless [`EmbedParams::truncate`] is on;
    /// [`Error::InvalidArgument`] for a text without tokens; tokenizer
    /// errors ([`Vocab::tokenize`](crate::Vocab::tokenize)); decode errors
    /// ([`Context::decode`]). Nothing is returned for the other texts then.
    #[doc(alias = "llama_decode")]
    #[doc(alias = "llama_get_embeddings_seq")]
    pub fn embed<S: AsRef<str>>(&mut self, texts: &[S]) -> Result<Vec<Vec<f32>>> {
        let mut tokens = Vec::new();
        try_reserve(&mut tokens, texts.len())?;
        for text in texts {
            tokens.push(self.tokenize(text.as_ref())?);
        }
        self.embed_tokens(&tokens)
    }

    /// Embeds one text; see [`Embedder::embed`].
    ///
    /// # Errors
    /// As [`Embedder::embed`].
    pub fn embed_one(&mut self, text: &str) -> Result<Vec<f32>> {
        let mut v = self.embed(&[text])?;
        Ok(v.pop().unwrap_or_default())
    }

    /// Embeds token sequences as they are (no special tokens are added):
    /// one vector per sequence, in order.
    ///
    /// # Errors
    /// As [`Embedder::embed`]; [`Error::InvalidToken`] for a token outside
    /// the vocabulary; [`Error::InvalidArgument`] for an empty sequence.
    #[doc(alias = "llama_decode")]
    #[doc(alias = "llama_get_embeddings_seq")]
    pub fn embed_tokens<T: AsRef<[Token]>>(&mut self, inputs: &[T]) -> Result<Vec<Vec<f32>>> {
        // Check everything first: a call embeds all inputs or fails early.
        let vocab = self.ctx.model().vocab();
        let mut lengths = Vec::new();
        try_reserve(&mut lengths, inputs.len())?;
        for (i, input) in inputs.iter().enumerate() {
            let input = input.as_ref();
            if input.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "embedding input {i} has no tokens (an empty text with a model that adds no BOS?)"
                )));
            }
            if input.len() > self.max_tokens && !self.truncate {
                return Err(Error::InputTooLarge { what: "an embedding input (in tokens)", limit: self.max_tokens });
            }
            for &t in input {
                vocab.check(t)?;
            }
            lengths.push(input.len().min(self.max_tokens));
        }
        let mut out = Vec::new();
        try_reserve(&mut out, inputs.len())?;
        let mut next = 0;
        while next < inputs.len() {
            // Pack whole inputs in order until the pass is full.
            let first = next;
            let mut n_tokens = 0;
            // The first input always fits (it is at most `max_tokens`);
            // later ones only with the padding.
            let padded = |n: usize| if self.pad_seq.is_some() { n.next_multiple_of(self.align) } else { n };
            while next < inputs.len()
                && next - first < self.n_seq_max
                && (next == first || n_tokens + padded(lengths[next]) <= self.max_tokens)
            {
                n_tokens += padded(lengths[next]);
                next += 1;
            }
            self.run_pass(&inputs[first..next], &lengths[first..next], &mut out)?;
        }
        Ok(out)
    }

    /// Decodes `inputs` (each cut to its length in `lengths`) as sequences
    /// `0..` of one pass from an empty cache, appending their vectors.
    fn run_pass<T: AsRef<[Token]>>(&mut self, inputs: &[T], lengths: &[usize], out: &mut Vec<Vec<f32>>) -> Result<()> {
        self.batch.clear();
        let mut pad_pos = 0;
        for (seq, (input, &len)) in inputs.iter().zip(lengths).enumerate() {
            let tokens = &input.as_ref()[..len];
            self.batch.push_sequence(tokens, 0, seq as SeqId, Logits::No)?;
            self.pad(tokens[0], &mut pad_pos)?;
        }
        self.ctx.clear_kv();
        self.passes += 1;
        let decoded = self.ctx.decode(&self.batch);
        let result = decoded.and_then(|()| {
            for seq in 0..inputs.len() {
                let pooled = self.ctx.sequence_embeddings(seq as SeqId)?;
                let mut v = Vec::new();
                try_reserve(&mut v, pooled.len())?;
                v.extend_from_slice(pooled);
                if self.normalize {
                    l2_normalize(&mut v);
                }
                out.push(v);
            }
            Ok(())
        });
        // Leave nothing behind: the next call starts from an empty cache
        // either way, and the memory is free meanwhile.
        self.ctx.clear_kv();
        result
    }

    /// Pads the batch to the next multiple of `align` tokens (as far as
    /// the pass has room) with `token` in the padding sequence, at its
    /// next positions `pad_pos..`.
    fn pad(&mut self, token: Token, pad_pos: &mut i32) -> Result<()> {
        let Some(seq) = self.pad_seq else { return Ok(()) };
        let end = self.batch.len().next_multiple_of(self.align).min(self.max_tokens);
        while self.batch.len() < end {
            // Any valid token will do: its sequence's output is not read.
            self.batch.push(token, *pad_pos, &[seq], Logits::No)?;
            *pad_pos += 1;
        }
        Ok(())
    }
}

/// Scales `v` to unit Euclidean length in place; an all-zero (or
/// non-finite) vector is left as it is.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
    if norm > 0.0 && norm.is_finite() {
        let scale = 1.0 / norm;
        v.iter_mut().for_each(|x| *x = (f64::from(*x) * scale) as f32);
    }
}

/// The cosine similarity of two vectors, in `-1.0..=1.0`: `NaN` if their
/// lengths differ, 0 if either is all zeros.
#[must_use]
pub fn cosine_similarity(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::NAN;
    }
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    (dot / (na.sqrt() * nb.sqrt())).clamp(-1.0, 1.0) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_and_cosine() {
        let mut v = vec![3.0, 4.0];
        l2_normalize(&mut v);
        assert!((v[0] - 0.6).abs() < 1e-7 && (v[1] - 0.8).abs() < 1e-7);
        let mut zero = vec![0.0; 3];
        l2_normalize(&mut zero);
        assert_eq!(zero, [0.0; 3]);
        assert!((cosine_similarity(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-7);
        assert!(cosine_similarity(&[1.0, 0.0], &[0.0, 2.0]).abs() < 1e-7);
        assert!((cosine_similarity(&[1.0, 1.0], &[-2.0, -2.0]) + 1.0).abs() < 1e-7);
        assert!(cosine_similarity(&[1.0], &[1.0, 2.0]).is_nan());
        assert_eq!(cosine_similarity(&[0.0, 0.0], &[1.0, 2.0]), 0.0);
    }

    #[test]
    fn params_build_a_unified_pooled_context() {
        let p = EmbedParams::default().n_ubatch(256).n_seq_max(16).pooling(Pooling::Last);
        let c = format!("{:?}", p.context_params());
        for want in ["n_ubatch: 256", "n_batch: 256", "n_seq_max: 16", "kv_unified: true", "embeddings: true", "Last"] {
            assert!(c.contains(want), "{want} missing from {c}");
        }
    }
}
