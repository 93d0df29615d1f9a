//! A conversation into tokens where only the chat template's own markup
//! can become control tokens ([`ChatFormat::tokenize`]).
//!
//! Every string a caller passes in (message content and parts, names, tool
//! call ids, reasoning, tool call names and arguments, tool definitions,
//! template variables) is put between two noncharacters (U+FDD0 …
//! U+FDD1) before rendering, around its trimmed core so that the
//! template's `trim`s see the same whitespace. After rendering, the markers
//! split the text into the template's own text and the callers' text:
//!
//! - control tokens are looked for in the template's text alone, as
//!   llama.cpp's special-token partition does (longest token first, with
//!   its left/right whitespace stripping), and
//! - everything between two control tokens, template text and callers'
//!   text together, is tokenized as plain text, one llama.cpp call per
//!   piece as llama.cpp itself tokenizes the pieces between special
//!   tokens, so a conversation without control-token text gets exactly
//!   the tokens of [`Vocab::tokenize_chat`].
//!
//! So a control token comes from the template's text or not at all. That
//! path is taken when the markers change nothing the template decides: the
//! rendering without them is the real one. A template that looks into the
//! strings (`startswith`, a `split` of reasoning from an answer) may decide
//! otherwise on marked text; then only the strings that could take part in
//! a control token are marked (they hold one's text, start with the end of
//! one, end with the start of one, or lie inside one, ASCII case ignored),
//! the rest render as they are, and the control tokens must be those of
//! the fully marked rendering where that one splits cleanly (so a template
//! that rewrites harmless text into a control token's text is refused). A
//! template that cuts a marked string apart (a slice, a `split`) leaves a
//! marker without its partner, and the conversation is refused
//! ([`Error::ChatMarkup`]) rather than tokenized unsafely.
//!
//! Object keys (parameter names in a tool's schema, argument names), the
//! `role` of a message and `type` fields are structure that templates
//! compare against: they are never marked, and one that holds or touches
//! a control token's text is refused.

use std::collections::HashSet;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::llama::types::Token;
use crate::llama::vocab::{AddBos, TokenAttrs, Vocab};

use super::{ChatFormat, RenderOptions, apply_builtin_template};

/// Before a caller's string, inside the rendered text.
const OPEN: char = '\u{FDD0}';
/// After it.
const CLOSE: char = '\u{FDD1}';

/// The tokens llama.cpp's special-token parsing turns text into (control
/// and unknown tokens; user-defined tokens are matched in plain text too),
/// and the lookups that decide whether a string could take part in one.
pub(crate) struct ControlTexts {
    /// Longest text first, as llama.cpp partitions.
    tokens: Vec<ControlToken>,
    /// Exact matches, every overlapping one: which tokens occur in a text.
    exact: Option<AhoCorasick>,
    /// Matches ignoring ASCII case: does a string hold one.
    folded: Option<AhoCorasick>,
    /// Lowercased proper prefixes and suffixes of the texts.
    prefixes: HashSet<String>,
    suffixes: HashSet<String>,
    /// The lowercased texts, NUL-separated: is a string inside one.
    joined: String,
    max_len: usize,
    /// Some text starts or ends with whitespace: then a wrapped string's
    /// whitespace stays inside its markers.
    whitespace_edges: bool,
}

struct ControlToken {
    token: Token,
    text: String,
    lstrip: bool,
    rstrip: bool,
}

impl std::fmt::Debug for ControlTexts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlTexts").field("tokens", &self.tokens.len()).finish_non_exhaustive()
    }
}

