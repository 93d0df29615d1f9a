//! `pattern` (an ECMA-262 regular expression) to a GBNF expression over the
//! *JSON text* of a string's contents: a literal `"` becomes `\"`, a
//! newline `\n`, and so on. Each character is produced in one canonical
//! spelling (a grammar never writes `\u0041` for `A`), a tightening that
//! never lets an invalid document through.
//!
//! The subset: literals, escapes (`\d \w \s \D \W \S`, `\n \t \r \f \v
//! \0`, `\xHH`, `\uHHHH`, escaped punctuation), classes `[...]` and
//! `[^...]` with ranges, `.`, groups `(...)`, `(?:...)`, `(?<name>...)`,
//! alternation, the quantifiers `? * + {m} {m,} {m,n}` (lazy forms too),
//! and `^`/`$` at the start/end of a top-level alternative. A side
//! without an anchor matches anything there, as JSON Schema's unanchored
//! `pattern` does. Backreferences, lookaround, word boundaries, Unicode
//! property classes, and anchors elsewhere are errors.

use super::rules::{class, literal};

/// The most repetitions a `{m,n}` may ask for (GBNF expands them).
const MAX_REPEAT: u32 = 1000;

#[derive(Clone, Debug)]
enum Node {
    /// A set of code points (a literal is a one-element set).
    Set {
        ranges: Vec<(char, char)>,
        negated: bool,
    },
    Seq(Vec<Node>),
    Alt(Vec<Node>),
    Repeat {
        node: Box<Node>,
        min: u32,
        max: Option<u32>,
    },
    Start,
    End,
}

struct Parser<'a> {
    chars: Vec<char>,
    pos: usize,
    _src: &'a str,
}

