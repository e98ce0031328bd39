//! The repository's docs stand alone and stay true to the workspace: README.md,
//! ARCHITECTURE.md and docs/*.md point at nothing outside the repository, every repository
//! path, source file, module and type they name exists, and ARCHITECTURE's layer diagram names
//! every workspace member and nothing else, with exactly the dependencies the members'
//! manifests declare.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The repository's root (this crate is `crates/agentbox-cli`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// README.md, ARCHITECTURE.md and every docs/*.md, with their text.
fn docs() -> Vec<(PathBuf, String)> {
    let root = root();
    let mut paths = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("a docs/ directory")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    more.sort();
    paths.extend(more);
    let docs: Vec<(PathBuf, String)> = paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, text)
        })
        .collect();
    let names: Vec<String> = docs.iter().map(|(p, _)| shown(p)).collect();
    for must in ["README.md", "ARCHITECTURE.md", "docs/tools.md", "docs/providers.md"] {
        assert!(names.iter().any(|n| n == must), "{must} is missing (found {names:?})");
    }
    docs
}

/// A path as the repository names it.
fn shown(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

/// Each line of `text` with its number and whether it is inside a fenced code block.
fn lines(text: &str) -> Vec<(usize, bool, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        out.push((i + 1, fenced, line));
    }
    out
}

#[test]
fn no_doc_points_outside_the_repository() {
    let root = root();
    let mut wrong = Vec::new();
    for (path, text) in docs() {
        let dir = path.parent().unwrap().to_path_buf();
        for (n, fenced, line) in lines(&text) {
            // Spelt in parts, so this test is not itself a line that points outside.
            for outside in [concat!("..", "/shared"), concat!("/work", "/shared")] {
                if line.contains(outside) {
                    wrong.push(format!("{}:{n}: names {outside}: {line}", shown(&path)));
                }
            }
            if fenced {
                continue;
            }
            // Markdown links, `](target)`: a link to the web is the web's; any other must be a
            // file of this repository.
            for (i, _) in line.match_indices("](") {
                let rest = &line[i + 2..];
                let Some(end) = rest.find(')') else { continue };
                let target = rest[..end].split('#').next().unwrap_or_default();
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                match dir.join(target).canonicalize() {
                    Ok(p) if p.starts_with(&root) => {}
                    Ok(p) => wrong.push(format!(
                        "{}:{n}: links {target}, which is outside the repository ({})",
                        shown(&path),
                        p.display()
                    )),
                    Err(e) => wrong.push(format!("{}:{n}: links {target}, which is not there: {e}", shown(&path))),
                }
            }
        }
    }
    assert!(wrong.is_empty(), "the docs must stand alone:\n{}", wrong.join("\n"));
}

/// More than a few `what` were checked (else the parse is wrong), and none of them is
/// `missing`, which lists each as `doc:line: name` under `says`.
fn found_all(checked: usize, what: &str, missing: &[String], says: &str) {
    assert!(
        checked > 20,
        "only {checked} {what} found in the docs: is the parse right?"
    );
    assert!(missing.is_empty(), "{says}:\n{}", missing.join("\n"));
}

/// The code spans of one line of prose: what stands between backticks.
fn code_spans(line: &str) -> impl Iterator<Item = &str> {
    line.split('`').skip(1).step_by(2)
}

/// Where a repository path a doc names may start.
const TOP: &[&str] = &["crates/", "docs/", "scripts/", "fuzz/", ".ci/"];

#[test]
fn every_repository_path_a_doc_names_exists() {
    let root = root();
    let mut checked = 0;
    let mut missing = Vec::new();
    for (path, text) in docs() {
        for (n, fenced, line) in lines(&text) {
            // In prose, paths are code spans; in a code block, words (a command's argument, the
            // comment that says which file an excerpt is from).
            let words: Vec<&str> = if fenced {
                line.split_whitespace().collect()
            } else {
                code_spans(line).collect()
            };
            for w in words {
                let w = w.trim_end_matches([',', '.', ';', ':', ')']);
                if !TOP.iter().any(|t| w.starts_with(t)) || w.contains(['<', '>', '*', '…', '{', ' ']) {
                    continue;
                }
                checked += 1;
                if !root.join(w).exists() {
                    missing.push(format!("{}:{n}: {w}", shown(&path)));
                }
            }
        }
    }
    found_all(
        checked,
        "paths",
        &missing,
        "paths the docs name that the repository does not hold",
    );
}

/// Every Rust source of the workspace (crates and fuzz targets), as the repository names it.
fn sources() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            if p.is_dir() && name != "target" && name != "node_modules" {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = root();
    let mut out = Vec::new();
    walk(&root.join("crates"), &mut out);
    walk(&root.join("fuzz"), &mut out);
    out.iter().map(|p| shown(p)).collect()
}