impl ControlTexts {
    pub(crate) fn new(vocab: &Vocab) -> Result<ControlTexts> {
        let special = TokenAttrs(TokenAttrs::CONTROL.0 | TokenAttrs::UNKNOWN.0);
        let lstrip = TokenAttrs(llamacpp_sys::llama_token_attr::LLAMA_TOKEN_ATTR_LSTRIP);
        let rstrip = TokenAttrs(llamacpp_sys::llama_token_attr::LLAMA_TOKEN_ATTR_RSTRIP);
        let mut tokens = Vec::new();
        for id in 0..i32::try_from(vocab.n_tokens()).unwrap_or(i32::MAX) {
            let token = Token(id);
            let attrs = vocab.attrs(token)?;
            if attrs.0 & special.0 == 0 {
                continue;
            }
            let text = vocab.text(token)?;
            if text.is_empty() {
                continue;
            }
            tokens.push(ControlToken {
                token,
                text: text.to_owned(),
                lstrip: attrs.contains(lstrip),
                rstrip: attrs.contains(rstrip),
            });
        }
        tokens.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.token.0.cmp(&b.token.0)));
        let build = |fold: bool| -> Result<Option<AhoCorasick>> {
            if tokens.is_empty() {
                return Ok(None);
            }
            AhoCorasickBuilder::new()
                .ascii_case_insensitive(fold)
                .match_kind(MatchKind::Standard)
                .build(tokens.iter().map(|t| t.text.as_bytes()))
                .map(Some)
                .map_err(|e| Error::ChatMarkup(format!("the control tokens' texts: {e}")))
        };
        let mut prefixes = HashSet::new();
        let mut suffixes = HashSet::new();
        let mut joined = String::new();
        let mut whitespace_edges = false;
        for t in &tokens {
            let lower = t.text.to_ascii_lowercase();
            for (i, _) in lower.char_indices().skip(1) {
                prefixes.insert(lower[..i].to_owned());
                suffixes.insert(lower[i..].to_owned());
            }
            joined.push_str(&lower);
            joined.push('\0');
            whitespace_edges |= t.text.starts_with(char::is_whitespace) || t.text.ends_with(char::is_whitespace);
        }
        Ok(ControlTexts {
            max_len: tokens.first().map_or(0, |t| t.text.len()),
            exact: build(false)?,
            folded: build(true)?,
            tokens,
            prefixes,
            suffixes,
            joined,
            whitespace_edges,
        })
    }

    /// Whether `s` could take part in a control token: it holds one's text,
    /// starts with the end of one, ends with the start of one, or lies
    /// inside one (ASCII case ignored, so `upper`/`lower` in a template
    /// cannot make one either).
    fn touches(&self, s: &str) -> bool {
        if s.is_empty() || self.tokens.is_empty() {
            return false;
        }
        if self.folded.as_ref().is_some_and(|ac| ac.is_match(s)) {
            return true;
        }
        let lower = s.to_ascii_lowercase();
        let ends = lower.char_indices().map(|(i, _)| i).chain([lower.len()]).filter(|&i| i > 0 && i < self.max_len);
        for i in ends {
            if self.suffixes.contains(&lower[..i]) {
                return true;
            }
        }
        let starts = lower.char_indices().map(|(i, _)| i).filter(|&i| lower.len() - i < self.max_len);
        for i in starts {
            if self.prefixes.contains(&lower[i..]) {
                return true;
            }
        }
        lower.len() < self.max_len && self.joined.contains(&lower)
    }

    /// `s` between the markers, its leading and trailing whitespace
    /// outside them (unless a control text has whitespace at an edge).
    fn wrap(&self, s: &str) -> String {
        let (lead, core, trail) = if self.whitespace_edges {
            ("", s, "")
        } else {
            let core = s.trim();
            let start = s.len() - s.trim_start().len();
            (&s[..start], core, &s[start + core.len()..])
        };
        format!("{lead}{OPEN}{core}{CLOSE}{trail}")
    }
}

/// Which of the callers' strings go between markers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// None: the rendering as the template means it.
    Nothing,
    /// Every string with something besides whitespace.
    Everything,
    /// The strings that could take part in a control token.
    Touching,
}

/// Walks what callers pass to the template: wraps strings (which, by
/// `mark`) and refuses structure that could take part in a control token.
struct Wrap<'a> {
    controls: &'a ControlTexts,
    mark: Mark,
}

