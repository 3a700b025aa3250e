//! Corpus replayer: runs each fuzz target's property over files on disk without libFuzzer, so the
//! corpus (and any crash artifact) can be checked on stable with a plain debug build.
//!
//! `replay` replays every target over `fuzz/corpus/<target>/`; `replay TARGET PATH...` replays one
//! target over the given files and directories (one level deep). Exits non-zero on any failure.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use palisade_fuzz::{TARGETS, Target};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let jobs: Vec<(Target, Vec<PathBuf>)> = match args.split_first() {
        None => {
            let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
            TARGETS.iter().map(|target| (*target, vec![corpus.join(target.name)])).collect()
        }
        Some((name, paths)) => match TARGETS.iter().find(|target| target.name == name) {
            Some(target) if !paths.is_empty() => vec![(*target, paths.iter().map(PathBuf::from).collect())],
            _ => {
                let names: Vec<&str> = TARGETS.iter().map(|target| target.name).collect();
                eprintln!("usage: replay [TARGET PATH...]   (targets: {})", names.join(", "));
                return ExitCode::from(2);
            }
        },
    };
    // Failures are reported per file below; the default hook would print each panic twice.
    std::panic::set_hook(Box::new(|_| {}));
    let mut failed = 0usize;
    for (target, paths) in jobs {
        let files = match inputs(&paths) {
            Ok(files) => files,
            Err(error) => {
                eprintln!("replay: {}: {error}", target.name);
                return ExitCode::FAILURE;
            }
        };
        if files.is_empty() {
            eprintln!("replay: {}: no inputs under {paths:?}", target.name);
            return ExitCode::FAILURE;
        }
        let mut target_failed = 0usize;
        for file in &files {
            let data = match std::fs::read(file) {
                Ok(data) => data,
                Err(error) => {
                    eprintln!("replay: {}: {}: {error}", target.name, file.display());
                    target_failed += 1;
                    continue;
                }
            };
            if let Err(panic) = std::panic::catch_unwind(|| (target.check)(&data)) {
                let why = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("panic");
                eprintln!("replay: {}: FAILED {}: {why}", target.name, file.display());
                target_failed += 1;
            }
        }
        eprintln!("replay: {}: {} inputs, {target_failed} failed", target.name, files.len());
        failed += target_failed;
    }
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// The files named, and the files directly inside the directories named, skipping dot-files
/// (libFuzzer's temporary files), in a stable order.
fn inputs(paths: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            for entry in std::fs::read_dir(path)? {
                let entry = entry?;
                let hidden = entry.file_name().to_string_lossy().starts_with('.');
                if !hidden && entry.file_type()?.is_file() {
                    files.push(entry.path());
                }
            }
        } else {
            std::fs::metadata(path)?;
            files.push(path.clone());
        }
    }
    files.sort();
    Ok(files)
}
