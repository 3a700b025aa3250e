//! Tidy checks over the source tree: every Rust file opens with a `//!` line saying what it owns,
//! every crate under `crates/` keeps the dependency rules ARCHITECTURE.md states ([`RULES`]), and
//! the structure rules of [`crate::structure`] (file length, no import circle, layers, code map).

use std::path::{Path, PathBuf};

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// Every problem found under `root`, one line each.
pub fn check(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let mut files = Vec::new();
    for dir in ["crates", "xtask", "bench", "fuzz"] {
        collect_rust_files(&root.join(dir), &mut files);
    }
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        if !text.starts_with("//!") {
            problems.push(format!("{}: must open with a `//!` line saying what the file owns", file.display()));
        }
    }
    check_dependencies(root, &mut problems);
    check_stage_list(root, &mut problems);
    crate::structure::check(root, &mut problems);
    problems
}

/// Where the request path's stages are listed in code (`pipeline::STAGES`) and in the docs.
const STAGES_SOURCE: &str = "crates/server/src/pipeline/mod.rs";
const STAGES_DOC: &str = "ARCHITECTURE.md";

/// ARCHITECTURE.md's stage list (between `<!-- stages -->` and `<!-- /stages -->`, comma
/// separated) must be `pipeline::STAGES`, in order, and every stage must be called in
/// `Stages::stages` in that order (each has a `// N. name` comment there).
fn check_stage_list(root: &Path, problems: &mut Vec<String>) {
    // A tree without the server crate (a test's) has no request path to check.
    if !root.join("crates/server").exists() {
        return;
    }
    let source = std::fs::read_to_string(root.join(STAGES_SOURCE)).unwrap_or_default();
    let doc = std::fs::read_to_string(root.join(STAGES_DOC)).unwrap_or_default();
    let Some(code) = stages_in_code(&source) else {
        problems.push(format!("{STAGES_SOURCE}: no `pub const STAGES: [&str; N] = [..];` list"));
        return;
    };
    let documented: Option<Vec<String>> = doc
        .split_once("<!-- stages -->")
        .and_then(|(_, rest)| rest.split_once("<!-- /stages -->"))
        .map(|(list, _)| list.split(',').map(|stage| stage.trim().to_owned()).filter(|s| !s.is_empty()).collect());
    match documented {
        None => problems.push(format!("{STAGES_DOC}: no `<!-- stages -->` … `<!-- /stages -->` list")),
        Some(documented) if documented != code => problems.push(format!(
            "{STAGES_DOC}: the stage list {documented:?} differs from {STAGES_SOURCE}'s STAGES {code:?}"
        )),
        Some(_) => {}
    }
    // The order of the numbered stage comments in the function that runs them.
    let mut last = 0;
    for stage in &code {
        let marker = format!(". {stage}");
        match find_stage_comment(&source, &marker) {
            Some(at) if at >= last => last = at,
            Some(_) => problems.push(format!("{STAGES_SOURCE}: stage `{stage}` runs out of the listed order")),
            None => problems.push(format!("{STAGES_SOURCE}: no `// N. {stage}` comment where the stage runs")),
        }
    }
}

/// The byte offset of a `// N. name` (or `// Nb. name`, `// Nc. name`, …) comment line for
/// `marker` (`. name`).
fn find_stage_comment(source: &str, marker: &str) -> Option<usize> {
    let mut offset = 0;
    for line in source.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("// ") {
            let number = rest.split('.').next().unwrap_or_default();
            let digits = number.trim_end_matches(|c: char| c.is_ascii_lowercase());
            let numbered = !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit());
            if numbered && rest[number.len()..].starts_with(marker) {
                return Some(offset);
            }
        }
        offset += line.len();
    }
    None
}

/// The names in `pub const STAGES: [&str; N] = ["a", "b", ...];`.
fn stages_in_code(source: &str) -> Option<Vec<String>> {
    let start = source.find("pub const STAGES")?;
    let list = &source[start..];
    let open = list.find('[').and_then(|first| list[first + 1..].find('[').map(|second| first + 1 + second))?;
    let close = list[open..].find(']')? + open;
    Some(
        list[open + 1..close]
            .split(',')
            .map(|item| item.trim().trim_matches('"').to_owned())
            .filter(|item| !item.is_empty())
            .collect(),
    )
}

