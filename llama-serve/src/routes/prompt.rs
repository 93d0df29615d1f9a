//! Requests to prompts: a completion request's prompts and echoes, a chat
//! request's messages rendered through the model's template
//! (content as plain text, tools described or passed to the template) with
//! the grammar its `response_format` or forced tool call asks for. These
//! run on the blocking pool ([`super::off_runtime`]).

use llamacpp::chat::{ChatOptions, ChatParser, Reasoning};
use llamacpp::constraint::{Constraint, JsonOptions};
use llamacpp::engine::{Prompt, Request};
use llamacpp::{AddBos, Special, Token, Vocab};
use serde_json::{Value, json};

use crate::choices::MAX_CHOICES;
use crate::error::{ApiError, engine_error};
use crate::openai::{CompletionRequest, PromptInput};
use crate::request::{Chat, Format};
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
pub(super) fn chat_prompt(ready: &Ready, config: &Config, req: &Chat) -> Result<ChatSetup, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("messages is empty").param("messages"));
    }
    // JSON through llguidance with the tightenings for small models
    // (bounded whitespace, no undeclared properties, bounded numbers and
    // recursion), as the GBNF converter wrote it before; compiled when the
    // engine takes the request (a bad schema is a 400 on response_format).
    let json = |schema: Value| Constraint::json_schema(schema).with_json_options(JsonOptions::tight());
    let response_constraint = match &req.format {
        Format::Text => None,
        Format::JsonObject => Some(json(json!({"type": "object"}))),
        Format::JsonSchema(schema) => Some(json(schema.clone())),
    };
    let mut reasoning = Reasoning::default().split(req.split_reasoning);
    let budget = match req.reasoning_budget {
        Some(n) if n >= 0 => usize::try_from(n).ok(),
        _ => config.reasoning_budget,
    };
    if let Some(budget) = budget {
        reasoning = reasoning.budget(budget);
    }
    let mut options = ChatOptions::default().tools(req.tools.clone()).reasoning(reasoning);
    for (k, v) in &req.template_vars {
        options = options.var(k.clone(), v.clone());
    }
    // Every text the client sent stays plain text: only the template's own
    // markup becomes control tokens (llamacpp's ChatFormat::prompt),
    // unless the operator asked for llama.cpp's behaviour.
    let options = options.control_tokens_in_text(config.special_in_content);
    // One JSON form for the template and the media decoder.
    let messages = serde_json::to_value(&req.messages).map_err(ApiError::internal)?;
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
