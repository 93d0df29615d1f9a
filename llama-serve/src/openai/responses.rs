//! OpenAI's Responses request (`POST /v1/responses`), and its translation
//! into the chat request every chat endpoint of this server runs through.
//! Stateless: `previous_response_id` and `store: true` are refused.

use llamacpp::chat::{ChatMessage, ContentPart, FunctionCall, MessageContent, Tool, ToolCall, ToolChoice};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, engine_error};
use crate::request::{self, Chat, Format, Sampling};

#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    pub input: Input,
    pub instructions: Option<String>,
    #[serde(default)]
    pub tools: Vec<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub text: Option<TextConfig>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub reasoning: Option<ReasoningConfig>,
    #[serde(default)]
    pub stream: bool,
    pub previous_response_id: Option<String>,
    pub store: Option<bool>,
}

/// `input`: text (one user message), or a list of items.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Items(Vec<Value>),
}

#[derive(Debug, Deserialize)]
pub struct TextConfig {
    pub format: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct ReasoningConfig {
    pub effort: Option<String>,
}

/// The reasoning budget an `effort` stands for (`None`: no limit).
pub fn effort_budget(effort: &str) -> Result<Option<i64>, ApiError> {
    Ok(match effort {
        "none" => Some(0),
        "minimal" => Some(128),
        "low" => Some(512),
        "medium" => Some(2048),
        "high" | "xhigh" => None,
        other => {
            return Err(ApiError::bad_request(format!(
                "reasoning.effort {other:?} is not none, minimal, low, medium, high or xhigh"
            ))
            .param("reasoning.effort"));
        }
    })
}

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::bad_request(message).param(param)
}

/// A message item's content as chat content: a string, or the text of its
/// `input_text`/`output_text` parts, or with `input_image` parts a list of
/// chat parts (`text` and `image_url`, in order).
fn message_content(content: &Value, at: &str) -> Result<MessageContent, ApiError> {
    let Value::Array(parts) = content else { return content_text(content, at).map(MessageContent::Text) };
    if !parts.iter().any(|p| p.get("type").and_then(Value::as_str) == Some("input_image")) {
        return content_text(content, at).map(MessageContent::Text);
    }
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        if part.get("type").and_then(Value::as_str) == Some("input_image") {
            let Some(url) = part.get("image_url").and_then(Value::as_str) else {
                return Err(bad(
                    format!("{at}: an input_image needs image_url (a data: URL; file_id is not kept here)"),
                    "input",
                ));
            };
            out.push(ContentPart::image_url(url));
        } else {
            out.push(ContentPart::text(part_text(part, at)?));
        }
    }
    Ok(MessageContent::Parts(out))
}

/// A content's text: a string, or the text of its `input_text`/
/// `output_text` parts.
fn content_text(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                text.push_str(part_text(part, at)?);
            }
            Ok(text)
        }
        _ => Err(bad(format!("{at}: content must be a string or a list of parts"), "input")),
    }
}

/// The text of an `input_text`/`output_text` part.
fn part_text<'a>(part: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
        (Some("input_text" | "output_text" | "text"), Some(t)) => Ok(t),
        (kind, _) => {
            Err(bad(format!("{at}: content part {kind:?} is not input_text, input_image or output_text"), "input"))
        }
    }
}

