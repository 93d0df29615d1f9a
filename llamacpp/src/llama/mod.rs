//! The first floor: safe types over llama.cpp's own objects, each owning
//! one C object (models, contexts and their KV cache, batches,
//! vocabularies, LoRA adapters, devices and RPC workers, multimodal
//! projectors), the typed slots upper floors keep their caches in, the memory plan
//! of what llama.cpp allocates, and the plumbing every call goes through
//! (the exception shim's results, deep-stack helper threads).

pub(crate) mod adapter;
pub(crate) mod backend;
pub(crate) mod batch;
pub(crate) mod context;
pub(crate) mod extensions;
pub(crate) mod ffi;
pub(crate) mod gguf;
pub(crate) mod model;
#[cfg(feature = "mtmd")]
pub mod mtmd;
pub mod plan;
pub(crate) mod quantize;
#[cfg(feature = "rpc")]
pub mod rpc;
pub(crate) mod stack;
pub(crate) mod thread;
pub(crate) mod types;
pub(crate) mod vocab;
