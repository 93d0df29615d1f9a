//! Issue 15: JSON Schema to GBNF. For each schema, documents that are
//! valid (as the `jsonschema` crate confirms) pass through the grammar
//! sampler token by token and may end there; invalid ones are refused at
//! some token or cannot end. Unsupported keywords are errors naming their
//! JSON pointer, and random schemas never panic the converter, whose
//! grammars llama.cpp's parser always accepts.
//!
//! Uses the vocabulary of the real default model (Gemma 3 270M, or
//! `LLAMA_MODEL`), loaded vocab-only; these never skip.

use std::sync::OnceLock;

use llama_suite::model_cache::model_path;
use llamacpp::json_schema::{json_grammar, schema_to_grammar};
use llamacpp::{AddBos, Error, Model, ModelParams, SamplerChain, Special, Vocab};

use super::cases::{cases, unsupported_cases};
use proptest::prelude::*;
use serde_json::{Value, json};

/// The real model, loaded vocab-only.
pub(super) fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = model_path().unwrap_or_else(|e| panic!("the real model is needed: {e}"));
        Model::load(&path, &ModelParams::default().vocab_only(true)).unwrap_or_else(|e| panic!("{e}"))
    })
}

fn vocab() -> &'static Vocab {
    model().vocab()
}

/// Whether the grammar lets `text` be generated in full and then end:
/// every token of its tokenization is allowed in turn (`Sampler::accept`
/// checks the grammar first and refuses a masked token), then the end
/// token is.
fn accepts(gbnf: &str, text: &str) -> bool {
    let vocab = vocab();
    let mut sampler = SamplerChain::new().grammar(vocab, gbnf, "root").greedy().build().unwrap();
    let tokens = vocab.tokenize(text, AddBos::No).unwrap();
    assert_eq!(vocab.detokenize(&tokens, AddBos::No, Special::Plain).unwrap(), text, "tokenization round trip");
    for &t in &tokens {
        match sampler.accept(t) {
            Ok(()) => {}
            Err(Error::Grammar(_)) => return false,
            Err(e) => panic!("{e}"),
        }
    }
    let eos = vocab.eos().expect("an end token");
    match sampler.accept(eos) {
        Ok(()) => true,
        Err(Error::Grammar(_)) => false,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn valid_documents_pass_and_invalid_ones_are_refused() {
    let cases = cases();
    assert!(cases.len() >= 30, "{} schemas", cases.len());
    let (mut n_valid, mut n_invalid) = (0, 0);
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let gbnf = schema_to_grammar(&c.schema).unwrap_or_else(|e| panic!("case {i} {}: {e}", c.schema));
        let validator = jsonschema::options().should_validate_formats(true).build(&c.schema).unwrap();
        for doc in c.valid {
            let value: Value = serde_json::from_str(doc).unwrap_or_else(|e| panic!("case {i}: {doc}: {e}"));
            if !validator.is_valid(&value) {
                failures.push(format!("case {i}: test data {doc} is not valid against {}", c.schema));
            }
            if !accepts(&gbnf, doc) {
                failures.push(format!("case {i}: valid {doc} refused by the grammar of {}:\n{gbnf}", c.schema));
            }
            n_valid += 1;
        }
        for doc in c.invalid {
            if let Ok(value) = serde_json::from_str::<Value>(doc)
                && validator.is_valid(&value)
            {
                failures.push(format!("case {i}: test data {doc} is valid against {}", c.schema));
            }
            if accepts(&gbnf, doc) {
                failures.push(format!("case {i}: invalid {doc} accepted by the grammar of {}:\n{gbnf}", c.schema));
            }
            n_invalid += 1;
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    println!("{} schemas: {n_valid} valid documents accepted, {n_invalid} invalid ones refused", cases.len());
}

#[test]
fn whitespace_is_bounded() {
    let gbnf = schema_to_grammar(&json!({"type": "array", "items": {"type": "integer"}})).unwrap();
    let ok = format!("[\n{}1]", " ".repeat(20));
    let too_much = format!("[\n{}1]", " ".repeat(21));
    assert!(accepts(&gbnf, &ok));
    assert!(!accepts(&gbnf, &too_much));
    assert!(!accepts(&gbnf, "[  1]"), "two spaces in a row");
}

/// `llamacpp` turns on serde_json's `preserve_order`: properties are
/// generated in the order the schema declares them (a tightening: the
/// other order is valid JSON Schema-wise, but not generated).
#[test]
fn properties_come_in_declared_order() {
    let schema = json!({"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "integer"}},
                        "required": ["zeta", "alpha"], "additionalProperties": false});
    let gbnf = schema_to_grammar(&schema).unwrap();
    assert!(accepts(&gbnf, r#"{"zeta": 1, "alpha": 2}"#));
    assert!(!accepts(&gbnf, r#"{"alpha": 2, "zeta": 1}"#));
}

#[test]
fn json_object_grammar_accepts_objects_only() {
    let g = json_grammar();
    assert!(accepts(g, r#"{"a": [1, {"b": "c"}], "d": null}"#));
    assert!(accepts(g, "{}"));
    assert!(!accepts(g, "[1]"));
    assert!(!accepts(g, r#""s""#));
    assert!(!accepts(g, "{"));
}

/// Unsupported keywords and constructs: an error naming the JSON pointer.
#[test]
fn unsupported_keywords_are_errors_with_their_pointer() {
    for (schema, pointer, needle) in unsupported_cases() {
        match schema_to_grammar(&schema) {
            Err(Error::JsonSchema { pointer: p, message }) => {
                assert_eq!(p, pointer, "{schema}: {message}");
                assert!(message.contains(needle), "{schema}: {message:?} lacks {needle:?}");
            }
            other => panic!("{schema}: expected an error at {pointer}, got {other:?}"),
        }
    }
}

/// Annotations are ignored: the grammar is the one without them.
#[test]
fn annotations_are_ignored() {
    let plain = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    let annotated = json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "https://x.invalid/s",
        "title": "T", "description": "D", "type": "object", "$comment": "c", "x-vendor": 1,
        "properties": {"a": {"type": "integer", "default": 3, "examples": [1], "deprecated": false, "readOnly": true}},
        "required": ["a"]});
    assert_eq!(schema_to_grammar(&plain).unwrap(), schema_to_grammar(&annotated).unwrap());
}

/// Keywords the generator draws from: supported ones and unsupported ones.
fn keyword_schema(depth: u32) -> BoxedStrategy<Value> {
    let pattern = proptest::collection::vec(
        prop_oneof![
            Just("a"),
            Just("b"),
            Just("."),
            Just("*"),
            Just("+"),
            Just("?"),
            Just("("),
            Just(")"),
            Just("|"),
            Just("["),
            Just("]"),
            Just("^"),
            Just("$"),
            Just("\\d"),
            Just("\\"),
            Just("{2,3}"),
            Just("{1}"),
            Just("-"),
            Just("\""),
            Just("é"),
            Just("(?:"),
            Just("(?="),
            Just("\\1"),
            Just("[^"),
        ],
        0..8,
    )
    .prop_map(|parts| parts.concat());
    let leaf = prop_oneof![
        prop_oneof![
            Just("string"),
            Just("integer"),
            Just("number"),
            Just("boolean"),
            Just("null"),
            Just("object"),
            Just("array"),
            Just("bogus")
        ]
        .prop_map(|t| json!({"type": t})),
        pattern.prop_map(|p| json!({"type": "string", "pattern": p})),
        (proptest::option::of(-300i64..300), proptest::option::of(-300i64..300), any::<bool>()).prop_map(
            |(lo, hi, ex)| {
                let mut m = serde_json::Map::new();
                m.insert("type".into(), json!(if ex { "integer" } else { "number" }));
                if let Some(lo) = lo {
                    m.insert(if ex { "exclusiveMinimum" } else { "minimum" }.into(), json!(lo));
                }
                if let Some(hi) = hi {
                    m.insert("maximum".into(), json!(hi));
                }
                Value::Object(m)
            }
        ),
        (-10.0f64..10.0).prop_map(|x| json!({"type": "number", "minimum": x})),
        (0u64..5, proptest::option::of(0u64..8)).prop_map(|(lo, hi)| {
            let mut m = json!({"type": "string", "minLength": lo});
            if let Some(hi) = hi {
                m["maxLength"] = json!(hi);
            }
            m
        }),
        prop_oneof![Just("date"), Just("time"), Just("date-time"), Just("uuid"), Just("email"), Just("uri")]
            .prop_map(|f| json!({"type": "string", "format": f})),
        proptest::collection::vec(
            prop_oneof![Just(json!(1)), Just(json!("a\"\\")), Just(json!(null)), Just(json!({"k": [true]}))],
            0..4
        )
        .prop_map(|v| json!({"enum": v})),
        Just(json!({"const": "c"})),
        Just(json!({})),
        Just(json!(true)),
        Just(json!({"type": ["string", "null"]})),
        Just(json!({"$ref": "#/$defs/d0"})),
        Just(json!({"$ref": "#/$defs/d1"})),
    ];
    // Unsupported or contradictory: errors (drawn less often).
    let bad = prop_oneof![
        Just(json!(false)),
        Just(json!({"not": {}})),
        Just(json!({"type": "array", "uniqueItems": true})),
        Just(json!({"multipleOf": 3})),
        Just(json!({"$ref": "#"})),
        Just(json!({"$ref": "#/$defs/missing"})),
        Just(json!({"$ref": "https://example.com/x"})),
        Just(json!({"anyOf": []})),
    ];
    let leaf = prop_oneof![6 => leaf, 1 => bad];
    if depth == 0 {
        return leaf.boxed();
    }
    let inner = keyword_schema(depth - 1);
    let names = prop_oneof![Just("a"), Just("b"), Just("c d"), Just("é\"")];
    prop_oneof![
        leaf,
        (
            proptest::collection::btree_map(names, inner.clone(), 0..4),
            any::<u8>(),
            prop_oneof![
                Just(None),
                Just(Some(json!(false))),
                Just(Some(json!(true))),
                Just(Some(json!({"type": "integer"})))
            ]
        )
            .prop_map(|(props, mask, additional)| {
                let required: Vec<&str> =
                    props.keys().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, k)| *k).collect();
                let mut m = serde_json::Map::new();
                m.insert("type".into(), json!("object"));
                m.insert("required".into(), json!(required));
                m.insert(
                    "properties".into(),
                    Value::Object(props.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
                );
                if let Some(a) = additional {
                    m.insert("additionalProperties".into(), a);
                }
                Value::Object(m)
            }),
        (inner.clone(), proptest::option::of(0u64..4), proptest::option::of(0u64..6)).prop_map(|(items, lo, hi)| {
            let mut m = json!({"type": "array", "items": items});
            if let Some(lo) = lo {
                m["minItems"] = json!(lo);
            }
            if let Some(hi) = hi {
                m["maxItems"] = json!(hi);
            }
            m
        }),
        (proptest::collection::vec(inner.clone(), 1..3), proptest::option::of(inner.clone()))
            .prop_map(|(prefix, items)| json!({"prefixItems": prefix, "items": items.unwrap_or(json!(false))})),
        (prop_oneof![Just("anyOf"), Just("oneOf"), Just("allOf")], proptest::collection::vec(inner.clone(), 1..4))
            .prop_map(|(k, v)| json!({ k: v })),
    ]
    .boxed()
}

fn root_schema() -> impl Strategy<Value = Value> {
    (keyword_schema(3), keyword_schema(2), keyword_schema(1)).prop_map(|(body, d0, d1)| match body {
        Value::Object(mut m) => {
            m.insert("$defs".into(), json!({"d0": d0, "d1": d1}));
            Value::Object(m)
        }
        other => other,
    })
}

/// Documents tried against the grammars of random schemas.
const PROBES: &[&str] = &[
    "null",
    "true",
    "0",
    "-7",
    "250",
    "3.5",
    "-0.25",
    "1e2",
    r#""""#,
    r#""a""#,
    r#""ab""#,
    r#""a\"\\""#,
    r#""c""#,
    r#""2024-02-29""#,
    r#""12:00:00Z""#,
    r#""123e4567-e89b-12d3-a456-426614174000""#,
    "[]",
    "[1]",
    r#"[1, "a"]"#,
    "[null, null, null]",
    "{}",
    r#"{"a": 1}"#,
    r#"{"a": "a", "b": [true]}"#,
    r#"{"b": null, "c d": 2}"#,
    r#"{"k": [true]}"#,
];

/// At least this many of the 250 random schemas are checked for soundness
/// (the rest fail the meta-schema or are refused), and at least this many
/// probe documents are accepted by a grammar and checked by the validator.
/// Proptest seeds each run afresh: these sit well below what runs reach
/// (measured: 80 schemas validated and 279 probes accepted in one run).
const MIN_VALIDATED: usize = 40;
const MIN_PROBES_ACCEPTED: usize = 120;

/// How much of the soundness check the random schemas reached.
#[derive(Debug, Default)]
struct Reach {
    converted: usize,
    validated: usize,
    probes_accepted: usize,
    refused: usize,
}

/// The converter never panics; what it returns, llama.cpp's parser takes
/// (no parse error, no left recursion, no abort); what a grammar accepts,
/// its schema accepts. The tally shows that check ran on many schemas and
/// documents, not on a lucky few.
#[test]
fn random_schemas_convert_or_fail_cleanly() {
    let config = ProptestConfig { cases: 250, failure_persistence: None, ..ProptestConfig::default() };
    let reach = std::cell::RefCell::new(Reach::default());
    let result = proptest::test_runner::TestRunner::new(config).run(&root_schema(), |schema| {
        let mut reach = reach.borrow_mut();
        match schema_to_grammar(&schema) {
            Ok(gbnf) => {
                reach.converted += 1;
                let built = SamplerChain::new().grammar(vocab(), &gbnf, "root").greedy().build();
                prop_assert!(built.is_ok(), "{}: {:?}\n{}", schema, built.err(), gbnf);
                // Soundness: what the grammar accepts, the schema accepts
                // (checked where the schema is valid against the meta-schema:
                // an unused `$defs` entry may not be, and is never read).
                if let Ok(validator) = jsonschema::options().should_validate_formats(true).build(&schema) {
                    reach.validated += 1;
                    for doc in PROBES {
                        if accepts(&gbnf, doc) {
                            reach.probes_accepted += 1;
                            let value: Value = serde_json::from_str(doc).unwrap();
                            prop_assert!(
                                validator.is_valid(&value),
                                "{} accepted by the grammar of {}:\n{}",
                                doc,
                                schema,
                                gbnf
                            );
                        }
                    }
                }
            }
            Err(Error::JsonSchema { pointer, message }) => {
                reach.refused += 1;
                prop_assert!(pointer.is_empty() || pointer.starts_with('/'), "{pointer}");
                prop_assert!(!message.is_empty());
                // The pointer names a place in the schema.
                prop_assert!(
                    schema.pointer(&pointer).is_some() || pointer.ends_with("$ref") || pointer.contains("allOf"),
                    "{pointer} not in {schema}: {message}"
                );
            }
            Err(e) => prop_assert!(false, "{e}"),
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let reach = reach.into_inner();
    eprintln!("random schemas: {reach:?}");
    assert_eq!(reach.converted + reach.refused, 250, "{reach:?}");
    assert!(reach.validated >= MIN_VALIDATED, "{reach:?}");
    assert!(reach.probes_accepted >= MIN_PROBES_ACCEPTED, "{reach:?}");
}