fn collect_rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name == "corpus" || name == "artifacts" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            collect_rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// HTTP servers and clients.
const HTTP: &[&str] = &["axum", "hyper", "hyper-util", "reqwest", "tower", "tower-http", "http-body-util"];
/// TLS.
const TLS: &[&str] = &["rustls", "tokio-rustls"];
/// Storage drivers.
const STORAGE: &[&str] = &["sqlx", "rusqlite", "redis"];
/// Cryptography.
const CRYPTO: &[&str] = &["aws-lc-rs", "ed25519-dalek", "jsonwebtoken"];
/// The async runtime (I/O).
const RUNTIME: &[&str] = &["tokio", "tokio-util"];

/// A group of crates a workspace crate must not depend on, and the ARCHITECTURE.md rule it keeps.
#[derive(Debug, Clone, Copy)]
pub struct Forbid {
    /// Package names (as published, not as renamed in `[dependencies]`).
    pub crates: &'static [&'static str],
    /// The rule, as ARCHITECTURE.md states it.
    pub because: &'static str,
}

/// The dependency rules of one workspace crate (its normal and target-specific `[dependencies]`;
/// dev-dependencies are free).
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// The package name.
    pub package: &'static str,
    /// What it must not depend on.
    pub forbid: &'static [Forbid],
}

/// Every crate under `crates/` has a rule here (a crate without one is a problem too); the list
/// "Dependency rules (checked by tidy)" in ARCHITECTURE.md says the same in words.
pub const RULES: &[Rule] = &[
    Rule {
        package: "palisade-base",
        forbid: &[
            Forbid {
                crates: &[
                    "palisade-wire",
                    "palisade-auth",
                    "palisade-store",
                    "palisade-killswitch",
                    "palisade-server",
                    "palisade-apps",
                    "palisade",
                ],
                because: "the leaf crate depends on nothing of the workspace",
            },
            Forbid { crates: HTTP, because: "the leaf crate knows no HTTP" },
            Forbid { crates: STORAGE, because: "the leaf crate knows no storage" },
        ],
    },
    Rule {
        package: "palisade-wire",
        forbid: &[
            Forbid {
                crates: &[
                    "palisade-auth",
                    "palisade-store",
                    "palisade-killswitch",
                    "palisade-server",
                    "palisade-apps",
                    "palisade",
                ],
                because: "the wire types depend on no workspace crate but palisade-base",
            },
            Forbid { crates: RUNTIME, because: "the wire types do no I/O" },
            Forbid { crates: HTTP, because: "the wire types use no transport library" },
            Forbid { crates: TLS, because: "the wire types use no transport library" },
            Forbid { crates: STORAGE, because: "the wire types do no I/O" },
            Forbid { crates: CRYPTO, because: "the wire types use no crypto" },
        ],
    },
    Rule {
        package: "palisade-store",
        forbid: &[
            Forbid { crates: &["palisade-wire"], because: "the store knows no MCP wire" },
            Forbid { crates: HTTP, because: "the store knows no HTTP" },
            Forbid {
                crates: &["palisade-auth", "palisade-killswitch", "palisade-server", "palisade-apps", "palisade"],
                because: "the store depends on no workspace crate but palisade-base",
            },
        ],
    },
    Rule {
        package: "palisade-killswitch",
        forbid: &[
            Forbid { crates: &["palisade-wire"], because: "the kill switch knows no MCP wire" },
            Forbid {
                crates: &["palisade-server", "palisade-apps", "palisade"],
                because: "the server wires the kill switch in, never the other way round",
            },
        ],
    },
    Rule {
        package: "palisade-auth",
        forbid: &[Forbid {
            crates: &["palisade-server", "palisade-apps", "palisade"],
            because: "auth returns VerifiedClaims; only palisade_server::auth makes a VerifiedPrincipal",
        }],
    },
    Rule {
        package: "palisade-server",
        forbid: &[
            Forbid {
                crates: &["sqlx", "rusqlite"],
                because: "nothing outside palisade-store sees SQL (the server uses the store's traits)",
            },
            Forbid {
                crates: &["reqwest"],
                because: "a URL others name is fetched only through palisade_auth::egress::EgressGuard",
            },
            Forbid { crates: &["palisade-apps", "palisade"], because: "the runtime knows no application and no CLI" },
        ],
    },
    Rule {
        package: "palisade-apps",
        forbid: &[Forbid {
            crates: &["palisade-store", "palisade-auth", "palisade"],
            because: "the applications use only palisade_server's public API and palisade_killswitch's redeem",
        }],
    },
    Rule {
        package: "palisade-gateway",
        forbid: &[
            Forbid {
                crates: &["sqlx", "rusqlite"],
                because: "nothing outside palisade-store sees SQL (the gateway uses the store's traits)",
            },
            Forbid {
                crates: &["palisade-apps", "palisade"],
                because: "the gateway is an application of the runtime, not of the CLI",
            },
        ],
    },
    Rule {
        package: "palisade-definitions",
        forbid: &[
            Forbid {
                crates: &[
                    "palisade-wire",
                    "palisade-auth",
                    "palisade-store",
                    "palisade-killswitch",
                    "palisade-server",
                    "palisade-apps",
                    "palisade-gateway",
                    "palisade-verify",
                    "palisade",
                ],
                because: "the findings are pure text analysis: no workspace crate but palisade-base",
            },
            Forbid { crates: HTTP, because: "the findings read text, never a network" },
            Forbid { crates: STORAGE, because: "the findings read text, never a store" },
            Forbid { crates: RUNTIME, because: "the findings read text, never a network" },
        ],
    },
    Rule {
        package: "palisade-verify",
        forbid: &[Forbid {
            crates: &[
                "palisade-server",
                "palisade-store",
                "palisade-auth",
                "palisade-killswitch",
                "palisade-gateway",
                "palisade-apps",
                "palisade",
            ],
            because: "the verifier is a client only: it shares the wire types, never the server's internals",
        }],
    },
    Rule {
        package: "palisade-host",
        forbid: &[
            Forbid {
                crates: &["sqlx", "rusqlite"],
                because: "nothing outside palisade-store sees SQL (the host uses the store's traits)",
            },
            Forbid { crates: &["palisade"], because: "the running system knows no CLI" },
        ],
    },
    Rule { package: "palisade", forbid: &[] },
];

