//! Constrained decoding with [llguidance]: output that follows a JSON
//! Schema, a regex or a Lark grammar, enforced by masking every token the
//! constraint forbids before the sampler chain runs, so every sampling mode
//! draws from the exactly constrained distribution.
//!
//! ```no_run
//! # fn main() -> Result<(), llamacpp::Error> {
//! use llamacpp::{Model, ModelParams, SamplingParams};
//! use llamacpp::constraint::Constraint;
//! let model = Model::load("model.gguf", &ModelParams::default())?;
//! let schema = serde_json::json!({
//!     "type": "object",
//!     "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
//!     "required": ["name", "age"],
//! });
//! let params = SamplingParams::default().temperature(0.7).constraint(Constraint::json_schema(schema));
//! let sampler = params.sampler(&model)?;
//! # let _ = sampler;
//! # Ok(())
//! # }
//! ```
//!
//! The vocabulary's token trie is built once per model (on the first
//! constrained sampler; 262,144 tokens take well under a second) and shared
//! by every request. Each mask then costs microseconds to a millisecond
//! (measured in docs/json-output.md), within llguidance's budget
//! ([`STEP_MAX_ITEMS`], [`STEP_LEXER_FUEL`], and at most 2,000 Earley items
//! in one row): a grammar whose mask or next parse step would cost more
//! fails that sample with [`Error::Grammar`](crate::Error::Grammar) instead
//! of taking the time (the sampler then needs a
//! [`reset`](crate::Sampler::reset)).
//!
//! # JSON Schema
//!
//! Schemas mean what JSON Schema says, as llguidance reads them: an object
//! may hold properties beyond the declared ones unless
//! `additionalProperties` says otherwise, whitespace between tokens is any
//! JSON whitespace, and declared properties come in the order the schema
//! lists them. Keywords llguidance cannot enforce are an error (it names
//! the keyword) rather than ignored. [`JsonOptions`] turns on this crate's
//! tightenings for small models (bounded whitespace, no undeclared
//! properties) and sets the depth bound of recursive schemas.
//!
//! GBNF grammars keep llama.cpp's own sampler
//! ([`SamplerChain::grammar`](crate::SamplerChain::grammar)), and
//! [`json_schema::schema_to_grammar`](crate::json_schema::schema_to_grammar)
//! still converts a schema to GBNF for it.

#[cfg(feature = "constraints")]
mod closing;
mod depth;
#[cfg(feature = "constraints")]
mod guide;
#[cfg(feature = "constraints")]
mod tokens;
#[cfg(not(feature = "constraints"))]
mod unsupported;

use std::collections::HashSet;

use serde_json::Value;

use crate::error::Result;
use crate::llama::model::Model;

#[cfg(feature = "constraints")]
pub(crate) use guide::Guide;
#[cfg(feature = "constraints")]
pub(crate) use tokens::TokenTable;
#[cfg(not(feature = "constraints"))]
pub(crate) use unsupported::{Guide, TokenTable};

impl TokenTable {
    /// The table of `model`'s vocabulary, built on first use and shared by
    /// every constrained sampler of the model (kept in its extensions).
    pub(crate) fn of(model: &Model) -> Result<std::sync::Arc<TokenTable>> {
        model.extensions().get_or_try_init(|| {
            model.vocab().check_has_tokenizer()?;
            TokenTable::build(model.vocab())
        })
    }
}

impl Model {
    /// Builds the vocabulary's token table for constrained sampling
    /// ([`crate::constraint`]) now, rather than in the first constrained
    /// sampler (about a second for a 262,144-token vocabulary): a server
    /// calls it at startup, off its request path.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a model
    /// without a vocabulary;
    /// [`Error::Grammar`](crate::Error::Grammar) for a vocabulary without an
    /// end-of-generation token.
    pub fn prepare_constraints(&self) -> Result<()> {
        TokenTable::of(self).map(drop)
    }
}

/// The closing stretch: the last quarter of the budget, at least this
/// many tokens (all of a budget shorter than that).
pub const MIN_CLOSING_TOKENS: usize = 16;

/// The deepest [`JsonOptions::max_depth`] accepted: llguidance's schema
/// compiler recurses through every level.
pub const MAX_DEPTH: usize = 64;

/// The budget of one token mask (llguidance's `ParserLimits`): Earley
/// items and lexer fuel spent computing it. A mask that would cost more
/// fails, and the request with it, instead of holding a thread.
/// llguidance's documented speeds (20,000 items and 14,000 fuel per
/// millisecond) put this budget at about 2.5 ms + 3.5 ms; measured in
/// docs/json-output.md.
pub const STEP_MAX_ITEMS: usize = 50_000;
/// See [`STEP_MAX_ITEMS`].
pub const STEP_LEXER_FUEL: u64 = 50_000;

