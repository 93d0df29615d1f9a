//! A depth bound for recursive schemas: a `$ref` that reaches itself again
//! is unrolled a bounded number of times, and the innermost copy refers to
//! `false`, so a document must close there. Without it a recursive schema
//! (a tree whose nodes hold `children` arrays of nodes) lets greedy decoding
//! nest forever: measured, the default model never closed one within 1,000
//! tokens.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

/// Where the unrolled copies go, under the root's `$defs`.
const UNROLLED: &str = "llama-depth";

/// `schema` with every recursive local `$ref` unrolled `max_depth` times:
/// a value may nest at most `max_depth` schemas reached through a `$ref`
/// that is part of a cycle; `$ref`s outside cycles are left as they count
/// nothing. Returns the schema unchanged when it has no cycle.
pub(super) fn bound_recursion(schema: &Value, max_depth: usize) -> Value {
    let targets = local_ref_targets(schema);
    let recursive = recursive_targets(&targets);
    if recursive.is_empty() {
        return schema.clone();
    }
    let mut unroll = Unroll { root: schema, recursive: &recursive, max_depth, names: HashMap::new(), pending: vec![] };
    let mut out = unroll.rewrite(schema, 0);
    let mut defs = Map::new();
    while let Some((target, depth, name)) = unroll.pending.pop() {
        let body = match schema.pointer(&target) {
            Some(node) => unroll.rewrite(node, depth),
            None => Value::Bool(false),
        };
        defs.insert(name, body);
    }
    match &mut out {
        Value::Object(root) => {
            let all = root.entry("$defs").or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(all) = all {
                all.insert(UNROLLED.into(), Value::Object(defs));
            }
            out
        }
        // A root that is `true`/`false` has no `$ref` to unroll.
        _ => schema.clone(),
    }
}

/// The JSON pointer a local `$ref` names (`#` → `""`, `#/a/b` → `/a/b`).
fn local_pointer(reference: &str) -> Option<&str> {
    let pointer = reference.strip_prefix('#')?;
    (pointer.is_empty() || pointer.starts_with('/')).then_some(pointer)
}

/// Every `$ref` string under `node`, not descending into definitions
/// (they count where they are referred to).
fn refs_under<'a>(node: &'a Value, out: &mut Vec<&'a str>) {
    match node {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("$ref", Value::String(r)) => {
                        if let Some(p) = local_pointer(r) {
                            out.push(p);
                        }
                    }
                    ("$defs" | "definitions", _) => {}
                    _ => refs_under(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| refs_under(v, out)),
        _ => {}
    }
}

/// The local pointers some `$ref` names, with the pointers their own
/// subschemas refer to.
fn local_ref_targets(schema: &Value) -> HashMap<String, Vec<String>> {
    let mut edges = HashMap::new();
    let mut todo = vec![String::new()];
    let mut root_refs = Vec::new();
    refs_under(schema, &mut root_refs);
    todo.extend(root_refs.iter().map(|s| s.to_string()));
    while let Some(target) = todo.pop() {
        if edges.contains_key(&target) {
            continue;
        }
        let mut refs = Vec::new();
        if let Some(node) = schema.pointer(&target) {
            refs_under(node, &mut refs);
        }
        let refs: Vec<String> = refs.into_iter().map(str::to_string).collect();
        todo.extend(refs.iter().cloned());
        edges.insert(target, refs);
    }
    edges
}

/// The targets that can reach themselves through `$ref`s.
fn recursive_targets(edges: &HashMap<String, Vec<String>>) -> HashSet<String> {
    let mut recursive = HashSet::new();
    for start in edges.keys() {
        let mut seen = HashSet::new();
        let mut stack: Vec<&String> = edges[start].iter().collect();
        while let Some(next) = stack.pop() {
            if next == start {
                recursive.insert(start.clone());
                break;
            }
            if seen.insert(next) {
                stack.extend(edges.get(next).into_iter().flatten());
            }
        }
    }
    recursive
}

struct Unroll<'a> {
    root: &'a Value,
    recursive: &'a HashSet<String>,
    max_depth: usize,
    /// (target, depth) → the name of its copy.
    names: HashMap<(String, usize), String>,
    pending: Vec<(String, usize, String)>,
}

impl Unroll<'_> {
    /// `node` at `depth` recursive levels, its `$ref`s pointing at copies.
    fn rewrite(&mut self, node: &Value, depth: usize) -> Value {
        match node {
            Value::Object(map) => {
                let mut out = Map::with_capacity(map.len());
                for (key, value) in map {
                    let rewritten = match (key.as_str(), value) {
                        ("$ref", Value::String(r)) => match local_pointer(r) {
                            Some(target) if self.root.pointer(target).is_some() => {
                                let next = depth + usize::from(self.recursive.contains(target));
                                if next > self.max_depth {
                                    // The `$ref` is a conjunct: the node
                                    // cannot hold once it cannot.
                                    return Value::Bool(false);
                                }
                                Value::String(self.copy_of(target, next))
                            }
                            _ => value.clone(),
                        },
                        // Definitions are copied where they are referred to.
                        ("$defs" | "definitions", _) => value.clone(),
                        _ => self.rewrite(value, depth),
                    };
                    out.insert(key.clone(), rewritten);
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(items.iter().map(|v| self.rewrite(v, depth)).collect()),
            other => other.clone(),
        }
    }

    /// The `$ref` of `target`'s copy at `depth`, queued to be written.
    fn copy_of(&mut self, target: &str, depth: usize) -> String {
        let n = self.names.len();
        let name = self
            .names
            .entry((target.to_string(), depth))
            .or_insert_with(|| {
                let name = format!("{n}-{depth}");
                self.pending.push((target.to_string(), depth, name.clone()));
                name
            })
            .clone();
        format!("#/$defs/{UNROLLED}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tree() -> Value {
        json!({
            "$defs": {"node": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "required": ["name"]
            }},
            "$ref": "#/$defs/node"
        })
    }

    #[test]
    fn schemas_without_cycles_are_unchanged() {
        let flat = json!({"$defs": {"a": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/a"}}});
        assert_eq!(bound_recursion(&flat, 2), flat);
    }

    #[test]
    fn a_tree_is_unrolled_to_the_depth_and_ends_in_false() {
        let out = bound_recursion(&tree(), 2);
        let copies = out.pointer("/$defs/llama-depth").unwrap().as_object().unwrap();
        assert_eq!(copies.len(), 2, "{out:#}");
        let root_ref = out["$ref"].as_str().unwrap().to_string();
        let first = out.pointer(local_pointer(&root_ref).unwrap()).unwrap();
        let inner_ref = first.pointer("/properties/children/items/$ref").unwrap().as_str().unwrap();
        let second = out.pointer(local_pointer(inner_ref).unwrap()).unwrap();
        assert_eq!(second.pointer("/properties/children/items"), Some(&Value::Bool(false)), "{out:#}");
    }

    #[test]
    fn the_root_referring_to_itself_counts() {
        let schema = json!({"type": "object", "properties": {"next": {"$ref": "#"}}});
        let out = bound_recursion(&schema, 1);
        let copy = out.pointer(local_pointer(out.pointer("/properties/next/$ref").unwrap().as_str().unwrap()).unwrap());
        assert_eq!(copy.unwrap().pointer("/properties/next"), Some(&Value::Bool(false)), "{out:#}");
    }
}
