//! Steering a JSON document toward its end when the token budget runs
//! low: the rule of [`Sampler::close_within`](crate::Sampler::close_within).
//!
//! Past the start of the closing stretch, the mask is narrowed to the first
//! non-empty one of these sets of tokens (each intersected with what the
//! constraint allows, so the document stays valid):
//!
//! * inside a string: a quote followed by nothing but brackets and
//!   whitespace (`"`, `"}`, `"]}`); then any token with a quote in it;
//! * elsewhere: an end-of-generation token (the document is complete);
//!   brackets and whitespace alone (`}`, `]`, `}\n]`); a token starting
//!   with a quote (a required key, or the shortest value: a string); a
//!   token starting with a comma (the next required member);
//! * else the whole mask.
//!
//! Values the schema leaves open cannot run on inside these sets, and
//! closing an object or array is preferred wherever the constraint allows
//! it; the shortest completion is not computed, so a schema whose
//! required structure is longer than the closing stretch can still miss.

use llguidance::toktrie::{SimpleVob, TokTrie};

use super::MIN_CLOSING_TOKENS;

/// The token sets of the rule, over one vocabulary.
pub(crate) struct ClosingSets {
    /// `"` then only brackets and whitespace.
    quote_then_close: SimpleVob,
    /// Any `"` in the token.
    has_quote: SimpleVob,
    /// Brackets and whitespace only, at least one bracket.
    close: SimpleVob,
    /// Starts with `"`.
    quote_first: SimpleVob,
    /// Starts with `,`.
    comma_first: SimpleVob,
    /// The end-of-generation tokens.
    eos: SimpleVob,
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\t' | b'\r')
}

/// Brackets and whitespace only, with at least one bracket.
fn closes(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == b'}' || b == b']' || is_space(b)) && bytes.iter().any(|&b| b == b'}' || b == b']')
}

impl ClosingSets {
    pub(crate) fn build(trie: &TokTrie) -> ClosingSets {
        let n = trie.vocab_size();
        let mut sets = ClosingSets {
            quote_then_close: SimpleVob::alloc(n),
            has_quote: SimpleVob::alloc(n),
            close: SimpleVob::alloc(n),
            quote_first: SimpleVob::alloc(n),
            comma_first: SimpleVob::alloc(n),
            eos: trie.eos_token_set(),
        };
        for id in 0..n as u32 {
            let bytes = trie.token(id);
            let Some(&first) = bytes.first() else { continue };
            if first == b'"' {
                sets.quote_first.allow_token(id);
                if bytes[1..].iter().all(|&b| b == b'}' || b == b']' || is_space(b)) {
                    sets.quote_then_close.allow_token(id);
                }
            }
            if bytes.contains(&b'"') {
                sets.has_quote.allow_token(id);
            }
            if closes(bytes) {
                sets.close.allow_token(id);
            }
            if first == b',' {
                sets.comma_first.allow_token(id);
            }
        }
        sets
    }
}

/// Where a document's text is, lexically: inside a string or not.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct JsonLexer {
    in_string: bool,
    /// Inside a string, after a backslash.
    escaped: bool,
}

impl JsonLexer {
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
            } else if b == b'"' {
                self.in_string = true;
            }
        }
    }
}

/// One document's budget and position for the rule.
#[derive(Clone, Debug, Default)]
pub(crate) struct Closing {
    /// Tokens consumed since the document started.
    pub(crate) consumed: usize,
    /// From how many consumed tokens on the rule applies; `None`: never.
    pub(crate) from: Option<usize>,
    pub(crate) lexer: JsonLexer,
}

impl Closing {
    /// The document should end within `budget` more tokens.
    pub(crate) fn set_budget(&mut self, budget: Option<usize>) {
        self.from = budget.map(|b| {
            let stretch = (b / 4).max(MIN_CLOSING_TOKENS).min(b);
            self.consumed + (b - stretch)
        });
    }

    pub(crate) fn active(&self) -> bool {
        self.from.is_some_and(|from| self.consumed >= from)
    }

    /// Narrows `mask` (what the constraint allows) by the rule.
    pub(crate) fn narrow(&self, mask: &mut SimpleVob, sets: &ClosingSets) {
        let tiers: &[&SimpleVob] = if self.lexer.in_string {
            &[&sets.quote_then_close, &sets.has_quote]
        } else {
            &[&sets.eos, &sets.close, &sets.quote_first, &sets.comma_first]
        };
        for tier in tiers {
            if !mask.and_is_zero(tier) {
                mask.and(tier);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lexer_tracks_strings_and_escapes() {
        let mut lexer = JsonLexer::default();
        lexer.feed(br#"{"a": "x\"y"#);
        assert!(lexer.in_string, "an escaped quote does not end the string");
        lexer.feed(br#"\\"#);
        assert!(lexer.in_string && !lexer.escaped);
        lexer.feed(br#"", "b"#);
        assert!(lexer.in_string, "inside the key b");
        lexer.feed(br#"": 1}"#);
        assert!(!lexer.in_string);
    }

    #[test]
    fn the_stretch_is_the_last_quarter_and_at_least_sixteen_tokens() {
        let mut closing = Closing { consumed: 10, ..Closing::default() };
        closing.set_budget(Some(200));
        assert_eq!(closing.from, Some(10 + 150));
        closing.set_budget(Some(40));
        assert_eq!(closing.from, Some(10 + 24));
        closing.set_budget(Some(8));
        assert_eq!(closing.from, Some(10), "all of a short budget");
        closing.set_budget(None);
        assert!(!closing.active());
    }

    #[test]
    fn token_classes() {
        assert!(closes(b"}") && closes(b"\n]}") && !closes(b"") && !closes(b" ") && !closes(b"},"));
    }
}
