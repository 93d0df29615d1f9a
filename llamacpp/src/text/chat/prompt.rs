//! A conversation made ready to generate ([`ChatFormat::prompt`]): its
//! tokens (only the template's markup as control tokens), the constraint
//! a required tool call runs under, the reasoning budget, and the parser
//! of the reply. [`Conversation`](super::Conversation), the engine's chat
//! requests and the server all start here.

use serde_json::{Map, Value, json};

use super::reasoning::{Reasoning, ReasoningFormat};
use super::tools::{ToolFormat, Tools};
use super::{ChatFormat, ChatMessage, ChatParser, RenderOptions};
use crate::error::{Error, Result};
use crate::llama::model::Model;
use crate::llama::types::Token;
use crate::llama::vocab::{AddBos, Special, Vocab};
use crate::sampling::constraint::Constraint;
use crate::sampling::sampler::{ReasoningBudget, SamplingParams};

/// What a conversation is rendered with besides its messages, as a
/// builder: the tools, the reasoning settings and extra template
/// variables.
#[derive(Clone, Debug, Default)]
pub struct ChatOptions {
    pub(crate) tools: Option<Tools>,
    pub(crate) reasoning: Reasoning,
    pub(crate) vars: Map<String, Value>,
    pub(crate) control_tokens_in_text: bool,
}

impl ChatOptions {
    /// The tools the model may (or must, see [`Tools::choice`]) call.
    #[must_use]
    pub fn tools(mut self, tools: impl Into<Option<Tools>>) -> Self {
        self.tools = tools.into();
        self
    }

    /// Thoughts on or off, their budget, split or not.
    #[must_use]
    pub fn reasoning(mut self, reasoning: Reasoning) -> Self {
        self.reasoning = reasoning;
        self
    }

    /// Lets the conversation's text become control tokens, as llama.cpp
    /// does: the rendered prompt is tokenized with every control token's
    /// text parsed ([`Vocab::tokenize_chat`]), so a message that says
    /// `<end_of_turn>` ends its turn. Only for text you trust entirely
    /// (default off: only the template's markup is markup).
    #[must_use]
    pub fn control_tokens_in_text(mut self, on: bool) -> Self {
        self.control_tokens_in_text = on;
        self
    }

    /// An extra template variable (Hugging Face's `chat_template_kwargs`:
    /// `reasoning_effort`, …). Its strings are plain text like the
    /// messages'.
    #[must_use]
    pub fn var(mut self, name: impl Into<String>, value: Value) -> Self {
        self.vars.insert(name.into(), value);
        self
    }
}

/// A conversation ready to generate ([`ChatFormat::prompt`]).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ChatPrompt {
    /// The prompt, BOS included where the model wants one: generate from
    /// it as it is.
    pub tokens: Vec<Token>,
    /// The constraint of a required tool call, if one is required.
    pub constraint: Option<Constraint>,
    /// How the output must render control tokens for
    /// [`ChatPrompt::parser`] to see the markers: [`Special::Markup`] when
    /// some tool or thought marker is a control token of the model.
    pub special: Special,
    /// The thought markers of the template (when split).
    pub reasoning_format: ReasoningFormat,
    /// The prompt ends inside the thoughts (the template opened them).
    pub thoughts_opened: bool,
    /// The limit on thoughts, if any.
    pub budget: Option<ReasoningBudget>,
    /// The syntax calls are read in, and whether several are (`None`: the
    /// output is not read for calls).
    pub tool_format: Option<(ToolFormat, bool)>,
    /// Where the conversation's media go among `tokens`, in order (the
    /// places of its image and audio parts): a request made from the
    /// prompt takes the media themselves
    /// (`Request::with_media`, feature `mtmd`).
    pub media_at: Vec<usize>,
}

impl ChatPrompt {
    /// A parser for the reply.
    pub fn parser(&self) -> ChatParser {
        let mut parser = ChatParser::new().reasoning(self.reasoning_format, self.thoughts_opened);
        if let Some((format, parallel)) = self.tool_format {
            parser = parser.tools(format, parallel);
        }
        parser
    }