/// What a constrained sampler's output must be.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Constraint {
    /// A JSON document valid against the schema.
    JsonSchema {
        /// The schema (draft 2020-12 unless it says otherwise).
        schema: Value,
        /// How the document is written; see [`JsonOptions`].
        options: JsonOptions,
    },
    /// Text matching the regex in full (Rust `regex` syntax, anchored at
    /// both ends).
    Regex(String),
    /// Text the Lark grammar (llguidance's dialect, start rule `start`)
    /// derives.
    Lark(String),
}

impl Constraint {
    /// A document valid against `schema`, with the default [`JsonOptions`].
    pub fn json_schema(schema: Value) -> Constraint {
        Constraint::JsonSchema { schema, options: JsonOptions::default() }
    }

    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    pub fn json_object() -> Constraint {
        Constraint::json_schema(serde_json::json!({"type": "object"}))
    }

    /// Text matching `regex` in full.
    pub fn regex(regex: impl Into<String>) -> Constraint {
        Constraint::Regex(regex.into())
    }

    /// Text of the Lark grammar `lark`.
    pub fn lark(lark: impl Into<String>) -> Constraint {
        Constraint::Lark(lark.into())
    }

    /// Whether its text is JSON or holds JSON values: a JSON Schema, or
    /// a Lark grammar with `%json` (as `Tools::forcing_constraint`
    /// writes). The closing rule of [`Sampler::close_within`](crate::Sampler::close_within)
    /// applies to these.
    pub fn writes_json(&self) -> bool {
        match self {
            Constraint::JsonSchema { .. } => true,
            Constraint::Lark(lark) => lark.contains("%json"),
            Constraint::Regex(_) => false,
        }
    }

    /// The same constraint with `options` (a JSON Schema one only; others
    /// are returned unchanged).
    #[must_use]
    pub fn with_json_options(self, options: JsonOptions) -> Constraint {
        match self {
            Constraint::JsonSchema { schema, .. } => Constraint::JsonSchema { schema, options },
            other => other,
        }
    }
}

/// How a JSON Schema constraint writes documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JsonOptions {
    /// `true`: between tokens, nothing, one space, or a newline and up to
    /// 20 spaces or tabs (a model cannot emit whitespace forever).
    /// `false` (the default): any run of JSON whitespace.
    pub bounded_whitespace: bool,
    /// `true`: an object schema with `properties` and no
    /// `additionalProperties` (nor `patternProperties`,
    /// `unevaluatedProperties`) allows only its declared properties, as if
    /// it said `"additionalProperties": false`; members of an `allOf` are
    /// left alone, since each would forbid the others' properties.
    /// `false` (the default): JSON Schema's rule, other properties allowed.
    pub no_additional_properties: bool,
    /// How deep values may nest through a recursive `$ref` (a `$ref` that
    /// can reach itself): the innermost level allows no further
    /// recursion (a model may still add siblings: bound arrays with
    /// `maxItems` for that). Default [`JsonOptions::DEFAULT_MAX_DEPTH`], at
    /// most [`MAX_DEPTH`].
    pub max_depth: usize,
    /// `true`: every value the schema leaves unbounded gets a bound, so
    /// that a model cannot write one forever (outside `allOf` members,
    /// whose bounds their siblings' would cut):
    /// * integers without `minimum`/`maximum`: at most 16 digits
    ///   ([`JsonOptions::MAX_MAGNITUDE`]), as the GBNF converter writes them;
    /// * numbers: the same magnitude, no exponent, and at most
    ///   [`JsonOptions::MAX_FRACTION_DIGITS`] digits after the point (as
    ///   `multipleOf` 10⁻⁶, unless the schema has a `multipleOf`);
    /// * not strings: a `maxLength` would slow every mask inside them
    ///   (docs/json-output.md); the closing rule of
    ///   [`Sampler::close_within`](crate::Sampler::close_within) ends them;
    /// * arrays without `maxItems`: at most [`JsonOptions::MAX_ITEMS`].
    ///
    /// `false` (the default): JSON Schema's own semantics.
    pub bounded_values: bool,
}

impl JsonOptions {
    /// The default recursion bound of [`JsonOptions::max_depth`].
    pub const DEFAULT_MAX_DEPTH: usize = 8;

