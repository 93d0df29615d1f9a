//! Checks of the repository's shape that a compiler does not make: the
//! floors of the `llamacpp` crate (a floor uses the floors below it,
//! never above, and no two of its modules import each other, directly or
//! around a loop), read off every `crate::` path in its sources; and the
//! docs' paths (every file the README's Layout and the docs name exists).
//!
//! The floors, bottom up: `llama` (llama.cpp's objects; with the crate's
//! `error` beside it), `sampling`, `text`, `serving`. `testing` (the
//! synthetic models) sits above them all and may be used by any floor's
//! unit tests. A module is a floor's file or folder (`llama/model`,
//! `text/chat`); `error.rs` is one of the first floor's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The floors, bottom up.
const FLOORS: &[&str] = &["llama", "sampling", "text", "serving"];

/// The one loop of imports the first floor keeps, and why: a context
/// borrows its model and is made from it; the memory plan loads
/// metadata-only models and contexts to measure them; and a model's load
/// asks the plan how many layers fit its devices (`GpuLayers::Fit`, the
/// default), with `ModelParams` holding the plan's `MemoryBudget` and the
/// `ContextParams` the fit must leave room for. Any other loop, or this one
/// grown by a module, fails the check.
const KNOTS: &[&[&str]] = &[&["llama/context", "llama/model", "llama/plan"]];

/// One `crate::` path in code (not in a comment), where it is written.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Import {
    /// The file, relative to the crate's `src/`.
    file: String,
    /// The 1-based line.
    line: usize,
    /// The path after `crate::` (`llama::model::Model`).
    path: String,
}

/// The floor of a module path's first segment: its index in [`FLOORS`];
/// `error` and `sys` are the first floor's; `None` for a name that is not
/// a floor (a root re-export such as `crate::Model`).
fn floor_of(first: &str) -> Option<usize> {
    match first {
        "error" | "Error" | "Result" | "sys" => Some(0),
        "testing" => Some(FLOORS.len()),
        _ => FLOORS.iter().position(|f| *f == first),
    }
}

/// The module a file or path belongs to: `error`, or a floor and its
/// first child (`text/chat`, `llama/types`).
fn module_of(segments: &[&str]) -> String {
    match segments {
        ["error" | "Error" | "Result", ..] => "error".to_owned(),
        [floor, child, ..] if FLOORS.contains(floor) => format!("{floor}/{child}"),
        [first, ..] => (*first).to_owned(),
        [] => String::new(),
    }
}

/// The code of a source file that is not its unit tests: everything before
/// a `#[cfg(test)]` (or `#[cfg(all(test, …))]`) followed by `mod tests`
/// (they come last by the house's rule), and nothing of a `tests.rs`.
fn non_test_code(file: &Path, text: &str) -> String {
    if file.file_name().is_some_and(|n| n == "tests.rs") {
        return String::new();
    }
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let test_cfg = line.trim().starts_with("#[cfg(") && line.contains("test");
        if test_cfg && lines.peek().is_some_and(|next| next.trim_start().starts_with("mod tests")) {
            break;
        }
        code.push_str(line);
        code.push('\n');
    }
    code
}

/// Every `crate::` path in `code`: inline paths and each member of a
/// `use crate::{…};` group (nested groups to their first segment).
fn imports_in(file: &str, code: &str) -> Vec<Import> {
    let mut found = Vec::new();
    for (i, line) in code.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            // `pub(crate)` and `$crate` are not paths into the crate.
            let before = &rest[..at];
            let path: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
            if !before.ends_with('$') && !path.is_empty() {
                found.push(Import { file: file.to_owned(), line: i + 1, path: path.trim_end_matches(':').to_owned() });
            }
            rest = after;
        }
    }
    // Members of groups, `use crate::{a::b, c::{d, e}}` or
    // `use crate::llama::{model::Model, vocab}`, which may span lines.
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let offset = code.len() - rest.len() + at;
        let after = &rest[at + "crate::".len()..];
        let prefix: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
        rest = after;
        let Some(body) = after[prefix.len()..].strip_prefix('{') else { continue };
        if !prefix.is_empty() && !prefix.ends_with("::") || code[..offset].ends_with('$') {
            continue;
        }
        let line = code[..offset].matches('\n').count() + 1;
        if code[..offset].rsplit('\n').next().is_some_and(|l| l.trim_start().starts_with("//")) {
            continue;
        }
        let mut depth = 0;
        let mut member = String::new();
        for c in body.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    push_member(&mut found, file, line, &prefix, &member);
                    member.clear();
                    continue;
                }
                _ => {}
            }
            member.push(c);
        }
        push_member(&mut found, file, line, &prefix, &member);
    }
    found
}

