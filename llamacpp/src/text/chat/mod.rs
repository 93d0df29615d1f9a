//! Chat templates: turning a conversation into the prompt a model was
//! trained on.
//!
//! - [`ChatTemplate`] runs a Jinja template (a model's
//!   `tokenizer.chat_template`) with minijinja, the way Hugging Face's
//!   `apply_chat_template` renders it.
//! - [`apply_builtin_template`] is llama.cpp's built-in matcher: a fixed list
//!   of formats, chosen by name.
//! - [`Model::chat_format`] picks for a model: its own template when it has
//!   one, else the built-in format of its family (or chatml), and says
//!   which ([`ChatFormat`]).
//! - [`ChatFormat::prompt`] makes a conversation ready to generate: its
//!   tokens (every caller's text plain text), the constraint of a
//!   required tool call ([`Tools`]), thoughts on or off and their budget
//!   ([`Reasoning`]), and a [`ChatParser`] that reads the reply into
//!   thoughts, text and tool calls ([`ChatEvent`]).
//! - [`Conversation`] keeps a chat's history and its KV cache between
//!   turns, and streams each reply as [`ChatEvent`]s.

mod builtin;
mod complete;
mod conversation;
mod jinja;
mod media;
mod output;
mod plain;
mod prompt;
mod python;
pub(crate) mod reasoning;
mod reply;
pub mod tools;
#[cfg(feature = "schemars")]
#[cfg_attr(docsrs, doc(cfg(feature = "schemars")))]
mod typed;

pub use crate::sampling::sampler::ReasoningBudget;
pub use conversation::{Conversation, DEFAULT_CONTEXT, DEFAULT_REPLY_TOKENS, Turn};
pub use media::{MediaPart, media_parts};
pub use output::{ChatEvent, ChatParser};
pub use prompt::{ChatOptions, ChatPrompt};
pub use reasoning::{Reasoning, ReasoningFormat};
pub use reply::{Reply, ReplyPart, ReplyReader};
pub use tools::{Tool, ToolChoice, ToolFormat, Tools};

use serde::{Deserialize, Serialize};

pub use builtin::{apply_builtin_template, builtin_chat_templates};
pub use jinja::{ChatTemplate, RenderOptions};

use crate::error::{Error, Result};
use crate::llama::model::Model;

/// One chat message, as Hugging Face templates expect it (and as OpenAI's
/// chat API sends it). Optional fields that are unset are absent from the
/// template's view (`message.tool_calls is defined` is false).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, …
    pub role: String,
    /// The text, or a list of parts; `None` (JSON `null`) for an assistant
    /// turn that only calls tools.
    pub content: Option<MessageContent>,
    /// The tool calls of an assistant turn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tool's (or participant's) name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's reasoning, for templates that render it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Any other field, passed to the template as it is (gpt-oss's
    /// template reads an assistant turn's `thinking`, for one).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// A message's content: one string, or a list of typed parts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// A list of parts (`[{"type": "text", "text": …}]`).
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ContentPart {
    /// A piece of text.
    Text {
        /// The text.
        text: String,
    },
    /// An image, by URL (a `data:` URL holds the file): its place in the
    /// prompt is in [`ChatPrompt::media_at`], and a request made from the
    /// prompt takes the decoded image.
    ImageUrl {
        /// Where the image is.
        image_url: ImageUrl,
    },
    /// An audio clip, base64.
    InputAudio {
        /// The clip.
        input_audio: InputAudio,
    },
}

impl ContentPart {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        ContentPart::Text { text: text.into() }
    }

    /// An image part by URL (`data:image/jpeg;base64,…`).
    pub fn image_url(url: impl Into<String>) -> Self {
        ContentPart::ImageUrl { image_url: ImageUrl { url: url.into(), detail: None } }
    }
}

/// The URL of an [`ContentPart::ImageUrl`] part: `{"url": …}`, or the
/// URL alone as a string (which some clients send).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "ImageUrlForm")]
pub struct ImageUrl {
    /// The URL (`data:image/png;base64,…`).
    pub url: String,
    /// OpenAI's `detail` (`auto`, `low`, `high`), passed through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The forms an [`ImageUrl`] is read from.
#[derive(Deserialize)]
#[serde(untagged)]
enum ImageUrlForm {
    Url(String),
    Object {
        url: String,
        #[serde(default)]
        detail: Option<String>,
    },
}

impl From<ImageUrlForm> for ImageUrl {
    fn from(form: ImageUrlForm) -> ImageUrl {
        match form {
            ImageUrlForm::Url(url) => ImageUrl { url, detail: None },
            ImageUrlForm::Object { url, detail } => ImageUrl { url, detail },
        }
    }
}

/// The clip of an [`ContentPart::InputAudio`] part.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputAudio {
    /// The file, base64.
    pub data: String,
    /// Its format: `wav` or `mp3`.
    pub format: String,
}

/// A function call made by an assistant turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, which the answering `tool` message repeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Always `function`.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// What is called.
    pub function: FunctionCall,
}

fn no_arguments() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

fn function_type() -> String {
    "function".to_owned()
}

/// The function and arguments of a [`ToolCall`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// The arguments: a JSON object as Hugging Face templates expect
    /// (OpenAI clients send a string holding JSON; templates differ in
    /// which they accept). Absent: an empty object.
    #[serde(default = "no_arguments")]
    pub arguments: serde_json::Value,
}

