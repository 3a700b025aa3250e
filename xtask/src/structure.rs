//! The structure checks of every crate's source tree: no source file over [`MAX_LINES`] lines,
//! no import circle between the module files of a crate, the layer order each crate's root file
//! states (and the code keeps), and ARCHITECTURE.md's code map naming exactly the files there are.
//!
//! The module tree is read from the `mod x;` declarations from the crate root down; a module
//! declared under `#[cfg(test)]` (and everything below it) is test code and left out. A file's
//! imports are the `crate::…` and `super::…` paths in its code (comments, strings and inline
//! `#[cfg(test)] mod` blocks removed), each resolved to the deepest module file it names. A
//! parent declaring or re-exporting its own children is ownership, not an import, so edges from
//! a module to its descendants are not counted; a child using its parent's items is.
//!
//! Written here rather than with a Rust parser crate: the check needs only paths and `mod`
//! lines, and a text scan keeps xtask's build to one dependency.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The most lines a source file under `crates/*/src` may have (test modules aside).
pub const MAX_LINES: usize = 900;

/// The sentence in a crate root's module docs that states its layers.
const LAYERS: &str = "Layers, low to high:";

/// One module file of a crate's tree.
#[derive(Debug)]
struct Module {
    /// The module path below the crate root (`[]` for the root itself).
    path: Vec<String>,
    file: PathBuf,
    /// The code with comments, strings and inline test modules blanked.
    code: String,
    /// The names of the children declared with `mod x;` (test modules aside).
    children: Vec<String>,
}

/// Every structure problem of the crates under `root/crates`, one line each.
pub fn check(root: &Path, problems: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(root.join("crates")) else { return };
    let mut crates: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.join("src").is_dir()).collect();
    crates.sort();
    let architecture = std::fs::read_to_string(root.join("ARCHITECTURE.md")).ok();
    for dir in crates {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let src = dir.join("src");
        let root_file = ["lib.rs", "main.rs"].iter().map(|f| src.join(f)).find(|p| p.is_file());
        let Some(root_file) = root_file else { continue };
        let modules = read_tree(&root_file, problems);
        let shown = |file: &Path| file.strip_prefix(root).unwrap_or(file).display().to_string();
        for module in &modules {
            let lines = std::fs::read_to_string(&module.file).map(|t| t.lines().count()).unwrap_or(0);
            if lines > MAX_LINES {
                problems.push(format!(
                    "{}: {lines} lines; a source file keeps to {MAX_LINES} (split it by responsibility)",
                    shown(&module.file)
                ));
            }
        }
        let edges = imports(&modules);
        for circle in circles(&modules, &edges) {
            let files: Vec<String> = circle.iter().map(|&i| shown(&modules[i].file)).collect();
            problems.push(format!("crates/{name}: import circle between {}", files.join(" ↔ ")));
        }
        check_layers(&modules, &edges, &shown(&root_file), &shown, problems);
        if let Some(architecture) = &architecture {
            let files: Vec<String> = modules
                .iter()
                .filter(|m| !m.path.is_empty())
                .filter_map(|m| m.file.strip_prefix(&src).ok().map(|p| p.to_string_lossy().replace('\\', "/")))
                .collect();
            let root_name = root_file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            check_code_map(root, &src, architecture, &name, &files, &root_name, problems);
        }
    }
}

/// The crate's module tree from its root file, in declaration order.
fn read_tree(root_file: &Path, problems: &mut Vec<String>) -> Vec<Module> {
    let mut modules = Vec::new();
    let mut pending = vec![(Vec::new(), root_file.to_path_buf())];
    while let Some((path, file)) = pending.pop() {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let (code, declared) = clean(&text);
        let dir = child_dir(&file, path.is_empty());
        let mut children = Vec::new();
        for child in declared {
            let candidates = match &child.path_attribute {
                Some(relative) => vec![file.parent().unwrap_or(Path::new(".")).join(relative)],
                None => vec![dir.join(format!("{}.rs", child.name)), dir.join(&child.name).join("mod.rs")],
            };
            let Some(found) = candidates.into_iter().find(|p| p.is_file()) else {
                problems.push(format!("{}: `mod {};` has no file", file.display(), child.name));
                continue;
            };
            if child.test {
                continue;
            }
            let mut child_path = path.clone();
            child_path.push(child.name.clone());
            children.push(child.name);
            pending.push((child_path, found));
        }
        modules.push(Module { path, file, code, children });
    }
    modules.sort_by(|a, b| a.path.cmp(&b.path));
    modules
}

