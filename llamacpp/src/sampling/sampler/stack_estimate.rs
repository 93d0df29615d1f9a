//! Stack estimates for the grammar code of llama.cpp that recurses once
//! per level of its input (see `crate::llama::stack`).
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
//! with each of these inputs when the helper is disabled. The regex size
//! per byte, which the vocabulary's pre-tokenizers use too, is
//! `crate::llama::stack::REGEX_STACK_PER_BYTE`.

use crate::llama::stack::REGEX_STACK_PER_BYTE;

/// Stack bytes per grammar rule level (parser, left-recursion check,
/// stack advance); measured at most 500 on x86-64.
pub(super) const GRAMMAR_STACK_PER_LEVEL: usize = 4 * 500;

/// An upper bound on the rules, hence on the recursion depth, that
/// llama.cpp's GBNF parser makes of `gbnf`: named rules (`::=`), groups,
/// and repetition operators, counted outside string literals, character
/// classes and comments.
///
/// # Errors
/// The repetitions llama.cpp cannot handle: `{m,n}` with `n < m` (its
/// count of optional copies, `n - m` in a `uint64_t`, wraps and the parser
/// never returns), and a repetition operator applied to another one
/// (`x++`, `x*?`, `x{2}+`): meaningless in GBNF, and each one multiplies
/// the parse stacks llama.cpp keeps on every token (16 of them stall it
/// for minutes).
pub(super) fn grammar_levels(gbnf: &str) -> Result<usize, String> {
    let bytes = gbnf.as_bytes();
    let mut levels = 1usize;
    // Whether the last element was a repetition operator.
    let mut after_repetition = false;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if matches!(c, b'*' | b'+' | b'?' | b'{') && after_repetition {
            return Err(format!("a repetition operator follows another one at byte {i}"));
        }
        if !c.is_ascii_whitespace() && c != b'#' {
            after_repetition = matches!(c, b'*' | b'+' | b'?' | b'{');
        }
        match c {
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
            b'{' => {
                levels += 1;
                i = check_repetition_bounds(bytes, i)?;
            }
            b'(' | b'*' | b'+' | b'?' => levels += 1,
            b':' if bytes[i..].starts_with(b"::=") => {
                levels += 1;
                i += 2;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(levels)
}

/// Reads `{m}`, `{m,}` or `{m,n}` at `bytes[open]` as llama.cpp's parser
/// does (spaces allowed around the numbers) and returns the index of the
/// closing brace (or where the scan stopped: a malformed bound is left to
/// llama.cpp, which rejects it).
fn check_repetition_bounds(bytes: &[u8], open: usize) -> Result<usize, String> {
    let skip_space = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    let number = |mut i: usize| {
        let mut n: Option<u64> = None;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            n = Some(n.unwrap_or(0).saturating_mul(10).saturating_add(u64::from(bytes[i] - b'0')));
            i += 1;
        }
        (n, i)
    };
    let (Some(min), i) = number(skip_space(open + 1)) else { return Ok(open) };
    let i = skip_space(i);
    if bytes.get(i) != Some(&b',') {
        return Ok(i);
    }
    let (max, i) = number(skip_space(i + 1));
    if let Some(max) = max
        && max < min
    {
        return Err(format!("the repetition {{{min},{max}}} at byte {open} has its maximum below its minimum"));
    }
    Ok(skip_space(i))
}

/// At most this many grammar elements once llama.cpp has expanded the
/// repetitions (`x{m,n}` becomes `n` copies of `x`, nested ones multiply):
/// 8 bytes each in the parsed grammar, which the engine parses at submit
/// and again on its thread.
pub const MAX_GRAMMAR_ELEMENTS: u64 = 1 << 18;

/// At most this many unbounded repetitions (`*`, `+`, `{m,}`) nested in one
/// another within a rule (`(("a"+)+)+` is 3): each level multiplies the
/// parse stacks llama.cpp advances on every token.
pub const MAX_GRAMMAR_LOOP_NESTING: u32 = 3;

/// One parenthesised group (or a rule's body) being sized.
#[derive(Default)]
struct Group {
    /// The finished alternatives' sizes.
    done: u64,
    /// The current alternative's size.
    current: u64,
    /// The last element's size and loop nesting, for a repetition after it.
    last: u64,
    last_loops: u32,
    /// The deepest loop nesting inside.
    loops: u32,
}

impl Group {
    fn element(&mut self, size: u64, loops: u32) {
        self.current = self.current.saturating_add(size);
        self.last = size;
        self.last_loops = loops;
        self.loops = self.loops.max(loops);
    }

    /// The last element repeated `copies` times (plus the rule llama.cpp
    /// makes for the repetition).
    fn repeat(&mut self, copies: u64, unbounded: bool) {
        let grown = self.last.saturating_mul(copies.max(1)).saturating_add(2);
        self.current = self.current.saturating_sub(self.last).saturating_add(grown);
        let loops = self.last_loops + u32::from(unbounded);
        self.last = grown;
        self.last_loops = loops;
        self.loops = self.loops.max(loops);
    }

    fn size(&self) -> u64 {
        self.done.saturating_add(self.current)
    }
}

/// Refuses a grammar whose repetitions expand past
/// [`MAX_GRAMMAR_ELEMENTS`] or nest unbounded ones deeper than
/// [`MAX_GRAMMAR_LOOP_NESTING`], before llama.cpp parses it.
pub(super) fn check_grammar_budget(gbnf: &str) -> Result<(), String> {
    let bytes = gbnf.as_bytes();
    let mut total = 0u64;
    let mut stack: Vec<Group> = vec![Group::default()];
    let finish_rule = |stack: &mut Vec<Group>, total: &mut u64| {
        while stack.len() > 1 {
            let inner = stack.pop().unwrap_or_default();
            if let Some(outer) = stack.last_mut() {
                outer.element(inner.size(), inner.loops);
            }
        }
        if let Some(rule) = stack.last_mut() {
            *total = total.saturating_add(rule.size());
            *rule = Group::default();
        }
    };
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let top = stack.len() - 1;
        match c {
            b'"' | b'[' => {
                let close = if c == b'"' { b'"' } else { b']' };
                let start = i;
                i += 1;
                while i < bytes.len() && bytes[i] != close {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                // A literal is an element per character, a class one.
                let size = if c == b'"' { (i - start).saturating_sub(1) as u64 } else { 1 };
                stack[top].element(size.max(1), 0);
            }
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'(' => stack.push(Group::default()),
            b')' if stack.len() > 1 => {
                let inner = stack.pop().unwrap_or_default();
                stack[top - 1].element(inner.size().saturating_add(2), inner.loops);
            }
            b'|' => {
                let g = &mut stack[top];
                g.done = g.done.saturating_add(g.current);
                g.current = 0;
                g.last = 0;
            }
            b'*' | b'+' => stack[top].repeat(1, true),
            b'?' => stack[top].repeat(1, false),
            b'{' => {
                let close = bytes[i..].iter().position(|&b| b == b'}').map_or(bytes.len(), |p| i + p);
                let inside = std::str::from_utf8(&bytes[i + 1..close]).unwrap_or_default();
                let mut parts = inside.split(',').map(|p| p.trim().parse::<u64>().ok());
                let min = parts.next().flatten().unwrap_or(0);
                let (copies, unbounded) = match parts.next() {
                    None => (min, false),
                    Some(Some(max)) => (max, false),
                    Some(None) => (min.saturating_add(1), true),
                };
                stack[top].repeat(copies, unbounded);
                i = close;
            }
            b':' if bytes[i..].starts_with(b"::=") => {
                // The name just read belongs to the new rule, not the last.
                let g = &mut stack[top];
                g.current = g.current.saturating_sub(g.last);
                finish_rule(&mut stack, &mut total);
                i += 2;
            }
            c if c.is_ascii_alphanumeric() || c == b'_' || c == b'-' => {
                while i + 1 < bytes.len()
                    && (bytes[i + 1].is_ascii_alphanumeric() || bytes[i + 1] == b'_' || bytes[i + 1] == b'-')
                {
                    i += 1;
                }
                stack[top].element(1, 0);
            }
            _ => {}
        }
        if stack.iter().any(|g| g.loops > MAX_GRAMMAR_LOOP_NESTING) {
            return Err(format!(
                "the grammar nests more than {MAX_GRAMMAR_LOOP_NESTING} unbounded repetitions in one another (at byte {i})"
            ));
        }
        i += 1;
    }
    finish_rule(&mut stack, &mut total);
    if total > MAX_GRAMMAR_ELEMENTS {
        return Err(format!(
            "the grammar expands to about {total} elements once its repetitions are written out, more than the \
             {MAX_GRAMMAR_ELEMENTS} allowed"
        ));
    }
    Ok(())
}

/// The stack needed to create, and to advance on each token, a grammar.
///
/// # Errors
/// As [`grammar_levels`].
pub(super) fn grammar_stack(gbnf: &str) -> Result<usize, String> {
    let levels = grammar_levels(gbnf)?;
    check_grammar_budget(gbnf)?;
    Ok(levels.saturating_mul(GRAMMAR_STACK_PER_LEVEL))
}

/// Refuses the trigger patterns on which libstdc++'s backtracking matcher
/// takes exponential time, on every token the grammar waits through (both
/// found by the grammar_lazy fuzz target): a quantifier applied to a
/// quantifier (`a+*`, `a*+?`; a lazy `?` right after one, as in `a*?`, is
/// fine), and a repeating quantifier on a group that itself holds one
/// (`(a+)*`, `([\s\S]+)*?x`). Other ambiguous patterns (`(a|a)*`) are not
/// caught.
pub(super) fn check_pattern(pattern: &str) -> Result<(), String> {
    let bytes = pattern.as_bytes();
    let refuse = |what: &str, at: usize| Err(format!("the trigger pattern {pattern:?} {what} at byte {at}"));
    // 0: after an atom; 1: after a quantifier; 2: after a quantifier and
    // its lazy `?`.
    let mut state = 0u8;
    // For each open group: whether it holds a repeating quantifier.
    let mut groups: Vec<bool> = Vec::new();
    // Right after a group closed: whether that group held one.
    let mut closed_group: Option<bool> = None;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let mut just_closed = None;
        match c {
            b'\\' => {
                state = 0;
                i += 1;
            }
            b'[' => {
                state = 0;
                i += 1;
                while i < bytes.len() && bytes[i] != b']' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'(' => {
                state = 0;
                groups.push(false);
            }
            b')' => {
                state = 0;
                let inner = groups.pop().unwrap_or(false);
                if let Some(outer) = groups.last_mut() {
                    *outer |= inner;
                }
                just_closed = Some(inner);
            }
            b'*' | b'+' | b'{' | b'?' => {
                if c == b'?' && state == 1 {
                    state = 2;
                } else if state != 0 {
                    return refuse("repeats a repetition", i);
                } else {
                    state = 1;
                    let start = i;
                    if c == b'{' {
                        while i < bytes.len() && bytes[i] != b'}' {
                            i += 1;
                        }
                    }
                    if repeats(&bytes[start..(i + 1).min(bytes.len())]) {
                        if closed_group == Some(true) {
                            return refuse("repeats a group that repeats", start);
                        }
                        if let Some(group) = groups.last_mut() {
                            *group = true;
                        }
                    }
                }
            }
            _ => state = 0,
        }
        closed_group = just_closed;
        i += 1;
    }
    Ok(())
}

/// Whether a quantifier (`*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`) can match
/// its atom more than once.
fn repeats(quantifier: &[u8]) -> bool {
    match quantifier.first() {
        Some(b'*' | b'+') => true,
        Some(b'{') => {
            let inside = String::from_utf8_lossy(&quantifier[1..]).trim_end_matches('}').to_owned();
            let mut parts = inside.split(',').map(|p| p.trim().parse::<u64>().ok());
            match (parts.next().flatten(), parts.next()) {
                (Some(n), None) => n >= 2,
                (_, Some(Some(max))) => max >= 2,
                _ => true,
            }
        }
        _ => false,
    }
}

/// The stack needed to compile `patterns` as `std::regex`es.
pub(super) fn patterns_stack(patterns: &[&str]) -> usize {
    patterns.iter().map(|p| p.len()).max().unwrap_or(0).saturating_mul(REGEX_STACK_PER_BYTE)
}

#[cfg(test)]
mod tests {
    use super::check_grammar_budget;

    /// Grammars that expand past the element budget, or nest unbounded
    /// repetitions too deep, are refused before llama.cpp parses them;
    /// the JSON grammar and schema grammars pass.
    #[test]
    fn grammar_expansion_and_loop_nesting_are_bounded() {
        let long = format!("root ::= \"{}\"{{2000}}", "x".repeat(1000));
        let e = check_grammar_budget(&long).unwrap_err();
        assert!(e.contains("expands to about 2000") && e.contains("262144"), "{e}");
        assert!(check_grammar_budget(r#"root ::= (("a"{100}){100}){100}"#).is_err());
        assert!(check_grammar_budget(r#"root ::= ("a"{100}){100}"#).is_ok());
        let e = check_grammar_budget(r#"root ::= (((("a"+)+)+)+)"#).unwrap_err();
        assert!(e.contains("nests more than 3"), "{e}");
        assert!(check_grammar_budget(r#"root ::= ((("a"+)+)+)"#).is_ok());
        assert!(check_grammar_budget(r#"root ::= ((("a"{2,})*)*)*"#).is_err());
        // Repetitions in separate rules or separate groups do not multiply.
        let spread = (0..200).map(|i| format!("r{i} ::= \"y\"{{1000}}\n")).collect::<String>();
        assert!(check_grammar_budget(&format!("root ::= r0\n{spread}")).is_ok());
        assert!(check_grammar_budget(crate::sampling::json_schema::json_grammar()).is_ok());
        let schema = serde_json::json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 64}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 16},
            "n": {"type": "integer"}, "nested": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}},
            "required": ["name"]});
        let gbnf = crate::sampling::json_schema::schema_to_grammar(&schema).unwrap();
        check_grammar_budget(&gbnf).unwrap_or_else(|e| panic!("{e}\n{gbnf}"));
    }

    #[test]
    fn levels_count_rules_outside_literals_classes_and_comments() {
        let grammar_levels = |g: &str| super::grammar_levels(g).unwrap();
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
        // Repetitions llama.cpp handles.
        assert_eq!(grammar_levels(r#"root ::= "a"{2} "b"{ 1 , 3 } "c"{0,} "d"{3,3}"#), 6);
        assert_eq!(grammar_levels("root ::= x* y+ z? # x** y++ in a comment"), 5);
    }

    #[test]
    fn trigger_patterns_that_repeat_a_repetition_are_refused() {
        for bad in [
            r"[\s\S]+*?(<tool>)",
            "a+*",
            "a**",
            "a{2}+",
            "a*?+",
            "(x)+{3}",
            r"([\s\S]+)*?(<tool>)",
            "(a+)+",
            "((a*)b)*",
            "(a{2,})+",
            "(?:a+){2,5}",
        ] {
            assert!(super::check_pattern(bad).is_err(), "{bad}");
        }
        for good in [
            r"^[\s\S]*?(<tool_call>)[\s\S]*$",
            "a*?b+?c??d{2,3}?",
            r"\*+",
            "[*+?]+",
            r"a\+*",
            "(a+)(b*)",
            "(a+)?",
            "(a+){1}",
            "(a?)*",
            "(ab)*c+",
            r"(?:\s*)?x",
        ] {
            assert!(super::check_pattern(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn repetitions_llama_cpp_cannot_handle_are_refused() {
        for bad in [
            r#"root ::= "a"{9,3}"#,
            r#"root ::= "a"{ 9 , 3 }"#,
            r#"root ::= ("a" | [^a])++"#,
            r#"root ::= "a"*?"#,
            r#"root ::= "a"{2}+"#,
            r#"root ::= "a"+ {2}"#,
            "root ::= \"a\"* \n *",
        ] {
            assert!(super::grammar_levels(bad).is_err(), "{bad}");
        }
        // Operators inside literals and classes, and separate elements, are fine.
        for good in [r#"root ::= "++" [*+?]"#, r#"root ::= "a"+ "b"+"#, r#"root ::= ("a"+)+"#, r#"root ::= "{9,3}""#] {
            assert!(super::grammar_levels(good).is_ok(), "{good}");
        }
    }
}