impl ChatMessage {
    /// A text message with the given role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_content: None,
            extra: serde_json::Map::new(),
        }
    }
    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
    /// A `tool` message: the result of the call `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { tool_call_id: Some(tool_call_id.into()), ..Self::new("tool", content) }
    }

    /// A message of `parts` (text, images, audio) with the given role.
    pub fn parts(role: impl Into<String>, parts: impl IntoIterator<Item = ContentPart>) -> Self {
        ChatMessage { content: Some(MessageContent::Parts(parts.into_iter().collect())), ..Self::new(role, "") }
    }

    /// The message's text: the content string, or its text parts joined.
    pub fn text(&self) -> String {
        match &self.content {
            None => String::new(),
            Some(MessageContent::Text(t)) => t.clone(),
            Some(MessageContent::Parts(parts)) => parts
                .iter()
                .filter_map(|p| match p {
                    ContentPart::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .concat(),
        }
    }
}

/// How a model's conversations become prompts, and which path was taken.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ChatFormat {
    /// The model's own Jinja template, with the texts of its BOS and EOS
    /// tokens.
    Jinja {
        /// The compiled template.
        template: ChatTemplate,
        /// The vocabulary's BOS text (`bos_token` in the template), or empty.
        bos_token: String,
        /// The vocabulary's EOS text (`eos_token`), or empty.
        eos_token: String,
    },
    /// llama.cpp's built-in template of this name: the fallback for a model
    /// without a template.
    Builtin(String),
}

impl ChatFormat {
    /// Renders `messages` into a prompt. A Jinja format fills `bos_token`
    /// and `eos_token` from the model unless `options` sets them.
    ///
    /// # Errors
    /// As [`ChatTemplate::render`]; a built-in format cannot render tools or
    /// extra variables and returns [`Error::ChatTemplate`] if given tools.
    pub fn render(&self, messages: &[ChatMessage], options: &RenderOptions) -> Result<String> {
        match self {
            ChatFormat::Jinja { template, bos_token, eos_token } => {
                let mut options = options.clone();
                options.bos_token.get_or_insert_with(|| bos_token.clone());
                options.eos_token.get_or_insert_with(|| eos_token.clone());
                template.render(messages, &options)
            }
            ChatFormat::Builtin(name) => {
                if options.tools.is_some() {
                    return Err(Error::ChatTemplate(format!(
                        "llama.cpp's built-in {name:?} template cannot render tools (the model has no template)"
                    )));
                }
                apply_builtin_template(name, messages, options.add_generation_prompt)
            }
        }
    }
}

impl Model {
    /// How this model's conversations become prompts: its Jinja template
    /// `tokenizer.chat_template` (or the named variant
    /// `tokenizer.chat_template.NAME`, e.g. `tool_use`) when it has one;
    /// otherwise llama.cpp's built-in template of its architecture's family
    /// (`gemma` for `gemma3`, …) or chatml, as llama.cpp's server does. The
    /// choice is logged at info level when the format is compiled; the
    /// default format (`None`) is compiled by the first call and shared by
    /// the later ones.
    ///
    /// # Errors
    /// [`Error::ChatTemplate`] if the model's template does not parse, or a
    /// named variant does not exist.
    #[doc(alias = "llama_model_chat_template")]
    pub fn chat_format(&self, name: Option<&str>) -> Result<ChatFormat> {
        match name {
            // The default format is compiled once per model, kept in its
            // extensions.
            None => {
                Ok(self.extensions().get_or_try_init(|| self.compile_chat_format(None).map(DefaultFormat))?.0.clone())
            }
            Some(_) => self.compile_chat_format(name),
        }
    }

    /// A chat format of a Jinja template of your own (a newer version of
    /// the model's, one from llama.cpp's `models/templates`, …), with this
    /// model's BOS and EOS texts.
    ///
    /// # Errors
    /// [`Error::ChatTemplate`] if the template does not parse.
    pub fn chat_format_from(&self, source: &str) -> Result<ChatFormat> {
        let template = ChatTemplate::new(source)?;
        let vocab = self.vocab();
        let text =
            |t: Option<crate::llama::types::Token>| t.and_then(|t| vocab.text(t).ok()).unwrap_or_default().to_owned();
        Ok(ChatFormat::Jinja { template, bos_token: text(vocab.bos()), eos_token: text(vocab.eos()) })
    }

    fn compile_chat_format(&self, name: Option<&str>) -> Result<ChatFormat> {
        if let Some(source) = self.chat_template(name) {
            let format = self.chat_format_from(source)?;
            log::info!("chat: the model's Jinja template {}", name.unwrap_or("(default)"));
            return Ok(format);
        }
        if let Some(name) = name {
            return Err(Error::ChatTemplate(format!("the model has no chat template named {name:?}")));
        }
        let arch = self.metadata("general.architecture").unwrap_or_default();
        let builtin = builtin_chat_templates();
        let family =
            builtin.iter().filter(|n| arch.starts_with(**n)).max_by_key(|n| n.len()).copied().unwrap_or("chatml");
        log::info!("chat: the model has no template; llama.cpp's built-in {family:?}");
        Ok(ChatFormat::Builtin(family.to_owned()))
    }

    /// Formats `messages` with [`chat_format(None)`](Self::chat_format):
    /// the model's Jinja template, or the built-in fallback.
    ///
    /// # Errors
    /// As [`ChatFormat::render`].
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_assistant: bool) -> Result<String> {
        self.chat_format(None)?.render(messages, &RenderOptions::default().add_generation_prompt(add_assistant))
    }
}

/// A model's default chat format ([`Model::chat_format`]`(None)`), as its
/// extensions keep it.
struct DefaultFormat(ChatFormat);
