//! Anthropic's Messages request, and its translation into the chat
//! request every chat endpoint of this server runs through (so that
//! Messages, Responses and Chat Completions share one path: the same
//! template rendering, tool constraints, reasoning budget and engine
//! request).

use std::collections::HashSet;

use llamacpp::chat::{self, ChatMessage, ContentPart, MessageContent};
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;
use crate::request::{self, Chat, Sampling, Stop};

/// `POST /v1/messages` (and `/v1/messages/count_tokens`, which has no
/// `max_tokens`). Unknown fields are ignored.
#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    #[serde(default)]
    pub system: Option<System>,
    pub messages: Vec<Message>,
    /// Required by `/v1/messages`; checked there.
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub stop_sequences: Vec<String>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub tools: Vec<Tool>,
    pub tool_choice: Option<ToolChoice>,
    pub thinking: Option<Thinking>,
}

/// `system`: text, or a list of text blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum System {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Content,
}

/// A message's content: text, or a list of blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// A content block. Kinds this server cannot take (documents) are a 400
/// rather than dropped.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default)]
        content: Option<Content>,
        #[serde(default)]
        is_error: bool,
    },
    /// An image: `{"type": "base64", "media_type", "data"}` or `{"type":
    /// "url", "url"}` (refused later: the server fetches nothing).
    Image {
        source: ImageSource,
    },
    /// Earlier thoughts sent back: not part of the prompt (as Anthropic
    /// drops them from earlier turns).
    Thinking {},
    RedactedThinking {},
    #[serde(other)]
    Other,
}

/// Where an image block's image is.
#[derive(Debug, Deserialize)]
pub struct ImageSource {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub media_type: Option<String>,
    #[serde(default)]
    pub data: Option<String>,
    #[serde(default)]
    pub url: Option<String>,
}

impl ImageSource {
    /// The image as a chat `image_url` part.
    fn to_part(&self) -> Result<ContentPart, String> {
        let url = match (self.kind.as_str(), &self.data, &self.url) {
            ("base64", Some(data), _) => {
                format!("data:{};base64,{data}", self.media_type.as_deref().unwrap_or("image/jpeg"))
            }
            ("url", _, Some(url)) => url.clone(),
            (kind, ..) => return Err(format!("an image source of type {kind:?} without its data or url")),
        };
        Ok(ContentPart::image_url(url))
    }
}

#[derive(Debug, Deserialize)]
pub struct Tool {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub input_schema: Value,
}

