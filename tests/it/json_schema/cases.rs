//! The corpus of issue 15: schemas with valid and invalid documents, and
//! the schemas the GBNF converter refuses, shared by `corpus` (GBNF) and
//! `guided` (llguidance).

use serde_json::{Value, json};

pub(super) struct Case {
    pub(super) schema: Value,
    pub(super) valid: &'static [&'static str],
    pub(super) invalid: &'static [&'static str],
}

pub(super) fn case(schema: Value, valid: &'static [&'static str], invalid: &'static [&'static str]) -> Case {
    Case { schema, valid, invalid }
}

/// Documents list properties in the schema's order (see
/// `properties_come_in_declared_order`).
pub(super) fn cases() -> Vec<Case> {
    vec![
        case(
            json!({"type": "string"}),
            &[r#""hello""#, r#""esc \" \\ \n \u00e9 \/""#, r#""日本語""#, r#""""#],
            &["hello", r#""open"#, r#""bad \x escape""#, r#""\ud800""#],
        ),
        case(
            json!({"type": "integer"}),
            &["0", "-12", "42", "9007199254740991"],
            &["01", "1.5", r#""1""#, "1.0e3x", "-"],
        ),
        case(json!({"type": "number"}), &["3.14", "-0.5", "1e10", "2E-3", "7"], &[".5", "1.", "+1", "NaN", "0x10"]),
        case(json!({"type": "boolean"}), &["true", "false"], &["True", "1", "null"]),
        case(json!({"type": "null"}), &["null"], &["nil", "0", "\"null\""]),
        case(
            json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                   "required": ["a"], "additionalProperties": false}),
            &[r#"{"a":1}"#, r#"{"a": 1, "b": "x"}"#, "{ \"a\" : 1 }", "{\n  \"a\": 1,\n  \"b\": \"y\"\n}"],
            &[r#"{"b":"x"}"#, r#"{"a":1,"c":2}"#, r#"{"a":"1"}"#, r#"{"a":1,}"#, "{}"],
        ),
        case(
            json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
                   "additionalProperties": false}),
            &["{}", r#"{"b":2}"#, r#"{"a":1,"c":3}"#, r#"{"a":1,"b":2,"c":3}"#, r#"{"c":3}"#],
            &[r#"{,"b":2}"#, r#"{"a":1 "b":2}"#, r#"{"d":1}"#, r#"{"a":null}"#],
        ),
        case(
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}}),
            &[r#"{"a":1,"x":"y"}"#, r#"{"x":"y","z":"w"}"#, "{}", r#"{"ab":"s"}"#, r#"{"":"empty key"}"#],
            &[r#"{"a":1,"x":2}"#, r#"{"x":"y","a":"s"}"#, r#"{"a":"s"}"#],
        ),
        case(
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": true}),
            &[r#"{"a":1,"b":[1,{"c":null}]}"#, r#"{"a":1}"#],
            &[r#"{"b":1}"#, r#"{"a":1,"a":"x"}"#],
        ),
        case(
            json!({"type": "object"}),
            &[r#"{"k": [1, 2.5, "s", true, null, {"n": {}}]}"#, "{}"],
            &["[]", r#"{"k"}"#, "1"],
        ),
        case(
            json!({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}),
            &["[1,2]", "[1, 2, 3]", "[ -1 , 0 ]"],
            &["[1]", "[1,2,3,4]", r#"[1,"a"]"#, "[]"],
        ),
        case(json!({"type": "array"}), &["[]", r#"[1,"a",null,[[]]]"#], &["[1,]", "[,]", "{}"]),
        case(
            json!({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false}),
            &[r#"["a",1]"#, r#"["a"]"#, "[]"],
            &[r#"["a",1,2]"#, "[1]"],
        ),
        case(
            json!({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3}),
            &[r#"["a",1]"#, r#"["a",1,true]"#],
            &[r#"["a"]"#, r#"["a",1,2]"#, r#"["a",1,true,false]"#],
        ),
        case(
            json!({"type": "string", "minLength": 2, "maxLength": 4}),
            &[r#""ab""#, r#""abcd""#, r#""é日""#, r#""\n\t""#, r#""😀😀""#],
            &[r#""a""#, r#""abcde""#, r#""""#],
        ),
        case(json!({"enum": ["red", "green", "blue"]}), &[r#""red""#, r#""blue""#], &[r#""Red""#, r#""redd""#, "red"]),
        case(
            json!({"enum": [1, "a", null, true, {"k": [1, 2]}, [3], "café", "naïve \"q\""]}),
            &["1", r#""a""#, "null", "true", r#"{"k":[1,2]}"#, "[3]", r#""café""#, r#""naïve \"q\"""#],
            &["2", "false", r#"{"k":[1]}"#, r#""cafe""#],
        ),
        case(json!({"const": "fixed"}), &[r#""fixed""#], &[r#""other""#, "fixed"]),
        case(json!({"type": ["integer", "string"], "enum": [1, "x", null]}), &["1", r#""x""#], &["null", "2"]),
        case(
            json!({"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"}),
            &[r#""ABC-12""#, r#""XYZ-1234""#],
            &[r#""AB-12""#, r#""ABC-1""#, r#""abc-12""#, r#""ABC-12345""#],
        ),
        case(
            json!({"type": "string", "pattern": "ab"}),
            &[r#""ab""#, r#""xxabyy""#, r#""\"ab\n""#],
            &[r#""a b""#, r#""""#],
        ),
        case(
            json!({"type": "string", "pattern": "^(foo|ba[rz])+(\\.[a-z]*)?$"}),
            &[r#""foobar""#, r#""baz.x""#, r#""foo.""#],
            &[r#""fo""#, r#""bar.X""#, r#""""#],
        ),
        case(json!({"type": "string", "pattern": "^a\"b\\\\c$"}), &[r#""a\"b\\c""#], &[r#""a\"bc""#, r#""a"b\c""#]),
        case(
            json!({"type": "string", "pattern": "^\\d{3}\\s\\w+$"}),
            &[r#""123 abc""#, r#""123\tx_1""#],
            &[r#""12 abc""#, r#""123abc""#, r#""123 a-b""#],
        ),
        case(json!({"type": "string", "pattern": "^.+$"}), &[r#""anything é""#], &[r#""a\nb""#, r#""""#]),
        case(
            json!({"type": "string", "pattern": "^[^a-c\"]{2}$"}),
            &[r#""xy""#, r#""\\\n""#],
            &[r#""ab""#, r#""x\"""#],
        ),
        case(
            json!({"type": "string", "format": "date"}),
            &[r#""2024-02-29""#, r#""2023-12-31""#, r#""2000-02-29""#, r#""2023-04-30""#],
            &[r#""2023-02-29""#, r#""2023-13-01""#, r#""2023-04-31""#, r#""1900-02-29""#, r#""2023-1-01""#],
        ),
        case(
            json!({"type": "string", "format": "time"}),
            &[r#""12:34:56Z""#, r#""23:59:59.123+02:00""#],
            &[r#""24:00:00Z""#, r#""12:60:00Z""#, r#""12:34""#],
        ),
        case(
            json!({"type": "string", "format": "date-time"}),
            &[r#""2024-01-15T08:30:00Z""#, r#""1999-12-31T23:59:59-05:00""#],
            &[r#""2024-01-15 08:30""#, r#""2024-01-32T08:30:00Z""#],
        ),
        case(
            json!({"type": "string", "format": "uuid"}),
            &[r#""123e4567-e89b-12d3-a456-426614174000""#],
            &[r#""123e4567e89b12d3a456426614174000""#, r#""123e4567-e89b-12d3-a456-42661417400g""#],
        ),
        case(
            json!({"type": "string", "format": "email"}),
            &[r#""john.doe@example.com""#, r#""a+b@mail.co.uk""#],
            &[r#""john@""#, r#""no-at-sign""#, r#""@example.com""#],
        ),
        case(
            json!({"type": "integer", "minimum": 10, "maximum": 250}),
            &["10", "99", "137", "200", "250"],
            &["9", "251", "-10", "1000", "0"],
        ),
        case(
            json!({"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 5}),
            &["-4", "0", "4"],
            &["-5", "5", "10", "-40"],
        ),
        case(json!({"type": "integer", "minimum": 0}), &["0", "123456"], &["-1", "-100"]),
        case(json!({"type": "integer", "maximum": -3}), &["-3", "-1000"], &["-2", "0", "5"]),
        case(
            json!({"type": "number", "minimum": 0, "maximum": 1}),
            &["0", "0.5", "1", "1.0", "0.999"],
            &["1.01", "-0.1", "2", "1.5"],
        ),
        case(
            json!({"type": "number", "exclusiveMinimum": 0, "maximum": 100}),
            &["0.001", "100", "50.5", "1"],
            &["0", "0.0", "100.5", "-1", "101"],
        ),
        case(json!({"type": ["string", "null"], "maxLength": 3}), &[r#""abc""#, "null"], &[r#""abcd""#, "1"]),
        case(
            json!({"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "string"}}]}),
            &["5", r#"["a"]"#, "[]"],
            &[r#""a""#, "[1]"],
        ),
        case(
            json!({"oneOf": [
                {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind", "x"]},
                {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}}, "required": ["kind", "y"]}
            ]}),
            &[r#"{"kind":"a","x":1}"#, r#"{"kind":"b","y":"s"}"#],
            &[r#"{"kind":"a","y":"s"}"#, r#"{"kind":"c","x":1}"#],
        ),
        case(
            json!({"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}),
            &[r#""s""#, "3", "null"],
            &["true", "1.5"],
        ),
        case(
            json!({"allOf": [
                {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"$ref": "#/$defs/b"}
            ], "$defs": {"b": {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}}}),
            &[r#"{"a":1,"b":"x"}"#],
            &[r#"{"a":1}"#, r#"{"b":"x"}"#],
        ),
        case(
            json!({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                                         "required": ["x", "y"], "additionalProperties": false}},
                   "type": "array", "items": {"$ref": "#/$defs/point"}}),
            &[r#"[{"x":1,"y":2.5}]"#, "[]"],
            &[r#"[{"x":1}]"#, r#"[{"x":1,"y":"2"}]"#],
        ),
        case(
            json!({"$defs": {"node": {"type": "object", "properties": {
                        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                        "value": {"type": "integer"}}, "required": ["value"], "additionalProperties": false}},
                   "$ref": "#/$defs/node"}),
            &[r#"{"children":[{"value":2},{"children":[],"value":3}],"value":1}"#, r#"{"value":0}"#],
            &[r#"{"children":[{}],"value":1}"#, r#"{"children":[]}"#],
        ),
        case(
            json!({"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}, "v": {"type": "integer"}},
                   "required": ["next", "v"], "additionalProperties": false}),
            &[r#"{"next":{"next":null,"v":2},"v":1}"#, r#"{"next":null,"v":1}"#],
            &[r#"{"next":{"v":2},"v":1}"#],
        ),
        case(
            json!({"definitions": {"s": {"type": "string", "maxLength": 2}}, "properties": {"a": {"$ref": "#/definitions/s"}},
                   "required": ["a"], "additionalProperties": false}),
            &[r#"{"a":"xy"}"#],
            &[r#"{"a":"xyz"}"#, r#"{"a":1}"#],
        ),
        case(json!({}), &[r#"[1, {"a": null}]"#, r#""s""#, "3", "null"], &["[1,", "nul", "{'a': 1}"]),
        case(json!(true), &["{}", "-1.5e3"], &["]"]),
        case(
            json!({"type": "object", "properties": {
                "tags": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "maxItems": 2},
                "user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1}, "name": {"type": "string"}},
                         "required": ["id", "name"], "additionalProperties": false}},
                "required": ["tags", "user"], "additionalProperties": false}),
            &[r#"{"tags":["x","z"],"user":{"id":7,"name":"Ann"}}"#, r#"{"tags":[],"user":{"id":1,"name":""}}"#],
            &[r#"{"tags":["x","y","z"],"user":{"id":7,"name":"Ann"}}"#, r#"{"tags":[],"user":{"id":0,"name":"A"}}"#],
        ),
        case(
            json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array", "items": [{"type": "integer"}], "additionalItems": false}),
            &["[1]", "[]"],
            &["[1,2]", r#"["a"]"#],
        ),
    ]
}

/// Unsupported keywords and constructs, with the pointer and a word of
/// the converter's error.
pub(super) fn unsupported_cases() -> Vec<(Value, &'static str, &'static str)> {
    vec![
        (json!({"type": "array", "uniqueItems": true}), "/uniqueItems", "uniqueItems"),
        (json!({"type": "number", "multipleOf": 2}), "/multipleOf", "multipleOf"),
        (json!({"not": {"type": "null"}}), "/not", "not"),
        (json!({"if": {}, "then": {}}), "/if", "if"),
        (
            json!({"properties": {"a": {"patternProperties": {}}}}),
            "/properties/a/patternProperties",
            "patternProperties",
        ),
        (json!({"type": "object", "dependentRequired": {}}), "/dependentRequired", "dependentRequired"),
        (json!({"minProperties": 1}), "/minProperties", "minProperties"),
        (json!({"items": {"contains": {}}}), "/items/contains", "contains"),
        (
            json!({"type": "array", "items": {"type": "string", "propertyNames": {}}}),
            "/items/propertyNames",
            "propertyNames",
        ),
        (json!({"$ref": "other.json#/x"}), "/$ref", "local"),
        (json!({"$ref": "#/$defs/missing"}), "/$ref", "resolve"),
        (json!({"$ref": "#anchor"}), "/$ref", "anchor"),
        (json!({"type": "string", "pattern": "(a)\\1"}), "/pattern", "backreference"),
        (json!({"type": "string", "pattern": "(?=a)b"}), "/pattern", "lookaround"),
        (json!({"type": "string", "pattern": "a\\bc"}), "/pattern", "boundar"),
        (json!({"type": "string", "format": "uri"}), "/format", "uri"),
        (json!({"type": "number", "minimum": 0.5}), "/minimum", "minimum"),
        (json!({"oneOf": [{"type": "integer"}, {"type": "number"}]}), "/oneOf", "oneOf"),
        (json!({"anyOf": [{"type": "string"}, false]}), "/anyOf/1", "false"),
        (
            json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"}),
            "/$defs/b/anyOf/0/$ref",
            "left recursion",
        ),
        (json!({"type": "object", "properties": {"a": {}}, "required": ["b"]}), "/required", "\"b\""),
        (json!({"prefixItems": [{}], "items": false, "minItems": 2}), "/minItems", "minItems"),
        (json!({"type": "integer", "minimum": 5, "maximum": 4}), "", "no integer"),
        (json!({"enum": []}), "/enum", "enum"),
        (json!({"type": "strin"}), "/type", "strin"),
        (json!({"properties": {"a": {"$anchor": "x"}}}), "/properties/a/$anchor", "$anchor"),
        (json!({"type": "string", "maxLength": 100000}), "/maxLength", "maxLength"),
        (json!(false), "", "false"),
        (
            json!({"properties": {"x/y~z": {"unevaluatedProperties": false}}}),
            "/properties/x~1y~0z/unevaluatedProperties",
            "unevaluated",
        ),
    ]
}
