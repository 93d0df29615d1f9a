//! The rules of each JSON type: strings (lengths, patterns, formats),
//! numbers (exact ranges), objects and arrays.

use serde_json::{Map, Value};

use super::{Converter, child, count, err, repeat, string_list};
use crate::sampling::json_schema::rules::{self, NumBound};
use crate::{Error, Result};

impl<'a> Converter<'a> {
    pub(super) fn string(&mut self, map: &Map<String, Value>, pointer: &str, hint: &str) -> Result<String> {
        let min = count(map, "minLength", pointer)?;
        let max = count(map, "maxLength", pointer)?;
        let q = rules::literal("\"");
        let space = self.prim("space");
        if let Some(format) = map.get("format") {
            let fp = child(pointer, "format");
            if let Some(k) = ["minLength", "maxLength", "pattern"].into_iter().find(|k| map.contains_key(*k)) {
                return Err(err(&child(pointer, k), format!("`{k}` next to `format` is not supported")));
            }
            let f = match format.as_str() {
                Some(f @ ("date" | "time" | "date-time" | "uuid" | "email")) => f,
                Some(f) => return Err(err(&fp, format!("the format {f:?} is not supported"))),
                None => return Err(err(&fp, "`format` must be a string")),
            };
            let f = self.prim(f);
            return Ok(self.add(&format!("{f}-string"), format!("{q} {f} {q} {space}")));
        }
        let c = self.prim("char");
        if let Some(pattern) = map.get("pattern") {
            let pp = child(pointer, "pattern");
            if let Some(k) = ["minLength", "maxLength"].into_iter().find(|k| map.contains_key(*k)) {
                return Err(err(&child(pointer, k), format!("`{k}` next to `pattern` is not supported")));
            }
            let Some(pattern) = pattern.as_str() else { return Err(err(&pp, "`pattern` must be a string")) };
            let body = crate::sampling::json_schema::regex::pattern_to_gbnf(pattern, &c)
                .map_err(|m| err(&pp, format!("`pattern`: {m}")))?;
            return Ok(self.add(hint, format!("{q} {body} {q} {space}")));
        }
        if min.is_none() && max.is_none() {
            return Ok(self.prim("string"));
        }
        let (lo, hi) = (min.unwrap_or(0), max);
        if hi.is_some_and(|h| h < lo) {
            return Err(err(&child(pointer, "maxLength"), "`maxLength` is below `minLength`: accepts nothing"));
        }
        Ok(self.add(hint, format!("{q} {} {q} {space}", repeat(&c, lo, hi))))
    }

    pub(super) fn integer(&mut self, map: &Map<String, Value>, pointer: &str, hint: &str) -> Result<String> {
        let (lo, hi) = bounds(map, pointer, true)?;
        if lo.is_none() && hi.is_none() {
            return Ok(self.prim("integer"));
        }
        // Integer bounds: inclusive after rounding.
        let lo = lo.map(|b| if b.inclusive { b.value } else { b.value + 1 });
        let hi = hi.map(|b| if b.inclusive { b.value } else { b.value - 1 });
        let Some(body) = rules::int_range(lo, hi) else {
            return Err(err(pointer, "the bounds admit no integer"));
        };
        let space = self.prim("space");
        Ok(self.add(hint, format!("({body}) {space}")))
    }

    pub(super) fn number(&mut self, map: &Map<String, Value>, pointer: &str, hint: &str) -> Result<String> {
        let (lo, hi) = bounds(map, pointer, false)?;
        if lo.is_none() && hi.is_none() {
            return Ok(self.prim("number"));
        }
        let Some(body) = rules::number_range(lo, hi) else {
            return Err(err(pointer, "the bounds admit no number"));
        };
        let space = self.prim("space");
        Ok(self.add(hint, format!("({body}) {space}")))
    }

