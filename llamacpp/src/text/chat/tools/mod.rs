//! Tool calls: the functions a conversation offers ([`Tools`]), the
//! syntax the model's chat template teaches ([`ToolFormat::from_template`]),
//! the calls read back out of its output as it streams (through
//! [`ChatParser`](super::ChatParser)), and a constraint that forces a call
//! when one is required ([`Tools::forcing_constraint`]).

mod definition;
mod format;
mod grammar;
mod stream;

pub use definition::{MAX_TOOLS, Tool, ToolChoice, Tools};
pub use format::ToolFormat;
pub(crate) use stream::{ToolEvent, ToolStream};

use crate::error::Result;
use crate::llama::model::Model;
use crate::sampling::constraint::Constraint;

/// A call as the model wrote it: the function's name and its arguments
/// as compact JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

impl Tools {
    /// The constraint a required call runs under (`None` unless the choice
    /// is [`ToolChoice::Required`] or [`ToolChoice::Named`]): only calls in
    /// `format`'s syntax to the allowed tools, each one's arguments valid
    /// against its parameter schema (one call, or several with
    /// [`Tools::parallel`]).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`](crate::Error::InvalidParameter) (`tools`)
    /// if a tool's parameters are a schema the constraint engine refuses.
    pub fn forcing_constraint(&self, format: ToolFormat, model: &Model) -> Result<Option<Constraint>> {
        if !self.forced() {
            return Ok(None);
        }
        grammar::forcing_constraint(format, self, model).map(Some)
    }
}

#[cfg(test)]
mod tests;
