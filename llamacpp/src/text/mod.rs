//! The third floor: text in and out. Generation with prompt caching, stop
//! strings and streaming pieces; chat templates, conversations, tool
//! calls and reasoning; where media go among a prompt's tokens.

pub mod chat;
pub mod generate;
pub(crate) mod placeholder;
#[cfg(feature = "mtmd")]
pub(crate) mod spliced;
