//! The operator's policy files, read and validated: [`load`] is the one way from `[policies]`
//! and a registry to a [`Policies`] value (for `serve`, `palisade policy check` and `test`).

use std::path::{Path, PathBuf};

use palisade_server::App;
use palisade_server::policy::{Policies, PolicySource};

use crate::settings::policies::PolicySettings;

/// Why the policies could not be loaded: a file could not be read, or the set does not
/// validate (every problem at its file and line).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file or directory could not be read.
    #[error("policies: {path}: {reason}")]
    Read {
        /// The file or directory.
        path: String,
        /// Why.
        reason: String,
    },
    /// The set does not validate against the registry's schema.
    #[error("{0}")]
    Invalid(#[from] palisade_server::policy::PolicyErrors),
}

/// The policy set of `settings`, validated against `app`; `None` when no file is configured.
pub fn load(settings: &PolicySettings, app: &App) -> Result<Option<Policies>, LoadError> {
    if !settings.enabled() {
        return Ok(None);
    }
    let sources = read_sources(&settings.files)?;
    Ok(Some(Policies::load(&sources, settings.limits, app)?))
}

/// The files' texts, in order (a `DIR/*.cedar` pattern expands to its files, sorted by name).
pub fn read_sources(files: &[PathBuf]) -> Result<Vec<PolicySource>, LoadError> {
    let mut sources = Vec::new();
    for file in files {
        for path in expand(file)? {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| LoadError::Read { path: path.display().to_string(), reason: e.to_string() })?;
            sources.push(PolicySource { name: path.display().to_string(), text });
        }
    }
    Ok(sources)
}

/// A file, or the `.cedar` files a `DIR/*.cedar` pattern names (at least one).
fn expand(file: &Path) -> Result<Vec<PathBuf>, LoadError> {
    if file.file_name().and_then(|n| n.to_str()) != Some("*.cedar") {
        return Ok(vec![file.to_path_buf()]);
    }
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let read_error = |e: std::io::Error| LoadError::Read { path: dir.display().to_string(), reason: e.to_string() };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_error)? {
        let path = entry.map_err(read_error)?.path();
        if path.extension().and_then(|e| e.to_str()) == Some("cedar") && path.is_file() {
            found.push(path);
        }
    }
    if found.is_empty() {
        return Err(LoadError::Read { path: file.display().to_string(), reason: "no .cedar file matches".into() });
    }
    found.sort();
    Ok(found)
}
