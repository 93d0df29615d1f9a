//! Typed JSON answers (feature `schemars`): the schema derived from the
//! Rust type the answer is read into, so the two cannot drift apart.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;

use super::ChatMessage;
use super::conversation::Conversation;
use crate::error::{Error, Result};
use crate::llama::model::Model;
use crate::sampling::constraint::{Constraint, JsonOptions};
use crate::text::generate::{CompleteOptions, FinishReason};

impl Constraint {
    /// JSON valid against `T`'s schema (derived with schemars), with the
    /// tightenings for small models ([`JsonOptions::tight`]).
    pub fn for_type<T: JsonSchema>() -> Constraint {
        let schema = schemars::schema_for!(T);
        Constraint::json_schema(schema.to_value()).with_json_options(JsonOptions::tight())
    }
}

/// The answer `text` read as `T`, unless generation ended before the
/// document did.
fn read<T: DeserializeOwned>(text: &str, reason: Option<&FinishReason>, tokens: usize) -> Result<T> {
    match reason {
        Some(FinishReason::Length | FinishReason::ContextFull) | None => {
            // The constraint allows the end only after a whole document: a
            // run that ended otherwise may still have finished one.
            serde_json::from_str(text)
                .map_err(|_| Error::JsonCutShort { tokens, reason: reason.cloned().unwrap_or(FinishReason::Length) })
        }
        _ => serde_json::from_str(text).map_err(|e| Error::JsonAnswer(e.to_string())),
    }
}

impl Conversation<'_> {
    /// The model's reply to the messages so far as a `T`: generated under
    /// `T`'s JSON schema (thoughts off and no tool calls for this turn),
    /// joined to the history as text, and deserialized.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), llamacpp::Error> {
    /// #[derive(serde::Deserialize, schemars::JsonSchema)]
    /// struct City { name: String, country: String }
    /// let model = llamacpp::Model::load("model.gguf", &llamacpp::ModelParams::default())?;
    /// let mut chat = llamacpp::chat::Conversation::new(&model)?;
    /// chat.user("Name the capital of France as JSON.");
    /// let city: City = chat.reply_json()?;
    /// println!("{} is in {}", city.name, city.country);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::JsonCutShort`] when the token limit or the context ended
    /// the reply before the document; [`Error::JsonAnswer`] when the
    /// document does not deserialize; as [`Conversation::reply`].
    pub fn reply_json<T: JsonSchema + DeserializeOwned>(&mut self) -> Result<T> {
        let mut turn = self.reply_constrained(Constraint::for_type::<T>())?;
        for event in &mut turn {
            event?;
        }
        read(&turn.reply().text(), turn.stats().finish_reason.as_ref(), turn.stats().generated_tokens)
    }
}

impl Model {
    /// [`Model::chat`] answered as a `T` (see [`Conversation::reply_json`]).
    ///
    /// # Errors
    /// As [`Conversation::reply_json`].
    pub fn chat_json<T: JsonSchema + DeserializeOwned>(
        &self,
        messages: &[ChatMessage],
        options: &CompleteOptions,
    ) -> Result<T> {
        let done = self.chat_constrained(messages, options, Constraint::for_type::<T>())?;
        read(&done.text, Some(&done.finish_reason), done.stats.generated_tokens)
    }

    /// [`Model::complete`] generated under `T`'s schema and read as a `T`.
    ///
    /// # Errors
    /// As [`Conversation::reply_json`], then as [`Model::complete`].
    pub fn complete_json<T: JsonSchema + DeserializeOwned>(
        &self,
        prompt: &str,
        options: &CompleteOptions,
    ) -> Result<T> {
        let options =
            options.clone().sampling(options.sampling_params().clone().constraint(Constraint::for_type::<T>()));
        let done = self.complete(prompt, &options)?;
        read(&done.text, Some(&done.finish_reason), done.stats.generated_tokens)
    }
}