type PResult<T> = Result<T, String>;

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn alt(&mut self, depth: usize) -> PResult<Node> {
        if depth > 64 {
            return Err("groups nested more than 64 deep".into());
        }
        let mut alts = vec![self.seq(depth)?];
        while self.eat('|') {
            alts.push(self.seq(depth)?);
        }
        Ok(if alts.len() == 1 { alts.pop().unwrap_or(Node::Seq(Vec::new())) } else { Node::Alt(alts) })
    }

    fn seq(&mut self, depth: usize) -> PResult<Node> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom(depth)?;
            let atom = self.quantifier(atom)?;
            items.push(atom);
        }
        Ok(Node::Seq(items))
    }

    fn quantifier(&mut self, atom: Node) -> PResult<Node> {
        let (min, max) = match self.peek() {
            Some('?') => {
                self.pos += 1;
                (0, Some(1))
            }
            Some('*') => {
                self.pos += 1;
                (0, None)
            }
            Some('+') => {
                self.pos += 1;
                (1, None)
            }
            // `braces` consumes its own text.
            Some('{') => match self.braces()? {
                Some(b) => b,
                None => return Ok(atom),
            },
            _ => return Ok(atom),
        };
        // A lazy quantifier matches the same strings.
        self.eat('?');
        if matches!(self.peek(), Some('?' | '*' | '+')) || self.peek() == Some('{') && self.looks_like_braces() {
            return Err(format!("a quantifier follows another at offset {}", self.pos));
        }
        if matches!(atom, Node::Start | Node::End) {
            return Err("a quantified anchor".into());
        }
        Ok(Node::Repeat { node: Box::new(atom), min, max })
    }

    fn looks_like_braces(&self) -> bool {
        let rest: String = self.chars[self.pos..].iter().take(24).collect();
        let Some(end) = rest.find('}') else { return false };
        let inner = &rest[1..end];
        !inner.is_empty() && inner.chars().all(|c| c.is_ascii_digit() || c == ',') && !inner.starts_with(',')
    }

    /// `{m}`, `{m,}`, `{m,n}` (consumed), or `None` for a literal `{`.
    fn braces(&mut self) -> PResult<Option<(u32, Option<u32>)>> {
        if !self.looks_like_braces() {
            return Ok(None);
        }
        self.pos += 1;
        let mut text = String::new();
        while let Some(c) = self.peek() {
            self.pos += 1;
            if c == '}' {
                break;
            }
            text.push(c);
        }
        let parse = |s: &str| s.parse::<u32>().map_err(|_| format!("repetition count {s:?} is too large"));
        let (min, max) = match text.split_once(',') {
            None => {
                let n = parse(&text)?;
                (n, Some(n))
            }
            Some((a, "")) => (parse(a)?, None),
            Some((a, b)) => (parse(a)?, Some(parse(b)?)),
        };
        if max.is_some_and(|m| m < min) {
            return Err(format!("repetition {{{text}}} has its maximum below its minimum"));
        }
        if min > MAX_REPEAT || max.is_some_and(|m| m > MAX_REPEAT) {
            return Err(format!("repetition {{{text}}} exceeds {MAX_REPEAT}"));
        }
        // The caller must not step over a brace: mark it handled.
        Ok(Some((min, max)))
    }

    fn atom(&mut self, depth: usize) -> PResult<Node> {
        let Some(c) = self.peek() else { return Err("unexpected end of pattern".into()) };
        self.pos += 1;
        Ok(match c {
            '^' => Node::Start,
            '$' => Node::End,
            '.' => Node::Set { ranges: vec![('\n', '\n'), ('\r', '\r'), ('\u{2028}', '\u{2029}')], negated: true },
            '(' => {
                if self.eat('?') {
                    match self.peek() {
                        Some(':') => self.pos += 1,
                        Some('<') if !matches!(self.chars.get(self.pos + 1), Some('=' | '!')) => {
                            while let Some(c) = self.peek() {
                                self.pos += 1;
                                if c == '>' {
                                    break;
                                }
                                if !(c.is_alphanumeric() || c == '_' || c == '<') {
                                    return Err("a malformed group name".into());
                                }
                            }
                        }
                        _ => return Err("lookaround and other `(?` groups are not supported".into()),
                    }
                }
                let inner = self.alt(depth + 1)?;
                if !self.eat(')') {
                    return Err("an unclosed group".into());
                }
                inner
            }
            ')' => return Err("an unmatched `)`".into()),
            '[' => self.class()?,
            '\\' => self.escape(false)?,
            '*' | '+' | '?' => return Err(format!("a quantifier with nothing to repeat at offset {}", self.pos - 1)),
            '{' if {
                self.pos -= 1;
                let b = self.looks_like_braces();
                self.pos += 1;
                b
            } =>
            {
                return Err("a quantifier with nothing to repeat".into());
            }
            c => Node::Set { ranges: vec![(c, c)], negated: false },
        })
    }

    /// After a `\`: a set (also for one literal character). In a class,
    /// `\b` is backspace.
    fn escape(&mut self, in_class: bool) -> PResult<Node> {
        let Some(c) = self.peek() else { return Err("a trailing backslash".into()) };
        self.pos += 1;
        let one = |c: char| Node::Set { ranges: vec![(c, c)], negated: false };
        let digit = vec![('0', '9')];
        let word = vec![('0', '9'), ('A', 'Z'), ('_', '_'), ('a', 'z')];
        let space = vec![
            ('\t', '\r'),
            (' ', ' '),
            ('\u{a0}', '\u{a0}'),
            ('\u{1680}', '\u{1680}'),
            ('\u{2000}', '\u{200a}'),
            ('\u{2028}', '\u{2029}'),
            ('\u{202f}', '\u{202f}'),
            ('\u{205f}', '\u{205f}'),
            ('\u{3000}', '\u{3000}'),
            ('\u{feff}', '\u{feff}'),
        ];
        Ok(match c {
            'd' => Node::Set { ranges: digit, negated: false },
            'D' => Node::Set { ranges: digit, negated: true },
            'w' => Node::Set { ranges: word, negated: false },
            'W' => Node::Set { ranges: word, negated: true },
            's' => Node::Set { ranges: space, negated: false },
            'S' => Node::Set { ranges: space, negated: true },
            'n' => one('\n'),
            't' => one('\t'),
            'r' => one('\r'),
            'f' => one('\u{c}'),
            'v' => one('\u{b}'),
            'b' if in_class => one('\u{8}'),
            '0' if !self.peek().is_some_and(|c| c.is_ascii_digit()) => one('\0'),
            'x' => one(self.hex(2)?),
            'u' => {
                if self.peek() == Some('{') {
                    return Err("`\\u{...}` escapes are not supported".into());
                }
                one(self.hex(4)?)
            }
            c if c.is_ascii_digit() => return Err("backreferences are not supported".into()),
            'b' | 'B' => return Err("word boundaries (`\\b`, `\\B`) are not supported".into()),
            'p' | 'P' => return Err("Unicode property classes (`\\p{...}`) are not supported".into()),
            'k' => return Err("named backreferences are not supported".into()),
            'c' => return Err("control escapes (`\\cX`) are not supported".into()),
            c if c.is_ascii_alphanumeric() => return Err(format!("the escape `\\{c}` is not supported")),
            c => one(c),
        })
    }

    fn hex(&mut self, n: usize) -> PResult<char> {
        let s: String = self.chars.iter().skip(self.pos).take(n).collect();
        if s.len() != n || !s.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err("a malformed hex escape".into());
        }
        self.pos += n;
        let v = u32::from_str_radix(&s, 16).map_err(|e| e.to_string())?;
        char::from_u32(v).ok_or_else(|| "an escape of a UTF-16 surrogate".to_string())
    }

    fn class(&mut self) -> PResult<Node> {
        let negated = self.eat('^');
        let mut ranges = Vec::new();
        let mut first = true;
        loop {
            let Some(c) = self.peek() else { return Err("an unclosed `[`".into()) };
            if c == ']' && !first {
                self.pos += 1;
                break;
            }
            if c == ']' {
                // `[]` matches nothing and `[^]` anything in ECMA-262.
                self.pos += 1;
                if negated {
                    return Ok(Node::Set { ranges: Vec::new(), negated: true });
                }
                return Err("an empty class `[]` matches nothing".into());
            }
            first = false;
            let lo = self.class_atom()?;
            if self.peek() == Some('-') && self.chars.get(self.pos + 1).is_some_and(|&c| c != ']') {
                self.pos += 1;
                let hi = self.class_atom()?;
                match (lo, hi) {
                    (ClassAtom::Char(a), ClassAtom::Char(b)) if a <= b => ranges.push((a, b)),
                    (ClassAtom::Char(_), ClassAtom::Char(_)) => return Err("a class range out of order".into()),
                    _ => return Err("a class range with a class escape as an end".into()),
                }
            } else {
                match lo {
                    ClassAtom::Char(c) => ranges.push((c, c)),
                    ClassAtom::Set(set, false) => ranges.extend(set),
                    ClassAtom::Set(..) => return Err("`\\D`, `\\W`, `\\S` inside a class are not supported".into()),
                }
            }
        }
        Ok(Node::Set { ranges, negated })
    }

    fn class_atom(&mut self) -> PResult<ClassAtom> {
        let Some(c) = self.peek() else { return Err("an unclosed `[`".into()) };
        self.pos += 1;
        if c == '[' && matches!(self.peek(), Some(':' | '=' | '.')) {
            return Err("POSIX classes are not supported".into());
        }
        if c != '\\' {
            return Ok(ClassAtom::Char(c));
        }
        match self.escape(true)? {
            Node::Set { ranges, negated } if ranges.len() == 1 && ranges[0].0 == ranges[0].1 && !negated => {
                Ok(ClassAtom::Char(ranges[0].0))
            }
            Node::Set { ranges, negated } => Ok(ClassAtom::Set(ranges, negated)),
            _ => Err("an unsupported escape in a class".into()),
        }
    }
}

