//! The continuous-batching engine (`llama::engine`): exact on the synthetic
//! model, teacher-forced on the real one.

pub(crate) mod real;
mod synthetic;
