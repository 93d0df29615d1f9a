//! Requests to prompts: a completion request's prompts and echoes, a chat
//! request's messages checked and rendered through the model's template
//! (content as plain text, tools described or passed to the template) with
//! the grammar its `response_format` or forced tool call asks for. These
//! run on the blocking pool ([`super::off_runtime`]).

use llamacpp::chat::RenderOptions;
use llamacpp::constraint::{Constraint, JsonOptions};
use llamacpp::engine::Prompt;
use llamacpp::{AddBos, Special, Token, Vocab};
use serde_json::{Value, json};

use crate::generation::{self, MAX_CHOICES};
use crate::openai::{ApiError, ChatRequest, CompletionRequest, PromptInput, ResponseFormat};
use crate::state::Ready;
use crate::tools::{self, ToolChoice, ToolFormat, Tools};

/// A completion request's prompts, and each one's echo (empty without
/// `echo`).
pub(super) fn completion_prompts(
    vocab: &Vocab,
    req: &CompletionRequest,
    n: usize,
) -> Result<(Vec<Prompt>, Vec<String>), ApiError> {
    let prompts: Vec<Prompt> = match &req.prompt {
        PromptInput::Text(t) => vec![text_prompt(t.clone())],
        PromptInput::Texts(ts) => ts.iter().cloned().map(text_prompt).collect(),
        PromptInput::Tokens(ids) => vec![Prompt::Tokens(ids.iter().copied().map(Token).collect())],
        PromptInput::TokenLists(lists) => {
            lists.iter().map(|ids| Prompt::Tokens(ids.iter().copied().map(Token).collect())).collect()
        }
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_request("prompt is empty").param("prompt"));
    }
    if prompts.len() * n > MAX_CHOICES {
        return Err(ApiError::bad_request(format!("prompts × n must be at most {MAX_CHOICES}")).param("n"));
    }
    let echoes: Vec<String> = if req.echo {
        prompts
            .iter()
            .map(|p| match p {
                Prompt::Text { text, .. } => Ok(text.clone()),
                Prompt::Tokens(t) => vocab.detokenize(t, AddBos::No, Special::Plain).map_err(generation::engine_error),
                _ => Ok(String::new()),
            })
            .collect::<Result<_, _>>()?
    } else {
        vec![String::new(); prompts.len()]
    };
    Ok((prompts, echoes))
}

fn text_prompt(text: String) -> Prompt {
    Prompt::Text { text, add_bos: AddBos::Yes, special: Special::Markup }
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

/// The chat request's prompt and constraint.
pub(super) fn chat_prompt(
    ready: &Ready,
    req: &ChatRequest,
    tools: Option<&Tools>,
    special_in_content: bool,
) -> Result<(Prompt, Option<Constraint>), ApiError> {
    for (i, m) in req.messages.iter().enumerate() {
        check_message(i, m)?;
    }
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("messages is empty").param("messages"));
    }
    let mut options = RenderOptions::default().add_generation_prompt(true);
    let mut messages = std::borrow::Cow::Borrowed(&req.messages);
    match tools {
        Some(t) if ready.tool_format != ToolFormat::Generic => options = options.tools(Value::Array(t.raw.clone())),
        // A template that teaches no syntax (or no template): the tools
        // and the syntax are described in a system message.
        Some(t) if t.choice != ToolChoice::None => {
            messages = std::borrow::Cow::Owned(with_tool_instructions(&req.messages, t));
        }
        _ => {}
    }
    for (k, v) in req.chat_template_kwargs.iter().flatten() {
        options = options.var(k.clone(), v.clone());
    }
    // JSON through llguidance with the tightenings for small models
    // (bounded whitespace, no undeclared properties, bounded numbers and
    // recursion), as the GBNF converter wrote it before; compiled when the
    // engine takes the request (a bad schema is a 400 on response_format).
    let json = |schema: Value| Constraint::json_schema(schema).with_json_options(JsonOptions::tight());
    let constraint = match (tools.filter(|t| t.forced()), &req.response_format) {
        (Some(forced), _) => Some(tools::forcing_constraint(ready.tool_format, forced, &ready.model)?),
        (None, None | Some(ResponseFormat::Text)) => None,
        (None, Some(ResponseFormat::JsonObject)) => Some(json(json!({"type": "object"}))),
        (None, Some(ResponseFormat::JsonSchema { json_schema })) => {
            Some(json(json_schema.schema.clone().unwrap_or(json!({}))))
        }
    };
    let vocab = ready.model.vocab();
    let invalid = |e: String| ApiError::bad_request(format!("invalid messages: {e}")).param("messages");
    let messages = Value::Array(messages.into_owned());
    // Every text the client sent stays plain text: only the template's own
    // markup becomes control tokens (llamacpp's ChatFormat::tokenize),
    // unless the operator asked for llama.cpp's behaviour.
    if !special_in_content {
        let tokens = ready.chat.tokenize_json(vocab, &messages, &options).map_err(generation::engine_error)?;
        return Ok((Prompt::Tokens(tokens), constraint));
    }
    let messages: Vec<llamacpp::ChatMessage> = serde_json::from_value(messages).map_err(|e| invalid(e.to_string()))?;
    let text = ready.chat.render(&messages, &options).map_err(generation::engine_error)?;
    // A template that wants a BOS writes it itself (as `bos_token`); a
    // second one would change the prompt.
    let bos = vocab.bos().and_then(|b| vocab.text(b).ok()).filter(|b| !b.is_empty());
    let add_bos = if bos.is_some_and(|b| text.starts_with(b)) { AddBos::No } else { AddBos::Yes };
    Ok((Prompt::Text { text, add_bos, special: Special::Markup }, constraint))
}

/// `messages` with the tools and the call syntax described in the system
/// message (added first, or appended to the first one's text).
fn with_tool_instructions(messages: &[Value], tools: &Tools) -> Vec<Value> {
    let list = Value::Array(tools.raw.iter().filter_map(|t| t.get("function").cloned()).collect());
    let instructions = format!(
        "You can call these functions:\n{list}\nTo call one, answer with only\n<tool_call>\n\
         {{\"name\": <function name>, \"arguments\": <arguments as a JSON object>}}\n</tool_call>"
    );
    let mut out = messages.to_vec();
    match out.first_mut() {
        Some(first) if first.get("role").and_then(Value::as_str) == Some("system") && first["content"].is_string() => {
            let text = format!("{}\n\n{instructions}", first["content"].as_str().unwrap_or_default());
            first["content"] = Value::String(text);
        }
        _ => out.insert(0, json!({"role": "system", "content": instructions})),
    }
    out
}