impl ResponsesRequest {
    /// The same request as a chat completion request: `instructions` as a
    /// system message, message items as messages, `function_call` items
    /// as an assistant's `tool_calls` (consecutive ones together),
    /// `function_call_output` items as `tool` messages, function tools as
    /// chat tools, `text.format` as `response_format`, `reasoning.effort`
    /// as the reasoning budget.
    ///
    /// # Errors
    /// A 400 for `previous_response_id` or `store: true` (this server keeps
    /// no responses), an empty `input`, an item or tool kind it cannot read,
    /// a `function_call_output` without its `function_call`, or
    /// `max_output_tokens` below 1.
    pub fn to_chat(&self) -> Result<Chat, ApiError> {
        if self.previous_response_id.is_some() {
            return Err(bad(
                "previous_response_id: this server keeps no responses (it is stateless); send the whole conversation in input",
                "previous_response_id",
            ));
        }
        if self.store == Some(true) {
            return Err(bad("store: this server keeps no responses (it is stateless); send store: false", "store"));
        }
        let mut messages: Vec<ChatMessage> = Vec::new();
        if let Some(instructions) = &self.instructions {
            messages.push(ChatMessage::system(instructions.clone()));
        }
        let mut called = std::collections::HashSet::new();
        match &self.input {
            Input::Text(text) => messages.push(ChatMessage::user(text.clone())),
            Input::Items(items) => {
                if items.is_empty() {
                    return Err(bad("input: at least one item is required", "input"));
                }
                for (i, item) in items.iter().enumerate() {
                    let at = format!("input[{i}]");
                    let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
                    match kind {
                        "message" => {
                            let role = item.get("role").and_then(Value::as_str).unwrap_or_default();
                            if !["user", "system", "developer", "assistant"].contains(&role) {
                                return Err(bad(
                                    format!("{at}: role {role:?} is not user, system, developer or assistant"),
                                    "input",
                                ));
                            }
                            let content = message_content(item.get("content").unwrap_or(&Value::Null), &at)?;
                            messages.push(ChatMessage { content: Some(content), ..ChatMessage::new(role, "") });
                        }
                        "function_call" => {
                            let (Some(call_id), Some(name)) =
                                (item.get("call_id").and_then(Value::as_str), item.get("name").and_then(Value::as_str))
                            else {
                                return Err(bad(format!("{at}: a function_call needs call_id and name"), "input"));
                            };
                            let arguments = item.get("arguments").and_then(Value::as_str).unwrap_or("{}");
                            called.insert(call_id.to_owned());
                            let call = ToolCall {
                                id: Some(call_id.to_owned()),
                                kind: "function".to_owned(),
                                function: FunctionCall { name: name.to_owned(), arguments: arguments.into() },
                            };
                            // Consecutive calls are one assistant turn.
                            match messages.last_mut() {
                                Some(last) if last.role == "assistant" && !last.tool_calls.is_empty() => {
                                    last.tool_calls.push(call);
                                }
                                _ => messages.push(ChatMessage {
                                    content: None,
                                    tool_calls: vec![call],
                                    ..ChatMessage::assistant("")
                                }),
                            }
                        }
                        "function_call_output" => {
                            let Some(call_id) = item.get("call_id").and_then(Value::as_str) else {
                                return Err(bad(format!("{at}: a function_call_output needs call_id"), "input"));
                            };
                            if !called.contains(call_id) {
                                return Err(bad(
                                    format!("{at}: function_call_output {call_id:?} has no function_call before it"),
                                    "input",
                                ));
                            }
                            let output = match item.get("output") {
                                Some(Value::String(s)) => s.clone(),
                                Some(other) => content_text(other, &at)?,
                                None => String::new(),
                            };
                            messages.push(ChatMessage::tool(call_id, output));
                        }
                        // Earlier thoughts are not part of the prompt.
                        "reasoning" => {}
                        other => return Err(bad(format!("{at}: item type {other:?} is not supported here"), "input")),
                    }
                }
            }
        }
        let mut chat = Chat::new(messages);
        match self.max_output_tokens {
            Some(n) if n < 1 => return Err(bad("max_output_tokens must be at least 1", "max_output_tokens")),
            Some(n) => chat.max_tokens = Some(usize::try_from(n).unwrap_or(usize::MAX)),
            None => {}
        }
        chat.sampling =
            Sampling { temperature: self.temperature, top_p: self.top_p, stream: self.stream, ..Sampling::default() };
        let mut functions = Vec::new();
        for (i, tool) in self.tools.iter().enumerate() {
            if tool.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad(format!("tools[{i}]: only function tools are supported"), "tools"));
            }
            let text = |key: &str| tool.get(key).and_then(Value::as_str).map(str::to_owned);
            functions.push(Tool {
                name: text("name").unwrap_or_default(),
                description: text("description"),
                parameters: tool
                    .get("parameters")
                    .filter(|p| !p.is_null())
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object"})),
            });
        }
        let choice = match &self.tool_choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => s.parse().map_err(engine_error)?,
            Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
                match o.get("name").and_then(Value::as_str) {
                    Some(name) => ToolChoice::Named(name.to_owned()),
                    None => return Err(bad("tool_choice: a function choice needs a name", "tool_choice")),
                }
            }
            Some(other) => return Err(bad(format!("tool_choice {other} is not supported"), "tool_choice")),
        };
        chat.tools = request::tools(functions, choice, self.parallel_tool_calls.unwrap_or(true))?;
        if let Some(format) = self.text.as_ref().and_then(|t| t.format.as_ref()) {
            chat.format = match format.get("type").and_then(Value::as_str) {
                Some("text") => Format::Text,
                Some("json_object") => Format::JsonObject,
                Some("json_schema") => Format::JsonSchema(format.get("schema").cloned().unwrap_or_else(|| json!({}))),
                other => return Err(bad(format!("text.format type {other:?} is not supported"), "text.format")),
            };
        }
        if let Some(effort) = self.reasoning.as_ref().and_then(|r| r.effort.as_deref()) {
            chat.reasoning_budget = effort_budget(effort)?;
        }
        Ok(chat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> ResponsesRequest {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn items_become_chat_messages() {
        let req = request(json!({
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
                {"type": "function_call_output", "call_id": "call_2", "output": "21 C"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks."}]},
            ],
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "max_output_tokens": 64,
            "reasoning": {"effort": "low"},
        }));
        let chat = req.to_chat().unwrap();
        assert_eq!(
            serde_json::to_value(&chat.messages).unwrap(),
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
                {"role": "tool", "tool_call_id": "call_2", "content": "21 C"},
                {"role": "user", "content": "Thanks."},
            ])
        );
        let tools = chat.tools.as_ref().unwrap();
        assert_eq!(tools.tool_choice(), &ToolChoice::Named("get_weather".into()));
        assert_eq!(tools.functions()[0].parameters, json!({"type": "object"}));
        assert_eq!(chat.max_tokens, Some(64));
        assert_eq!(chat.reasoning_budget, Some(512));
        assert!(matches!(chat.format, Format::JsonSchema(_)), "{:?}", chat.format);
    }

    #[test]
    fn what_a_stateless_server_cannot_do_is_a_400() {
        let err = |body: Value| request(body).to_chat().unwrap_err();
        assert_eq!(
            err(json!({"input": "x", "previous_response_id": "resp_1"})).param.as_deref(),
            Some("previous_response_id")
        );
        assert_eq!(err(json!({"input": "x", "store": true})).param.as_deref(), Some("store"));
        assert!(err(json!({"input": []})).message.contains("at least one item"));
        let orphan = json!({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]});
        assert!(err(orphan).message.contains("no function_call"));
        assert!(err(json!({"input": "x", "tools": [{"type": "web_search"}]})).message.contains("function tools"));
        assert!(err(json!({"input": "x", "max_output_tokens": 0})).message.contains("at least 1"));
        assert!(err(json!({"input": "x", "reasoning": {"effort": "max"}})).message.contains("effort"));
        assert!(request(json!({"input": "x", "store": false})).to_chat().is_ok());
    }
}
