//! GBNF building blocks: escaping, the primitive JSON rules, string
//! formats, and exact integer and number ranges as digit rules.

use std::fmt::Write as _;

/// The most digits an integer part (and a fraction) may have: bounds the
/// length of generated numbers, as llama.cpp's converter does.
pub(super) const MAX_DIGITS: usize = 16;

/// A GBNF string literal matching exactly `text`.
pub(super) fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One character inside a GBNF character class: alphanumerics and
/// non-ASCII as themselves, all other ASCII as `\xHH` (llama.cpp's parser
/// knows no `\-` or `\^`).
pub(super) fn class_char(c: char) -> String {
    if c.is_ascii_alphanumeric() || (c as u32) > 0x7f { c.to_string() } else { format!("\\x{:02X}", c as u32) }
}

/// A GBNF character class of inclusive code point ranges (`negated`: any
/// character but those).
pub(super) fn class(ranges: &[(char, char)], negated: bool) -> String {
    let mut out = String::from("[");
    if negated {
        out.push('^');
    }
    for &(lo, hi) in ranges {
        out.push_str(&class_char(lo));
        if hi != lo {
            out.push('-');
            out.push_str(&class_char(hi));
        }
    }
    out.push(']');
    out
}

/// The primitive rules by name, each with the primitives its body uses.
/// `space` is bounded: nothing, one space, or one newline and up to 20
/// spaces or tabs, so a model cannot emit whitespace forever.
pub(super) fn primitive(name: &str) -> Option<(&'static str, &'static [&'static str])> {
    Some(match name {
        "space" => (r#"| " " | "\n" [ \t]{0,20}"#, &[]),
        // One JSON string character: anything but `"`, `\` and controls,
        // or an escape; `\u` escapes of UTF-16 surrogates are left out so
        // that one `char` is always one code point (exact minLength).
        "char" => (
            r#"[^"\\\x00-\x1F\x7F] | "\\" (["\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))"#,
            &[],
        ),
        "string" => (r#""\"" char* "\"" space"#, &["char", "space"]),
        "integral-part" => (r#"[0] | [1-9] [0-9]{0,15}"#, &[]),
        "integer" => (r#""-"? integral-part space"#, &["integral-part", "space"]),
        "number" => {
            (r#""-"? integral-part ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})? space"#, &["integral-part", "space"])
        }
        "boolean" => (r#"("true" | "false") space"#, &["space"]),
        "null" => (r#""null" space"#, &["space"]),
        "value" => (
            r#"object | array | string | number | boolean | null"#,
            &["object", "array", "string", "number", "boolean", "null"],
        ),
        "object" => (
            r#""{" space (string ":" space value ("," space string ":" space value)*)? "}" space"#,
            &["string", "value", "space"],
        ),
        "array" => (r#""[" space (value ("," space value)*)? "]" space"#, &["value", "space"]),
        // RFC 3339 full-date, with the days of each month and leap years.
        "date" => (
            concat!(
                r#"[0-9]{4} "-" ("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])"#,
                r#" | [0-9]{4} "-" ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30")"#,
                r#" | [0-9]{4} "-02-" ("0" [1-9] | "1" [0-9] | "2" [0-8])"#,
                r#" | ([0-9]{2} ("0" [48] | [2468] [048] | [13579] [26]) | ("0" [48] | [2468] [048] | [13579] [26]) "00" | "0000") "-02-29""#
            ),
            &[],
        ),
        // RFC 3339 full-time (no leap second; "Z" or a numeric offset).
        "time" => (
            r#"([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,9})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])"#,
            &[],
        ),
        "date-time" => (r#"date "T" time"#, &["date", "time"]),
        "uuid" => {
            (r#"[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}"#, &[])
        }
        // A conservative RFC 5321 mailbox: dot-atoms of bounded length and
        // a domain of two or more labels.
        "email" => (
            r#"email-atom ("." email-atom){0,3} "@" email-label ("." email-label){1,3}"#,
            &["email-atom", "email-label"],
        ),
        "email-atom" => (r#"[a-zA-Z0-9!#$%&'*+/=?^_`{|}~\x2D]{1,32}"#, &[]),
        "email-label" => (r#"[a-zA-Z0-9] ([a-zA-Z0-9\x2D]{0,30} [a-zA-Z0-9])?"#, &[]),
        _ => return None,
    })
}

/// Digits of `n` (no sign).
fn digits(n: u64) -> Vec<u8> {
    n.to_string().into_bytes()
}

/// A GBNF expression for the decimal strings of the integers in `lo..=hi`
/// (non-negative, no leading zeros), as alternatives joined by `|`.
/// `hi = None` is unbounded (up to [`MAX_DIGITS`] digits).
pub(super) fn uint_range(lo: u64, hi: Option<u64>) -> String {
    let max_value = 10u64.pow(MAX_DIGITS as u32) - 1;
    let hi = hi.unwrap_or(max_value).min(max_value);
    let mut alts = Vec::new();
    if lo > hi {
        return String::new();
    }
    let (lo_len, hi_len) = (digits(lo).len(), digits(hi).len());
    for len in lo_len..=hi_len {
        let floor = if len == 1 { 0 } else { 10u64.pow(len as u32 - 1) };
        let ceil = 10u64.pow(len as u32) - 1;
        let (a, b) = (lo.max(floor), hi.min(ceil));
        if a > b {
            continue;
        }
        same_length(&digits(a), &digits(b), &mut String::new(), &mut alts);
    }
    alts.join(" | ")
}

/// Alternatives for the digit strings between `lo` and `hi` (same length),
/// each prefixed with `prefix`.
fn same_length(lo: &[u8], hi: &[u8], prefix: &mut String, alts: &mut Vec<String>) {
    if lo.is_empty() {
        alts.push(if prefix.is_empty() { "\"\"".into() } else { prefix.trim_end().to_string() });
        return;
    }
    let rest = lo.len() - 1;
    let any_rest = |out: &mut String| {
        if rest > 0 {
            let _ = write!(out, " [0-9]{{{rest}}}");
        }
    };
    let (l, h) = (lo[0], hi[0]);
    if l == h {
        let mark = prefix.len();
        let _ = write!(prefix, "\"{}\" ", l as char);
        same_length(&lo[1..], &hi[1..], prefix, alts);
        prefix.truncate(mark);
        return;
    }
    let lo_min = lo[1..].iter().all(|&d| d == b'0');
    let hi_max = hi[1..].iter().all(|&d| d == b'9');
    // First digit `l` with the rest from lo[1..] up to all nines, unless
    // that is every suffix (then it joins the middle range).
    let first = if lo_min { l } else { l + 1 };
    let last = if hi_max { h } else { h - 1 };
    if !lo_min {
        let mark = prefix.len();
        let _ = write!(prefix, "\"{}\" ", l as char);
        let nines = vec![b'9'; rest];
        same_length(&lo[1..], &nines, prefix, alts);
        prefix.truncate(mark);
    }
    if first <= last {
        let mut alt = prefix.clone();
        let _ = write!(alt, "[{}-{}]", first as char, last as char);
        any_rest(&mut alt);
        alts.push(alt);
    }
    if !hi_max {
        let mark = prefix.len();
        let _ = write!(prefix, "\"{}\" ", h as char);
        let zeros = vec![b'0'; rest];
        same_length(&zeros, &hi[1..], prefix, alts);
        prefix.truncate(mark);
    }
}

/// An inclusive bound of an integer range (`None`: unbounded).
pub(super) type Bound = Option<i64>;

/// A GBNF expression for the integers in `lo..=hi` in JSON (no `-0`, no
/// leading zeros), or `None` if the range is empty.
pub(super) fn int_range(lo: Bound, hi: Bound) -> Option<String> {
    let mut alts = Vec::new();
    // Negative part: "-" then magnitudes in max(1, -hi)..=-lo.
    if lo.is_none_or(|l| l < 0) {
        let mag_lo = match hi {
            Some(h) if h < 0 => h.unsigned_abs(),
            _ => 1,
        };
        let mag_hi = lo.map(i64::unsigned_abs);
        let body = uint_range(mag_lo, mag_hi);
        if !body.is_empty() {
            alts.push(format!("\"-\" ({body})"));
        }
    }
    // Non-negative part: max(0, lo)..=hi.
    if hi.is_none_or(|h| h >= 0) {
        let from = lo.map_or(0, |l| l.max(0) as u64);
        let body = uint_range(from, hi.map(|h| h as u64));
        if !body.is_empty() {
            alts.push(format!("({body})"));
        }
    }
    if alts.is_empty() { None } else { Some(alts.join(" | ")) }
}

/// A bound on a number: the integer value and whether it is inclusive.
#[derive(Clone, Copy, Debug)]
pub(super) struct NumBound {
    pub value: i64,
    pub inclusive: bool,
}

/// Fractions: any, all zeros, and not all zeros (for exclusive bounds;
/// the last digit is then nonzero, a harmless tightening).
const ANY_FRACTION: &str = r#"("." [0-9]{1,16})?"#;
const ZERO_FRACTION: &str = r#"("." [0]{1,16})?"#;
const NONZERO_FRACTION: &str = r#""." [0-9]{0,15} [1-9]"#;

/// Magnitudes `m` (non-negative, written as digits with an optional
/// fraction, no exponent) with `lo <= m` (or `<`) and `m <= hi` (or `<`),
/// integer bounds; `hi = None` is unbounded. Alternatives joined by `|`.
fn magnitude_range(lo: NumBound, hi: Option<NumBound>) -> Vec<String> {
    let l = lo.value as u64;
    let mut alts = Vec::new();
    let mut push = |ints: String, frac: &str| {
        if !ints.is_empty() {
            alts.push(format!("({ints}) {frac}"));
        }
    };
    match hi {
        Some(h) if (h.value as u64) == l => {
            if lo.inclusive && h.inclusive {
                push(uint_range(l, Some(l)), ZERO_FRACTION);
            }
        }
        Some(h) if (h.value as u64) < l => {}
        _ => {
            // The integer part equal to the lower bound.
            push(uint_range(l, Some(l)), if lo.inclusive { ANY_FRACTION } else { NONZERO_FRACTION });
            match hi {
                None => push(uint_range(l + 1, None), ANY_FRACTION),
                Some(h) => {
                    let h_val = h.value as u64;
                    if h_val > l + 1 {
                        push(uint_range(l + 1, Some(h_val - 1)), ANY_FRACTION);
                    }
                    if h.inclusive {
                        push(uint_range(h_val, Some(h_val)), ZERO_FRACTION);
                    }
                }
            }
        }
    }
    alts
}

/// A GBNF expression for the JSON numbers (no exponent) between integer
/// bounds, or `None` if none are. `-0` is left out.
pub(super) fn number_range(lo: Option<NumBound>, hi: Option<NumBound>) -> Option<String> {
    let mut alts = Vec::new();
    // x < 0: x = -m, m > 0, m <= -lo, m >= -hi.
    if lo.is_none_or(|l| l.value < 0) {
        let mag_lo = match hi {
            Some(h) if h.value < 0 => NumBound { value: -h.value, inclusive: h.inclusive },
            _ => NumBound { value: 0, inclusive: false },
        };
        let mag_hi = lo.map(|l| NumBound { value: -l.value, inclusive: l.inclusive });
        let neg = magnitude_range(mag_lo, mag_hi);
        if !neg.is_empty() {
            alts.push(format!("\"-\" ({})", neg.join(" | ")));
        }
    }
    // x >= 0.
    if hi.is_none_or(|h| h.value > 0 || (h.value == 0 && h.inclusive)) {
        let mag_lo = match lo {
            Some(l) if l.value >= 0 => l,
            _ => NumBound { value: 0, inclusive: true },
        };
        let pos = magnitude_range(mag_lo, hi);
        alts.extend(pos);
    }
    if alts.is_empty() { None } else { Some(alts.join(" | ")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_escape_quotes_backslashes_and_controls() {
        assert_eq!(literal("a\"b\\c\n\u{1}é"), r#""a\"b\\c\n\x01é""#);
    }

    #[test]
    fn uint_ranges() {
        assert_eq!(uint_range(0, Some(9)), "[0-9]");
        assert_eq!(uint_range(5, Some(5)), "\"5\"");
        assert_eq!(uint_range(10, Some(99)), "[1-9] [0-9]{1}");
        assert_eq!(uint_range(15, Some(42)), "\"1\" [5-9] | [2-3] [0-9]{1} | \"4\" [0-2]");
        assert_eq!(uint_range(7, Some(12)), "[7-9] | \"1\" [0-2]");
        assert_eq!(uint_range(3, Some(2)), "");
    }
}