/// The code spans of prose (not of code blocks), with the line each is on.
fn spans(text: &str) -> Vec<(usize, &str)> {
    lines(text)
        .into_iter()
        .filter(|(_, fenced, _)| !fenced)
        .flat_map(|(n, _, line)| code_spans(line).map(move |w| (n, w)))
        .collect()
}

#[test]
fn every_source_file_a_doc_names_exists() {
    let sources = sources();
    let mut checked = 0;
    let mut missing = Vec::new();
    for (path, text) in docs() {
        for (n, w) in spans(&text) {
            // `sockets.rs`, `namespace/sockets.rs`: a file of the workspace, by the end of its
            // path (a whole path from the root is the test above's).
            let is_file =
                w.ends_with(".rs") && w.len() > 3 && w.chars().all(|c| c.is_ascii_alphanumeric() || "_-/.".contains(c));
            if !is_file || TOP.iter().any(|t| w.starts_with(t)) {
                continue;
            }
            checked += 1;
            if !sources.iter().any(|s| s.ends_with(&format!("/{w}"))) {
                missing.push(format!("{}:{n}: {w}", shown(&path)));
            }
        }
    }
    found_all(
        checked,
        "source files",
        &missing,
        "source files the docs name that the workspace does not hold",
    );
}

/// Every identifier in the sources under `dir` (its words of `[A-Za-z0-9_]`).
fn words_in(files: &[String], prefix: &str) -> BTreeSet<String> {
    let root = root();
    let mut words = BTreeSet::new();
    for f in files.iter().filter(|f| f.starts_with(prefix)) {
        let text = std::fs::read_to_string(root.join(f)).unwrap_or_default();
        for w in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !w.is_empty() {
                words.insert(w.to_string());
            }
        }
    }
    words
}

/// The types the workspace defines: the names after `struct`, `enum`, `trait`, `type`, `union`.
fn types_defined(files: &[String]) -> BTreeSet<String> {
    let root = root();
    let mut types = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(root.join(f)).unwrap_or_default();
        let tokens: Vec<&str> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        for pair in tokens.windows(2) {
            if ["struct", "enum", "trait", "type", "union"].contains(&pair[0]) {
                types.insert(pair[1].to_string());
            }
        }
    }
    types
}

#[test]
fn every_module_and_type_a_doc_names_is_in_the_code() {
    let files = sources();
    let all = words_in(&files, "");
    let types = types_defined(&files);
    let mut by_crate: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let root = root();
    let mut checked = 0;
    let mut missing = Vec::new();
    for (path, text) in docs() {
        for (n, w) in spans(&text) {
            // A Rust path as the docs write one: `agentbox_core::durability`,
            // `Sandbox::files()`, `LazyEnv::new`: segments of identifiers joined by `::`, a
            // call's parentheses at the end.
            let bare = w.split('(').next().unwrap_or_default().trim_end_matches("::");
            let segments: Vec<&str> = bare.split("::").collect();
            let ident = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if segments.len() < 2 || !segments.iter().all(|s| ident(s)) {
                continue;
            }
            let first = segments[0];
            let words = if let Some(krate) = first.strip_prefix("agentbox_") {
                let dir = format!("crates/agentbox-{}/", krate.replace('_', "-"));
                if !root.join(&dir).is_dir() {
                    missing.push(format!("{}:{n}: {w}: no crate {dir}", shown(&path)));
                    continue;
                }
                &*by_crate.entry(dir.clone()).or_insert_with(|| words_in(&files, &dir))
            } else if first.starts_with(|c: char| c.is_ascii_uppercase()) && first.chars().any(|c| c.is_lowercase()) {
                if !types.contains(first) {
                    missing.push(format!("{}:{n}: {w}: no type {first} in the workspace", shown(&path)));
                    continue;
                }
                &all
            } else {
                continue;
            };
            let rest = &segments[1..];
            checked += 1;
            if let Some(gone) = rest.iter().find(|s| !words.contains(**s)) {
                missing.push(format!("{}:{n}: {w}: {gone} is in none of its sources", shown(&path)));
            }
        }
    }
    found_all(
        checked,
        "Rust paths",
        &missing,
        "modules and types the docs name that the code does not hold",
    );
}

#[test]
fn the_readme_asks_for_the_rust_the_workspace_declares() {
    let workspace = toml_file(&root().join("Cargo.toml"));
    let declared = workspace["workspace"]["package"]["rust-version"]
        .as_str()
        .expect("workspace.package.rust-version");
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let asked = readme
        .split("Rust (")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect("the README's quick start says which Rust: \"Rust (1.NN or later\"");
    assert_eq!(asked, declared, "the README's Rust is not the workspace's rust-version");
}

/// A workspace member as its manifest declares it.
struct Member {
    /// Its workspace crates among `[dependencies]`.
    normal: BTreeSet<String>,
    /// Its workspace crates among `[dev-dependencies]` only.
    dev: BTreeSet<String>,
}

