//! The streaming generator (`llamacpp::generate`): the synthetic model, then
//! the real one.

mod real;
mod speculative;
mod synthetic;
