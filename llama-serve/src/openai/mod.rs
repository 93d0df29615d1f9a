//! The OpenAI request and response bodies this server speaks, and its
//! error shape.

mod error;
mod request;
mod response;

pub use error::ApiError;
pub use request::*;
pub use response::*;
