//! Structured output: JSON Schema to GBNF (`llamacpp::json_schema`) and
//! constraints through llguidance (`llamacpp::constraint`), each fed the
//! corpus token by token, then constrained generation on the real model.

mod cases;
mod corpus;
pub(crate) mod guided;
mod real;
