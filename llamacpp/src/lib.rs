//! Safe, fast Rust API for [llama.cpp](https://github.com/ggml-org/llama.cpp):
//! local LLM inference on GGUF models.
//!
//! ```no_run
//! use llamacpp::{CompleteOptions, Model, ModelParams};
//!
//! # fn main() -> Result<(), llamacpp::Error> {
//! let model = Model::load("gemma-3-270m-q4_k_m.gguf", &ModelParams::default())?;
//! let done = model.complete("The capital of France is", &CompleteOptions::default().max_tokens(16))?;
//! println!("{}", done.text);
//! # Ok(())
//! # }
//! ```
//!
//! Under the one-call path: [`Context::eval`] (a prompt of any length),
//! [`Sampler::sample`] at [`Output::Last`], [`Vocab::decode`], streaming
//! with [`generate::Session`], many users at once with [`engine`].
//!
//! ```no_run
//! use llamacpp::{AddBos, ContextParams, Model, ModelParams, Output, Sampler};
//!
//! # fn main() -> Result<(), llamacpp::Error> {
//! let model = Model::load("gemma-3-270m-q4_k_m.gguf", &ModelParams::default())?;
//! let mut ctx = model.new_context(&ContextParams::default().n_ctx(2048))?;
//! ctx.eval(&model.vocab().tokenize("The capital of France is", AddBos::Yes)?, 0)?;
//! let next = Sampler::greedy().sample(&mut ctx, Output::Last)?;
//! println!("{}", model.vocab().decode(&[next])?);
//! # Ok(())
//! # }
//! ```
//!
//! # Soundness
//! No safe call can cause undefined behaviour or abort the process:
//! arguments llama.cpp would `GGML_ASSERT` on are checked in Rust first and
//! returned as [`Error`], and every entry point that can throw a C++
//! exception goes through a C++ shim that catches it. Lifetimes tie each
//! object that keeps a model pointer (contexts, grammar samplers, LoRA
//! adapters) to its [`Model`]. Calls whose recursion in llama.cpp grows
//! with the input (regex pre-tokenizers, deeply nested grammars, lazy
//! grammar triggers) run on a helper thread with a stack sized for the
//! input; input-sized allocations in Rust fail with
//! [`Error::OutOfMemory`] instead of aborting.
//!
//! Outside the promise: resource exhaustion inside llama.cpp (a failed C++
//! allocation outside the shim, the out-of-memory killer), inputs needing
//! more than 16 GiB of stack ([`Error::InputTooLarge`]), and the raw
//! pointers of `as_ptr` and [`sys`]. The repository's `docs/soundness.md`
//! lists each guarantee with the test that checks it.
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use llamacpp_sys as sys;

/// Builder setters `fn name(mut self, value: T) -> Self`, each assigning a
/// field (through a conversion where given): for the parameter builders.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty => $field:ident $(($conv:expr))?;)*) => {$(
        $(#[$doc])*
        #[must_use]
        pub fn $name(mut self, value: $ty) -> Self {
            self.$field = setters!(@conv value $(, $conv)?);
            self
        }
    )*};
    (@conv $v:ident) => { $v };
    (@conv $v:ident, $conv:expr) => { $conv($v) };
}

// The crate's floors, bottom up: a floor uses the floors below it, never
// above (tests/house.rs of the suite checks every `crate::` path). Inside
// the crate, paths name the floor (`crate::llama::model::Model`); the
// public paths (`llamacpp::chat`, `llamacpp::Model`) are the re-exports
// below.
mod error;
mod llama;
mod sampling;
mod serving;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod text;

#[cfg(feature = "mtmd")]
#[cfg_attr(docsrs, doc(cfg(feature = "mtmd")))]
pub use llama::mtmd;
pub use llama::plan;
#[cfg(feature = "rpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "rpc")))]
pub use llama::rpc;
pub use sampling::{constraint, json_schema, speculative};
pub use serving::embed;
#[cfg(feature = "engine")]
#[cfg_attr(docsrs, doc(cfg(feature = "engine")))]
pub use serving::engine;
pub use text::{chat, generate};

pub use error::{Error, Result, StateError};
pub use llama::adapter::LoraAdapter;
pub use llama::backend::{
    Device, DeviceKind, cpu_variant, cpu_variants, devices, init, supports_gpu_offload, supports_mlock, supports_mmap,
    supports_rpc, system_info, time_us, unused_cpu_features, version,
};
pub use llama::batch::{Batch, Logits, Pos, SeqId};
pub use llama::context::{
    AbortHandle, Attention, Context, ContextParams, FlashAttention, KvType, Output, OwnedContext, PerfCounters,
    Pooling, max_sequences,
};
pub use llama::model::{
    DEFAULT_FIT_MARGIN, GpuLayers, LoadMode, MetadataValue, Model, ModelParams, RopeType, SplitMode, split_path,
    split_prefix,
};
pub use llama::quantize::{FileType, QuantizeParams, quantize};
pub use llama::vocab::{AddBos, Detokenizer, Special, Token, TokenAttrs, Vocab};
pub use sampling::sampler::{
    Candidates, CustomSampler, MAX_TOP_LOGPROBS, SamplePath, Sampler, SamplerChain, SamplingParams, TokenData,
};
pub use serving::embed::{EmbedParams, Embedder};
pub use text::chat::{ChatFormat, ChatMessage, ChatTemplate, apply_builtin_template, builtin_chat_templates};
pub use text::generate::{CompleteOptions, Completed};
