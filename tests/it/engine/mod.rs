//! The continuous-batching engine (`llamacpp::engine`): exact on the synthetic
//! model, teacher-forced on the real one.

pub(crate) mod real;
mod synthetic;