enum ClassAtom {
    Char(char),
    Set(Vec<(char, char)>, bool),
}

/// Sorted, merged ranges.
fn normalize(ranges: &[(char, char)]) -> Vec<(char, char)> {
    let mut r: Vec<(u32, u32)> = ranges.iter().map(|&(a, b)| (a as u32, b as u32)).collect();
    r.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::new();
    for (a, b) in r {
        match out.last_mut() {
            Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out.into_iter().filter_map(|(a, b)| Some((char::from_u32(a)?, char::from_u32(b)?))).collect()
}

/// The characters JSON writes with a short escape, and the escape.
const SHORT_ESCAPES: [(char, &str); 7] =
    [('"', "\\\""), ('\\', "\\\\"), ('\n', "\\n"), ('\r', "\\r"), ('\t', "\\t"), ('\u{8}', "\\b"), ('\u{c}', "\\f")];

/// Whether JSON text must escape `c`.
fn needs_escape(c: char) -> bool {
    c == '"' || c == '\\' || (c as u32) < 0x20
}

/// How JSON text writes `c` (escaped if it must be).
fn json_spelling(c: char) -> String {
    if let Some((_, e)) = SHORT_ESCAPES.iter().find(|(k, _)| *k == c) {
        return (*e).to_string();
    }
    if needs_escape(c) { format!("\\u{:04x}", c as u32) } else { c.to_string() }
}

/// GBNF for one JSON-text character of a set of code points.
fn set_to_gbnf(ranges: &[(char, char)], negated: bool) -> PResult<String> {
    let ranges = normalize(ranges);
    if !negated && ranges.len() == 1 && ranges[0].0 == ranges[0].1 {
        return Ok(literal(&json_spelling(ranges[0].0)));
    }
    let contains = |c: char| ranges.iter().any(|&(a, b)| a <= c && c <= b);
    let member = |c: char| contains(c) != negated;
    let mut alts = Vec::new();
    // Characters written raw: members that need no escape.
    if negated {
        let mut excluded = ranges.clone();
        excluded.push(('"', '"'));
        excluded.push(('\\', '\\'));
        excluded.push(('\0', '\u{1f}'));
        alts.push(class(&normalize(&excluded), true));
    } else {
        let mut raw = Vec::new();
        for &(a, b) in &ranges {
            // Split out '"' (0x22), '\\' (0x5C) and controls (< 0x20).
            let (mut a, b) = (a as u32, b as u32);
            a = a.max(0x20);
            let mut start = a;
            for cut in [0x22u32, 0x5c] {
                if start <= cut && cut <= b {
                    if start < cut {
                        raw.push((start, cut - 1));
                    }
                    start = cut + 1;
                }
            }
            if start <= b {
                raw.push((start, b));
            }
        }
        let raw: Vec<(char, char)> =
            raw.into_iter().filter_map(|(a, b)| Some((char::from_u32(a)?, char::from_u32(b)?))).collect();
        if !raw.is_empty() {
            alts.push(class(&raw, false));
        }
    }
    // Members that must be escaped.
    for c in (0u32..0x20).filter_map(char::from_u32).chain(['"', '\\']) {
        if member(c) {
            alts.push(literal(&json_spelling(c)));
        }
    }
    match alts.len() {
        0 => Err("a class that matches no character".into()),
        1 => Ok(alts.pop().unwrap_or_default()),
        _ => Ok(format!("({})", alts.join(" | "))),
    }
}

/// Whether `node` can match the empty string.
fn nullable(node: &Node) -> bool {
    match node {
        Node::Set { .. } => false,
        Node::Seq(items) => items.iter().all(nullable),
        Node::Alt(alts) => alts.iter().any(nullable),
        Node::Repeat { node, min, .. } => *min == 0 || nullable(node),
        Node::Start | Node::End => true,
    }
}

fn to_gbnf(node: &Node) -> PResult<String> {
    Ok(match node {
        Node::Set { ranges, negated } => set_to_gbnf(ranges, *negated)?,
        Node::Seq(items) if items.is_empty() => "\"\"".into(),
        Node::Seq(items) => {
            let parts = items.iter().map(to_gbnf).collect::<PResult<Vec<_>>>()?;
            if parts.len() == 1 {
                parts.into_iter().next().unwrap_or_default()
            } else {
                format!("({})", parts.join(" "))
            }
        }
        Node::Alt(alts) => {
            let parts = alts.iter().map(to_gbnf).collect::<PResult<Vec<_>>>()?;
            format!("({})", parts.join(" | "))
        }
        Node::Repeat { node, min, max } => {
            // An unbounded repetition of what can be empty is left
            // recursion through an empty match for llama.cpp.
            if max.is_none() && nullable(node) {
                return Err("an unbounded quantifier on a group that can match the empty string".into());
            }
            if *max == Some(0) {
                return Ok("\"\"".into());
            }
            let inner = to_gbnf(node)?;
            let op = match (min, max) {
                (0, Some(1)) => "?".to_string(),
                (0, None) => "*".to_string(),
                (1, None) => "+".to_string(),
                (m, None) => format!("{{{m},}}"),
                (m, Some(n)) if m == n => format!("{{{m}}}"),
                (m, Some(n)) => format!("{{{m},{n}}}"),
            };
            // Parenthesised, so that no operator follows another.
            format!("({inner}){op}")
        }
        Node::Start | Node::End => return Err("`^` or `$` inside the pattern is not supported".into()),
    })
}

/// Splits an alternative's leading `^` and trailing `$` off.
fn strip_anchors(node: Node) -> (bool, Node, bool) {
    let mut items = match node {
        Node::Seq(items) => items,
        other => vec![other],
    };
    let start = matches!(items.first(), Some(Node::Start));
    if start {
        items.remove(0);
    }
    let end = matches!(items.last(), Some(Node::End));
    if end {
        items.pop();
    }
    (start, Node::Seq(items), end)
}

/// The GBNF expression (a sequence of elements, no surrounding quotes) for
/// the JSON text of the strings `pattern` matches; `any_char` is the rule
/// for an arbitrary JSON string character (used for unanchored sides).
pub(super) fn pattern_to_gbnf(pattern: &str, any_char: &str) -> PResult<String> {
    let mut parser = Parser { chars: pattern.chars().collect(), pos: 0, _src: pattern };
    let tree = parser.alt(0)?;
    if parser.pos != parser.chars.len() {
        return Err(format!("an unmatched `)` at offset {}", parser.pos));
    }
    let alts = match tree {
        Node::Alt(alts) => alts,
        other => vec![other],
    };
    let mut out = Vec::new();
    for alt in alts {
        let (start, body, end) = strip_anchors(alt);
        let mut parts = Vec::new();
        if !start {
            parts.push(format!("{any_char}*"));
        }
        parts.push(to_gbnf(&body)?);
        if !end {
            parts.push(format!("{any_char}*"));
        }
        out.push(parts.join(" "));
    }
    Ok(if out.len() == 1 { out.pop().unwrap_or_default() } else { format!("({})", out.join(" | ")) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchored_literals_and_classes() {
        assert_eq!(pattern_to_gbnf("^ab$", "char").unwrap(), r#"("a" "b")"#);
        assert_eq!(pattern_to_gbnf("^[a-c]+$", "char").unwrap(), "([a-c])+");
        assert_eq!(pattern_to_gbnf("x", "char").unwrap(), r#"char* "x" char*"#);
        assert_eq!(pattern_to_gbnf("^\"$", "char").unwrap(), r#""\\\"""#);
    }

    #[test]
    fn unsupported_constructs_are_errors() {
        for p in [
            "(a)\\1", "(?=a)", "(?!a)", "(?<=a)b", "a\\b", "\\p{L}", "a^b", "(a*)*", "a**", "[z-a]", "(a", "a)",
            "x{3,2}",
        ] {
            assert!(pattern_to_gbnf(p, "char").is_err(), "{p}");
        }
    }
}