impl Wrap<'_> {
    fn no_markers(s: &str, what: &str) -> Result<()> {
        if s.contains([OPEN, CLOSE]) {
            return Err(Error::ChatMarkup(format!(
                "{what} holds U+FDD0 or U+FDD1, the noncharacters that keep callers' text apart from the template's"
            )));
        }
        Ok(())
    }

    fn structure(&self, s: &str, what: &str) -> Result<()> {
        Self::no_markers(s, what)?;
        let lower = s.to_ascii_lowercase();
        let holds = self.controls.folded.as_ref().is_some_and(|ac| ac.is_match(s));
        let touches = (1..lower.len())
            .filter(|&i| lower.is_char_boundary(i))
            .any(|i| self.controls.suffixes.contains(&lower[..i]) || self.controls.prefixes.contains(&lower[i..]));
        if holds || touches {
            return Err(Error::ChatMarkup(format!(
                "{what} {s:?} holds or touches a control token's text; it is structure the template reads, so it \
                 cannot be kept as plain text"
            )));
        }
        Ok(())
    }

    fn value(&mut self, value: &mut Value, what: &str) -> Result<()> {
        match value {
            Value::String(s) => {
                Self::no_markers(s, what)?;
                let wrap = match self.mark {
                    Mark::Nothing => false,
                    Mark::Everything => !s.trim().is_empty() || (self.controls.whitespace_edges && !s.is_empty()),
                    Mark::Touching => self.controls.touches(s),
                };
                if wrap {
                    *s = self.controls.wrap(s);
                }
            }
            Value::Array(items) => {
                for item in items {
                    self.value(item, what)?;
                }
            }
            Value::Object(map) => {
                for (key, item) in map.iter_mut() {
                    self.structure(key, "an object key")?;
                    match (key.as_str(), &*item) {
                        ("role" | "type", Value::String(s)) => self.structure(s, key)?,
                        _ => self.value(item, what)?,
                    }
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
        Ok(())
    }
}

/// `rendered` without its markers.
fn unmarked(rendered: &str) -> String {
    rendered.chars().filter(|&c| c != OPEN && c != CLOSE).collect()
}

/// The control tokens of partitioned pieces, in order.
fn controls_of(pieces: &[Piece]) -> Vec<usize> {
    pieces.iter().filter_map(|p| if let Piece::Control(i) = p { Some(*i) } else { None }).collect()
}

/// A piece of the rendered text: the template's own, or a caller's.
#[derive(Debug)]
enum Piece {
    Template(String),
    Caller(String),
    Control(usize),
}

/// Splits `rendered` at the markers; a marker without its partner (the
/// template cut a wrapped string apart) refuses the conversation.
fn split(rendered: &str) -> Result<Vec<Piece>> {
    let cut = || {
        Error::ChatMarkup(
            "the chat template cut apart a text that holds control-token text (a slice or split of message \
             content), so it cannot be kept apart from the template's markup"
                .into(),
        )
    };
    let mut pieces = Vec::new();
    let mut rest = rendered;
    while let Some(open) = rest.find([OPEN, CLOSE]) {
        if rest[open..].starts_with(CLOSE) {
            return Err(cut());
        }
        let inside = &rest[open + OPEN.len_utf8()..];
        let close = inside.find([OPEN, CLOSE]).filter(|&i| inside[i..].starts_with(CLOSE)).ok_or_else(cut)?;
        pieces.push(Piece::Template(rest[..open].to_owned()));
        pieces.push(Piece::Caller(inside[..close].to_owned()));
        rest = &inside[close + CLOSE.len_utf8()..];
    }
    pieces.push(Piece::Template(rest.to_owned()));
    Ok(pieces)
}

/// llama.cpp's special-token partition, over the template's text only:
/// each control token that occurs, longest first, splits every template
/// piece at each of its occurrences, stripping ASCII whitespace beside it
/// where the token says so.
fn partition(controls: &ControlTexts, pieces: Vec<Piece>) -> Vec<Piece> {
    let Some(exact) = &controls.exact else { return pieces };
    let mut present = HashSet::new();
    for piece in &pieces {
        if let Piece::Template(text) = piece {
            present.extend(exact.find_overlapping_iter(text.as_str()).map(|m| m.pattern().as_usize()));
        }
    }
    let mut order: Vec<usize> = present.into_iter().collect();
    order.sort_unstable();
    let mut pieces = pieces;
    for index in order {
        let token = &controls.tokens[index];
        let mut out = Vec::with_capacity(pieces.len());
        for piece in pieces {
            let Piece::Template(text) = piece else {
                out.push(piece);
                continue;
            };
            let mut rest = text.as_str();
            let mut strip_next = false;
            while let Some(at) = rest.find(token.text.as_str()) {
                let mut left = &rest[..at];
                if strip_next {
                    left = left.trim_start_matches(|c: char| c.is_ascii_whitespace());
                }
                if token.lstrip {
                    left = left.trim_end_matches(|c: char| c.is_ascii_whitespace());
                }
                out.push(Piece::Template(left.to_owned()));
                out.push(Piece::Control(index));
                strip_next = token.rstrip;
                rest = &rest[at + token.text.len()..];
            }
            if strip_next {
                rest = rest.trim_start_matches(|c: char| c.is_ascii_whitespace());
            }
            out.push(Piece::Template(rest.to_owned()));
        }
        pieces = out;
    }
    pieces
}

/// The tokens of the partitioned pieces: the text between two control
/// tokens in one plain tokenization, then the model's BOS unless the
/// template wrote it; and the places of the media marks
/// ([`MEDIA`](super::media::MEDIA)), where the text is cut.
fn tokens(vocab: &Vocab, controls: &ControlTexts, pieces: &[Piece]) -> Result<(Vec<Token>, Vec<usize>)> {
    let (mut out, mut places) = (Vec::new(), Vec::new());
    let mut text = String::new();
    let flush = |text: &mut String, out: &mut Vec<Token>, places: &mut Vec<usize>| -> Result<()> {
        for (i, piece) in text.split(super::media::MEDIA).enumerate() {
            if i > 0 {
                places.push(out.len());
            }
            if !piece.is_empty() {
                out.extend(vocab.tokenize(piece, AddBos::No)?);
            }
        }
        text.clear();
        Ok(())
    };
    for piece in pieces {
        match piece {
            Piece::Template(t) | Piece::Caller(t) => text.push_str(t),
            Piece::Control(index) => {
                flush(&mut text, &mut out, &mut places)?;
                out.push(controls.tokens[*index].token);
            }
        }
    }
    flush(&mut text, &mut out, &mut places)?;
    let before = out.len();
    vocab.chat_bos(&mut out)?;
    // A BOS put in front moves every place.
    let shift = out.len() - before;
    places.iter_mut().for_each(|p| *p += shift);
    Ok((out, places))
}

impl ChatFormat {
    /// Renders `messages` (with the generation prompt and tools of
    /// `options`) and tokenizes the prompt so that only the template's own
    /// markup becomes control tokens: text from the messages, the tools and
    /// the template variables stays plain text, whatever it holds (see the
    /// module docs of `chat::plain` for how). The model's BOS is added
    /// unless the template writes it.
    ///
    /// [`Vocab::tokenize_chat`] of [`ChatFormat::render`] is the explicit
    /// opt-in to llama.cpp's behaviour, where control-token text anywhere
    /// in the rendered prompt becomes the control token: only for messages
    /// you trust.
    ///
    /// # Errors
    /// [`Error::ChatMarkup`] if an object key, a `role` or a `type` holds
    /// control-token text, or the template cuts apart a text that holds
    /// some; the errors of [`ChatFormat::render`] and [`Vocab::tokenize`].
    pub fn tokenize(
        &self,
        vocab: &Vocab,
        messages: &[crate::text::chat::ChatMessage],
        options: &RenderOptions,
    ) -> Result<Vec<Token>> {
        let messages = serde_json::to_value(messages).map_err(|e| Error::ChatTemplate(e.to_string()))?;
        self.tokenize_json(vocab, &messages, options)
    }

    /// [`ChatFormat::tokenize`] for messages given as JSON (OpenAI-style
    /// objects, passed to the template as they are).
    ///
    /// # Errors
    /// As [`ChatFormat::tokenize`].
    pub fn tokenize_json(&self, vocab: &Vocab, messages: &Value, options: &RenderOptions) -> Result<Vec<Token>> {
        let (tokens, places) = self.tokenize_json_with_media(vocab, messages, options)?;
        if !places.is_empty() {
            return Err(Error::ChatMarkup(
                "a message holds U+FDD2, the noncharacter that stands for an image or audio part".into(),
            ));
        }
        Ok(tokens)
    }

    /// [`ChatFormat::tokenize_json`], with the places of the media marks
    /// among the tokens.
    pub(crate) fn tokenize_json_with_media(
        &self,
        vocab: &Vocab,
        messages: &Value,
        options: &RenderOptions,
    ) -> Result<(Vec<Token>, Vec<usize>)> {
        let controls = &*vocab.extensions().get_or_try_init(|| ControlTexts::new(vocab))?;
        let real = self.render_marked(controls, Mark::Nothing, messages, options)?;
        // Every caller's string between markers: control tokens can only
        // come from the template's text. Used when the markers change
        // nothing the template decides (the unmarked text is the real
        // rendering) and no string was cut apart: nearly always.
        // (A template may also refuse marked strings: a length check.)
        let everything = self
            .render_marked(controls, Mark::Everything, messages, options)
            .and_then(|text| split(&text).map(|pieces| (pieces, unmarked(&text) == real)));
        if let Ok((pieces, true)) = everything {
            return tokens(vocab, controls, &partition(controls, pieces));
        }
        // The template looks into the strings (a `startswith`, a `split`
        // of reasoning from an answer): only the strings that could take
        // part in a control token between markers, the rest as they are,
        // and where the fully marked rendering splits, the control tokens
        // must be the same as there (a template that rewrites harmless
        // text into a control token's text is caught here).
        let touching = self.render_marked(controls, Mark::Touching, messages, options)?;
        let pieces = partition(controls, split(&touching)?);
        if let Ok((all, false)) = everything
            && controls_of(&pieces) != controls_of(&partition(controls, all))
        {
            return Err(Error::ChatMarkup(
                "the chat template makes control tokens out of the conversation's text (it rewrites or joins \
                 strings into a control token's text), so the text cannot be kept plain"
                    .into(),
            ));
        }
        tokens(vocab, controls, &pieces)
    }

    /// Renders with the callers' strings marked as `mark` says; every
    /// object key, role and type is checked first.
    fn render_marked(
        &self,
        controls: &ControlTexts,
        mark: Mark,
        messages: &Value,
        options: &RenderOptions,
    ) -> Result<String> {
        let mut wrap = Wrap { controls, mark };
        let mut messages = messages.clone();
        wrap.value(&mut messages, "a message")?;
        let mut options = options.clone();
        if let Some(tools) = options.tools.as_mut() {
            wrap.value(tools, "a tool definition")?;
        }
        for (name, value) in options.vars.iter_mut() {
            wrap.structure(name, "a template variable's name")?;
            wrap.value(value, "a template variable")?;
        }
        match self {
            ChatFormat::Jinja { template, bos_token, eos_token } => {
                options.bos_token.get_or_insert_with(|| bos_token.clone());
                options.eos_token.get_or_insert_with(|| eos_token.clone());
                template.render_json(&messages, &options)
            }
            ChatFormat::Builtin(name) => {
                if options.tools.is_some() {
                    return Err(Error::ChatTemplate(format!(
                        "llama.cpp's built-in {name:?} template cannot render tools (the model has no template)"
                    )));
                }
                let messages: Vec<crate::text::chat::ChatMessage> =
                    serde_json::from_value(messages).map_err(|e| Error::ChatTemplate(e.to_string()))?;
                apply_builtin_template(name, &messages, options.add_generation_prompt)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_split_and_refuse_a_lone_marker() {
        let pieces = split(&format!("a{OPEN}b{CLOSE}c{OPEN}{CLOSE}")).unwrap();
        let texts: Vec<String> = pieces
            .iter()
            .map(|p| match p {
                Piece::Template(t) => format!("T:{t}"),
                Piece::Caller(t) => format!("C:{t}"),
                Piece::Control(i) => format!("X:{i}"),
            })
            .collect();
        assert_eq!(texts, ["T:a", "C:b", "T:c", "C:", "T:"]);
        for bad in [format!("a{OPEN}b"), format!("a{CLOSE}b"), format!("{OPEN}a{OPEN}b{CLOSE}")] {
            assert!(matches!(split(&bad), Err(Error::ChatMarkup(_))), "{bad:?}");
        }
    }
}
