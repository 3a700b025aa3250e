//! Tests of the structure checks on small made-up trees.

use std::path::{Path, PathBuf};

/// A fresh folder with `files` (path, text) written under it.
fn tree(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("palisade-structure-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let file = dir.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, text).unwrap();
    }
    dir
}

fn problems_of(dir: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    super::check(dir, &mut problems);
    std::fs::remove_dir_all(dir).unwrap();
    problems
}

const MAP: &str = "### `crates/x` — x\n\n`a.rs`, `b.rs`, `p/mod.rs`, `p/c.rs`\n\n## Next\n";

#[test]
fn a_tree_that_keeps_the_rules_has_no_problem() {
    let dir = tree(
        "clean",
        &[
            ("ARCHITECTURE.md", MAP),
            (
                "crates/x/src/lib.rs",
                "//! X.\n//! Layers, low to high: `a` →\n//! `b`, `p`.\nmod a;\nmod b;\npub mod p;\n",
            ),
            // Comments, strings and test code name `b` without importing it.
            (
                "crates/x/src/a.rs",
                "//! A.\n// crate::b::X\nconst S: &str = \"crate::b\";\nconst R: &str = r#\"crate::b\"#;\nfn f<'a>(x: &'a str) -> char { '{' }\n#[cfg(test)]\nmod tests {\n    use crate::b::X;\n}\n#[cfg(test)]\nmod more;\n",
            ),
            ("crates/x/src/a/more.rs", "//! Test.\nuse crate::b::X;\n"),
            ("crates/x/src/b.rs", "//! B.\nuse crate::{a, p::{c::Y}};\n"),
            // A parent re-exporting its child, the child using its parent: no circle.
            ("crates/x/src/p/mod.rs", "//! P.\nmod c;\npub use c::Y;\npub use self::c::Z;\n"),
            ("crates/x/src/p/c.rs", "//! C.\nuse super::super::a;\npub struct Y;\n"),
        ],
    );
    let problems = problems_of(&dir);
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn a_circle_a_layer_breach_and_a_long_file_are_found() {
    let long = format!("//! Long.\n{}", "fn f() {}\n".repeat(super::MAX_LINES - 1));
    let dir = tree(
        "circle",
        &[
            ("ARCHITECTURE.md", MAP),
            ("crates/x/src/lib.rs", "//! X.\n//! Layers, low to high: `a`, `p` → `b`.\nmod a;\nmod b;\nmod p;\n"),
            ("crates/x/src/a.rs", "//! A.\nfn g() -> crate::b::X { todo!() }\n"),
            ("crates/x/src/b.rs", "//! B.\nuse crate::p::c;\n"),
            ("crates/x/src/p/mod.rs", "//! P.\nmod c;\n"),
            ("crates/x/src/p/c.rs", &format!("{long}use crate::{{a::Y}};\n")),
        ],
    );
    let problems = problems_of(&dir);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains("p/c.rs: 901 lines"), "{}", problems[0]);
    assert!(problems[1].contains("import circle between") && problems[1].contains("a.rs ↔"), "{}", problems[1]);
    assert!(problems[2].contains("module `a` imports `b`, which the layer order"), "{}", problems[2]);
}

#[test]
fn the_layer_sentence_and_the_code_map_must_match_the_tree() {
    let dir = tree(
        "stated",
        &[
            (
                "ARCHITECTURE.md",
                "### `crates/x` — x\n\n`lib.rs`, `a.rs` and `gone.rs`, `tests/it.rs`, `crates/y/src/lib.rs`, `crates/y/src/no.rs`\n",
            ),
            ("crates/x/src/lib.rs", "//! X.\n//! Layers, low to high: `a` → `ghost`.\nmod a;\nmod b;\n"),
            ("crates/x/src/a.rs", "//! A.\n"),
            ("crates/x/src/b.rs", "//! B.\n"),
            ("crates/y/src/lib.rs", "//! Y without layers.\n"),
        ],
    );
    let problems = problems_of(&dir);
    assert_eq!(problems.len(), 7, "{problems:#?}");
    assert!(problems[0].contains("names `ghost`, which is no module"), "{}", problems[0]);
    assert!(problems[1].contains("module `b` is missing from the layer order"), "{}", problems[1]);
    assert!(problems[2].contains("does not name `b.rs`"), "{}", problems[2]);
    assert!(problems[3].contains("names `gone.rs`, which is no source file"), "{}", problems[3]);
    assert!(problems[4].contains("names `crates/y/src/no.rs`, which is no source file"), "{}", problems[4]);
    assert!(problems[5].contains("crates/y/src/lib.rs: no `//! Layers, low to high:"), "{}", problems[5]);
    assert!(problems[6].contains("no code map section `### `crates/y`"), "{}", problems[6]);
}
