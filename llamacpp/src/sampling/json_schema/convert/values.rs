//! What the schema walk reads off schema values: counts and lists,
//! types, and whether the branches of a `oneOf` can overlap.

use std::collections::HashSet;

use serde_json::{Map, Value};

use super::*;

/// `x{lo,hi}` in GBNF (`x` atomic), empty for `{0,0}`.
pub(super) fn repeat(x: &str, lo: u64, hi: Option<u64>) -> String {
    match (lo, hi) {
        (_, Some(0)) => String::new(),
        (0, None) => format!("{x}*"),
        (1, None) => format!("{x}+"),
        (0, Some(1)) => format!("{x}?"),
        (1, Some(1)) => x.to_string(),
        (lo, None) => format!("{x}{{{lo},}}"),
        (lo, Some(hi)) if lo == hi => format!("{x}{{{lo}}}"),
        (lo, Some(hi)) => format!("{x}{{{lo},{hi}}}"),
    }
}

/// A count keyword (`minLength`, `maxItems`, ...): a non-negative integer
/// up to [`MAX_COUNT`].
pub(super) fn count(map: &Map<String, Value>, key: &str, pointer: &str) -> Result<Option<u64>> {
    let Some(v) = map.get(key) else { return Ok(None) };
    let n = v.as_u64().or_else(|| v.as_f64().filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < 1e18).map(|f| f as u64));
    match n {
        None => Err(err(&child(pointer, key), format!("`{key}` must be a non-negative integer"))),
        Some(n) if n > MAX_COUNT => {
            Err(err(&child(pointer, key), format!("`{key}` above {MAX_COUNT} is not supported")))
        }
        Some(n) => Ok(Some(n)),
    }
}

pub(super) fn string_list<'v>(v: &'v Value, pointer: &str) -> Result<Vec<&'v str>> {
    v.as_array()
        .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
        .ok_or_else(|| err(pointer, "must be an array of strings"))
}

/// Whether `v` is of JSON Schema type `t`.
pub(super) fn has_type(v: &Value, t: &str) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "object" => v.is_object(),
        "array" => v.is_array(),
        _ => false,
    }
}

/// The JSON kinds a schema can accept (`number` covers integers), if it
/// says (by `type`, `const` or `enum`).
/// Comparisons [`Converter::check_disjoint`] may make for one `oneOf`
/// (about a tenth of a second): 4,000 branches, or far fewer with large
/// discriminator enums.
pub(super) const ONE_OF_WORK_LIMIT: usize = 8_000_000;

/// A `oneOf` branch as `check_disjoint` compares it.
pub(super) struct Shape {
    /// The JSON types it allows (`None`: any).
    pub(super) kinds: Option<Vec<&'static str>>,
    /// Required properties with listed values (`None`: not such an object).
    pub(super) discriminators: Option<Vec<(String, HashSet<String>)>>,
}

impl Shape {
    /// Whether no value matches both, and the comparisons it took.
    pub(super) fn disjoint(&self, other: &Shape) -> (bool, usize) {
        let mut cost = 1;
        if let (Some(ka), Some(kb)) = (&self.kinds, &other.kinds) {
            cost += ka.len() * kb.len();
            if ka.iter().all(|k| !kb.contains(k)) {
                return (true, cost);
            }
        }
        let (Some(da), Some(db)) = (&self.discriminators, &other.discriminators) else { return (false, cost) };
        for (name, va) in da {
            cost += db.len();
            let Some((_, vb)) = db.iter().find(|(n, _)| n == name) else { continue };
            let (small, large) = if va.len() <= vb.len() { (va, vb) } else { (vb, va) };
            cost += small.len();
            if small.iter().all(|v| !large.contains(v)) {
                return (true, cost);
            }
        }
        (false, cost)
    }
}

/// JSON text that equal values share: object keys sorted (maps keep their
/// insertion order here, which `==` ignores and `to_string` does not).
pub(super) fn canonical(v: &Value) -> String {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            let body: Vec<String> =
                entries.into_iter().map(|(k, v)| format!("{}:{}", Value::from(k.as_str()), canonical(v))).collect();
            format!("{{{}}}", body.join(","))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(canonical).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

pub(super) fn kinds(s: &Value) -> Option<Vec<&'static str>> {
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    if let Some(c) = s.get("const") {
        return Some(vec![kind(c)]);
    }
    if let Some(Value::Array(vs)) = s.get("enum") {
        return Some(vs.iter().map(kind).collect());
    }
    let norm = |t: &str| -> Option<&'static str> {
        Some(match t {
            "integer" | "number" => "number",
            "null" => "null",
            "boolean" => "boolean",
            "string" => "string",
            "array" => "array",
            "object" => "object",
            _ => return None,
        })
    };
    match s.get("type")? {
        Value::String(t) => Some(vec![norm(t)?]),
        Value::Array(ts) => ts.iter().map(|t| t.as_str().and_then(norm)).collect(),
        _ => None,
    }
}

/// `%XX` decoding of a URI fragment.
pub(super) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(h) = s.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(h, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
