//! Tidy checks over the source tree: every Rust file opens with a `//!` line saying what it owns.

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
    problems
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

#[cfg(test)]
mod tests {
    #[test]
    fn every_source_file_opens_with_a_module_doc() {
        let problems = super::check(&super::workspace_root());
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn the_check_catches_a_file_without_one() {
        let dir = std::env::temp_dir().join(format!("palisade-tidy-{}", std::process::id()));
        let crates = dir.join("crates");
        std::fs::create_dir_all(&crates).unwrap();
        std::fs::write(crates.join("bad.rs"), "fn main() {}\n").unwrap();
        let problems = super::check(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(problems.len(), 1);
    }
}