    pub(super) fn object(&mut self, map: &'a Map<String, Value>, pointer: &str, hint: &str) -> Result<String> {
        let props_pointer = child(pointer, "properties");
        let props: Vec<(&'a str, &'a Value, String)> = match map.get("properties") {
            None => Vec::new(),
            Some(Value::Object(ps)) => ps.iter().map(|(k, v)| (k.as_str(), v, child(&props_pointer, k))).collect(),
            Some(_) => return Err(err(&props_pointer, "`properties` must be an object")),
        };
        let required: Vec<(&str, String)> = match map.get("required") {
            None => Vec::new(),
            Some(v) => string_list(v, &child(pointer, "required"))?
                .into_iter()
                .map(|r| (r, child(pointer, "required")))
                .collect(),
        };
        let additional = map.get("additionalProperties");
        if props.is_empty() && required.is_empty() && additional.is_none_or(|a| a == &Value::Bool(true)) {
            return Ok(self.prim("object"));
        }
        self.object_rule(props, &required, additional.map(|a| (a, child(pointer, "additionalProperties"))), hint)
    }

    /// An object with the declared properties in order (required ones
    /// always, optional ones optionally) and then, if `additional` allows
    /// them, other properties (not named like a declared one). Without
    /// `additionalProperties`, no other properties are generated.
    pub(super) fn object_rule(
        &mut self,
        props: Vec<(&'a str, &'a Value, String)>,
        required: &[(&str, String)],
        additional: Option<(&'a Value, String)>,
        hint: &str,
    ) -> Result<String> {
        for (r, rp) in required {
            if !props.iter().any(|(n, ..)| n == r) {
                return Err(err(rp, format!("required property {r:?} is not in `properties` (not supported)")));
            }
        }
        let space = self.prim("space");
        self.guard += 1;
        let result = (|| {
            let mut kvs = Vec::new();
            for (name, schema, p) in &props {
                let key = serde_json::to_string(name).map_err(|e| err(p, e.to_string()))?;
                let value = self.visit(schema, p, &format!("{hint}-{name}"))?;
                kvs.push((
                    format!("{} {space} {} {space} {value}", rules::literal(&key), rules::literal(":")),
                    required.iter().any(|(r, _)| r == name),
                ));
            }
            let extra = match additional {
                None | Some((Value::Bool(false), _)) => None,
                Some((schema, ap)) => {
                    let value = self.visit(schema, &ap, &format!("{hint}-additional"))?;
                    let key = self.key_except(props.iter().map(|(n, ..)| *n), hint);
                    Some(self.add(
                        &format!("{hint}-additional-kv"),
                        format!("{key} {} {space} {value}", rules::literal(":")),
                    ))
                }
            };
            Ok::<_, Error>((kvs, extra))
        })();
        self.guard -= 1;
        let (kvs, extra) = result?;
        let comma = format!("{} {space}", rules::literal(","));
        // seq[i][first]: properties i.. (first: no comma before the next).
        let n = kvs.len();
        let mut next: [String; 2] = match &extra {
            None => [String::new(), String::new()],
            Some(kv) => [format!("({comma} {kv})*"), format!("({kv} ({comma} {kv})*)?")],
        };
        for i in (0..n).rev() {
            let (kv, is_required) = &kvs[i];
            let mut cur: [String; 2] = [String::new(), String::new()];
            for first in [false, true] {
                let lead = if first { kv.clone() } else { format!("{comma} {kv}") };
                let present = format!("{lead} {}", next[0]).trim_end().to_string();
                let body = if *is_required {
                    present
                } else if next[usize::from(first)].is_empty() {
                    format!("({present})?")
                } else {
                    format!("({present} | {})", next[usize::from(first)])
                };
                cur[usize::from(first)] = self.add(&format!("{hint}-{i}{}", if first { "" } else { "-rest" }), body);
            }
            next = cur;
        }
        let open = rules::literal("{");
        let close = rules::literal("}");
        Ok(self.add(hint, format!("{open} {space} {} {close} {space}", next[1])))
    }

    /// A JSON string (and whitespace) other than the given names.
    fn key_except<'n>(&mut self, names: impl Iterator<Item = &'n str>, hint: &str) -> String {
        #[derive(Default)]
        struct Trie {
            end: bool,
            next: Vec<(char, Trie)>,
        }
        let mut trie = Trie::default();
        for name in names {
            let mut node = &mut trie;
            for c in name.chars() {
                let i = match node.next.iter().position(|(k, _)| *k == c) {
                    Some(i) => i,
                    None => {
                        node.next.push((c, Trie::default()));
                        node.next.len() - 1
                    }
                };
                node = &mut node.next[i].1;
            }
            node.end = true;
        }
        let c = self.prim("char");
        let space = self.prim("space");
        let q = rules::literal("\"");
        fn walk(node: &Trie, c: &str, q: &str) -> String {
            let mut alts = Vec::new();
            if !node.end {
                alts.push(q.to_string());
            }
            let mut excluded: Vec<(char, char)> = node.next.iter().map(|(k, _)| (*k, *k)).collect();
            excluded.extend([('"', '"'), ('\\', '\\'), ('\0', '\u{1f}')]);
            excluded.sort_unstable();
            alts.push(format!("{} {c}* {q}", rules::class(&excluded, true)));
            for (k, sub) in &node.next {
                let spelled = serde_json::to_string(&k.to_string()).unwrap_or_default();
                let inner = &spelled[1..spelled.len().saturating_sub(1)];
                alts.push(format!("{} {}", rules::literal(inner), walk(sub, c, q)));
            }
            format!("({})", alts.join(" | "))
        }
        let body = format!("{q} {} {space}", walk(&trie, &c, &q));
        self.add(&format!("{hint}-additional-key"), body)
    }

