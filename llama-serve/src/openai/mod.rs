//! The OpenAI request and response bodies this server speaks (its error
//! shape is [`crate::error::ApiError`]'s).

mod request;
mod response;
mod responses;

pub use request::*;
pub use response::*;
pub use responses::ResponsesRequest;
