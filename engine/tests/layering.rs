//! The engine's module graph is a DAG (docs/DESIGN-NOTES.md): no top-level module of
//! `engine/src` reaches, directly or through others, back to itself. Read from the source:
//! every `crate::<module>` path outside comments and `#[cfg(test)]` code is an edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read engine/src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`log/frames.rs` → `log`).
fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a component");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_owned()
}

/// `crate::<name>` references in code (not comments, not `#[cfg(test)]` items onwards).
fn references(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("#[cfg(test)]") {
            break; // unit tests sit at the end of a file and may reach anywhere
        }
        if code.starts_with("//") {
            continue;
        }
        let code = code.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| top_module(&src, f))
        .filter(|m| m != "lib")
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for file in &files {
        let from = top_module(&src, file);
        if from == "lib" || file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("read a source file");
        for to in references(&text) {
            if to != from && modules.contains(&to) {
                graph.get_mut(&from).expect("known module").insert(to);
            }
        }
    }
    graph
}

/// A cycle through `start`, if any (depth-first search for a path back to it).
fn cycle_from(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn visit(
        graph: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in &graph[at] {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if visit(graph, start, next, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_owned()];
    let mut seen = BTreeSet::new();
    visit(graph, start, start, &mut path, &mut seen).then_some(path)
}

#[test]
fn the_engine_module_graph_has_no_cycle() {
    let graph = module_graph();
    assert!(
        graph.len() > 20 && graph["shared"].contains("log"),
        "the scan found the modules and their edges: {graph:?}"
    );
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|m| cycle_from(&graph, m))
        .map(|c| c.join(" → "))
        .collect();
    assert!(
        cycles.is_empty(),
        "module cycles in engine/src (move the shared piece down a layer):\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_scan_sees_a_cycle_when_there_is_one() {
    let mut graph = module_graph();
    graph
        .get_mut("log")
        .expect("log module")
        .insert("shared".into());
    let cycle = cycle_from(&graph, "shared").expect("shared → log → shared");
    assert_eq!(cycle.first().map(String::as_str), Some("shared"));
    assert_eq!(cycle.last().map(String::as_str), Some("shared"));
}