/// `tool_choice`: `auto`, `any` (some tool), `tool` (the named one) or
/// `none`.
#[derive(Debug, Deserialize)]
pub struct ToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
    #[serde(default)]
    pub disable_parallel_tool_use: bool,
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}` or
/// `{"type": "disabled"}`.
#[derive(Debug, Deserialize)]
pub struct Thinking {
    #[serde(rename = "type")]
    pub kind: String,
    pub budget_tokens: Option<i64>,
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message)
}

/// The text of blocks that must all be text (`system`, a tool result).
fn text_of(blocks: &[Block], what: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for block in blocks {
        match block {
            Block::Text { text: t } => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(t);
            }
            _ => return Err(bad(format!("{what}: only text blocks are supported here"))),
        }
    }
    Ok(text)
}

impl MessagesRequest {
    /// The typed chat request every chat API makes: `system` as a system
    /// message, `tool_use` blocks as an assistant's tool calls,
    /// `tool_result` blocks as `tool` messages, `tools`/`tool_choice` as
    /// function tools, `thinking` as the reasoning budget. `max_tokens` is
    /// the caller's (checked there).
    ///
    /// # Errors
    /// A 400 for what the Messages API forbids: no messages, a role other
    /// than `user` or `assistant`, a `tool_result` whose `tool_use` is not
    /// in an earlier assistant turn, a block kind this server cannot read.
    pub fn to_chat(&self, max_tokens: Option<usize>) -> Result<Chat, ApiError> {
        if self.messages.is_empty() {
            return Err(bad("messages: at least one message is required").param("messages"));
        }
        let mut messages = Vec::new();
        match &self.system {
            Some(System::Text(text)) => messages.push(ChatMessage::system(text.clone())),
            Some(System::Blocks(blocks)) => messages.push(ChatMessage::system(text_of(blocks, "system")?)),
            None => {}
        }
        let mut called = HashSet::new();
        for (i, m) in self.messages.iter().enumerate() {
            let at = |why: String| bad(format!("messages.{i}: {why}")).param("messages");
            let blocks: Vec<&Block> = match &m.content {
                Content::Text(text) => {
                    if m.role != "user" && m.role != "assistant" {
                        return Err(at(format!("role {:?} is not user or assistant", m.role)));
                    }
                    messages.push(ChatMessage::new(m.role.clone(), text.clone()));
                    continue;
                }
                Content::Blocks(blocks) => blocks.iter().collect(),
            };
            match m.role.as_str() {
                "user" => {
                    let mut parts = Vec::new();
                    for block in blocks {
                        match block {
                            Block::Text { text: t } => parts.push(ContentPart::text(t.clone())),
                            Block::Image { source } => parts.push(source.to_part().map_err(at)?),
                            Block::ToolResult { tool_use_id, content, is_error } => {
                                if !called.contains(tool_use_id.as_str()) {
                                    return Err(at(format!(
                                        "tool_result {tool_use_id:?} has no tool_use with that id in an earlier \
                                         assistant message"
                                    )));
                                }
                                let mut result = match content {
                                    None => String::new(),
                                    Some(Content::Text(t)) => t.clone(),
                                    Some(Content::Blocks(b)) => text_of(b, &format!("messages.{i}: tool_result"))?,
                                };
                                if *is_error {
                                    result = format!("Error: {result}");
                                }
                                messages.push(ChatMessage::tool(tool_use_id.clone(), result));
                            }
                            Block::Thinking {} | Block::RedactedThinking {} => {}
                            Block::ToolUse { .. } => return Err(at("a user message cannot hold tool_use".into())),
                            Block::Other => {
                                return Err(at(
                                    "this server reads text, image, tool_use and tool_result blocks only".into()
                                ));
                            }
                        }
                    }
                    if !parts.is_empty() {
                        messages.push(ChatMessage::parts("user", parts));
                    }
                }
                "assistant" => {
                    let mut text = String::new();
                    let mut calls = Vec::new();
                    for block in blocks {
                        match block {
                            Block::Text { text: t } => text.push_str(t),
                            Block::ToolUse { id, name, input } => {
                                called.insert(id.as_str());
                                calls.push(chat::ToolCall {
                                    id: Some(id.clone()),
                                    kind: "function".to_owned(),
                                    function: chat::FunctionCall {
                                        name: name.clone(),
                                        arguments: input.to_string().into(),
                                    },
                                });
                            }
                            Block::Thinking {} | Block::RedactedThinking {} => {}
                            Block::ToolResult { .. } => {
                                return Err(at("an assistant message cannot hold tool_result".into()));
                            }
                            Block::Image { .. } => return Err(at("an assistant message cannot hold an image".into())),
                            Block::Other => {
                                return Err(at(
                                    "this server reads text, image, tool_use and tool_result blocks only".into()
                                ));
                            }
                        }
                    }
                    let content = (calls.is_empty() || !text.is_empty()).then_some(MessageContent::Text(text));
                    messages.push(ChatMessage { content, tool_calls: calls, ..ChatMessage::assistant("") });
                }
                role => return Err(at(format!("role {role:?} is not user or assistant"))),
            }
        }
        let mut chat = Chat::new(messages);
        chat.max_tokens = max_tokens;
        chat.sampling = Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop: Stop::Many(self.stop_sequences.clone()),
            stream: self.stream,
            ..Sampling::default()
        };
        let functions = self
            .tools
            .iter()
            .map(|t| chat::Tool {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: match &t.input_schema {
                    Value::Null => serde_json::json!({"type": "object"}),
                    schema => schema.clone(),
                },
            })
            .collect();
        let (choice, parallel) = match &self.tool_choice {
            None => (chat::ToolChoice::Auto, true),
            Some(choice) => {
                let kind = match (choice.kind.as_str(), &choice.name) {
                    ("auto", _) => chat::ToolChoice::Auto,
                    ("any", _) => chat::ToolChoice::Required,
                    ("none", _) => chat::ToolChoice::None,
                    ("tool", Some(name)) => chat::ToolChoice::Named(name.clone()),
                    ("tool", None) => return Err(bad("tool_choice: type tool needs a name").param("tool_choice")),
                    (other, _) => {
                        return Err(bad(format!("tool_choice: type {other:?} is not auto, any, tool or none"))
                            .param("tool_choice"));
                    }
                };
                (kind, !choice.disable_parallel_tool_use)
            }
        };
        chat.tools = request::tools(functions, choice, parallel)?;
        chat.reasoning_budget = match &self.thinking {
            None => None,
            Some(t) if t.kind == "enabled" => match t.budget_tokens {
                Some(n) if n >= 1 => Some(n),
                _ => return Err(bad("thinking: budget_tokens must be at least 1").param("thinking")),
            },
            Some(t) if t.kind == "disabled" => Some(0),
            Some(t) => {
                return Err(bad(format!("thinking: type {:?} is not enabled or disabled", t.kind)).param("thinking"));
            }
        };
        Ok(chat)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn request(body: Value) -> MessagesRequest {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn a_conversation_with_a_tool_round_trip_becomes_chat_messages() {
        let req = request(json!({
            "max_tokens": 64,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "...", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
                    {"type": "text", "text": "And tomorrow?"}]},
            ],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "enabled", "budget_tokens": 32},
            "stop_sequences": ["END"],
        }));
        let chat = req.to_chat(Some(64)).unwrap();
        assert_eq!(
            serde_json::to_value(&chat.messages).unwrap(),
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
                {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
            ])
        );
        let tools = chat.tools.as_ref().unwrap();
        assert_eq!(tools.tool_choice(), &chat::ToolChoice::Required);
        assert!(!tools.is_parallel());
        assert_eq!(tools.functions().len(), 1);
        assert_eq!(chat.reasoning_budget, Some(32));
        assert_eq!(chat.max_tokens, Some(64));
        assert_eq!(chat.sampling.stop_list(), ["END"]);
    }

    #[test]
    fn what_the_api_forbids_is_a_400() {
        let err = |body: Value| request(body).to_chat(Some(8)).unwrap_err().message;
        assert!(err(json!({"messages": []})).contains("at least one message"));
        let orphan = json!({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]}]});
        assert!(err(orphan).contains("no tool_use"), "a tool_result without its tool_use");
        assert!(err(json!({"messages": [{"role": "system", "content": "x"}]})).contains("not user or assistant"));
        let document = json!({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]});
        assert!(err(document).contains("text, image, tool_use and tool_result"));
        let choice = json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool"}});
        assert!(err(choice).contains("needs a name"));
        let thinking = json!({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled"}});
        assert!(err(thinking).contains("budget_tokens"));
    }
}
