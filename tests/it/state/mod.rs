//! KV cache state: the ways of reaching a state agree, and saving,
//! restoring and editing it.

mod equivalence;
mod memory;
