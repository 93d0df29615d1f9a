//! The integration tests, one binary with a module per subject; each
//! subject keeps its synthetic-model and real-model parts side by side
//! (a `real` module, or tests named for the default model), so
//! `cargo test --test it -- engine::` runs one subject and `--skip ::real::`
//! leaves the real model out.
//!
//! Binaries of their own remain where the process is the unit: a global
//! allocator (`out_of_memory`), a global logger (`lora_lock`) or metrics
//! recorder (`engine_metrics`), resident-memory measurement (`leaks`),
//! child processes per case (`never_abort`, `hardening`, `stack_depth`),
//! and threads sharing one model with nothing else running (`threads`).
//! The compiler as the test is `llamacpp/tests/compile_fail.rs`.

mod chat_plain;
mod chat_template;
mod conversation;
mod cpu_dispatch;
#[cfg(any(feature = "vulkan", feature = "cuda"))]
mod device;
mod embed;
mod engine;
mod ergonomics;
mod generate;
mod json_schema;
mod lora;
mod model_api;
mod model_cache;
#[cfg(feature = "mtmd")]
mod mtmd;
mod pinned;
mod plan;
mod quantize;
#[cfg(feature = "rpc")]
mod rpc;
mod sampling;
mod shim_context;
mod state;
mod synthetic;
mod thread_safety;
mod tokenizer_vectors;