/// One member of a group (`model::{Model, X}` under `llama::`), to its
/// first segment.
fn push_member(found: &mut Vec<Import>, file: &str, line: usize, prefix: &str, member: &str) {
    let head: String = member.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
    let head = head.trim_end_matches(':');
    if !head.is_empty() && head != "self" {
        found.push(Import { file: file.to_owned(), line, path: format!("{prefix}{head}") });
    }
}

/// What the floor check finds wrong in the crate at `src`: each upward
/// import, each path that does not name its floor, and each loop of
/// imports between modules.
fn floor_violations(src: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rust_files(src) {
        let rel = file.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/");
        let rel = rel.trim_end_matches(".rs").trim_end_matches("/mod").to_owned();
        let segments: Vec<&str> = rel.split('/').collect();
        let Some(own_floor) = floor_of(segments[0]).filter(|_| segments[0] != "testing") else { continue };
        let own_module = module_of(&segments);
        let text = std::fs::read_to_string(&file).unwrap();
        for import in imports_in(&rel, &non_test_code(&file, &text)) {
            let path: Vec<&str> = import.path.split("::").collect();
            let Some(floor) = floor_of(path[0]) else {
                problems.push(format!(
                    "{}.rs:{}: crate::{} names no floor: write the path through its floor (crate::llama::…, crate::text::…)",
                    import.file, import.line, import.path
                ));
                continue;
            };
            if floor > own_floor {
                problems.push(format!(
                    "{}.rs:{}: crate::{} climbs from {} up to {}",
                    import.file,
                    import.line,
                    import.path,
                    FLOORS[own_floor],
                    FLOORS.get(floor).unwrap_or(&"testing")
                ));
            }
            let target = module_of(&path);
            if target != own_module && path.len() > 1 || target == "error" && own_module != "error" {
                edges.entry(own_module.clone()).or_default().insert(target);
            }
        }
    }
    for cycle in cycles(&edges).into_iter().filter(|c| !is_known_knot(c)) {
        problems.push(format!("modules import each other around a loop: {}", cycle.join(" -> ")));
    }
    problems
}

/// Whether a loop (as [`cycles`] describes it) is one of [`KNOTS`].
fn is_known_knot(cycle: &[String]) -> bool {
    let members: Vec<&str> = cycle.iter().map(|m| m.split(' ').next().unwrap_or("")).collect();
    KNOTS.contains(&members.as_slice())
}

/// The `.rs` files under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Each group of more than one module that import each other (directly or
/// around a loop), with what each member uses of the group. The graph is
/// small (tens of modules): each module's reach is found by a walk.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(m) = todo.pop() {
            for next in edges.get(m).into_iter().flatten() {
                if seen.insert(next) {
                    todo.push(next);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<&String>> = edges.keys().map(|m| (m, reach(m))).collect();
    let mut grouped = BTreeSet::new();
    let mut groups = Vec::new();
    for (m, from_m) in &reaches {
        if grouped.contains(m) || !from_m.contains(m) {
            continue;
        }
        // The modules on a loop through `m`: reached from it, reaching it.
        let group: Vec<&String> =
            from_m.iter().copied().filter(|o| reaches.get(o).is_some_and(|r| r.contains(m))).collect();
        grouped.extend(group.iter().copied());
        groups.push(
            group
                .iter()
                .map(|name| {
                    let uses: Vec<&str> =
                        edges[*name].iter().filter(|t| group.contains(t)).map(String::as_str).collect();
                    format!("{name} (uses {})", uses.join(", "))
                })
                .collect(),
        );
    }
    groups
}

/// The repository's own top-level folders and files a doc may name in a
/// path; `target/` and `vendor/` are made by builds, so not checked.
fn checked_top(root: &Path, first: &str) -> bool {
    !matches!(first, "target" | "vendor" | "") && root.join(first).exists()
}

/// What the docs name that is not in the tree: relative links of
/// `README.md`, `docs/*.md` and the crates' READMEs, and every path in
/// backticks that starts at a top-level folder of the repository
/// (`llamacpp/src/…`, `scripts/…`); paths with wildcards or placeholders
/// are not checked. The bundle `llamacpp-sys/llama.cpp/` is made by
/// `scripts/package.sh`.
fn missing_doc_paths(root: &Path) -> Vec<String> {
    let mut docs: Vec<PathBuf> =
        vec![root.join("README.md"), root.join("llamacpp-sys/README.md"), root.join("model-cache/README.md")];
    let mut in_docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    let mut missing = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        let name = doc.strip_prefix(root).unwrap().display().to_string();
        // Links: `](target)` with a relative target.
        for (at, _) in text.match_indices("](") {
            let target: String = text[at + 2..].chars().take_while(|c| !matches!(c, ')' | '#' | ' ')).collect();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            if !doc.parent().unwrap().join(&target).exists() {
                missing.push(format!("{name}: link to {target}"));
            }
        }
        // Paths in backticks.
        for (i, span) in text.split('`').enumerate() {
            let path_chars = |c: char| c.is_alphanumeric() || "_.+-/".contains(c);
            if i % 2 == 0 || !span.contains('/') || !span.chars().all(path_chars) {
                continue;
            }
            let first = span.split('/').next().unwrap();
            if !checked_top(root, first) || span.starts_with("llamacpp-sys/llama.cpp") {
                continue;
            }
            if !root.join(span).exists() {
                missing.push(format!("{name}: `{span}`"));
            }
        }
    }
    missing
}

