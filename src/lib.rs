//! Support code shared by the examples, integration tests and benchmarks at
//! the repository root: the default model fetcher and the synthetic test
//! model writer. Not published.

pub mod bench;
pub mod model_cache;
pub mod python;
pub mod size;
pub mod synthetic;
pub mod teacher;
pub mod token_prompts;