/// Checks each `crates/*/Cargo.toml` against [`RULES`].
fn check_dependencies(root: &Path, problems: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(root.join("crates")) else { return };
    let mut manifests: Vec<PathBuf> =
        entries.flatten().map(|entry| entry.path().join("Cargo.toml")).filter(|path| path.is_file()).collect();
    manifests.sort();
    for manifest in manifests {
        let shown = manifest.display();
        let text = match std::fs::read_to_string(&manifest) {
            Ok(text) => text,
            Err(error) => {
                problems.push(format!("{shown}: cannot be read: {error}"));
                continue;
            }
        };
        let table = match text.parse::<toml::Table>() {
            Ok(table) => table,
            Err(error) => {
                problems.push(format!("{shown}: is not valid TOML: {error}"));
                continue;
            }
        };
        let Some(package) = table.get("package").and_then(|p| p.get("name")).and_then(toml::Value::as_str) else {
            problems.push(format!("{shown}: has no [package] name"));
            continue;
        };
        let Some(rule) = RULES.iter().find(|rule| rule.package == package) else {
            problems.push(format!("{shown}: crate `{package}` has no dependency rule in xtask/src/tidy.rs RULES"));
            continue;
        };
        for dependency in dependencies(&table) {
            for forbid in rule.forbid {
                if forbid.crates.contains(&dependency.as_str()) {
                    problems
                        .push(format!("{shown}: `{package}` must not depend on `{dependency}`: {}", forbid.because));
                }
            }
        }
    }
}

