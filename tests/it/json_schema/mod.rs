//! Structured output: JSON Schema to GBNF (`llama::json_schema`) and
//! constraints through llguidance (`llama::constraint`), each fed the
//! corpus token by token, then constrained generation on the real model.

mod cases;
mod corpus;
pub(crate) mod guided;
mod real;