/// Where a file's `mod x;` children live: beside a crate root or `mod.rs`, else in the folder
/// named after the file.
fn child_dir(file: &Path, is_root: bool) -> PathBuf {
    let parent = file.parent().unwrap_or(Path::new(".")).to_path_buf();
    if is_root || file.file_name().is_some_and(|n| n == "mod.rs") {
        parent
    } else {
        parent.join(file.file_stem().unwrap_or_default())
    }
}

/// A `mod x;` line.
#[derive(Debug)]
struct Declared {
    name: String,
    test: bool,
    path_attribute: Option<String>,
}

/// The code with comments and string contents blanked and inline `#[cfg(test)]` modules cut,
/// and the `mod x;` declarations in it.
fn clean(text: &str) -> (String, Vec<Declared>) {
    let blanked = blank(text);
    let mut code = String::with_capacity(blanked.len());
    let mut declared = Vec::new();
    let mut attributes = String::new();
    let mut skip_depth: Option<i64> = None;
    let mut depth = 0i64;
    for (raw_line, line) in text.lines().zip(blanked.lines()) {
        let trimmed = line.trim();
        let opens = line.matches('{').count() as i64;
        let closes = line.matches('}').count() as i64;
        if let Some(start) = skip_depth {
            depth += opens - closes;
            if depth <= start {
                skip_depth = None;
            }
            code.push('\n');
            continue;
        }
        if trimmed.starts_with("#[") {
            attributes.push_str(raw_line.trim());
            code.push_str(line);
            code.push('\n');
            continue;
        }
        let test = attributes.contains("cfg(test)");
        if let Some(name) = mod_name(trimmed) {
            if trimmed.ends_with(';') {
                let path_attribute = attributes
                    .split_once("#[path = \"")
                    .and_then(|(_, rest)| rest.split_once('"'))
                    .map(|(p, _)| p.to_owned());
                declared.push(Declared { name, test, path_attribute });
            } else if test && opens > closes {
                skip_depth = Some(depth);
                depth += opens - closes;
                attributes.clear();
                code.push('\n');
                continue;
            }
        }
        if !trimmed.is_empty() {
            attributes.clear();
        }
        depth += opens - closes;
        code.push_str(line);
        code.push('\n');
    }
    (code, declared)
}

/// `x` of a line `[pub[(…)]] mod x;` or `… mod x {`.
fn mod_name(line: &str) -> Option<String> {
    let mut rest = line;
    if let Some(after) = rest.strip_prefix("pub") {
        rest = after.trim_start();
        if rest.starts_with('(') {
            rest = rest.split_once(')')?.1.trim_start();
        }
    }
    let rest = rest.strip_prefix("mod ")?;
    let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty()).then_some(name)
}

