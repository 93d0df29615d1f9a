//! The server's inside form of a request, typed: what every API asks of
//! the model once its dialect has read it (OpenAI's Chat Completions and
//! Responses, Anthropic's Messages). Messages are the library's
//! [`ChatMessage`]s and tools its checked [`Tools`], so the core
//! (prompt, constraints, engine requests) reads no API's JSON.

use llamacpp::chat::{ChatMessage, Tool, ToolChoice, Tools};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{ApiError, engine_error};

/// `stop`: one string or a list.
#[derive(Debug, Deserialize, Default)]
#[serde(untagged)]
pub enum Stop {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// How to sample and answer: the fields OpenAI's endpoints share, read
/// under their names (with the extras llama.cpp's server accepts:
/// `top_k`, `min_p`, `repeat_penalty`, `grammar`, `ignore_eos`); the
/// other dialects fill in what their API has.
#[derive(Debug, Deserialize, Default)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub seed: Option<u32>,
    /// Token id (as a string key) → bias in [-100, 100].
    pub logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    pub grammar: Option<String>,
    /// Keep generating past end-of-generation tokens (to `max_tokens`):
    /// load tests use it to get the same output length from every server.
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub stop: Stop,
    pub n: Option<usize>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Speculative decoding for this request (drafts from its own text;
    /// the same output): `true` or `false`, else the server's `--spec`.
    pub speculative: Option<bool>,
}

impl Sampling {
    /// `stop`, as a list.
    pub fn stop_list(&self) -> Vec<String> {
        match &self.stop {
            Stop::None => Vec::new(),
            Stop::One(s) => vec![s.clone()],
            Stop::Many(v) => v.clone(),
        }
    }

    /// Whether the client asked for a usage chunk at the end of a stream.
    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().is_some_and(|o| o.include_usage)
    }
}

/// What the reply must be.
#[derive(Debug, Default, Clone, PartialEq)]
pub enum Format {
    /// Free text.
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching this schema.
    JsonSchema(Value),
}

/// A chat request, whatever API sent it.
#[derive(Debug)]
pub struct Chat {
    pub messages: Vec<ChatMessage>,
    pub tools: Option<Tools>,
    pub format: Format,
    /// Thoughts apart from the text (`reasoning_content`, thinking blocks,
    /// reasoning items); `false` leaves them in the text.
    pub split_reasoning: bool,
    /// The most tokens of thought; `None` or `-1`: the server's
    /// `--reasoning-budget`.
    pub reasoning_budget: Option<i64>,
    /// Extra template variables (`chat_template_kwargs`).
    pub template_vars: Map<String, Value>,
    pub max_tokens: Option<usize>,
    pub sampling: Sampling,
}

impl Chat {
    /// `messages` with the defaults: thoughts split, no tools, free text.
    pub fn new(messages: Vec<ChatMessage>) -> Chat {
        Chat {
            messages,
            tools: None,
            format: Format::Text,
            split_reasoning: true,
            reasoning_budget: None,
            template_vars: Map::new(),
            max_tokens: None,
            sampling: Sampling::default(),
        }
    }
}

/// The checked tools of a request (`None` without any): a 400 naming
/// `tools` or `tool_choice` for what [`Tools`] refuses.
pub fn tools(functions: Vec<Tool>, choice: ToolChoice, parallel: bool) -> Result<Option<Tools>, ApiError> {
    let tools = Tools::new(functions).and_then(|t| t.choice(choice)).map_err(engine_error)?.parallel(parallel);
    Ok((!tools.functions().is_empty()).then_some(tools))
}

/// A tool call's arguments as the JSON text OpenAI's APIs carry.
pub fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}
