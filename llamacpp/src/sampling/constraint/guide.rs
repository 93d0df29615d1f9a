//! One request's constraint state: llguidance's matcher over the model's
//! token table, and the mask of the current position.

use std::sync::Arc;

use llguidance::Matcher;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::SimpleVob;
use serde_json::Value;

use super::closing::Closing;
use super::{Constraint, MAX_DEPTH, TokenTable, prepared_schema};
use crate::error::{Error, Result};
use crate::llama::stack::with_stack;
use crate::llama::types::Token;

// `Sampler` is `Send` (its `unsafe impl` covers llama.cpp's chain); the
// guide it holds must be `Send` on its own account, which this checks at
// compile time: llguidance's matcher and token table hold no thread-bound
// state (no `Rc`, no thread-local), and the table is shared through `Arc`.
const _: fn() = || {
    fn send<T: Send>() {}
    fn sync<T: Send + Sync>() {}
    send::<Guide>();
    sync::<TokenTable>();
};

/// A compiled constraint following one generation.
pub(crate) struct Guide {
    table: Arc<TokenTable>,
    matcher: Matcher,
    /// The mask of the current position, once computed.
    mask: Option<SimpleVob>,
    /// An end-of-generation token was accepted: the document is complete,
    /// and only end tokens are allowed after it (as llama.cpp's grammar
    /// sampler does once its grammar completes).
    ended: bool,
    /// The closing rule of a constraint that writes JSON (`None` for
    /// others, whose text the rule does not know).
    closing: Option<Closing>,
}

impl std::fmt::Debug for Guide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guide").field("ended", &self.ended).finish_non_exhaustive()
    }
}

fn grammar_error(e: impl std::fmt::Display) -> Error {
    Error::Grammar(e.to_string())
}

/// Stack bytes llguidance's schema compiler uses per nesting level of a
/// schema (each recursive level unrolled counts as one more): a 16-level
/// tree compiled on a 256 KiB stack and a 32-level one did not, so about
/// 16 KiB, times 4 for other targets and builds.
const COMPILE_STACK_PER_LEVEL: usize = 64 << 10;

/// How deep `value` nests (objects and arrays).
fn nesting(value: &Value) -> usize {
    match value {
        Value::Object(map) => 1 + map.values().map(nesting).max().unwrap_or(0),
        Value::Array(items) => 1 + items.iter().map(nesting).max().unwrap_or(0),
        _ => 0,
    }
}

/// llguidance's refusal of `schema` as [`Error::JsonSchema`], with the
/// JSON pointer of what it refused where that can be told: the first node
/// holding a keyword llguidance lists as unimplemented, else the pointer
/// this crate's own converter refuses (the same construct, where both
/// refuse), else the root.
fn schema_error(schema: &Value, message: String) -> Error {
    let keyword =
        message.strip_prefix("Unimplemented keys: [\"").and_then(|rest| rest.split('"').next()).map(str::to_string);
    let pointer = keyword
        .and_then(|k| pointer_of_key(schema, &k, String::new()))
        .or_else(|| match crate::sampling::json_schema::schema_to_grammar(schema) {
            Err(Error::JsonSchema { pointer, .. }) => Some(pointer),
            _ => None,
        })
        .unwrap_or_default();
    Error::JsonSchema { pointer, message }
}

/// The JSON pointer of `key` in the first object (document order) under
/// `node` that holds it.
fn pointer_of_key(node: &Value, key: &str, at: String) -> Option<String> {
    let escape = |s: &str| s.replace('~', "~0").replace('/', "~1");
    match node {
        Value::Object(map) => {
            if map.contains_key(key) {
                return Some(format!("{at}/{}", escape(key)));
            }
            map.iter().find_map(|(k, v)| pointer_of_key(v, key, format!("{at}/{}", escape(k))))
        }
        Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| pointer_of_key(v, key, format!("{at}/{i}"))),
        _ => None,
    }
}

