//! JSON Schema to GBNF: grammars that make a model's output a JSON
//! document valid against a schema, for [`SamplerChain::grammar`](crate::SamplerChain::grammar).
//!
//! ```no_run
//! # fn main() -> Result<(), llamacpp::Error> {
//! use llamacpp::{Model, ModelParams, SamplerChain};
//! let model = Model::load("model.gguf", &ModelParams::default())?;
//! let schema = serde_json::json!({
//!     "type": "object",
//!     "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
//!     "required": ["name", "age"],
//! });
//! let gbnf = llamacpp::json_schema::schema_to_grammar(&schema)?;
//! let sampler = SamplerChain::new().grammar(model.vocab(), &gbnf, "root").greedy().build()?;
//! # let _ = sampler;
//! # Ok(())
//! # }
//! ```
//!
//! # What the grammar accepts
//!
//! Every document the grammar accepts is valid against the schema; the
//! converter returns [`Error::JsonSchema`](crate::Error::JsonSchema)
//! (with the JSON pointer of the keyword) for anything it cannot express
//! exactly, rather than a grammar that lets invalid output through. It
//! does not accept every valid document: output is written one way
//! (these are the *tightenings*):
//!
//! - whitespace only between tokens, bounded: nothing, one space, or a
//!   newline and up to 20 spaces or tabs (`space ::= | " " | "\n" [ \t]{0,20}`),
//!   so a model cannot emit whitespace forever;
//! - numbers with at most 16 integer digits, 16 fraction digits and a
//!   2-digit exponent (so that it fits an `f64`); no `-0`; integers without fraction or exponent;
//! - strings with each character spelled one way (no `\u` escape of a
//!   surrogate; in patterns and formats, no escape where a raw character
//!   will do);
//! - object properties in the order the schema declares them (this crate
//!   turns on `serde_json`'s `preserve_order`, so a parsed or `json!`-built
//!   schema keeps it), and **no properties beyond the declared ones unless
//!   `additionalProperties` is given** (`true` or a schema: then after the
//!   declared ones, with other names);
//! - `enum` and `const` values in their compact serialization;
//! - formats in one spelling (`Z` for UTC, upper-case `T`, no leap second).
//!
//! # Supported keywords
//!
//! - `type` (a name or an array of names: `["string", "null"]`), `enum`,
//!   `const` (any JSON value; next to `type` only);
//! - objects: `properties`, `required` (names in `properties`),
//!   `additionalProperties` (`false`, `true`, a schema);
//! - arrays: `items` (a schema, or a tuple as in draft 4-2019),
//!   `prefixItems`, `additionalItems` (after tuple `items`), `minItems`,
//!   `maxItems` (up to 1000), `uniqueItems: false`;
//! - strings: `minLength`, `maxLength` (up to 1000), `pattern` (see
//!   below), `format`: `date`, `time`, `date-time`, `uuid`, `email`
//!   (exact to RFC 3339 including month lengths and leap years; `email` a
//!   conservative subset of RFC 5321 addresses);
//! - `integer`: `minimum`, `maximum`, `exclusiveMinimum`,
//!   `exclusiveMaximum` (draft 4 booleans too) within ±10^15, as exact
//!   digit-range rules; `number`: the same bounds when they are integers
//!   (then without exponents), otherwise an error;
//! - `anyOf`; `oneOf` when no value can match two branches (branches of
//!   distinct types, or objects told apart by a required property with
//!   different `const`/`enum` values), otherwise an error; `allOf` of one
//!   schema, or of object schemas (`properties`, `required`,
//!   `type: "object"`, local `$ref`s to them), merged;
//! - `$ref` to `#` or a JSON pointer `#/...` (`$defs`, `definitions`, or
//!   anywhere), recursive too (not left-recursive: a `$ref` that reaches
//!   itself without an object or array in between is an error); no
//!   remote references, anchors, or `$id` below the root;
//! - `true` and `{}` accept any JSON value; `false` is an error.
//!
//! Annotations are ignored: `title`, `description`, `$schema`, `$id` (at
//! the root), `$comment`, `examples`, `default`, `deprecated`,
//! `readOnly`, `writeOnly`, `contentEncoding`, `contentMediaType`, and
//! keys starting with `x-`. Every other keyword is an error, among them
//! `not`, `if`/`then`/`else`, `multipleOf`, `uniqueItems: true`,
//! `contains`, `patternProperties`, `propertyNames`, `minProperties`,
//! `maxProperties`, `dependentRequired`, `dependentSchemas`,
//! `unevaluatedProperties`, `unevaluatedItems`, `$anchor` and
//! `$dynamicRef`.
//!
//! # Patterns
//!
//! `pattern` is an ECMA-262 regex, unanchored as JSON Schema says: a side
//! without `^`/`$` matches any text there. Supported: literals, escapes
//! (`\d \w \s \D \W \S \n \t \r \f \v \0 \xHH \uHHHH`, escaped
//! punctuation), classes with ranges and negation, `.` (no line
//! terminators), groups (capturing, `(?:...)`, named), alternation, and
//! `? * + {m} {m,} {m,n}` (lazy too). Backreferences, lookaround, `\b`,
//! `\p{...}`, anchors other than at an alternative's ends, and an
//! unbounded quantifier on what can match nothing (`(a*)*`) are errors.
//! A pattern cannot be combined with `minLength`/`maxLength`, nor a
//! `format` with either.

