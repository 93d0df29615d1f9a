//! Stack estimates for the grammar code of llama.cpp that recurses once
//! per level of its input (see `crate::stack`).
//!
//! - The GBNF parser recurses once per nesting level of parentheses.
//! - Left-recursion detection at grammar creation, and advancing the parse
//!   stacks on every accepted token, recurse along chains of rules whose
//!   first element is another rule. Every group `( … )`, every repetition
//!   operator and every named rule is one rule, so their count bounds the
//!   length of any such chain (a chain never visits a rule twice: that
//!   would be left recursion, which llama.cpp rejects).
//! - Lazy-grammar trigger patterns are `std::regex`es, compiled once
//!   (recursing per level of the pattern) and matched against all text
//!   generated while the grammar waits for its trigger (recursing per
//!   byte of that text).
//!
//! The per-level sizes were measured on x86-64 (gcc 12, libstdc++) with
//! the pinned llama.cpp, by bisecting the largest input that a thread of a
//! fixed stack survives (1 MiB: 3,203 characters through deepseek-llm's
//! regex pre-tokenizer, 327 bytes each; 128 KiB: 261 levels of nested
//! parentheses, under 500 bytes each), and are multiplied by 4 for other
//! compilers and targets. `tests/stack_depth.rs` overflows a small stack
//! with each of these inputs when the helper is disabled.

/// Stack bytes per grammar rule level (parser, left-recursion check,
/// stack advance); measured at most 500 on x86-64.
pub(super) const GRAMMAR_STACK_PER_LEVEL: usize = 4 * 500;

/// Stack bytes per byte of text matched by a `std::regex`; measured 327
/// on x86-64 (libstdc++'s matcher).
pub(crate) const REGEX_STACK_PER_BYTE: usize = 4 * 330;

/// An upper bound on the rules, hence on the recursion depth, that
/// llama.cpp's GBNF parser makes of `gbnf`: named rules (`::=`), groups,
/// and repetition operators, counted outside string literals, character
/// classes and comments.
pub(super) fn grammar_levels(gbnf: &str) -> usize {
    let bytes = gbnf.as_bytes();
    let mut levels = 1usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' | b'[' => {
                let close = if bytes[i] == b'"' { b'"' } else { b']' };
                i += 1;
                while i < bytes.len() && bytes[i] != close {
                    // An escape takes the next byte with it.
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'(' | b'*' | b'+' | b'?' | b'{' => levels += 1,
            b':' if bytes[i..].starts_with(b"::=") => {
                levels += 1;
                i += 2;
            }
            _ => {}
        }
        i += 1;
    }
    levels
}

/// The stack needed to create, and to advance on each token, a grammar.
pub(super) fn grammar_stack(gbnf: &str) -> usize {
    grammar_levels(gbnf).saturating_mul(GRAMMAR_STACK_PER_LEVEL)
}

/// The stack needed to compile `patterns` as `std::regex`es.
pub(super) fn patterns_stack(patterns: &[&str]) -> usize {
    patterns.iter().map(|p| p.len()).max().unwrap_or(0).saturating_mul(REGEX_STACK_PER_BYTE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_count_rules_outside_literals_classes_and_comments() {
        assert_eq!(grammar_levels(r#"root ::= "a""#), 2);
        assert_eq!(grammar_levels(r#"root ::= ("a" | b)* b ::= [a-z]+"#), 6);
        // Operators inside literals, classes and comments are not rules.
        assert_eq!(grammar_levels(r#"root ::= "(*+?{" [(*+?{\]] # ( ( ( ::="#), 2);
        // An escaped quote does not end the literal.
        assert_eq!(grammar_levels(r#"root ::= "\"(((" x"#), 2);
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(1000), ")".repeat(1000));
        assert_eq!(grammar_levels(&deep), 1002);
        let chain: String = (0..500).map(|i| format!("r{i} ::= r{}\n", i + 1)).collect();
        assert_eq!(grammar_levels(&chain), 501);
        // Unterminated literals and classes end the scan without panicking.
        assert_eq!(grammar_levels("root ::= \"abc"), 2);
        assert_eq!(grammar_levels("root ::= [abc\\"), 2);
    }
}