impl Guide {
    /// Compiles `constraint` against the model's token table.
    pub(crate) fn new(table: Arc<TokenTable>, constraint: &Constraint) -> Result<Guide> {
        let (grammar, stack) = match constraint {
            Constraint::JsonSchema { schema, options } => {
                if options.max_depth > MAX_DEPTH {
                    return Err(Error::InvalidParameter {
                        name: "max_depth",
                        message: format!("must be at most {MAX_DEPTH}, got {}", options.max_depth),
                    });
                }
                let stack = (options.max_depth + 1 + nesting(schema)) * COMPILE_STACK_PER_LEVEL;
                (TopLevelGrammar::from_json_schema(prepared_schema(schema, options)), stack)
            }
            Constraint::Regex(rx) => (TopLevelGrammar::from_regex(rx), 0),
            Constraint::Lark(lark) => (TopLevelGrammar::from_lark(lark.clone()), 0),
        };
        let factory = &table.factory;
        let parser =
            with_stack("the constraint", stack, || factory.create_parser(grammar))?.map_err(|e| match constraint {
                Constraint::JsonSchema { schema, .. } => schema_error(schema, e.to_string()),
                _ => grammar_error(e),
            })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::Grammar(e));
        }
        let closing = constraint.writes_json().then(Closing::default);
        Ok(Guide { table, matcher, mask: None, ended: false, closing })
    }

    fn is_eog(&self, token: Token) -> bool {
        self.table.factory.tok_env().tok_trie().eos_tokens().contains(&(token.0 as u32))
    }

    /// The tokens allowed next (computed once per position).
    pub(crate) fn mask(&mut self) -> Result<&SimpleVob> {
        if self.mask.is_none() {
            let mut mask = if self.ended {
                self.table.factory.tok_env().tok_trie().eos_token_set()
            } else {
                self.matcher.compute_mask_or_eos().map_err(grammar_error)?
            };
            if let Some(closing) = self.closing.as_ref().filter(|c| c.active() && !self.ended) {
                closing.narrow(&mut mask, self.table.closing_sets());
            }
            if mask.is_zero() {
                return Err(Error::Grammar("the constraint allows no token here".into()));
            }
            self.mask = Some(mask);
        }
        Ok(self.mask.as_ref().unwrap_or_else(|| unreachable!("just computed")))
    }

    /// Whether `token` may come next: the mask if it is computed, else
    /// llguidance's check of that one token (cheaper than a mask).
    pub(crate) fn allows(&mut self, token: Token) -> Result<bool> {
        if token.0 < 0 {
            return Ok(false);
        }
        if self.ended {
            return Ok(self.is_eog(token));
        }
        if self.closing.as_ref().is_some_and(Closing::active) {
            // The rule narrows the mask: ask it.
            self.mask()?;
        }
        if let Some(mask) = &self.mask {
            return Ok(mask.is_allowed(token.0 as u32));
        }
        if self.is_eog(token) {
            return self.matcher.is_accepting().map_err(grammar_error);
        }
        let n = self.matcher.validate_tokens(&[token.0 as u32]).map_err(grammar_error)?;
        Ok(n == 1)
    }

    /// Moves past `token`, which [`Guide::allows`] or the mask allowed.
    pub(crate) fn consume(&mut self, token: Token) -> Result<()> {
        if self.ended {
            // Only end tokens come here (see `allows`); the mask stays.
            return Ok(());
        }
        self.mask = None;
        if self.is_eog(token) {
            // The document is complete; llguidance needs no end token.
            self.ended = true;
            return Ok(());
        }
        self.matcher.consume_token(token.0 as u32).map_err(grammar_error)?;
        if let Some(closing) = &mut self.closing {
            closing.consumed += 1;
            closing.lexer.feed(self.table.factory.tok_env().tok_trie().token(token.0 as u32));
        }
        Ok(())
    }

    /// The document should end within `budget` more tokens (see
    /// [`Sampler::close_within`](crate::Sampler::close_within)).
    pub(crate) fn close_within(&mut self, budget: Option<usize>) {
        if let Some(closing) = &mut self.closing {
            closing.set_budget(budget);
            self.mask = None;
        }
    }

    /// Starts the document over.
    pub(crate) fn reset(&mut self) -> Result<()> {
        self.mask = None;
        self.ended = false;
        if let Some(closing) = &mut self.closing {
            *closing = Closing::default();
        }
        self.matcher.reset().map_err(grammar_error)
    }

    /// An independent copy with the same state.
    pub(crate) fn deep_clone(&self) -> Guide {
        Guide {
            table: self.table.clone(),
            matcher: self.matcher.deep_clone(),
            mask: self.mask.clone(),
            ended: self.ended,
            closing: self.closing.clone(),
        }
    }
}
