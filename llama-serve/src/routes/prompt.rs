//! Requests to prompts: a completion request's prompts and echoes, a chat
//! request's messages checked and rendered through the model's template
//! (content as plain text, tools described or passed to the template) with
//! the grammar its `response_format` or forced tool call asks for. These
//! run on the blocking pool ([`super::off_runtime`]).

use llamacpp::chat::{ChatOptions, ChatParser, Reasoning, Tools};
use llamacpp::constraint::{Constraint, JsonOptions};
use llamacpp::engine::{Prompt, Request};
use llamacpp::{AddBos, Special, Token, Vocab};
use serde_json::{Value, json};

use crate::choices::MAX_CHOICES;
use crate::error::{ApiError, engine_error};
use crate::openai::{ChatRequest, CompletionRequest, PromptInput, ResponseFormat};
use crate::state::{Config, Ready};

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
                Prompt::Tokens(t) => vocab.detokenize(t, AddBos::No, Special::Plain).map_err(engine_error),
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

/// A chat request made ready for the engine: the request every choice
/// starts from (prompt, control-token rendering, and through
/// [`Request::chat`] the forced call's constraint and the reasoning
/// budget), the constraint of `response_format`, and the parser of each
/// choice's reply.
pub(super) struct ChatSetup {
    pub request: Request,
    /// The prompt's length in tokens.
    pub prompt_tokens: usize,
    pub response_constraint: Option<Constraint>,
    pub parser: ChatParser,
}

/// The chat request's prompt, constraints and reply parser.
pub(super) fn chat_prompt(
    ready: &Ready,
    config: &Config,
    req: &ChatRequest,
    tools: Option<Tools>,
) -> Result<ChatSetup, ApiError> {
    for (i, m) in req.messages.iter().enumerate() {
        check_message(i, m)?;
    }
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("messages is empty").param("messages"));
    }
    // JSON through llguidance with the tightenings for small models
    // (bounded whitespace, no undeclared properties, bounded numbers and
    // recursion), as the GBNF converter wrote it before; compiled when the
    // engine takes the request (a bad schema is a 400 on response_format).
    let json = |schema: Value| Constraint::json_schema(schema).with_json_options(JsonOptions::tight());
    let response_constraint = match &req.response_format {
        None | Some(ResponseFormat::Text) => None,
        Some(ResponseFormat::JsonObject) => Some(json(json!({"type": "object"}))),
        Some(ResponseFormat::JsonSchema { json_schema }) => Some(json(json_schema.schema.clone().unwrap_or(json!({})))),
    };
    let mut reasoning = Reasoning::default().split(req.reasoning_format.as_deref() != Some("none"));
    let budget = match req.reasoning_budget {
        Some(n) if n >= 0 => usize::try_from(n).ok(),
        Some(-1) | None => config.reasoning_budget,
        Some(n) => {
            return Err(ApiError::bad_request(format!("reasoning_budget {n} is below -1")).param("reasoning_budget"));
        }
    };
    if let Some(budget) = budget {
        reasoning = reasoning.budget(budget);
    }
    let mut options = ChatOptions::default().tools(tools).reasoning(reasoning);
    for (k, v) in req.chat_template_kwargs.iter().flatten() {
        options = options.var(k.clone(), v.clone());
    }
    // Every text the client sent stays plain text: only the template's own
    // markup becomes control tokens (llamacpp's ChatFormat::prompt),
    // unless the operator asked for llama.cpp's behaviour.
    let options = options.control_tokens_in_text(config.special_in_content);
    let messages = Value::Array(req.messages.clone());
    let prompt = ready.chat.prompt_json(&ready.model, &messages, &options).map_err(engine_error)?;
    let media = crate::media::decode(ready, &messages, config.max_media)?;
    let prompt_tokens = prompt.tokens.len() + media.tokens;
    Ok(ChatSetup {
        request: crate::media::attach(Request::chat(&prompt), media),
        prompt_tokens,
        response_constraint,
        parser: prompt.parser(),
    })
}
