//! Support code shared by the examples, integration tests and benchmarks at
//! the repository root: the default model fetcher, benchmark and teacher-forcing
//! helpers, and `synthetic` (the published `llama::testing`, under its old
//! name). Not published.

pub mod bench;
pub use llama_model_cache as model_cache;
pub mod python;
pub mod safe_api;
pub use llama::testing as synthetic;
pub mod teacher;
pub mod token_prompts;
