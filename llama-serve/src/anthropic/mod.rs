//! Anthropic's Messages API: the request and its translation into this
//! server's chat request ([`request`]), the answer, stream events and
//! error shape ([`response`]).

mod request;
mod response;

pub use request::MessagesRequest;
pub use response::*;