mod convert;
mod regex;
mod rules;

use std::sync::OnceLock;

use serde_json::Value;

use crate::Result;

/// The GBNF grammar (start rule `root`) of the JSON documents valid
/// against `schema`; see the [module docs](self) for what is supported.
///
/// # Errors
/// [`Error::JsonSchema`](crate::Error::JsonSchema) naming the JSON pointer
/// and keyword of the first part of the schema that cannot be expressed
/// exactly (an unsupported keyword, a remote `$ref`, a pattern outside
/// the subset, bounds that accept nothing, ...).
pub fn schema_to_grammar(schema: &Value) -> Result<String> {
    convert::Converter::new(schema).run()
}

/// The GBNF grammar (start rule `root`) of any JSON *object*: what
/// OpenAI's `response_format: {"type": "json_object"}` asks for. Its
/// values are any JSON values, with the whitespace and number limits of
/// [`schema_to_grammar`].
pub fn json_grammar() -> &'static str {
    static GRAMMAR: OnceLock<String> = OnceLock::new();
    GRAMMAR.get_or_init(|| {
        schema_to_grammar(&serde_json::json!({"type": "object"}))
            .unwrap_or_else(|_| unreachable!("the object schema converts"))
    })
}

/// Keywords that do not constrain values (and `x-` extensions).
fn is_annotation(key: &str) -> bool {
    matches!(
        key,
        "title"
            | "description"
            | "$schema"
            | "$id"
            | "$comment"
            | "examples"
            | "default"
            | "deprecated"
            | "readOnly"
            | "writeOnly"
            | "contentEncoding"
            | "contentMediaType"
            | "$defs"
            | "definitions"
    ) || key.starts_with("x-")
}