    pub(super) fn array(&mut self, map: &'a Map<String, Value>, pointer: &str, hint: &str) -> Result<String> {
        if let Some(u) = map.get("uniqueItems")
            && u != &Value::Bool(false)
        {
            return Err(err(&child(pointer, "uniqueItems"), "`uniqueItems: true` is not supported"));
        }
        let min = count(map, "minItems", pointer)?.unwrap_or(0);
        let max = count(map, "maxItems", pointer)?;
        if max.is_some_and(|m| m < min) {
            return Err(err(&child(pointer, "maxItems"), "`maxItems` is below `minItems`: accepts nothing"));
        }
        // The tuple part and the schema of the rest (`None`: no more items).
        let (prefix, prefix_key, rest, rest_key): (&'a [Value], &str, Option<&'a Value>, &str) =
            match (map.get("prefixItems"), map.get("items")) {
                (Some(Value::Array(p)), items) if !p.is_empty() => {
                    if map.contains_key("additionalItems") {
                        return Err(err(
                            &child(pointer, "additionalItems"),
                            "`additionalItems` next to `prefixItems` is not supported",
                        ));
                    }
                    (p, "prefixItems", Some(items.unwrap_or(&Value::Bool(true))), "items")
                }
                (Some(_), _) => {
                    return Err(err(&child(pointer, "prefixItems"), "`prefixItems` must be a non-empty array"));
                }
                (None, Some(Value::Array(p))) => {
                    (p, "items", Some(map.get("additionalItems").unwrap_or(&Value::Bool(true))), "additionalItems")
                }
                (None, items) => {
                    if map.contains_key("additionalItems") {
                        return Err(err(
                            &child(pointer, "additionalItems"),
                            "`additionalItems` without tuple `items` is not supported",
                        ));
                    }
                    (&[], "prefixItems", Some(items.unwrap_or(&Value::Bool(true))), "items")
                }
            };
        let rest = rest.filter(|r| **r != Value::Bool(false));
        let k = prefix.len() as u64;
        if rest.is_none() && min > k {
            return Err(err(&child(pointer, "minItems"), "`minItems` exceeds the tuple's length: accepts nothing"));
        }
        let space = self.prim("space");
        self.guard += 1;
        let items = (|| {
            let mut out = Vec::new();
            for (i, s) in prefix.iter().enumerate() {
                out.push(self.visit(s, &format!("{pointer}/{prefix_key}/{i}"), &format!("{hint}-{i}"))?);
            }
            let r = match rest {
                Some(r) => Some(self.visit(r, &child(pointer, rest_key), &format!("{hint}-item"))?),
                None => None,
            };
            Ok::<_, Error>((out, r))
        })();
        self.guard -= 1;
        let (items, rest) = items?;
        let comma = format!("{} {space}", rules::literal(","));
        // The rest, after the tuple.
        let limit = max.unwrap_or(u64::MAX);
        let mut body = match &rest {
            None => String::new(),
            Some(_) if limit <= k => String::new(),
            Some(r) => {
                let lo = min.saturating_sub(k);
                let hi = max.map(|m| m - k);
                if k > 0 {
                    repeat(&format!("({comma} {r})"), lo, hi)
                } else {
                    let tail = |lo: u64| repeat(&format!("({comma} {r})"), lo, hi.map(|h| h - 1));
                    if lo == 0 { format!("({r} {})?", tail(0)) } else { format!("{r} {}", tail(lo - 1)) }
                }
            }
        };
        for j in (0..items.len()).rev() {
            if j as u64 >= limit {
                continue;
            }
            let lead = if j == 0 { items[j].clone() } else { format!("{comma} {}", items[j]) };
            body = if (j as u64) < min { format!("{lead} {body}") } else { format!("({lead} {body})?") };
        }
        let (open, close) = (rules::literal("["), rules::literal("]"));
        Ok(self.add(hint, format!("{open} {space} {body} {close} {space}")))
    }
}

