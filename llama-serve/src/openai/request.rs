//! Request bodies. Unknown fields are ignored; a field of the wrong type
//! is a 400. A chat request becomes the server's typed [`Chat`] here.

use llamacpp::chat::{ChatMessage, Tools};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{ApiError, engine_error};
use crate::request::{Chat, Format, Sampling};

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
    /// Checked one by one into [`ChatMessage`]s ([`ChatRequest::into_chat`]).
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

impl ChatRequest {
    /// The typed chat request: each message checked ([`check_message`])
    /// and read as a [`ChatMessage`], the tools checked.
    ///
    /// # Errors
    /// A 400 naming the field: a message of an unknown role or the wrong
    /// shape, a tool or `tool_choice` that [`Tools`] refuses, a
    /// `reasoning_budget` below -1.
    pub fn into_chat(self) -> Result<Chat, ApiError> {
        let messages = self
            .messages
            .into_iter()
            .enumerate()
            .map(|(i, mut m)| {
                check_message(i, &m)?;
                without_nulls(&mut m);
                serde_json::from_value::<ChatMessage>(m).map_err(|e| {
                    ApiError::bad_request(format!("messages[{i}]: not a chat message as this API writes one: {e}"))
                        .param("messages")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tools = Tools::from_openai(self.tools.as_deref(), self.tool_choice.as_ref(), self.parallel_tool_calls)
            .map_err(engine_error)?;
        let format = match self.response_format {
            None | Some(ResponseFormat::Text) => Format::Text,
            Some(ResponseFormat::JsonObject) => Format::JsonObject,
            Some(ResponseFormat::JsonSchema { json_schema }) => {
                Format::JsonSchema(json_schema.schema.unwrap_or_else(|| Value::Object(Default::default())))
            }
        };
        if let Some(n) = self.reasoning_budget.filter(|&n| n < -1) {
            return Err(ApiError::bad_request(format!("reasoning_budget {n} is below -1")).param("reasoning_budget"));
        }
        Ok(Chat {
            messages,
            tools,
            format,
            split_reasoning: self.reasoning_format.as_deref() != Some("none"),
            reasoning_budget: self.reasoning_budget,
            template_vars: self.chat_template_kwargs.unwrap_or_default(),
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            sampling: self.sampling,
        })
    }
}

/// A message with its `null` fields dropped (but `content`): clients
/// that send back a reply as the SDK gave it write `"tool_calls": null`,
/// `"name": null`, … for what is absent; a tool call's `null` fields too.
fn without_nulls(message: &mut Value) {
    let Value::Object(fields) = message else { return };
    fields.retain(|k, v| k == "content" || !v.is_null());
    if let Some(Value::Array(calls)) = fields.get_mut("tool_calls") {
        for call in calls {
            if let Value::Object(call) = call {
                call.retain(|_, v| !v.is_null());
            }
        }
    }
}

/// The roles a chat message may have (OpenAI's; `developer` is its newer
/// name for `system`, which templates receive as it is).
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// Refuses a message whose role is not one of [`ROLES`], or whose content
/// is missing or of the wrong type for its role: text or a list of parts
/// for every role, except that an assistant message that calls tools may
/// have none. Templates render whatever they are given, so an unknown role
/// ("wizard", markup in a role) would otherwise reach the prompt.
fn check_message(i: usize, m: &Value) -> Result<(), ApiError> {
    let bad = |why: String| Err(ApiError::bad_request(format!("messages[{i}]: {why}")).param("messages"));
    let Some(role) = m.get("role").and_then(Value::as_str) else {
        return bad("no role".to_owned());
    };
    if !ROLES.contains(&role) {
        return bad(format!("role {role:?} is not one of {}", ROLES.join(", ")));
    }
    match m.get("content") {
        Some(Value::String(_) | Value::Array(_)) => Ok(()),
        None | Some(Value::Null) if role == "assistant" && m.get("tool_calls").is_some_and(Value::is_array) => Ok(()),
        None | Some(Value::Null) => bad(format!("a {role} message needs content")),
        Some(other) => bad(format!("content must be a string or a list of parts, not {other}")),
    }
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

#[cfg(test)]
mod tests {
    use llamacpp::chat::{ContentPart, MessageContent, ToolChoice};
    use serde_json::json;

    use super::*;

    fn chat(body: Value) -> Result<Chat, ApiError> {
        serde_json::from_value::<ChatRequest>(body).unwrap().into_chat()
    }

    #[test]
    fn a_chat_request_becomes_typed() {
        let chat = chat(json!({
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Look:"},
                                             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            ],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "required",
            "response_format": {"type": "json_object"},
            "max_tokens": 9,
            "max_completion_tokens": 7,
            "reasoning_format": "none",
            "chat_template_kwargs": {"enable_thinking": false},
            "stop": "END",
        }))
        .unwrap();
        assert_eq!(chat.messages.len(), 4);
        assert_eq!(chat.messages[0].role, "developer");
        assert_eq!(
            chat.messages[1].content,
            Some(MessageContent::Parts(vec![
                ContentPart::text("Look:"),
                ContentPart::image_url("data:image/png;base64,AA==")
            ]))
        );
        assert_eq!(chat.messages[2].tool_calls[0].function.arguments, json!("{}"));
        assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(chat.tools.as_ref().map(|t| t.tool_choice().clone()), Some(ToolChoice::Required));
        assert_eq!(chat.format, Format::JsonObject);
        assert_eq!(chat.max_tokens, Some(7), "max_completion_tokens wins");
        assert!(!chat.split_reasoning);
        assert_eq!(chat.template_vars.get("enable_thinking"), Some(&json!(false)));
        assert_eq!(chat.sampling.stop_list(), ["END"]);
    }

    /// What SDKs send back as they got it: `null` for absent fields, an
    /// image URL as a string, a call without arguments.
    #[test]
    fn nulls_and_the_short_forms_clients_send_are_read() {
        let chat = chat(json!({"messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": "data:image/png;base64,AA=="}], "name": null},
            {"role": "assistant", "content": "ok", "tool_calls": null, "refusal": null, "thinking": "hm"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": null, "function": {"name": "f"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "1"},
        ]}))
        .unwrap();
        assert_eq!(
            chat.messages[0].content,
            Some(MessageContent::Parts(vec![ContentPart::image_url("data:image/png;base64,AA==")]))
        );
        assert_eq!(chat.messages[0].name, None);
        assert!(chat.messages[1].tool_calls.is_empty());
        assert_eq!(chat.messages[1].extra.get("thinking"), Some(&json!("hm")), "other fields reach the template");
        assert!(!chat.messages[1].extra.contains_key("refusal"));
        let call = &chat.messages[2].tool_calls[0];
        assert_eq!((call.kind.as_str(), &call.function.arguments), ("function", &json!({})));
    }

    #[test]
    fn a_message_of_the_wrong_shape_is_a_400_naming_it() {
        let err = |messages: Value| chat(json!({"messages": messages})).unwrap_err();
        let e = err(json!([{"role": "wizard", "content": "x"}]));
        assert_eq!(
            (e.message.as_str(), e.param.as_deref()),
            ("messages[0]: role \"wizard\" is not one of system, developer, user, assistant, tool", Some("messages"))
        );
        let e =
            err(json!([{"role": "user", "content": "x"}, {"role": "user", "content": [{"type": "file", "file": {}}]}]));
        assert!(e.message.starts_with("messages[1]: "), "{}", e.message);
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(err(json!([{"role": "user"}])).message.contains("needs content"));
        assert!(e.message.contains("not a chat message"), "{}", e.message);
        let e = chat(json!({"messages": [{"role": "user", "content": "x"}], "reasoning_budget": -2})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning_budget"));
    }
}
