//! JSON Schema to grammar (`llama::json_schema`): the corpus fed token by
//! token, then constrained generation on the real model.

mod corpus;
pub(crate) mod guided;
mod real;