/// `text` with comments and the contents of string and char literals replaced by spaces
/// (newlines kept, so lines still line up).
fn blank(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let keep = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut nesting = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    nesting += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    nesting -= 1;
                    out.push_str("  ");
                    i += 2;
                    if nesting == 0 {
                        break;
                    }
                } else {
                    out.push(keep(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            // A raw string: r"…" or r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            out.push('"');
            i = j + 1;
            while i < chars.len() {
                if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                out.push(keep(chars[i]));
                i += 1;
            }
            out.push('"');
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(keep(chars[i]));
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let close = if next == Some('\\') {
                (i + 2..chars.len().min(i + 12)).find(|&j| chars[j] == '\'')
            } else {
                (chars.get(i + 2) == Some(&'\'')).then_some(i + 2)
            };
            match close {
                Some(end) => {
                    out.push_str("' '");
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// The import edges (from, to) between module files, indices into `modules`, without edges from
/// a module to itself or its descendants.
fn imports(modules: &[Module]) -> Vec<(usize, usize)> {
    let index: BTreeMap<&[String], usize> = modules.iter().enumerate().map(|(i, m)| (m.path.as_slice(), i)).collect();
    let mut edges = Vec::new();
    for (from, module) in modules.iter().enumerate() {
        for path in referenced_paths(&module.code, &module.path) {
            // The deepest module file the path names.
            let target = (0..=path.len()).rev().find_map(|n| index.get(&path[..n]).copied());
            if let Some(to) = target {
                let descendant = modules[to].path.starts_with(&module.path);
                if !descendant && !edges.contains(&(from, to)) {
                    edges.push((from, to));
                }
            }
        }
    }
    edges
}

/// Every absolute module path (segments below the crate root) that `crate::…` and `super::…`
/// paths in `code` name, for a module at `at`.
fn referenced_paths(code: &str, at: &[String]) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if ident_before(&chars, i) || (i > 0 && chars[i - 1] == ':') {
            i += 1;
            continue;
        }
        let rest: String = chars[i..chars.len().min(i + 7)].iter().collect();
        let base: Option<(Vec<String>, usize)> = if rest.starts_with("crate::") {
            Some((Vec::new(), 7))
        } else if rest.starts_with("super::") {
            let mut base = at.to_vec();
            let mut j = i;
            while chars[j..].iter().take(7).collect::<String>() == "super::" {
                base.pop();
                j += 7;
            }
            Some((base, j - i))
        } else {
            None
        };
        let Some((base, skip)) = base else {
            i += 1;
            continue;
        };
        i += skip;
        let (paths, used) = parse_tree(&chars[i..]);
        for tail in paths {
            let mut path = base.clone();
            path.extend(tail);
            found.push(path);
        }
        i += used.max(1);
    }
    found
}

/// The paths of a use tree starting at `chars` (`a::b::C`, `a::{b, c::D}`, …), and how many
/// chars it spans.
fn parse_tree(chars: &[char]) -> (Vec<Vec<String>>, usize) {
    let mut i = 0;
    let mut prefix = Vec::new();
    loop {
        while chars.get(i).is_some_and(|c| c.is_whitespace()) {
            i += 1;
        }
        let start = i;
        while chars.get(i).is_some_and(|c| c.is_alphanumeric() || *c == '_') {
            i += 1;
        }
        if i > start {
            prefix.push(chars[start..i].iter().collect::<String>());
        }
        let group_here = i == start && prefix.is_empty() && chars.get(i) == Some(&'{');
        let separator = chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':');
        if group_here || separator {
            if separator {
                i += 2;
            }
            if chars.get(i) == Some(&'{') {
                i += 1;
                let mut all = Vec::new();
                loop {
                    let (paths, used) = parse_tree(&chars[i..]);
                    i += used;
                    for tail in paths {
                        let mut path = prefix.clone();
                        path.extend(tail);
                        all.push(path);
                    }
                    // Skip an `as alias` or `self`/`*` remainder up to the separator.
                    let mut depth = 0;
                    while let Some(&c) = chars.get(i) {
                        match c {
                            '{' => depth += 1,
                            '}' if depth == 0 => break,
                            '}' => depth -= 1,
                            ',' if depth == 0 => break,
                            _ => {}
                        }
                        i += 1;
                    }
                    match chars.get(i) {
                        Some(',') => i += 1,
                        Some('}') => {
                            i += 1;
                            break;
                        }
                        _ => break,
                    }
                }
                if all.is_empty() {
                    all.push(prefix);
                }
                return (all, i);
            }
            continue;
        }
        return (vec![prefix], i);
    }
}

/// The import circles: strongly connected sets of more than one module file (Tarjan).
fn circles(modules: &[Module], edges: &[(usize, usize)]) -> Vec<Vec<usize>> {
    struct Walk<'a> {
        next: Vec<Vec<usize>>,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        counter: usize,
        found: &'a mut Vec<Vec<usize>>,
    }
    fn visit(walk: &mut Walk<'_>, v: usize) {
        walk.index[v] = Some(walk.counter);
        walk.low[v] = walk.counter;
        walk.counter += 1;
        walk.stack.push(v);
        walk.on_stack[v] = true;
        for w in walk.next[v].clone() {
            match walk.index[w] {
                None => {
                    visit(walk, w);
                    walk.low[v] = walk.low[v].min(walk.low[w]);
                }
                Some(index) if walk.on_stack[w] => walk.low[v] = walk.low[v].min(index),
                Some(_) => {}
            }
        }
        if Some(walk.low[v]) == walk.index[v] {
            let mut set = Vec::new();
            while let Some(w) = walk.stack.pop() {
                walk.on_stack[w] = false;
                set.push(w);
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                set.sort_unstable();
                walk.found.push(set);
            }
        }
    }
    let n = modules.len();
    let mut next = vec![Vec::new(); n];
    for &(from, to) in edges {
        next[from].push(to);
    }
    let mut found = Vec::new();
    let mut walk = Walk {
        next,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        counter: 0,
        found: &mut found,
    };
    for v in 0..n {
        if walk.index[v].is_none() {
            visit(&mut walk, v);
        }
    }
    found.sort();
    found
}

/// The root's `Layers, low to high: …` sentence lists every top-level module once, and no module
/// imports one of a higher layer.
fn check_layers(
    modules: &[Module],
    edges: &[(usize, usize)],
    shown_root: &str,
    shown: &dyn Fn(&Path) -> String,
    problems: &mut Vec<String>,
) {
    let Some(root) = modules.iter().find(|m| m.path.is_empty()) else { return };
    let text = std::fs::read_to_string(&root.file).unwrap_or_default();
    let Some(layers) = stated_layers(&text) else {
        problems.push(format!("{shown_root}: no `//! {LAYERS} `a` → `b`, `c`.` sentence in the module docs"));
        return;
    };
    let mut layer_of: BTreeMap<&str, usize> = BTreeMap::new();
    for (layer, group) in layers.iter().enumerate() {
        for name in group {
            if layer_of.insert(name, layer).is_some() {
                problems.push(format!("{shown_root}: `{name}` is named twice in the layer order"));
            }
        }
    }
    for name in layer_of.keys() {
        if !root.children.iter().any(|c| c == name) {
            problems.push(format!("{shown_root}: the layer order names `{name}`, which is no module of the crate"));
        }
    }
    for child in &root.children {
        if !layer_of.contains_key(child.as_str()) {
            problems.push(format!("{shown_root}: module `{child}` is missing from the layer order"));
        }
    }
    let mut reported = Vec::new();
    for &(from, to) in edges {
        let (Some(a), Some(b)) = (modules[from].path.first(), modules[to].path.first()) else { continue };
        let (Some(&la), Some(&lb)) = (layer_of.get(a.as_str()), layer_of.get(b.as_str())) else { continue };
        if lb > la && !reported.contains(&(a, b)) {
            reported.push((a, b));
            problems.push(format!(
                "{}: module `{a}` imports `{b}`, which the layer order in {shown_root} puts above it",
                shown(&modules[from].file)
            ));
        }
    }
}

/// The groups of the layer sentence in a root file's `//!` docs, low to high.
fn stated_layers(text: &str) -> Option<Vec<Vec<String>>> {
    let docs: String =
        text.lines().filter_map(|l| l.trim_start().strip_prefix("//!")).map(|l| format!("{} ", l.trim())).collect();
    let (_, rest) = docs.split_once(LAYERS)?;
    let (sentence, _) = rest.split_once('.')?;
    let groups: Vec<Vec<String>> = sentence
        .split('→')
        .map(|group| {
            group.split(',').map(|name| name.trim().trim_matches('`').to_owned()).filter(|n| !n.is_empty()).collect()
        })
        .collect();
    (groups.iter().all(|g: &Vec<String>| !g.is_empty())).then_some(groups)
}

/// ARCHITECTURE.md's section `### `crates/<name>` …` names every one of `files` (paths relative
/// to `src/`, in backticks; the root file may be named too) and no `.rs` path that does not exist
/// (another crate's file is named by its path from the workspace root).
fn check_code_map(
    root: &Path,
    src: &Path,
    architecture: &str,
    name: &str,
    files: &[String],
    root_name: &str,
    problems: &mut Vec<String>,
) {
    let heading = format!("crates/{name}");
    let mut section = None;
    let mut lines = architecture.lines();
    while let Some(line) = lines.next() {
        let is_heading =
            line.starts_with("### ") && line.split_whitespace().nth(1).is_some_and(|w| w.trim_matches('`') == heading);
        if is_heading {
            let body: Vec<&str> =
                lines.by_ref().take_while(|l| !l.starts_with("### ") && !l.starts_with("## ")).collect();
            section = Some(body.join("\n"));
            break;
        }
    }
    let Some(section) = section else {
        problems.push(format!("ARCHITECTURE.md: no code map section `### `{heading}` …`"));
        return;
    };
    let named: Vec<&str> = section
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|t| t.strip_prefix(&format!("{heading}/src/")).unwrap_or(t))
        .filter(|t| t.ends_with(".rs") && !t.contains(' ') && !t.starts_with("tests/") && !t.starts_with("examples/"))
        .collect();
    for file in files {
        if !named.contains(&file.as_str()) {
            problems.push(format!("ARCHITECTURE.md: the `{heading}` section does not name `{file}`"));
        }
    }
    let mut reported: Vec<&str> = Vec::new();
    for token in named {
        let exists = if token.starts_with("crates/") {
            root.join(token).is_file()
        } else {
            // A test module's file (not required, since it is no source file) may be named too.
            token == root_name || files.iter().any(|f| f == token) || src.join(token).is_file()
        };
        if !exists && !reported.contains(&token) {
            reported.push(token);
            problems.push(format!("ARCHITECTURE.md: the `{heading}` section names `{token}`, which is no source file"));
        }
    }
}

#[cfg(test)]
mod tests;