    /// `sampling` with what the prompt needs: the tool call's constraint
    /// (replacing any constraint or grammar of `sampling`) and the
    /// reasoning budget.
    pub fn sampling(&self, sampling: SamplingParams) -> SamplingParams {
        let mut sampling = match &self.constraint {
            Some(c) => sampling.constraint(c.clone()),
            None => sampling,
        };
        if let Some(budget) = &self.budget {
            sampling = sampling.reasoning_budget(budget.clone());
        }
        sampling
    }
}

impl ChatFormat {
    /// The template's source (`None` for a built-in format).
    pub fn source(&self) -> Option<&str> {
        match self {
            ChatFormat::Jinja { template, .. } => Some(template.source()),
            ChatFormat::Builtin(_) => None,
        }
    }

    /// The tool-call syntax the template teaches.
    pub fn tool_format(&self) -> ToolFormat {
        ToolFormat::from_template(self.source())
    }

    /// The thought markers the template writes.
    pub fn reasoning_format(&self) -> ReasoningFormat {
        ReasoningFormat::from_template(self.source())
    }

    /// Makes `messages` ready to generate with `options`: rendered with the
    /// generation prompt and tokenized as [`ChatFormat::tokenize`] does
    /// (every caller string plain text, the model's BOS once); the tools
    /// passed to the template, or described in a system message when the
    /// template shows no call syntax; thoughts switched off through the
    /// template's `enable_thinking` where it reads one, and a budget of 0
    /// written into the prompt when the template opened them.
    ///
    /// # Errors
    /// As [`ChatFormat::tokenize`]; [`Error::InvalidParameter`] (`tools`)
    /// for a tool whose schema cannot constrain a required call.
    pub fn prompt(&self, model: &Model, messages: &[ChatMessage], options: &ChatOptions) -> Result<ChatPrompt> {
        let messages = serde_json::to_value(messages).map_err(|e| Error::ChatTemplate(e.to_string()))?;
        self.prompt_json(model, &messages, options)
    }

    /// [`ChatFormat::prompt`] for messages given as JSON (OpenAI-style
    /// objects, passed to the template as they are).
    ///
    /// # Errors
    /// As [`ChatFormat::prompt`].
    pub fn prompt_json(&self, model: &Model, messages: &Value, options: &ChatOptions) -> Result<ChatPrompt> {
        let vocab = model.vocab();
        let tool_format = self.tool_format();
        let mut render = RenderOptions::default().add_generation_prompt(true);
        for (k, v) in &options.vars {
            render = render.var(k.clone(), v.clone());
        }
        let reasoning = &options.reasoning;
        if self.source().is_some_and(|s| s.contains("enable_thinking")) && !options.vars.contains_key("enable_thinking")
        {
            render = render.var("enable_thinking", Value::Bool(reasoning.enabled));
        }
        let mut messages = std::borrow::Cow::Borrowed(messages);
        let tools = options.tools.as_ref();
        match tools {
            Some(t) if tool_format != ToolFormat::Generic => render = render.tools(t.to_json()),
            // A template that teaches no syntax (or no template): the
            // tools and the syntax are described in a system message.
            Some(t) if t.parsed() => messages = std::borrow::Cow::Owned(with_tool_instructions(&messages, t)?),
            _ => {}
        }
        let (messages, n_media) = super::media::substitute(&messages)?;
        let (mut tokens, media_at) = if options.control_tokens_in_text {
            if n_media > 0 {
                return Err(Error::Unsupported(
                    "image and audio parts with control_tokens_in_text (the text is not cut at their places)".into(),
                ));
            }
            (vocab.tokenize_chat(&self.render_value(&messages, &render)?)?, Vec::new())
        } else {
            self.tokenize_json_with_media(vocab, &messages, &render)?
        };
        if media_at.len() != n_media {
            return Err(Error::ChatTemplate(format!(
                "the chat template rendered {} of the conversation's {n_media} image and audio parts",
                media_at.len()
            )));
        }
        let constraint = match tools {
            Some(t) => t.forcing_constraint(tool_format, model)?,
            None => None,
        };
        // The budget holds whether or not the thoughts are split out.
        let reasoning_format = self.reasoning_format();
        let mut opened = reasoning_format.markers().is_some_and(|(open, _)| ends_with_text(vocab, &tokens, open));
        let mut budget = reasoning.effective_budget();
        if opened
            && budget == Some(0)
            && let Some(close) = reasoning_format.forced_close()
        {
            // Thoughts the template opened are closed at once.
            tokens.extend(vocab.tokenize_special(&close, AddBos::No)?);
            opened = false;
        }
        if constraint.is_some() {
            // A required call is the whole reply.
            budget = None;
        }
        let reads_calls = tools.filter(|t| t.parsed()).map(|t| (tool_format, t.is_parallel()));
        let markers_are_tokens = reads_calls.is_some_and(|(f, _)| f.markers_are_tokens())
            || (reasoning.split
                && reasoning_format
                    .markers()
                    .is_some_and(|(open, close)| is_control_text(vocab, open) || is_control_text(vocab, close)));
        Ok(ChatPrompt {
            tokens,
            constraint,
            special: if markers_are_tokens { Special::Markup } else { Special::Plain },
            reasoning_format: if reasoning.split { reasoning_format } else { ReasoningFormat::None },
            thoughts_opened: opened,
            budget: budget.and_then(|tokens| reasoning_format.budget(opened, tokens)),
            tool_format: reads_calls,
            media_at,
        })
    }
}

