//! The second floor: choosing tokens. Sampler chains over llama.cpp's
//! samplers with Rust shortcuts, structured output (JSON Schema, regex and
//! Lark constraints through llguidance, JSON Schema to GBNF), and the
//! drafts of speculative decoding.

pub mod constraint;
pub mod json_schema;
pub(crate) mod sampler;
pub mod speculative;
