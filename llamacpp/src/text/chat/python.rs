//! What Hugging Face's Jinja environment gets from Python and minijinja
//! does not do the same way: `str()` of values (`True`, `None`, `{'a': 1}`),
//! `json.dumps` (its separators, float repr and escapes, non-ASCII kept),
//! and `datetime.strftime`.

use std::fmt::Write as _;
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectRepr, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Python's `None` where iterating it must fail as in Python (minijinja's
/// none iterates as empty): what Hugging Face passes as `tools` and
/// `documents` when there are none. It is false, prints `None`, is `none`
/// to the `none` test and `null` to `tojson`.
#[derive(Debug)]
struct PyNone;

impl Object for PyNone {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }
    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::NonEnumerable
    }
    fn is_true(self: &Arc<Self>) -> bool {
        false
    }
    fn render(self: &Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("None")
    }
}

/// A Python `None` (see [`PyNone`]).
pub(super) fn none() -> Value {
    Value::from_object(PyNone)
}

/// A Python generator: iterates once (later iterations are empty), has
/// no length, is always true, and `json.dumps` refuses it.
#[derive(Debug)]
struct Generator(std::sync::Mutex<Option<Vec<Value>>>);

impl Object for Generator {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Iterable
    }
    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let items = self.0.lock().map(|mut items| items.take()).unwrap_or_default();
        Enumerator::Iter(Box::new(items.unwrap_or_default().into_iter()))
    }
    fn is_true(self: &Arc<Self>) -> bool {
        true
    }
    fn render(self: &Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<generator object>")
    }
}

/// `items` as a Python generator (see [`Generator`]).
pub(super) fn generator(items: Vec<Value>) -> Value {
    Value::from_object(Generator(std::sync::Mutex::new(Some(items))))
}

/// Whether `value` is the Python `None` of [`none`].
pub(super) fn is_py_none(value: &Value) -> bool {
    value.downcast_object_ref::<PyNone>().is_some()
}

/// Python's `str(value)`: what `{{ value }}` prints in jinja2.
pub(super) fn str_of(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        ValueKind::Undefined => {}
        _ => repr(value, out),
    }
}

/// Python's `repr(value)`, as it appears inside a printed list or dict.
fn repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Plain if is_py_none(value) => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => number(value, out),
        ValueKind::String => string_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(&item, out);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(&key, out);
                out.push_str(": ");
                repr(&value.get_item(&key).unwrap_or_default(), out);
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Python's repr of a string: single quotes unless the text holds a single
/// quote and no double one; backslash escapes for control characters.
fn string_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

