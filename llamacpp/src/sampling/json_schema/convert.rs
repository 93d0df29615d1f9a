//! The schema walk: each subschema becomes a GBNF expression, named rules
//! for `$ref` targets (so recursion works) and for repeated parts.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::rules;
use super::{is_annotation, pointer_token};
use crate::{Error, Result};

mod types;
mod values;

use values::*;

/// Nesting deeper than this (of subschemas, as walked) is an error rather
/// than a stack overflow.
const MAX_DEPTH: usize = 128;
/// The most items, characters or repetitions a bound may ask for: GBNF
/// expands bounded repetitions into that many rules.
const MAX_COUNT: u64 = 1000;

/// Keywords with some support (each type's handler reads its own and
/// rejects the values it cannot express).
const SUPPORTED: &[&str] = &[
    "type",
    "enum",
    "const",
    "$ref",
    "anyOf",
    "oneOf",
    "allOf",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
];

const OBJECT_KEYS: &[&str] = &["properties", "required", "additionalProperties"];
const ARRAY_KEYS: &[&str] = &["items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"];
const STRING_KEYS: &[&str] = &["minLength", "maxLength", "pattern", "format"];
const NUMBER_KEYS: &[&str] = &["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];

pub(super) fn err(pointer: &str, message: impl Into<String>) -> Error {
    Error::JsonSchema { pointer: pointer.to_string(), message: message.into() }
}

fn child(pointer: &str, token: &str) -> String {
    format!("{pointer}/{}", pointer_token(token))
}

/// A `$ref` target: its rule name, the nesting guard when its walk began,
/// and whether the walk is done.
struct RefRule {
    name: String,
    guard: usize,
    done: bool,
}

pub(super) struct Converter<'a> {
    root: &'a Value,
    /// Rules in order of creation (`None`: reserved, body still to come).
    rules: Vec<(String, Option<String>)>,
    taken: HashSet<String>,
    /// The next number to try after a rule name's base (see `fresh`).
    next_suffix: HashMap<String, usize>,
    by_body: HashMap<String, String>,
    refs: HashMap<String, RefRule>,
    /// How many literals deep the walk is (inside `{`/`[`): a `$ref` met
    /// again at the same guard is left recursion.
    guard: usize,
    depth: usize,
}

impl<'a> Converter<'a> {
    pub(super) fn new(root: &'a Value) -> Self {
        Converter {
            root,
            rules: Vec::new(),
            taken: HashSet::new(),
            next_suffix: HashMap::new(),
            by_body: HashMap::new(),
            refs: HashMap::new(),
            guard: 0,
            depth: 0,
        }
    }

    /// The grammar, with `root` as its start rule.
    pub(super) fn run(mut self) -> Result<String> {
        if let Value::Object(map) = self.root
            && let Some(id) = map.get("$id")
            && !id.is_string()
        {
            return Err(err("/$id", "`$id` must be a string"));
        }
        self.reference("#", "")?;
        let mut out = String::new();
        for (name, body) in &self.rules {
            let body = body.as_deref().unwrap_or("\"\"");
            out.push_str(&format!("{name} ::= {body}\n"));
        }
        Ok(out)
    }

    fn fresh(&mut self, hint: &str) -> String {
        let mut base: String =
            hint.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
        while base.contains("--") {
            base = base.replace("--", "-");
        }
        let base = base.trim_matches('-').to_string();
        let base = if base.is_empty() { "r".to_string() } else { base };
        // Numbered from where the last rule of this base left off: rules
        // that share a hint (a property name used at many places) would
        // otherwise each try every earlier number.
        let mut n = self.next_suffix.get(&base).copied().unwrap_or(0);
        let mut name = if n == 0 { base.clone() } else { format!("{base}-{n}") };
        while self.taken.contains(&name) || rules::primitive(&name).is_some() {
            n += 1;
            name = format!("{base}-{n}");
        }
        self.next_suffix.insert(base, n + 1);
        self.taken.insert(name.clone());
        name
    }

    /// A named rule for `body` (shared with an identical earlier body).
    fn add(&mut self, hint: &str, body: String) -> String {
        if let Some(name) = self.by_body.get(&body) {
            return name.clone();
        }
        let name = self.fresh(hint);
        self.rules.push((name.clone(), Some(body.clone())));
        self.by_body.insert(body, name.clone());
        name
    }

    /// A primitive rule (and the ones it uses), by name.
    fn prim(&mut self, name: &str) -> String {
        if !self.taken.contains(name)
            && let Some((body, deps)) = rules::primitive(name)
        {
            self.taken.insert(name.to_string());
            self.rules.push((name.to_string(), Some(body.to_string())));
            for dep in deps {
                self.prim(dep);
            }
        }
        name.to_string()
    }

