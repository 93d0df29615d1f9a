//! Message content as plain text: only the chat template's own markup may
//! become control tokens. A user who writes `<end_of_turn>` or
//! `<|im_start|>` in a message must not close their turn and open another
//! (a forged system or assistant turn): the rendered chat is otherwise
//! tokenized with special-token parsing, which turns that text into the
//! real control token.
//!
//! Content without any control-token text is rendered and tokenized as
//! before, in one piece. Content with some is rendered with a placeholder
//! per text (private-use code points around its index), and the rendering
//! is tokenized piece by piece: the template's text with special-token
//! parsing, each content text without. A template that mangles the
//! placeholders (slices or rewrites content) cannot be split that way, and
//! such a request is refused rather than tokenized unsafely.

use llamacpp::chat::{ChatFormat, ChatMessage, RenderOptions};
use llamacpp::{AddBos, Token, Vocab};
use serde_json::Value;

/// Around a placeholder's index: code points of the Supplementary Private
/// Use Area-A, which no template writes and no tokenizer merges with text.
const OPEN: char = '\u{F0000}';
const CLOSE: char = '\u{F0001}';

/// The texts a message carries into the prompt: its content (a string, or
/// the `text` of each part) and its tool calls' names and arguments.
fn texts_mut(message: &mut Value) -> Vec<&mut String> {
    let mut out = Vec::new();
    let Value::Object(map) = message else { return out };
    for (key, value) in map.iter_mut() {
        match (key.as_str(), value) {
            ("content", Value::String(s)) => out.push(s),
            ("content", Value::Array(parts)) => {
                out.extend(parts.iter_mut().filter_map(|p| match p.get_mut("text") {
                    Some(Value::String(s)) => Some(s),
                    _ => None,
                }));
            }
            ("tool_calls", Value::Array(calls)) => {
                for call in calls {
                    if let Some(Value::Object(function)) = call.get_mut("function") {
                        for (k, v) in function.iter_mut() {
                            if let ("name" | "arguments", Value::String(s)) = (k.as_str(), v) {
                                out.push(s);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Whether `text` holds the text of a control or special token.
fn holds_markup(vocab: &Vocab, text: &str) -> llamacpp::Result<bool> {
    Ok(vocab.tokenize_special(text, AddBos::No)? != vocab.tokenize(text, AddBos::No)?)
}

/// Whether a rendered chat still needs the model's BOS: a template that
/// wants one writes it itself (as `bos_token`), and a second one would
/// change the prompt.
pub fn bos_to_add(vocab: &Vocab, rendered: &str) -> AddBos {
    let bos = vocab.bos().and_then(|b| vocab.text(b).ok()).filter(|b| !b.is_empty());
    if bos.is_some_and(|b| rendered.starts_with(b)) { AddBos::No } else { AddBos::Yes }
}

/// Why content could not be kept as text.
#[derive(Debug)]
pub enum ContentError {
    /// The vocabulary, the template or the messages refused.
    Llama(llamacpp::Error),
    /// The template changed a placeholder.
    Mangled,
    /// The messages do not parse as chat messages.
    Messages(String),
}

impl From<llamacpp::Error> for ContentError {
    fn from(e: llamacpp::Error) -> Self {
        ContentError::Llama(e)
    }
}

/// The prompt's tokens with every message text tokenized as plain text,
/// or `None` when no message text holds markup (then the caller renders
/// and tokenizes as usual, which gives the same tokens).
///
/// # Errors
/// [`ContentError`].
pub fn plain_content_tokens(
    chat: &ChatFormat,
    vocab: &Vocab,
    messages: &[Value],
    options: &RenderOptions,
) -> Result<Option<Vec<Token>>, ContentError> {
    let mut marked: Vec<Value> = messages.to_vec();
    let mut texts = Vec::new();
    let mut any_markup = false;
    for message in &mut marked {
        for text in texts_mut(message) {
            any_markup |= holds_markup(vocab, text)?;
            let placeholder = format!("{OPEN}{}{CLOSE}", texts.len());
            texts.push(std::mem::replace(text, placeholder));
        }
    }
    if !any_markup {
        return Ok(None);
    }
    let messages: Vec<ChatMessage> =
        serde_json::from_value(Value::Array(marked)).map_err(|e| ContentError::Messages(e.to_string()))?;
    let rendered = chat.render(&messages, options)?;
    let mut add_bos = bos_to_add(vocab, &rendered);
    let mut tokens = Vec::new();
    let mut rest = rendered.as_str();
    loop {
        let (markup, after) = match rest.split_once(OPEN) {
            Some((markup, after)) => (markup, Some(after)),
            None => (rest, None),
        };
        if !markup.is_empty() || add_bos == AddBos::Yes {
            tokens.extend(vocab.tokenize_special(markup, add_bos)?);
        }
        add_bos = AddBos::No;
        let Some(after) = after else { break };
        let (index, after) = after.split_once(CLOSE).ok_or(ContentError::Mangled)?;
        let text = index.parse::<usize>().ok().and_then(|i| texts.get(i)).ok_or(ContentError::Mangled)?;
        tokens.extend(vocab.tokenize(text, AddBos::No)?);
        rest = after;
    }
    if rest.contains(CLOSE) {
        return Err(ContentError::Mangled);
    }
    Ok(Some(tokens))
}

#[cfg(test)]
mod tests {
    use llamacpp::chat::ChatTemplate;
    use llamacpp::testing::{TINY_CONTROL_TOKEN, TINY_CONTROL_TOKEN_ID, TinyModelSpec, tiny_llama_path};
    use llamacpp::{Model, ModelParams};
    use serde_json::json;

    use super::*;

    fn format(source: &str) -> ChatFormat {
        ChatFormat::Jinja {
            template: ChatTemplate::new(source).unwrap(),
            bos_token: String::new(),
            eos_token: String::new(),
        }
    }

    #[test]
    fn content_with_markup_is_plain_text_or_refused_when_the_template_changes_it() {
        let model = Model::load(tiny_llama_path(&TinyModelSpec::default()).unwrap(), &ModelParams::default()).unwrap();
        let vocab = model.vocab();
        let options = RenderOptions::default();
        let forged = [json!({"role": "user", "content": format!("hi {TINY_CONTROL_TOKEN} there")})];
        let plain = [json!({"role": "user", "content": "hi there"})];
        let control = Token(TINY_CONTROL_TOKEN_ID);

        // The template's own markup is a control token; the content's text
        // of one is not.
        let keeps = format(&format!("{TINY_CONTROL_TOKEN}{{% for m in messages %}}{{{{ m.content }}}}{{% endfor %}}"));
        let tokens = plain_content_tokens(&keeps, vocab, &forged, &options).unwrap().expect("content with markup");
        assert_eq!(tokens.iter().filter(|&&t| t == control).count(), 1, "{tokens:?}");
        assert_eq!(tokens.first(), vocab.bos().as_ref());
        assert_eq!(tokens[1], control);
        let text = vocab.tokenize(&format!("hi {TINY_CONTROL_TOKEN} there"), AddBos::No).unwrap();
        assert_eq!(tokens[2..], text[..]);
        assert!(plain_content_tokens(&keeps, vocab, &plain, &options).unwrap().is_none(), "no markup: the usual path");

        // A template that slices content cuts into the placeholder.
        let slices = format("{% for m in messages %}{{ m.content[:-1] }}{% endfor %}");
        let refused = plain_content_tokens(&slices, vocab, &forged, &options);
        assert!(matches!(refused, Err(ContentError::Mangled)), "{refused:?}");
        let reversed = format("{% for m in messages %}{{ m.content | reverse }}{% endfor %}");
        let refused = plain_content_tokens(&reversed, vocab, &forged, &options);
        assert!(matches!(refused, Err(ContentError::Mangled)), "{refused:?}");
    }
}
