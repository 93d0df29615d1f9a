//! Request bodies. Unknown fields are ignored; a field of the wrong type
//! is a 400.

use serde::Deserialize;
use serde_json::Value;

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

/// The sampling fields both endpoints share, OpenAI's and the extras
/// llama.cpp's server accepts (`top_k`, `min_p`, `repeat_penalty`,
/// `grammar`, `ignore_eos`).
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
    /// `stop`, as a list (taken out of the request).
    pub fn stop_list(&self) -> Vec<String> {
        match &self.stop {
            Stop::None => Vec::new(),
            Stop::One(s) => vec![s.clone()],
            Stop::Many(v) => v.clone(),
        }
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptInput,
    pub max_tokens: Option<usize>,
    /// The number of top alternatives per token (0–20).
    pub logprobs: Option<usize>,
    #[serde(default)]
    pub echo: bool,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// A completion prompt: text, texts, token ids, or lists of token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i32>),
    TokenLists(Vec<Vec<i32>>),
}

/// `response_format`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Debug, Deserialize)]
pub struct JsonSchemaFormat {
    #[serde(default)]
    pub schema: Option<Value>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// Passed to the chat template as written (after a shape check).
    pub messages: Vec<Value>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<usize>,
    pub response_format: Option<ResponseFormat>,
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or `{"type": "function", "function":
    /// {"name": …}}` (see [`llamacpp::chat::Tools`]).
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Extra template variables (llama.cpp's server extension), e.g.
    /// `{"enable_thinking": false}`.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// `none` leaves the model's thoughts in `content`; anything else
    /// (`auto`, `deepseek`, the default) splits them into
    /// `reasoning_content` (llama.cpp's server extension).
    pub reasoning_format: Option<String>,
    /// The most tokens of thought (`-1` or absent: the server's
    /// `--reasoning-budget`; llama.cpp's server extension).
    pub reasoning_budget: Option<i64>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// `POST /v1/embeddings`.
#[derive(Debug, Deserialize)]
pub struct EmbeddingRequest {
    pub input: EmbeddingInput,
    #[serde(default)]
    pub encoding_format: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    One(String),
    Many(Vec<String>),
}