    /// The rule of a local `$ref` (`#` or `#/json/pointer`).
    fn reference(&mut self, reference: &str, pointer: &str) -> Result<String> {
        let Some(fragment) = reference.strip_prefix('#') else {
            return Err(err(pointer, format!("`$ref` {reference:?}: only local references (`#/...`) are supported")));
        };
        let target_pointer = percent_decode(fragment);
        if !(target_pointer.is_empty() || target_pointer.starts_with('/')) {
            return Err(err(pointer, format!("`$ref` {reference:?}: anchors are not supported, only JSON pointers")));
        }
        if let Some(r) = self.refs.get(&target_pointer) {
            if !r.done && r.guard == self.guard {
                return Err(err(
                    pointer,
                    format!("`$ref` {reference:?} recurses without consuming input (left recursion)"),
                ));
            }
            return Ok(r.name.clone());
        }
        let Some(target) = self.root.pointer(&target_pointer) else {
            return Err(err(pointer, format!("`$ref` {reference:?} does not resolve")));
        };
        let name = if target_pointer.is_empty() {
            self.taken.insert("root".into());
            "root".to_string()
        } else {
            self.fresh(&format!("ref{target_pointer}"))
        };
        let slot = self.rules.len();
        self.rules.push((name.clone(), None));
        self.refs.insert(target_pointer.clone(), RefRule { name: name.clone(), guard: self.guard, done: false });
        let body = self.visit(target, &target_pointer, &name)?;
        self.rules[slot].1 = Some(body);
        if let Some(r) = self.refs.get_mut(&target_pointer) {
            r.done = true;
        }
        Ok(name)
    }

    /// A GBNF expression (a rule name, literal or parenthesised group)
    /// for the JSON text of the values `schema` accepts, with whitespace
    /// after it.
    pub(super) fn visit(&mut self, schema: &'a Value, pointer: &str, hint: &str) -> Result<String> {
        if self.depth >= MAX_DEPTH {
            return Err(err(pointer, format!("the schema nests deeper than {MAX_DEPTH} levels")));
        }
        self.depth += 1;
        let result = self.visit_inner(schema, pointer, hint);
        self.depth -= 1;
        result
    }