/// The package names of a manifest's `[dependencies]` and `[target.*.dependencies]` (a renamed
/// dependency by its `package`), sorted, without duplicates.
fn dependencies(manifest: &toml::Table) -> Vec<String> {
    let mut tables = Vec::new();
    tables.extend(manifest.get("dependencies").and_then(toml::Value::as_table));
    if let Some(targets) = manifest.get("target").and_then(toml::Value::as_table) {
        for target in targets.values() {
            tables.extend(target.get("dependencies").and_then(toml::Value::as_table));
        }
    }
    let mut names: Vec<String> = tables
        .into_iter()
        .flat_map(|table| table.iter())
        .map(|(key, spec)| spec.get("package").and_then(toml::Value::as_str).unwrap_or(key).to_owned())
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    /// A fresh, empty folder of this test process under the system temp dir.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("palisade-tidy-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write_manifest(root: &std::path::Path, dir: &str, text: &str) {
        let dir = root.join("crates").join(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("Cargo.toml"), text).unwrap();
    }

    #[test]
    fn every_source_file_opens_with_a_module_doc_and_every_crate_keeps_its_dependency_rules() {
        let problems = super::check(&super::workspace_root());
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn the_check_catches_a_file_without_one() {
        let dir = scratch("doc");
        std::fs::create_dir_all(dir.join("crates")).unwrap();
        std::fs::write(dir.join("crates").join("bad.rs"), "fn main() {}\n").unwrap();
        let problems = super::check(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(problems.len(), 1);
    }

    #[test]
    fn the_check_catches_a_forbidden_dependency_and_a_crate_without_a_rule() {
        let dir = scratch("deps");
        // The store on the MCP wire and on an HTTP client (renamed, and target-specific).
        write_manifest(
            &dir,
            "store",
            concat!(
                "[package]\nname = \"palisade-store\"\n\n",
                "[dependencies]\npalisade-wire.workspace = true\nserde = \"1\"\n\n",
                "[target.'cfg(unix)'.dependencies]\nhttp = { package = \"reqwest\", version = \"0.13\" }\n\n",
                "[dev-dependencies]\naxum = \"0.8\"\n",
            ),
        );
        // A kill switch that keeps its rules: no problem.
        write_manifest(
            &dir,
            "killswitch",
            "[package]\nname = \"palisade-killswitch\"\n\n[dependencies]\nserde = \"1\"\n",
        );
        write_manifest(&dir, "extra", "[package]\nname = \"palisade-extra\"\n");
        let problems = super::check(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(problems.len(), 3, "{}", problems.join("\n"));
        assert!(problems[0].contains("`palisade-extra` has no dependency rule"), "{}", problems[0]);
        assert!(
            problems[1].contains("must not depend on `palisade-wire`: the store knows no MCP wire"),
            "{}",
            problems[1]
        );
        assert!(problems[2].contains("must not depend on `reqwest`: the store knows no HTTP"), "{}", problems[2]);
    }

    #[test]
    fn the_stage_list_must_match_the_code() {
        let dir = std::env::temp_dir().join(format!("palisade-tidy-stages-{}", std::process::id()));
        let pipeline = dir.join("crates/server/src/pipeline");
        std::fs::create_dir_all(&pipeline).unwrap();
        let code = "//! x\npub const STAGES: [&str; 2] = [\"one\", \"two\"];\n// 1. one: first\n// 2. two: then\n";
        std::fs::write(pipeline.join("mod.rs"), code).unwrap();
        std::fs::write(dir.join("ARCHITECTURE.md"), "<!-- stages -->\none, two\n<!-- /stages -->\n").unwrap();
        let mut problems = Vec::new();
        super::check_stage_list(&dir, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        std::fs::write(dir.join("ARCHITECTURE.md"), "<!-- stages -->\ntwo, one\n<!-- /stages -->\n").unwrap();
        super::check_stage_list(&dir, &mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
        let swapped = "//! x\npub const STAGES: [&str; 2] = [\"one\", \"two\"];\n// 2. two: then\n// 1. one: first\n";
        std::fs::write(pipeline.join("mod.rs"), swapped).unwrap();
        std::fs::write(dir.join("ARCHITECTURE.md"), "<!-- stages -->\none, two\n<!-- /stages -->\n").unwrap();
        let mut problems = Vec::new();
        super::check_stage_list(&dir, &mut problems);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("out of the listed order"), "{problems:?}");
    }
}
