//! One-call chat: [`Model::chat`], for scripts and tests that want the
//! answer, not a streaming loop.

use super::{ChatMessage, ChatOptions, Conversation};
use crate::error::Result;
use crate::llama::model::Model;
use crate::llama::types::FinishReason;
use crate::sampling::constraint::Constraint;
use crate::text::generate::{CompleteOptions, Completed};

impl Model {
    /// Answers a conversation: renders `messages` with the model's chat
    /// template (llama.cpp's built-in format of its family, chatml if none:
    /// see [`Model::chat_format`]) with the generation prompt, tokenizes it
    /// with [`ChatFormat::tokenize`](crate::ChatFormat::tokenize) (only the
    /// template's own markup becomes control tokens: a message that says
    /// `<end_of_turn>` cannot end its turn; no second BOS), and generates
    /// the reply as [`Model::complete`].
    ///
    /// # Errors
    /// The chat template's errors ([`Error::ChatTemplate`](crate::Error::ChatTemplate),
    /// [`Error::ChatTemplateRaised`](crate::Error::ChatTemplateRaised),
    /// [`Error::ChatMarkup`](crate::Error::ChatMarkup)), then as
    /// [`Model::complete`].
    pub fn chat(&self, messages: &[ChatMessage], options: &CompleteOptions) -> Result<Completed> {
        self.chat_constrained(messages, options, None)
    }

    /// [`Model::chat`], the reply under `constraint` when one is given.
    pub(crate) fn chat_constrained(
        &self,
        messages: &[ChatMessage],
        options: &CompleteOptions,
        constraint: impl Into<Option<Constraint>>,
    ) -> Result<Completed> {
        let format = self.chat_format(None)?;
        let prompt = format.prompt(self, messages, &ChatOptions::default())?;
        let params = options.context_for(self, prompt.tokens.len());
        let mut chat = Conversation::with_context(self, &params)?
            .sampling(options.sampling_params().clone())
            .generate_options(options.generate_options().clone());
        for m in messages {
            chat.push(m.clone());
        }
        let mut turn = match constraint.into() {
            Some(c) => chat.reply_constrained(c)?,
            None => chat.reply()?,
        };
        for event in &mut turn {
            event?;
        }
        let stats = turn.stats().clone();
        let finish_reason = stats.finish_reason.clone().unwrap_or(FinishReason::Length);
        Ok(Completed { text: turn.reply().text(), finish_reason, stats })
    }
}