    /// The bound of integers and numbers under
    /// [`bounded_values`](Self::bounded_values): 16 digits (as the GBNF
    /// converter writes integers; llguidance compares number bounds as
    /// doubles, so 10¹⁶ itself also passes for a `number`).
    pub const MAX_MAGNITUDE: i64 = 9_999_999_999_999_999;
    /// Digits after the decimal point of a number under
    /// [`bounded_values`](Self::bounded_values).
    pub const MAX_FRACTION_DIGITS: u32 = 6;
    /// Items of an array under [`bounded_values`](Self::bounded_values).
    pub const MAX_ITEMS: u64 = 64;

    /// This crate's tightenings for small models: bounded whitespace, no
    /// undeclared properties and bounded values (what
    /// [`schema_to_grammar`](crate::json_schema::schema_to_grammar) writes,
    /// and more: it bounds integers alone).
    pub fn tight() -> JsonOptions {
        JsonOptions {
            bounded_whitespace: true,
            no_additional_properties: true,
            bounded_values: true,
            ..JsonOptions::default()
        }
    }

    /// The schema llguidance compiles for `schema` under these options:
    /// recursion unrolled to [`max_depth`](Self::max_depth), the
    /// tightenings written into it (and llguidance's whitespace option
    /// under `x-guidance`). [`Constraint::json_schema`] does this itself;
    /// this is for schemas embedded in a Lark grammar (`%json {...}`).
    pub fn prepare(&self, schema: &Value) -> Value {
        prepared_schema(schema, self)
    }
}

impl Default for JsonOptions {
    fn default() -> Self {
        JsonOptions {
            bounded_whitespace: false,
            no_additional_properties: false,
            max_depth: Self::DEFAULT_MAX_DEPTH,
            bounded_values: false,
        }
    }
}

/// The bounded whitespace of [`JsonOptions::bounded_whitespace`], as the
/// GBNF converter writes it.
const BOUNDED_WHITESPACE: &str = r"(?: |\n[ \t]{0,20})";

/// The schema llguidance compiles for `schema` with `options`: recursion
/// unrolled, tightenings written into it, and llguidance's own options
/// under `x-guidance` (unless the schema sets them itself).
pub(crate) fn prepared_schema(schema: &Value, options: &JsonOptions) -> Value {
    let mut out = depth::bound_recursion(schema, options.max_depth);
    if options.no_additional_properties || options.bounded_values {
        let mut keep_open = HashSet::new();
        all_of_refs(&out, &mut keep_open);
        let root = out.clone();
        let tighten = Tighten {
            root: &root,
            keep_open: &keep_open,
            close: options.no_additional_properties,
            bound: options.bounded_values,
        };
        tighten.walk(&mut out, String::new(), false);
    }
    let Value::Object(root) = &mut out else { return out };
    if options.bounded_whitespace && !root.contains_key("x-guidance") {
        root.insert("x-guidance".into(), serde_json::json!({"whitespace_pattern": BOUNDED_WHITESPACE}));
    }
    out
}

