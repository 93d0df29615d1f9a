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

/// At most this many JSON nodes in all unrolled copies together: once the
/// next copy would pass it, the `$ref` that needs it becomes `false`, as
/// at the depth bound. Each copy is a whole subschema, so without it a few
/// MB of schema with many recursive targets unrolled into gigabytes.
pub(super) const MAX_UNROLLED_NODES: usize = 1 << 16;

/// `schema` with every recursive local `$ref` unrolled `max_depth` times:
/// a value may nest at most `max_depth` schemas reached through a `$ref`
/// that is part of a cycle; `$ref`s outside cycles are left as they count
/// nothing. The copies hold at most [`MAX_UNROLLED_NODES`] nodes (deeper
/// nesting ends in `false` sooner) and no definitions (their `$ref`s point
/// into the original ones). Returns the schema unchanged when it has no
/// cycle.
pub(super) fn bound_recursion(schema: &Value, max_depth: usize) -> Value {
    let targets = local_ref_targets(schema);
    let recursive = recursive_targets(&targets);
    if recursive.is_empty() {
        return schema.clone();
    }
    let mut unroll = Unroll {
        root: schema,
        recursive: &recursive,
        max_depth,
        names: HashMap::new(),
        pending: vec![],
        sizes: HashMap::new(),
        produced: 0,
        keep_defs: true,
    };
    let mut out = unroll.rewrite(schema, 0);
    unroll.keep_defs = false;
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
    /// Nodes of each target (definitions aside), and of all copies so far.
    sizes: HashMap<String, usize>,
    produced: usize,
    /// Definitions are kept in the original tree, not in copies.
    keep_defs: bool,
}

/// JSON nodes under `node`, not counting definitions.
fn nodes(node: &Value) -> usize {
    match node {
        Value::Object(map) => {
            1 + map
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "$defs" | "definitions"))
                .map(|(_, v)| nodes(v))
                .sum::<usize>()
        }
        Value::Array(items) => 1 + items.iter().map(nodes).sum::<usize>(),
        _ => 1,
    }
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
                                if next > self.max_depth || !self.affords(target, next) {
                                    // The `$ref` is a conjunct: the node
                                    // cannot hold once it cannot.
                                    return Value::Bool(false);
                                }
                                Value::String(self.copy_of(target, next))
                            }
                            _ => value.clone(),
                        },
                        // Definitions are copied where they are referred to.
                        ("$defs" | "definitions", _) if self.keep_defs => value.clone(),
                        ("$defs" | "definitions", _) => continue,
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

    /// Whether `target`'s copy at `depth` exists or fits the budget (then
    /// it is counted).
    fn affords(&mut self, target: &str, depth: usize) -> bool {
        if self.names.contains_key(&(target.to_string(), depth)) {
            return true;
        }
        let root = self.root;
        let size = *self.sizes.entry(target.to_string()).or_insert_with(|| root.pointer(target).map_or(1, nodes));
        if self.produced.saturating_add(size) > MAX_UNROLLED_NODES {
            return false;
        }
        self.produced += size;
        true
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

    /// Many recursive targets, each a large subschema: the copies stop at
    /// the node budget (the rest end in `false`), and copies hold no
    /// definitions, so the output stays within the input plus the budget.
    #[test]
    fn unrolling_is_bounded_by_the_size_it_produces() {
        let pad: Map<String, Value> =
            (0..100).map(|i| (format!("p{i}"), json!({"type": "integer", "minimum": i}))).collect();
        let defs: Map<String, Value> = (0..200)
            .map(|i| {
                let node = json!({"type": "object", "properties": {"next": {"$ref": format!("#/$defs/d{i}")}, "pad": {"type": "object", "properties": pad}}});
                (format!("d{i}"), node)
            })
            .collect();
        let refs: Map<String, Value> =
            (0..200).map(|i| (format!("x{i}"), json!({"$ref": format!("#/$defs/d{i}")}))).collect();
        let schema = json!({"$defs": defs, "type": "object", "properties": refs});
        let input = nodes_all(&schema);
        // Unbounded, 200 targets × 8 depths × ~300 nodes: about 500,000.
        let out = bound_recursion(&schema, 8);
        let produced = nodes_all(&out) - input;
        assert!(produced <= MAX_UNROLLED_NODES + 1000, "{produced} nodes unrolled");
        assert!(produced > MAX_UNROLLED_NODES / 2, "{produced}: the budget is used");
        // The small tree still unrolls to its full depth.
        let tree = bound_recursion(&tree(), 8);
        assert_eq!(tree.pointer("/$defs/llama-depth").unwrap().as_object().unwrap().len(), 8);
    }

    fn nodes_all(node: &Value) -> usize {
        match node {
            Value::Object(map) => 1 + map.values().map(nodes_all).sum::<usize>(),
            Value::Array(items) => 1 + items.iter().map(nodes_all).sum::<usize>(),
            _ => 1,
        }
    }

    #[test]
    fn the_root_referring_to_itself_counts() {
        let schema = json!({"type": "object", "properties": {"next": {"$ref": "#"}}});
        let out = bound_recursion(&schema, 1);
        let copy = out.pointer(local_pointer(out.pointer("/properties/next/$ref").unwrap().as_str().unwrap()).unwrap());
        assert_eq!(copy.unwrap().pointer("/properties/next"), Some(&Value::Bool(false)), "{out:#}");
    }
}
