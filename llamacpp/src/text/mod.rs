//! The third floor: text in and out. Generation with prompt caching, stop
//! strings and streaming pieces; chat templates, conversations, tool
//! calls and reasoning.

pub mod chat;
pub mod generate;
#[cfg(feature = "mtmd")]
pub mod mtmd;
pub(crate) mod placeholder;