/// The lower and upper bounds of a number (`integer`: bounds may be any
/// number, rounded inwards; `number`: bounds must be integers). Draft 4's
/// boolean `exclusiveMinimum`/`exclusiveMaximum` are understood too.
fn bounds(map: &Map<String, Value>, pointer: &str, integer: bool) -> Result<(Option<NumBound>, Option<NumBound>)> {
    const LIMIT: f64 = 1e15;
    let get = |key: &str, lower: bool, inclusive: bool| -> Result<Option<NumBound>> {
        let Some(v) = map.get(key) else { return Ok(None) };
        let p = child(pointer, key);
        let Some(f) = v.as_f64() else { return Err(err(&p, format!("`{key}` must be a number"))) };
        if f.is_nan() || f.abs() >= LIMIT {
            return Err(err(&p, format!("`{key}` beyond ±10^15 is not supported")));
        }
        if f.fract() != 0.0 {
            if !integer {
                return Err(err(&p, format!("a non-integer `{key}` on a `number` is not supported")));
            }
            // Rounded inwards, the bound becomes inclusive.
            let r = if lower { f.ceil() } else { f.floor() };
            return Ok(Some(NumBound { value: r as i64, inclusive: true }));
        }
        Ok(Some(NumBound { value: f as i64, inclusive }))
    };
    let draft4 = |key: &str| map.get(key).and_then(Value::as_bool);
    let mut lo = get("minimum", true, draft4("exclusiveMinimum") != Some(true))?;
    let mut hi = get("maximum", false, draft4("exclusiveMaximum") != Some(true))?;
    if draft4("exclusiveMinimum").is_none()
        && let Some(b) = get("exclusiveMinimum", true, false)?
    {
        lo = Some(match lo {
            Some(l) if l.value > b.value || (l.value == b.value && !l.inclusive) => l,
            _ => b,
        });
    }
    if draft4("exclusiveMaximum").is_none()
        && let Some(b) = get("exclusiveMaximum", false, false)?
    {
        hi = Some(match hi {
            Some(h) if h.value < b.value || (h.value == b.value && !h.inclusive) => h,
            _ => b,
        });
    }
    Ok((lo, hi))
}
