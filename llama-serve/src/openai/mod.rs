//! The OpenAI request and response bodies this server speaks, and its
//! error shape.

mod error;
mod request;
mod response;
mod responses;

pub use error::ApiError;
pub use request::*;
pub use response::*;
pub use responses::ResponsesRequest;