fn toml_file(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The workspace crates (`agentbox-…`) named in the dependency tables called `kind`, also the
/// target-specific ones.
fn workspace_deps(manifest: &toml::Table, kind: &str) -> BTreeSet<String> {
    let mut tables: Vec<&toml::Table> = manifest.get(kind).and_then(|t| t.as_table()).into_iter().collect();
    if let Some(targets) = manifest.get("target").and_then(|t| t.as_table()) {
        for t in targets.values() {
            tables.extend(t.get(kind).and_then(|t| t.as_table()));
        }
    }
    tables
        .into_iter()
        .flat_map(|t| t.keys())
        .filter(|k| k.starts_with("agentbox-"))
        .cloned()
        .collect()
}

/// Every member of the root Cargo.toml's `workspace.members`, by package name.
fn members() -> BTreeMap<String, Member> {
    let root = root();
    let workspace = toml_file(&root.join("Cargo.toml"));
    let dirs = workspace["workspace"]["members"]
        .as_array()
        .expect("workspace.members is a list");
    let mut out = BTreeMap::new();
    for dir in dirs {
        let dir = dir.as_str().expect("a member is a path");
        let manifest = toml_file(&root.join(dir).join("Cargo.toml"));
        let name = manifest["package"]["name"]
            .as_str()
            .unwrap_or_else(|| panic!("{dir}: package.name"))
            .to_string();
        let normal = workspace_deps(&manifest, "dependencies");
        let dev = workspace_deps(&manifest, "dev-dependencies")
            .difference(&normal)
            .cloned()
            .collect();
        out.insert(name, Member { normal, dev });
    }
    assert!(out.len() >= 10, "only {} members read from Cargo.toml", out.len());
    out
}

/// One line of the diagram: a crate, its normal dependencies, its dev-only ones.
struct Line {
    name: String,
    normal: BTreeSet<String>,
    dev: BTreeSet<String>,
}

/// The layer diagram: the first code block of ARCHITECTURE.md's "## The layers", one crate a
/// line, `──►` before its normal dependencies and `┄►` before its dev-only ones (short names:
/// `core` for `agentbox-core`).
fn diagram() -> Vec<Line> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let section = text
        .split("\n## The layers")
        .nth(1)
        .expect("ARCHITECTURE.md has a section \"## The layers\"");
    let section = section.split("\n## ").next().unwrap();
    let block = section.split("```").nth(1).expect("\"## The layers\" has a code block");
    let full = |short: &str| format!("agentbox-{short}");
    let mut out = Vec::new();
    for line in block.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let (before_dev, dev) = line.split_once("┄►").unwrap_or((line, ""));
        let (name, normal) = before_dev.split_once("──►").unwrap_or((before_dev, ""));
        let name = name.trim();
        assert!(
            !name.is_empty() && !name.contains(' '),
            "a diagram line starts with one crate's name: {line:?}"
        );
        out.push(Line {
            name: name.to_string(),
            normal: normal.split_whitespace().map(full).collect(),
            dev: dev.split_whitespace().map(full).collect(),
        });
    }
    out
}

#[test]
fn the_layer_diagram_is_the_workspace_and_its_dependencies() {
    let members = members();
    let lines = diagram();
    let mut wrong = Vec::new();

    let drawn: Vec<&str> = lines.iter().map(|l| l.name.as_str()).collect();
    let unique: BTreeSet<&str> = drawn.iter().copied().collect();
    if unique.len() != drawn.len() {
        wrong.push(format!("a crate is drawn twice: {drawn:?}"));
    }
    for name in &unique {
        if !members.contains_key(*name) {
            wrong.push(format!("{name} is in the diagram but is no workspace member"));
        }
    }
    for name in members.keys() {
        if !unique.contains(name.as_str()) {
            wrong.push(format!("{name} is a workspace member the diagram does not name"));
        }
    }

    for (at, line) in lines.iter().enumerate() {
        let Some(m) = members.get(&line.name) else { continue };
        if line.normal != m.normal {
            wrong.push(format!(
                "{}: the diagram draws dependencies {:?}, its Cargo.toml has {:?}",
                line.name, line.normal, m.normal
            ));
        }
        if line.dev != m.dev {
            wrong.push(format!(
                "{}: the diagram draws dev-only dependencies {:?}, its Cargo.toml has {:?}",
                line.name, line.dev, m.dev
            ));
        }
        // Calls flow down: every normal dependency is drawn below its dependent.
        let above: BTreeSet<&str> = lines[..at].iter().map(|l| l.name.as_str()).collect();
        for dep in &line.normal {
            if above.contains(dep.as_str()) || *dep == line.name {
                wrong.push(format!("{} depends on {dep}, which is drawn above it", line.name));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md's layer diagram is not the workspace:\n{}",
        wrong.join("\n")
    );
}