fn number(value: &Value, out: &mut String) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
    } else if let Ok(x) = f64::try_from(value.clone()) {
        float_repr(x, out);
    } else {
        let _ = write!(out, "{value}");
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, fixed
/// notation for exponents -4..16 (with `.0` when whole), else `1e+16`.
pub(super) fn float_repr(x: f64, out: &mut String) {
    if x.is_nan() {
        out.push_str("nan");
        return;
    }
    if x.is_infinite() {
        out.push_str(if x > 0.0 { "inf" } else { "-inf" });
        return;
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `-1.25e-7`.
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    out.push_str(sign);
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            out.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
}

/// The keyword arguments of `json.dumps` that templates pass to `tojson`.
#[derive(Debug)]
pub(super) struct JsonStyle {
    /// `None`: one line; `Some(prefix)`: one item per line, nested by `prefix`.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
}

impl Default for JsonStyle {
    fn default() -> Self {
        JsonStyle {
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
            ensure_ascii: false,
        }
    }
}

/// `json.dumps(value, ...)` with Python's output byte for byte.
pub(super) fn json_dumps(value: &Value, style: &JsonStyle, out: &mut String) -> Result<(), Error> {
    json_value(value, style, 0, out)
}

fn json_value(value: &Value, style: &JsonStyle, depth: usize, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Plain if is_py_none(value) => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if value.is_integer() {
                let _ = write!(out, "{value}");
            } else {
                let x = f64::try_from(value.clone())?;
                if x.is_nan() {
                    out.push_str("NaN");
                } else if x.is_infinite() {
                    out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" });
                } else {
                    float_repr(x, out);
                }
            }
        }
        ValueKind::String => json_string(value.as_str().unwrap_or_default(), style.ensure_ascii, out),
        ValueKind::Iterable if value.downcast_object_ref::<Generator>().is_some() => {
            return Err(Error::new(ErrorKind::InvalidOperation, "Object of type generator is not JSON serializable"));
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            json_container(out, style, depth, '[', ']', &items, |item, out| json_value(item, style, depth + 1, out))?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if style.sort_keys {
                keys.sort_by_cached_key(ToString::to_string);
            }
            json_container(out, style, depth, '{', '}', &keys, |key, out| {
                match key.as_str() {
                    Some(k) => json_string(k, style.ensure_ascii, out),
                    // json.dumps turns int, float, bool and None keys into strings.
                    None => {
                        let mut k = String::new();
                        json_value(key, style, depth + 1, &mut k)?;
                        json_string(&k, style.ensure_ascii, out);
                    }
                }
                out.push_str(&style.key_separator);
                json_value(&value.get_item(key)?, style, depth + 1, out)
            })?;
        }
        ValueKind::Undefined => {
            return Err(Error::new(ErrorKind::InvalidOperation, "Object of type Undefined is not JSON serializable"));
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {kind} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

fn json_container(
    out: &mut String,
    style: &JsonStyle,
    depth: usize,
    open: char,
    close: char,
    items: &[Value],
    mut item: impl FnMut(&Value, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, depth: usize| {
        if let Some(indent) = &style.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    };
    newline(out, depth + 1);
    for (i, v) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_separator);
            newline(out, depth + 1);
        }
        item(v, out)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

fn json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// A UTC calendar time broken down from Unix seconds.
struct Civil {
    year: i64,
    month: u32,     // 1..=12
    day: u32,       // 1..=31
    yday: u32,      // 1..=366
    weekday: usize, // 0 = Monday
    hour: u32,
    minute: u32,
    second: u32,
}

fn civil(unix: i64) -> Civil {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400) as u32;
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let before = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334][month as usize - 1];
    let yday = before + day + u32::from(leap && month > 2);
    // 1970-01-01 was a Thursday.
    let weekday = (days + 3).rem_euclid(7) as usize;
    Civil { year, month, day, yday, weekday, hour: secs / 3600, minute: secs / 60 % 60, second: secs % 60 }
}

/// `datetime.strftime(format)` for a UTC time, with the directives chat
/// templates use; an unknown directive is kept as written, as glibc does.
pub(super) fn strftime(unix: i64, format: &str) -> String {
    let t = civil(unix);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let month = MONTHS[t.month as usize - 1];
        let weekday = WEEKDAYS[t.weekday];
        let _ = match d {
            'Y' => write!(out, "{}", t.year),
            'y' => write!(out, "{:02}", t.year.rem_euclid(100)),
            'm' => write!(out, "{:02}", t.month),
            'd' => write!(out, "{:02}", t.day),
            'e' => write!(out, "{:2}", t.day),
            'j' => write!(out, "{:03}", t.yday),
            'B' => write!(out, "{month}"),
            'b' | 'h' => write!(out, "{}", &month[..3]),
            'A' => write!(out, "{weekday}"),
            'a' => write!(out, "{}", &weekday[..3]),
            'u' => write!(out, "{}", t.weekday + 1),
            'w' => write!(out, "{}", (t.weekday + 1) % 7),
            'H' => write!(out, "{:02}", t.hour),
            'I' => write!(out, "{:02}", (t.hour + 11) % 12 + 1),
            'p' => write!(out, "{}", if t.hour < 12 { "AM" } else { "PM" }),
            'M' => write!(out, "{:02}", t.minute),
            'S' => write!(out, "{:02}", t.second),
            'F' => write!(out, "{}-{:02}-{:02}", t.year, t.month, t.day),
            'T' => write!(out, "{:02}:{:02}:{:02}", t.hour, t.minute, t.second),
            'Z' => write!(out, "UTC"),
            'z' => write!(out, "+0000"),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr_of(v: Value) -> String {
        let mut s = String::new();
        str_of(&v, &mut s);
        s
    }

    #[test]
    fn floats_print_like_python() {
        let cases = [
            (18.0, "18.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.25e-7, "1.25e-07"),
        ];
        for (x, want) in cases {
            let mut s = String::new();
            float_repr(x, &mut s);
            assert_eq!(s, want, "{x}");
        }
    }

    #[test]
    fn values_print_like_python_str() {
        assert_eq!(repr_of(Value::from(true)), "True");
        assert_eq!(repr_of(Value::from(())), "None");
        assert_eq!(repr_of(Value::from("it's")), "it's");
        let v = Value::from_serialize(serde_json::json!({"a": [1, 2.0, "x'", null, false], "b": "q\"'"}));
        assert_eq!(repr_of(v), r#"{'a': [1, 2.0, "x'", None, False], 'b': 'q"\''}"#);
    }

    #[test]
    fn json_dumps_matches_python() {
        let v = Value::from_serialize(serde_json::json!({"z": "Zürich \"q\"\n", "a": [1, 2.5, true, null], "e": {}}));
        let mut s = String::new();
        json_dumps(&v, &JsonStyle::default(), &mut s).unwrap();
        assert_eq!(s, r#"{"z": "Zürich \"q\"\n", "a": [1, 2.5, true, null], "e": {}}"#);
        let style = JsonStyle {
            indent: Some("  ".into()),
            item_separator: ",".into(),
            ensure_ascii: true,
            ..JsonStyle::default()
        };
        let mut s = String::new();
        json_dumps(&v, &style, &mut s).unwrap();
        assert_eq!(
            s,
            "{\n  \"z\": \"Z\\u00fcrich \\\"q\\\"\\n\",\n  \"a\": [\n    1,\n    2.5,\n    true,\n    null\n  ],\n  \"e\": {}\n}"
        );
    }

    #[test]
    fn strftime_formats_utc_dates() {
        // 2025-12-01 00:00:00 UTC, a Monday.
        assert_eq!(strftime(1_764_547_200, "%d %B %Y"), "01 December 2025");
        assert_eq!(
            strftime(1_764_547_200, "%Y-%m-%d %A %a %b %j %H:%M:%S %%"),
            "2025-12-01 Monday Mon Dec 335 00:00:00 %"
        );
        // 2024-02-29 13:05:09 UTC, a leap day, a Thursday.
        assert_eq!(strftime(1_709_211_909, "%F %T %I %p %u %w %y"), "2024-02-29 13:05:09 01 PM 4 4 24");
    }
}