    fn visit_inner(&mut self, schema: &'a Value, pointer: &str, hint: &str) -> Result<String> {
        let map = match schema {
            Value::Bool(true) => return Ok(self.prim("value")),
            Value::Bool(false) => return Err(err(pointer, "the schema `false` accepts nothing")),
            Value::Object(map) => map,
            _ => return Err(err(pointer, "a schema must be an object or a boolean")),
        };
        // Every keyword is supported, an annotation, or an error.
        let mut keys = Vec::new();
        for key in map.keys() {
            if key == "$id" && !pointer.is_empty() {
                return Err(err(&child(pointer, key), "`$id` below the root is not supported"));
            }
            if is_annotation(key) {
                continue;
            }
            if !SUPPORTED.contains(&key.as_str()) {
                return Err(err(&child(pointer, key), format!("the keyword `{key}` is not supported")));
            }
            keys.push(key.as_str());
        }
        let only = |allowed: &[&str], what: &str| -> Result<()> {
            match keys.iter().find(|k| !allowed.contains(k)) {
                Some(k) => Err(err(&child(pointer, k), format!("`{k}` next to `{what}` is not supported"))),
                None => Ok(()),
            }
        };
        if let Some(r) = map.get("$ref") {
            only(&["$ref"], "$ref")?;
            let Some(r) = r.as_str() else { return Err(err(&child(pointer, "$ref"), "`$ref` must be a string")) };
            return self.reference(r, &child(pointer, "$ref"));
        }
        if map.contains_key("const") || map.contains_key("enum") {
            only(&["const", "enum", "type"], if map.contains_key("const") { "const" } else { "enum" })?;
            return self.literals(map, pointer, hint);
        }
        for combinator in ["anyOf", "oneOf", "allOf"] {
            if let Some(branches) = map.get(combinator) {
                only(&[combinator], combinator)?;
                let p = child(pointer, combinator);
                let Some(branches) = branches.as_array().filter(|b| !b.is_empty()) else {
                    return Err(err(&p, format!("`{combinator}` must be a non-empty array")));
                };
                return match combinator {
                    "allOf" => self.all_of(branches, &p, hint),
                    "oneOf" => {
                        self.check_disjoint(branches, &p)?;
                        self.any_of(branches, &p, hint)
                    }
                    _ => self.any_of(branches, &p, hint),
                };
            }
        }
        let types: Vec<&str> = match map.get("type") {
            None => {
                let mut inferred = Vec::new();
                for (t, ks) in
                    [("object", OBJECT_KEYS), ("array", ARRAY_KEYS), ("string", STRING_KEYS), ("number", NUMBER_KEYS)]
                {
                    if keys.iter().any(|k| ks.contains(k)) {
                        inferred.push(t);
                    }
                }
                if inferred.is_empty() {
                    return Ok(self.prim("value"));
                }
                inferred
            }
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) if !ts.is_empty() => {
                let mut out = Vec::new();
                for t in ts {
                    match t.as_str() {
                        Some(t) if !out.contains(&t) => out.push(t),
                        Some(_) => {}
                        None => return Err(err(&child(pointer, "type"), "`type` entries must be strings")),
                    }
                }
                out
            }
            Some(_) => return Err(err(&child(pointer, "type"), "`type` must be a string or a non-empty array")),
        };
        let mut alts = Vec::new();
        for t in types {
            let h = if alts.is_empty() { hint.to_string() } else { format!("{hint}-{t}") };
            alts.push(self.typed(t, map, pointer, &h)?);
        }
        Ok(if alts.len() == 1 { alts.pop().unwrap_or_default() } else { format!("({})", alts.join(" | ")) })
    }

    fn typed(&mut self, t: &str, map: &'a Map<String, Value>, pointer: &str, hint: &str) -> Result<String> {
        match t {
            "null" => Ok(self.prim("null")),
            "boolean" => Ok(self.prim("boolean")),
            "string" => self.string(map, pointer, hint),
            "integer" => self.integer(map, pointer, hint),
            "number" => self.number(map, pointer, hint),
            "object" => self.object(map, pointer, hint),
            "array" => self.array(map, pointer, hint),
            other => Err(err(&child(pointer, "type"), format!("unknown type {other:?}"))),
        }
    }

    /// `const` / `enum`: the exact serialized values (of the listed types).
    fn literals(&mut self, map: &Map<String, Value>, pointer: &str, hint: &str) -> Result<String> {
        let values: Vec<&Value> = match (map.get("const"), map.get("enum")) {
            (Some(_), Some(_)) => return Err(err(&child(pointer, "enum"), "`enum` next to `const` is not supported")),
            (Some(c), None) => vec![c],
            (None, Some(Value::Array(vs))) if !vs.is_empty() => vs.iter().collect(),
            _ => return Err(err(&child(pointer, "enum"), "`enum` must be a non-empty array")),
        };
        let types: Option<Vec<&str>> = match map.get("type") {
            None => None,
            Some(Value::String(t)) => Some(vec![t.as_str()]),
            Some(Value::Array(ts)) => Some(ts.iter().filter_map(Value::as_str).collect()),
            Some(_) => return Err(err(&child(pointer, "type"), "`type` must be a string or an array")),
        };
        // Each value once, in order; a set keeps it linear in the values
        // (40,000 of them took 1.1 s with a list scan).
        let mut alts = Vec::new();
        let mut seen = HashSet::new();
        for v in values {
            if types.as_ref().is_some_and(|ts| !ts.iter().any(|t| has_type(v, t))) {
                continue;
            }
            let text = serde_json::to_string(v).map_err(|e| err(pointer, e.to_string()))?;
            let lit = rules::literal(&text);
            if seen.insert(lit.clone()) {
                alts.push(lit);
            }
        }
        if alts.is_empty() {
            return Err(err(pointer, "no `enum`/`const` value has the schema's `type`: it accepts nothing"));
        }
        let space = self.prim("space");
        Ok(self.add(hint, format!("({}) {space}", alts.join(" | "))))
    }

    fn any_of(&mut self, branches: &'a [Value], pointer: &str, hint: &str) -> Result<String> {
        let mut alts = Vec::new();
        let mut seen = HashSet::new();
        for (i, b) in branches.iter().enumerate() {
            let e = self.visit(b, &format!("{pointer}/{i}"), &format!("{hint}-{i}"))?;
            if seen.insert(e.clone()) {
                alts.push(e);
            }
        }
        Ok(if alts.len() == 1 { alts.pop().unwrap_or_default() } else { self.add(hint, alts.join(" | ")) })
    }

    /// `oneOf` is exact only where no value can match two branches: each
    /// pair must differ in type, or both be objects whose required
    /// property has a different `const`/`enum` in each (a discriminator).
    ///
    /// Every pair is compared, so the work is bounded
    /// ([`ONE_OF_WORK_LIMIT`]): past it the schema is refused (use
    /// `anyOf`), however large the request that carries it.
    fn check_disjoint(&self, branches: &[Value], pointer: &str) -> Result<()> {
        let shapes: Vec<Shape> = branches.iter().map(|b| self.shape(b)).collect();
        let mut work = 0usize;
        for i in 0..shapes.len() {
            for j in i + 1..shapes.len() {
                let (disjoint, cost) = shapes[i].disjoint(&shapes[j]);
                work += cost;
                if work > ONE_OF_WORK_LIMIT {
                    return Err(err(
                        pointer,
                        format!(
                            "`oneOf` with {} branches is too costly to check pair by pair (over {ONE_OF_WORK_LIMIT} \
                             comparisons): use `anyOf`",
                            branches.len()
                        ),
                    ));
                }
                if !disjoint {
                    return Err(err(
                        pointer,
                        format!(
                            "`oneOf` branches {i} and {j} may both match a value (they are not of distinct types or \
                             told apart by a required `const` property): use `anyOf`"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn resolve<'v>(&'v self, mut schema: &'v Value) -> &'v Value {
        for _ in 0..32 {
            match schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#')) {
                Some(p) => match self.root.pointer(&percent_decode(p)) {
                    Some(t) => schema = t,
                    None => break,
                },
                None => break,
            }
        }
        schema
    }

    /// What [`Shape::disjoint`] compares of a `oneOf` branch.
    fn shape(&self, branch: &Value) -> Shape {
        let s = self.resolve(branch);
        let kinds = kinds(s).map(|mut ks| {
            ks.sort_unstable();
            ks.dedup();
            ks
        });
        // The required properties whose values a `const` or `enum` lists
        // (as canonical JSON text, so that they can be hashed).
        let discriminators = (|| {
            let required = s.get("required")?.as_array()?;
            let props = s.get("properties")?.as_object()?;
            Some(
                required
                    .iter()
                    .filter_map(Value::as_str)
                    .filter_map(|r| {
                        let p = self.resolve(props.get(r)?);
                        let values: HashSet<String> = match (p.get("const"), p.get("enum")) {
                            (Some(c), _) => std::iter::once(canonical(c)).collect(),
                            (None, Some(Value::Array(vs))) => vs.iter().map(canonical).collect(),
                            _ => return None,
                        };
                        Some((r.to_string(), values))
                    })
                    .collect(),
            )
        })();
        Shape { kinds, discriminators }
    }

    /// `allOf`: one branch is that branch; several must be plain objects
    /// (`properties`, `required`, `type: "object"`, or a `$ref` to one),
    /// merged. A property in two branches is an error.
    fn all_of(&mut self, branches: &'a [Value], pointer: &str, hint: &str) -> Result<String> {
        if let [only] = branches {
            return self.visit(only, &format!("{pointer}/0"), hint);
        }
        let mut props: Vec<(&'a str, &'a Value, String)> = Vec::new();
        let mut required: Vec<(&'a str, String)> = Vec::new();
        for (i, b) in branches.iter().enumerate() {
            let bp = format!("{pointer}/{i}");
            let (mut schema, mut sp) = (b, bp.clone());
            for _ in 0..32 {
                let Some(r) = schema.get("$ref") else { break };
                let target = r.as_str().and_then(|r| r.strip_prefix('#')).map(percent_decode);
                match target.as_deref().and_then(|t| self.root.pointer(t).map(|s| (s, t.to_string()))) {
                    Some((s, t))
                        if schema.as_object().is_some_and(|m| m.keys().all(|k| k == "$ref" || is_annotation(k))) =>
                    {
                        schema = s;
                        sp = t;
                    }
                    _ => {
                        return Err(err(
                            &sp,
                            "`allOf` of a `$ref` that is not a plain local reference is not supported",
                        ));
                    }
                }
            }
            let Some(map) = schema.as_object() else {
                return Err(err(&sp, "`allOf` of more than one schema supports object schemas only"));
            };
            for (k, v) in map {
                match k.as_str() {
                    "type" if v == "object" => {}
                    "properties" => {
                        let Some(ps) = v.as_object() else {
                            return Err(err(&child(&sp, k), "`properties` must be an object"));
                        };
                        for (name, s) in ps {
                            if props.iter().any(|(n, ..)| n == name) {
                                return Err(err(
                                    &child(&child(&sp, k), name),
                                    format!("`allOf` defines property {name:?} twice"),
                                ));
                            }
                            props.push((name, s, child(&child(&sp, k), name)));
                        }
                    }
                    "required" => {
                        required.extend(string_list(v, &child(&sp, k))?.into_iter().map(|r| (r, child(&sp, k))))
                    }
                    k if is_annotation(k) => {}
                    _ => {
                        return Err(err(&child(&sp, k), format!("`{k}` in an `allOf` of objects is not supported")));
                    }
                }
            }
        }
        let required: Vec<(&str, String)> = required;
        self.object_rule(props, &required, None, hint)
    }
}
