//! The operator's policy files, read and validated: [`load`] is the one way from `[policies]`
//! and a registry to a [`Policies`] value (for `serve`, a reload, `palisade policy check` and
//! `test`). With `require_signed`, [`read`] refuses a file whose `FILE.sig` is missing or is not
//! the kill switch's policy root key's signature of exactly its bytes: whoever can write the
//! policy files (or the configuration's `files` list) cannot widen access without that key.

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
    /// A file's signature is missing or does not verify (`require_signed`).
    #[error("policies: {path}: {reason}")]
    Unsigned {
        /// The file.
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
    let sources = read(settings)?;
    Ok(Some(Policies::load(&sources, settings.limits, app)?))
}

/// The files of `settings`, each checked against its signature when `require_signed`.
pub fn read(settings: &PolicySettings) -> Result<Vec<PolicySource>, LoadError> {
    let sources = read_sources(&settings.files)?;
    if let Some(key) = &settings.signed_by {
        let key = palisade_killswitch::keys::read_public_key(key).map_err(|e| LoadError::Unsigned {
            path: key.display().to_string(),
            reason: format!("the policy root public key could not be read: {e}"),
        })?;
        for source in &sources {
            let signature_path = signature_path(Path::new(&source.name));
            let unsigned = |reason: String| LoadError::Unsigned { path: source.name.clone(), reason };
            let signature = std::fs::read(&signature_path)
                .map_err(|e| unsigned(format!("no signature {}: {e}", signature_path.display())))?;
            if !palisade_killswitch::keys::verify_policy_file(&key, source.text.as_bytes(), &signature) {
                return Err(unsigned(format!(
                    "{} is not the policy root key's signature of this file (require_signed)",
                    signature_path.display()
                )));
            }
        }
    }
    Ok(sources)
}

/// Where a policy file's detached signature lives: `FILE.sig`.
pub fn signature_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".sig");
    PathBuf::from(name)
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