/// What the README's Layout names that is not in the tree: each line is a
/// path, then what it holds, where every word that looks like a path (ends
/// in `/` or a file extension, outside backticks) is relative to the
/// line's path.
fn missing_layout_paths(root: &Path) -> Vec<String> {
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let layout = readme.split("## Layout").nth(1).expect("README.md has a Layout section");
    let block = layout.split("```text").nth(1).and_then(|b| b.split("```").next()).expect("a text block");
    let mut missing = Vec::new();
    let mut lines = 0;
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        lines += 1;
        let mut words = line.split_whitespace();
        let base = words.next().unwrap();
        if !root.join(base).exists() {
            missing.push(format!("Layout: {base}"));
            continue;
        }
        let mut quoted = false;
        for word in words {
            let ticks = word.matches('`').count();
            let inside = quoted || word.starts_with('`');
            if ticks % 2 == 1 {
                quoted = !quoted;
            }
            let word = word.trim_matches(|c: char| matches!(c, ',' | ';' | ':' | '(' | ')' | '.'));
            // `llama.cpp` is a name, `shim/shim.cpp` a path.
            let looks_like_path = word.ends_with('/')
                || [".rs", ".md", ".sh", ".py", ".toml"].iter().any(|e| word.ends_with(e))
                || word.contains('/') && word.ends_with(".cpp");
            if inside || !looks_like_path || word.contains('*') {
                continue;
            }
            if !root.join(base).join(word).exists() {
                missing.push(format!("Layout: {base} {word}"));
            }
        }
    }
    assert!(lines >= 10, "the Layout block has {lines} lines");
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("llamacpp/src")
    }

    /// The floors hold: nothing imports a floor above its own, every path
    /// names its floor, and no modules import each other.
    #[test]
    fn llamacpp_keeps_its_floors() {
        let problems = floor_violations(&src());
        assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
    }

    /// The check sees what it must: an upward import (inline, in a group,
    /// in a nested group), a path through a root re-export, and a loop;
    /// not a comment, `pub(crate)`, `$crate` or a unit test.
    #[test]
    fn the_floor_check_finds_each_kind_of_problem() {
        let dir = tempfile::tempdir().unwrap();
        let write = |rel: &str, text: &str| {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            "llama/model/mod.rs",
            "// crate::text::chat in a comment\npub(crate) use crate::llama::vocab::Vocab;\n\
             use crate::{error::Result, text::chat::ChatFormat};\nfn f() { crate::serving::engine::go(); }\n\
             macro_rules! m { () => { $crate::text::x } }\n\
             #[cfg(test)]\nmod tests {\n    use crate::text::generate;\n}\n",
        );
        write("llama/vocab.rs", "use crate::Model;\nuse crate::llama::{types::Token, model::{Model, X}};\n");
        write("sampling/sampler.rs", "use crate::{llama::{model::Model}, sampling::constraint::C};\n");
        write("sampling/constraint.rs", "use crate::sampling::sampler::S;\n");
        let problems = floor_violations(dir.path());
        let has = |needle: &str| problems.iter().any(|p| p.contains(needle));
        assert!(has("llama/model.rs:3: crate::text::chat::ChatFormat climbs from llama up to text"), "{problems:#?}");
        assert!(has("llama/model.rs:4: crate::serving::engine::go climbs from llama up to serving"), "{problems:#?}");
        assert!(has("llama/vocab.rs:1: crate::Model names no floor"), "{problems:#?}");
        assert!(has("loop: llama/model (uses llama/vocab) -> llama/vocab (uses llama/model)"), "{problems:#?}");
        assert!(has("sampling/constraint (uses sampling/sampler) -> sampling/sampler (uses sampling/constraint)"));
        // The comment, pub(crate), $crate and the unit test's import.
        assert_eq!(problems.len(), 5, "{problems:#?}");
    }

    /// Every path the docs and the README's Layout name exists.
    #[test]
    fn the_docs_name_only_paths_that_exist() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut missing = missing_doc_paths(root);
        missing.extend(missing_layout_paths(root));
        assert!(missing.is_empty(), "named in the docs, not in the tree:\n{}", missing.join("\n"));
    }
}