/// The JSON pointers that members of an `allOf` refer to: closing them
/// would forbid the other members' properties.
fn all_of_refs(node: &Value, out: &mut HashSet<String>) {
    match node {
        Value::Object(map) => {
            if let Some(Value::Array(members)) = map.get("allOf") {
                for member in members {
                    if let Some(Value::String(r)) = member.get("$ref")
                        && let Some(pointer) = r.strip_prefix('#')
                    {
                        out.insert(pointer.to_string());
                    }
                }
            }
            map.values().for_each(|v| all_of_refs(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| all_of_refs(v, out)),
        _ => {}
    }
}

/// The pass of [`JsonOptions::no_additional_properties`] and
/// [`JsonOptions::bounded_values`] over a schema.
struct Tighten<'a> {
    /// The schema before the pass, to resolve `allOf` members' `$ref`s.
    root: &'a Value,
    /// The pointers `allOf` members refer to (see [`all_of_refs`]).
    keep_open: &'a HashSet<String>,
    /// Close objects over their declared properties.
    close: bool,
    /// Bound open values.
    bound: bool,
}

/// Whether a schema's `type` is or includes `name`.
fn has_type(map: &serde_json::Map<String, Value>, name: &str) -> bool {
    match map.get("type") {
        Some(Value::String(t)) => t == name,
        Some(Value::Array(ts)) => ts.iter().any(|t| t == name),
        _ => false,
    }
}

/// Writes [`JsonOptions::bounded_values`]'s bounds into one schema node
/// (not an `allOf` member), where the schema sets none of its own.
fn bound_values(map: &mut serde_json::Map<String, Value>) {
    let has = |map: &serde_json::Map<String, Value>, keys: &[&str]| keys.iter().any(|k| map.contains_key(*k));
    if has_type(map, "integer") || has_type(map, "number") {
        let magnitude = JsonOptions::MAX_MAGNITUDE;
        for (inclusive, exclusive, bound) in
            [("maximum", "exclusiveMaximum", magnitude), ("minimum", "exclusiveMinimum", -magnitude)]
        {
            if !has(map, &[inclusive, exclusive]) {
                map.insert(inclusive.into(), bound.into());
            }
        }
        if has_type(map, "number") && !has_type(map, "integer") && !map.contains_key("multipleOf") {
            // llguidance writes a bounded number without an exponent; a
            // decimal `multipleOf` bounds the digits after the point.
            let step = format!("1e-{}", JsonOptions::MAX_FRACTION_DIGITS);
            let step: serde_json::Number = step.parse().unwrap_or_else(|_| unreachable!("a valid JSON number"));
            map.insert("multipleOf".into(), Value::Number(step));
        }
    }
    // Strings get no `maxLength`: one defeats llguidance's precomputed
    // masks for string content (the p99 mask over the corpus went from
    // 2.1 to 5.0 ms), and the closing rule of `Sampler::close_within`
    // ends an open string within the token budget.
    let enumerated = has(map, &["const", "enum"]);
    let array = has_type(map, "array") || (!map.contains_key("type") && has(map, &["items", "prefixItems"]));
    if array && !enumerated && !map.contains_key("maxItems") && map.get("items") != Some(&Value::Bool(false)) {
        let min = map.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        let prefix = map.get("prefixItems").and_then(Value::as_array).map_or(0, |p| p.len() as u64);
        map.insert("maxItems".into(), JsonOptions::MAX_ITEMS.max(min).max(prefix).into());
    }
}

/// The keywords that already say what an object allows beyond its
/// declared properties.
const OPEN_KEYWORDS: [&str; 3] = ["additionalProperties", "patternProperties", "unevaluatedProperties"];

impl Tighten<'_> {
    /// The names an `allOf` of object schemas declares, if every member
    /// is one that allows no other names of its own accord: closing the
    /// parent over them keeps what the members allow together.
    fn all_of_names(&self, members: &[Value]) -> Option<Vec<String>> {
        let mut names = Vec::new();
        for member in members {
            let member = match member.get("$ref") {
                Some(Value::String(r)) => self.root.pointer(r.strip_prefix('#')?)?,
                _ => member,
            };
            let map = member.as_object()?;
            if OPEN_KEYWORDS.iter().any(|k| map.get(*k).is_some_and(|v| v != &Value::Bool(false)))
                || map.contains_key("allOf")
            {
                return None;
            }
            for name in map.get("properties").and_then(Value::as_object).into_iter().flat_map(|p| p.keys()) {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
        Some(names)
    }

    /// Closing: adds `"additionalProperties": false` to every object
    /// schema under `node` (at JSON pointer `at`) that declares
    /// `properties` and says nothing about other ones, except members of
    /// an `allOf` (`in_all_of`) and what they refer to; a parent of an
    /// `allOf` of object schemas is closed over the names they declare
    /// instead. Bounding: see [`bound_values`].
    fn walk(&self, node: &mut Value, at: String, in_all_of: bool) {
        let escape = |s: &str| s.replace('~', "~0").replace('/', "~1");
        match node {
            Value::Object(map) => {
                let says_nothing = !OPEN_KEYWORDS.iter().any(|k| map.contains_key(*k));
                let open = map.get("properties").is_some_and(Value::is_object) && says_nothing;
                let all_of = match map.get("allOf") {
                    Some(Value::Array(members)) if self.close && says_nothing && !in_all_of => {
                        self.all_of_names(members)
                    }
                    _ => None,
                };
                if let Some(names) = all_of {
                    let properties = map.entry("properties").or_insert_with(|| Value::Object(Default::default()));
                    if let Value::Object(properties) = properties {
                        for name in names {
                            properties.entry(name).or_insert_with(|| Value::Object(Default::default()));
                        }
                    }
                    map.insert("additionalProperties".into(), Value::Bool(false));
                } else if self.close && open && !in_all_of && !self.keep_open.contains(&at) {
                    map.insert("additionalProperties".into(), Value::Bool(false));
                }
                if self.bound && !in_all_of {
                    bound_values(map);
                }
                for (key, value) in map.iter_mut() {
                    let here = format!("{at}/{}", escape(key));
                    match key.as_str() {
                        // Names, not schemas: descend into each one's schema.
                        "properties" | "$defs" | "definitions" | "patternProperties" | "dependentSchemas" => {
                            if let Value::Object(named) = value {
                                for (name, v) in named.iter_mut() {
                                    self.walk(v, format!("{here}/{}", escape(name)), false);
                                }
                            }
                        }
                        "allOf" => {
                            if let Value::Array(members) = value {
                                for (i, v) in members.iter_mut().enumerate() {
                                    self.walk(v, format!("{here}/{i}"), true);
                                }
                            }
                        }
                        "enum" | "const" | "default" | "examples" | "x-guidance" => {}
                        _ => self.walk(value, here, false),
                    }
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter_mut().enumerate() {
                    self.walk(v, format!("{at}/{i}"), false);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn tight_options_close_declared_objects_but_not_all_of_members() {
        let schema = json!({
            "type": "object",
            "properties": {"a": {"type": "object", "properties": {"b": {}}}, "c": {"type": "object"},
                           "n": {"type": "integer", "exclusiveMinimum": 0}},
            "allOf": [{"properties": {"d": {}}}],
            "default": {"properties": {}},
        });
        let out = prepared_schema(&schema, &JsonOptions::tight());
        assert_eq!(out["additionalProperties"], json!(false));
        assert_eq!(out.pointer("/properties/a/additionalProperties"), Some(&json!(false)));
        assert_eq!(out.pointer("/properties/c/additionalProperties"), None, "no properties declared");
        assert_eq!(out.pointer("/allOf/0/additionalProperties"), None);
        let all_of = json!({"allOf": [{"properties": {"a": {}}}, {"$ref": "#/$defs/b"}], "$defs": {"b": {"properties": {"b": {}}}}});
        let closed = prepared_schema(&all_of, &JsonOptions::tight());
        assert_eq!(closed["additionalProperties"], json!(false), "{closed:#}");
        assert_eq!(closed["properties"], json!({"a": {}, "b": {}}), "closed over the members' names");
        assert_eq!(closed.pointer("/$defs/b/additionalProperties"), None, "a member's target stays open");
        assert_eq!(out.pointer("/properties/n/maximum"), Some(&json!(JsonOptions::MAX_MAGNITUDE)));
        assert_eq!(out.pointer("/properties/n/minimum"), None, "exclusiveMinimum is kept alone");
        assert_eq!(out.pointer("/default/additionalProperties"), None, "a value, not a schema");
        assert_eq!(out.pointer("/x-guidance/whitespace_pattern"), Some(&json!(BOUNDED_WHITESPACE)));
        let spec = prepared_schema(&schema, &JsonOptions::default());
        assert_eq!(spec, schema, "the default options change nothing");
    }

    #[test]
    fn bounded_values_bound_what_the_schema_leaves_open() {
        let schema = json!({
            "type": "object",
            "properties": {
                "x": {"type": "number"},
                "step": {"type": "number", "multipleOf": 0.5, "minimum": 0},
                "s": {"type": "string", "format": "email"},
                "long": {"type": "string", "minLength": 2000},
                "cut": {"type": "string", "maxLength": 3},
                "e": {"type": "string", "enum": ["a"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "pair": {"type": "array", "prefixItems": [{}, {}], "items": false},
                "any": {},
            },
            "allOf": [{"properties": {"m": {"type": "string"}}}],
        });
        let out = prepared_schema(&schema, &JsonOptions { bounded_values: true, ..JsonOptions::default() });
        let at = |p: &str| out.pointer(p).cloned();
        assert_eq!(at("/properties/x/maximum"), Some(json!(JsonOptions::MAX_MAGNITUDE)));
        assert_eq!(at("/properties/x/minimum"), Some(json!(-JsonOptions::MAX_MAGNITUDE)));
        assert_eq!(at("/properties/x/multipleOf").and_then(|v| v.as_f64()), Some(1e-6));
        assert_eq!(at("/properties/step/multipleOf"), Some(json!(0.5)), "the schema's own step is kept");
        assert_eq!(at("/properties/step/minimum"), Some(json!(0)));
        assert_eq!(at("/properties/s/maxLength"), None, "strings are closed by the budget");
        assert_eq!(at("/properties/cut/maxLength"), Some(json!(3)));
        assert_eq!(at("/properties/tags/maxItems"), Some(json!(JsonOptions::MAX_ITEMS)));
        assert_eq!(at("/properties/pair/maxItems"), None, "closed by items: false");
        assert_eq!(at("/properties/any"), Some(json!({})), "no type: left alone");
        assert_eq!(at("/properties/e/maxItems"), None);
        assert_eq!(at("/additionalProperties"), None, "closing is the other option");
    }
}
