//! Response bodies, typed as the requests are: what each endpoint
//! answers, whole or as streamed chunks.

use serde::Serialize;

#[derive(Debug, Serialize, Clone, Copy, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    pub completion_tokens_details: CompletionTokensDetails,
}

/// OpenAI's names for predicted tokens: here the speculative draft tokens
/// the sampler confirmed and the ones it rejected.
#[derive(Debug, Serialize, Clone, Copy, Default)]
pub struct CompletionTokensDetails {
    pub accepted_prediction_tokens: usize,
    pub rejected_prediction_tokens: usize,
}

#[derive(Debug, Serialize, Clone, Copy, Default)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, o: Usage) {
        self.prompt_tokens += o.prompt_tokens;
        self.completion_tokens += o.completion_tokens;
        self.total_tokens += o.total_tokens;
        self.prompt_tokens_details.cached_tokens += o.prompt_tokens_details.cached_tokens;
        self.completion_tokens_details.accepted_prediction_tokens +=
            o.completion_tokens_details.accepted_prediction_tokens;
        self.completion_tokens_details.rejected_prediction_tokens +=
            o.completion_tokens_details.rejected_prediction_tokens;
    }
}

impl From<llamacpp::engine::Usage> for Usage {
    fn from(u: llamacpp::engine::Usage) -> Self {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: u.cached_tokens },
            completion_tokens_details: CompletionTokensDetails {
                accepted_prediction_tokens: u.accepted_draft_tokens,
                rejected_prediction_tokens: u.rejected_draft_tokens,
            },
        }
    }
}

/// `GET /health` once the model runs.
#[derive(Debug, Serialize)]
pub struct Health {
    pub status: &'static str,
}

/// `GET /v1/models`.
#[derive(Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

/// What every completion response and chunk starts with.
#[derive(Debug, Clone, Serialize)]
pub struct Header {
    pub id: String,
    /// `text_completion`, `chat.completion` or `chat.completion.chunk`.
    pub object: &'static str,
    pub created: u64,
    pub model: String,
}

/// `POST /v1/completions`: the whole response, or one streamed chunk.
#[derive(Debug, Serialize)]
pub struct TextCompletion {
    #[serde(flatten)]
    pub header: Header,
    pub choices: Vec<TextChoice>,
    /// Whole: always. Streamed with `include_usage`: `null` until the last
    /// chunk; without it, absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

#[derive(Debug, Serialize)]
pub struct TextChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<TextLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// The legacy completions `logprobs` object.
#[derive(Debug, Default, Serialize)]
pub struct TextLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    /// Per token, the top alternatives' text → log-probability.
    pub top_logprobs: Vec<serde_json::Map<String, serde_json::Value>>,
    pub text_offset: Vec<usize>,
}

/// `POST /v1/chat/completions` without `stream`.
#[derive(Debug, Serialize)]
pub struct ChatCompletion {
    #[serde(flatten)]
    pub header: Header,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Debug, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// `null` when the message is only tool calls.
    pub content: Option<String>,
    /// The thoughts before the answer (llama.cpp's server extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// A call the model made.
#[derive(Debug, Serialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Debug, Serialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

/// A streamed call: the first chunk of call `index` carries its id and
/// name (and empty arguments), later ones pieces of its arguments.
#[derive(Debug, Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, Serialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// One chunk of a streamed chat completion.
#[derive(Debug, Serialize)]
pub struct ChatChunk {
    #[serde(flatten)]
    pub header: Header,
    pub choices: Vec<ChatChunkChoice>,
    /// As [`TextCompletion::usage`] when streamed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

#[derive(Debug, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// What a chunk adds to the assistant's message (`{}` in the last one).
#[derive(Debug, Default, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// The chat `logprobs` object.
#[derive(Debug, Default, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<LogprobEntry>,
}

/// A sampled token's log-probability and the top alternatives'.
#[derive(Debug, Serialize)]
pub struct LogprobEntry {
    #[serde(flatten)]
    pub token: Logprob,
    pub top_logprobs: Vec<Logprob>,
}

#[derive(Debug, Serialize)]
pub struct Logprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// `POST /v1/embeddings`.
#[derive(Debug, Serialize)]
pub struct EmbeddingList {
    pub object: &'static str,
    pub data: Vec<EmbeddingData>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Debug, Serialize)]
pub struct EmbeddingData {
    pub object: &'static str,
    pub index: usize,
    pub embedding: EmbeddingVector,
}

/// Floats, or their little-endian `f32` bytes in base64.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Serialize)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}
