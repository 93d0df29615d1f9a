//! Tool calls: which syntax the model's chat template teaches
//! ([`ToolFormat::from_template`]), the calls parsed back out of its
//! output, whole or as it streams ([`ToolStream`]), and a constraint that
//! forces a call when the client requires one ([`forcing_constraint`]).

mod format;
mod grammar;
mod request;
mod stream;

pub use format::ToolFormat;
pub use grammar::forcing_constraint;
pub use request::{ToolChoice, Tools};
pub use stream::{ToolEvent, ToolStream, parse};

/// A call as the model wrote it: the function's name and its arguments
/// as compact JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

#[cfg(test)]
mod tests;