impl ChatFormat {
    /// Renders messages given as JSON.
    fn render_value(&self, messages: &Value, options: &RenderOptions) -> Result<String> {
        match self {
            ChatFormat::Jinja { template, bos_token, eos_token } => {
                let mut options = options.clone();
                options.bos_token.get_or_insert_with(|| bos_token.clone());
                options.eos_token.get_or_insert_with(|| eos_token.clone());
                template.render_json(messages, &options)
            }
            ChatFormat::Builtin(_) => {
                let messages: Vec<ChatMessage> =
                    serde_json::from_value(messages.clone()).map_err(|e| Error::ChatTemplate(e.to_string()))?;
                self.render(&messages, options)
            }
        }
    }
}

/// Whether the prompt's text ends with `marker` (whitespace after it
/// aside).
fn ends_with_text(vocab: &Vocab, tokens: &[Token], marker: &str) -> bool {
    let tail = &tokens[tokens.len().saturating_sub(16)..];
    vocab.detokenize(tail, AddBos::No, Special::Markup).is_ok_and(|text| text.trim_end().ends_with(marker))
}

/// Whether `text` is one control token of the model.
fn is_control_text(vocab: &Vocab, text: &str) -> bool {
    matches!(vocab.tokenize_special(text, AddBos::No).as_deref(), Ok([t]) if vocab.is_control(*t))
}

/// `messages` with the tools and the call syntax described in the system
/// message (added first, or appended to the first one's text).
fn with_tool_instructions(messages: &Value, tools: &Tools) -> Result<Value> {
    let Value::Array(messages) = messages else {
        return Err(Error::InvalidArgument("the messages must be a JSON list".into()));
    };
    let list = Value::Array(
        tools.to_json().as_array().into_iter().flatten().filter_map(|t| t.get("function").cloned()).collect(),
    );
    let instructions = format!(
        "You can call these functions:\n{list}\nTo call one, answer with only\n<tool_call>\n\
         {{\"name\": <function name>, \"arguments\": <arguments as a JSON object>}}\n</tool_call>"
    );
    let mut out = messages.clone();
    match out.first_mut() {
        Some(first) if first.get("role").and_then(Value::as_str) == Some("system") && first["content"].is_string() => {
            let text = format!("{}\n\n{instructions}", first["content"].as_str().unwrap_or_default());
            first["content"] = Value::String(text);
        }
        _ => out.insert(0, json!({"role": "system", "content": instructions})),
    }
    Ok(Value::Array(out))
}
