//! The top floor: many requests over one model. The engine's continuous
//! batching (feature `engine`) and batched embeddings.

pub mod embed;
#[cfg(feature = "engine")]
pub mod engine;