/// A JSON pointer reference token (`~` as `~0`, `/` as `~1`).
fn pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::Error;

    fn pointer_of(schema: Value) -> (String, String) {
        match schema_to_grammar(&schema) {
            Err(Error::JsonSchema { pointer, message }) => (pointer, message),
            other => panic!("expected a JsonSchema error, got {other:?}"),
        }
    }

    #[test]
    fn simple_object_grammar() {
        let g = schema_to_grammar(&json!({
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "required": ["a"]
        }))
        .unwrap();
        assert!(g.starts_with("root ::= "), "{g}");
        assert!(g.contains("integer ::= "), "{g}");
        assert!(g.contains(r#""\"a\"""#), "{g}");
    }

    /// Schemas as large as a request body may carry: each value, branch and
    /// rule name costs about the same however many came before (a list
    /// scan per enum value took 1.1 s for 40,000 values; these 200,000
    /// would take minutes).
    #[test]
    fn large_enums_unions_and_repeated_names_convert_in_linear_time() {
        let values: Vec<Value> = (0..600_000).map(|i| json!(format!("v{}", i % 300_000))).collect();
        let g = schema_to_grammar(&json!({"enum": values})).unwrap();
        assert_eq!(g.matches(r#""\"v299999\"""#).count(), 1, "each value once");
        let rule = g.lines().find(|l| l.contains("v299999")).unwrap();
        assert_eq!(rule.matches(" | ").count(), 300_000 - 1, "{}", &rule[..100]);

        let branches: Vec<Value> = (0..40_000).map(|i| json!({"const": i % 20_000})).collect();
        let g = schema_to_grammar(&json!({"anyOf": branches})).unwrap();
        let widest = g.lines().map(|l| l.matches(" | ").count()).max().unwrap();
        assert_eq!(widest, 20_000 - 1, "each distinct branch once");

        // 20,000 properties whose names have no ASCII letter or digit: their
        // rules all get the base name `root`, numbered 20,000 times.
        let properties: serde_json::Map<String, Value> =
            (0..20_000u32).map(|i| (char::from_u32(0x4E00 + i).unwrap().to_string(), json!({"const": i}))).collect();
        let g = schema_to_grammar(&json!({"type": "object", "properties": properties})).unwrap();
        assert!(g.contains("\nroot-20000 ::= "), "{}", &g[..200]);
    }

    #[test]
    fn one_of_is_checked_pair_by_pair_within_a_bound() {
        let tagged = |n: usize| -> Vec<Value> {
            (0..n)
                .map(|i| json!({"type": "object", "properties": {"kind": {"const": i}}, "required": ["kind"]}))
                .collect()
        };
        assert!(schema_to_grammar(&json!({"oneOf": tagged(500)})).is_ok());
        let (p, m) = pointer_of(json!({"oneOf": tagged(20_000)}));
        assert_eq!(p, "/oneOf");
        assert!(m.contains("too costly") && m.contains("20000 branches"), "{m}");
        // Equal object values in another key order are one value: the two
        // branches overlap.
        let object_tag =
            |value: Value| json!({"type": "object", "properties": {"t": {"enum": [value]}}, "required": ["t"]});
        let (_, m) =
            pointer_of(json!({"oneOf": [object_tag(json!({"a": 1, "b": 2})), object_tag(json!({"b": 2, "a": 1}))]}));
        assert!(m.contains("branches 0 and 1 may both match"), "{m}");
        assert!(
            schema_to_grammar(&json!({"oneOf": [object_tag(json!({"a": 1})), object_tag(json!({"a": 2}))]})).is_ok()
        );
    }

    #[test]
    fn unsupported_keywords_name_their_pointer() {
        let (p, m) = pointer_of(json!({"properties": {"a": {"type": "array", "uniqueItems": true}}}));
        assert_eq!(p, "/properties/a/uniqueItems");
        assert!(m.contains("uniqueItems"), "{m}");
        let (p, _) = pointer_of(json!({"anyOf": [{"type": "string"}, {"not": {}}]}));
        assert_eq!(p, "/anyOf/1/not");
        let (p, _) = pointer_of(json!({"$ref": "http://example.com/s.json"}));
        assert_eq!(p, "/$ref");
        let (p, _) = pointer_of(json!({"$defs": {"a/b": {"multipleOf": 2}}, "$ref": "#/$defs/a~1b"}));
        assert_eq!(p, "/$defs/a~1b/multipleOf");
        let (p, _) = pointer_of(json!({"$ref": "#"}));
        assert_eq!(p, "/$ref");
        let (p, _) = pointer_of(json!(false));
        assert_eq!(p, "");
    }

    #[test]
    fn json_grammar_is_an_object() {
        assert!(json_grammar().starts_with("root ::= object"), "{}", json_grammar());
    }
}
