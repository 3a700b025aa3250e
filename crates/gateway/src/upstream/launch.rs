//! The launch of a local stdio server as a reviewer approves it: the exact command, every
//! argument, the environment names, working directory, grants, network, limits, confinement
//! and sharing, and the SHA-256 of the executable file that will run (its resolved path) and of
//! every argument that names an existing file. [`LaunchSpec::digest`] covers all of it, so a
//! change to any of it — the executable's bytes included — is a new, unapproved launch.
//!
//! The launch is a pin ([`DefinitionKind::Launch`]) of the upstream: approved, held, rejected
//! and signed exactly like a definition, and its canonical text is what `pins diff` compares.

use std::collections::HashMap;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use aws_lc_rs::digest;
use palisade_base::hex::hex;
use palisade_store::PinObservation;
use serde_json::{Value, json};

use super::settings::{StdioSettings, UpstreamSettings};
use crate::pins::{DefinitionKind, PinSubject, canonical_text, definition_digest};

/// Why a launch cannot be resolved. Texts name paths, never file contents or secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// The command is not found on `PATH`, or is not an executable regular file.
    #[error("command {command:?}: {reason}")]
    Command {
        /// The command as configured.
        command: String,
        /// What is wrong.
        reason: String,
    },
    /// A file could not be read to be hashed.
    #[error("{path}: cannot be read to compute its digest: {reason}")]
    Unreadable {
        /// The file.
        path: String,
        /// The I/O error's kind.
        reason: String,
    },
    /// An argument names a path the gateway protects (its secrets, data, audit log or
    /// configuration): such a launch is refused, never hashed or shown.
    #[error(
        "args[{index}] names {path}, which the gateway protects (a secret, its data or its configuration); a launch may not name it"
    )]
    Protected {
        /// The argument's index.
        index: usize,
        /// The protected path it names.
        path: String,
    },
    /// The launch could not be written as canonical JSON (it cannot be pinned).
    #[error("the launch cannot be pinned: {0}")]
    Canonical(String),
}

/// A launch, resolved: what will run, exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    /// The upstream's id.
    pub upstream_id: String,
    /// The pin subject's URL (`stdio:<id>`).
    pub upstream_url: String,
    /// The configured launch.
    pub settings: StdioSettings,
    /// The executable's canonical path (symlinks resolved): what is run.
    pub executable: PathBuf,
    /// SHA-256 (hex) of the executable's bytes.
    pub executable_sha256: String,
    /// For each argument naming an existing regular file (an absolute path, or relative to the
    /// working directory): its index, canonical path and SHA-256.
    pub argument_files: Vec<(usize, PathBuf, String)>,
}

impl LaunchSpec {
    /// Resolves `upstream`'s launch: the command looked up on `path_var` (the gateway's `PATH`)
    /// when it is a bare name, symlinks resolved, the executable and argument files hashed.
    /// `None` when the upstream is not a stdio one.
    pub fn resolve(upstream: &UpstreamSettings, path_var: Option<&str>) -> Option<Result<Self, LaunchError>> {
        let stdio = upstream.stdio.as_ref()?;
        Some(Self::resolve_stdio(&upstream.id, upstream.url.as_str(), stdio, path_var))
    }

    fn resolve_stdio(
        upstream_id: &str,
        upstream_url: &str,
        settings: &StdioSettings,
        path_var: Option<&str>,
    ) -> Result<Self, LaunchError> {
        let executable = find_executable(&settings.command, path_var)?;
        let executable_sha256 = file_sha256(&executable)?;
        let mut argument_files = Vec::new();
        let protected: Vec<PathBuf> = settings
            .protected
            .iter()
            .map(|path| std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()))
            .collect();
        for (index, arg) in settings.args.iter().enumerate() {
            let candidate = Path::new(arg);
            let candidate =
                if candidate.is_absolute() { candidate.to_path_buf() } else { settings.cwd.join(candidate) };
            let Ok(canonical) = std::fs::canonicalize(&candidate) else { continue };
            if let Some(inside) = protected.iter().find(|path| canonical.starts_with(path)) {
                return Err(LaunchError::Protected { index, path: inside.to_string_lossy().into_owned() });
            }
            if canonical.is_file() {
                let sha = file_sha256(&canonical)?;
                argument_files.push((index, canonical, sha));
            }
        }
        Ok(Self {
            upstream_id: upstream_id.to_owned(),
            upstream_url: upstream_url.to_owned(),
            settings: settings.clone(),
            executable,
            executable_sha256,
            argument_files,
        })
    }

    /// The launch as a JSON object: what is pinned, shown and diffed.
    pub fn definition(&self) -> Value {
        let s = &self.settings;
        json!({
            "command": s.command,
            "executable": self.executable.to_string_lossy(),
            "executable_sha256": self.executable_sha256,
            "args": s.args,
            "argument_files": self.argument_files.iter().map(|(index, path, sha)| json!({
                "arg": index, "path": path.to_string_lossy(), "sha256": sha,
            })).collect::<Vec<_>>(),
            "env": s.env,
            "env_files": s.env_files.iter().map(|(name, path)| (name.clone(), json!(path.to_string_lossy())))
                .collect::<serde_json::Map<_, _>>(),
            "cwd": s.cwd.to_string_lossy(),
            "grants": s.grants.iter().map(|g| json!({"path": g.path.to_string_lossy(), "rw": g.rw}))
                .collect::<Vec<_>>(),
            "network": s.network,
            "confinement": s.confinement.as_str(),
            "shared": s.shared,
            "max_processes": s.max_processes,
            "limits": {
                "memory_bytes": s.limits.memory_bytes,
                "processes": s.limits.processes,
                "cpu_secs": s.limits.cpu_secs,
                "open_files": s.limits.open_files,
            },
        })
    }

    /// SHA-256 over the RFC 8785 bytes of [`Self::definition`].
    pub fn digest(&self) -> Result<String, LaunchError> {
        definition_digest(&self.definition()).map_err(|error| LaunchError::Canonical(error.to_string()))
    }

    /// The canonical text the store keeps (and `pins diff` compares).
    pub fn canonical_text(&self) -> Result<String, LaunchError> {
        canonical_text(&self.definition()).map_err(|error| LaunchError::Canonical(error.to_string()))
    }

    /// What the store keeps of the launch pin, seen at `seen_at_ms`.
    pub fn observation(&self, seen_at_ms: i64) -> Result<PinObservation, LaunchError> {
        let subject = self.subject();
        Ok(PinObservation {
            pin_id: subject.pin_id(),
            upstream_id: subject.upstream_id,
            upstream_url: subject.upstream_url,
            kind: DefinitionKind::Launch.as_str().to_owned(),
            name: String::new(),
            digest: self.digest()?,
            definition: self.canonical_text()?,
            seen_at_ms,
        })
    }

    /// The pin subject of this upstream's launch.
    pub fn subject(&self) -> PinSubject {
        launch_subject(&self.upstream_id, &self.upstream_url)
    }

    /// What `palisade upstreams show` prints: every field, untruncated, one per line, with
    /// control characters escaped so a crafted argument cannot hide the next line.
    pub fn render(&self) -> String {
        let s = &self.settings;
        let mut out = String::new();
        let mut line = |label: &str, value: &str| {
            out.push_str(&format!("{label:<18}{}\n", escape(value)));
        };
        line("upstream", &self.upstream_id);
        line("command", &s.command);
        line("executable", &self.executable.to_string_lossy());
        line("executable sha256", &self.executable_sha256);
        for (index, arg) in s.args.iter().enumerate() {
            line(&format!("args[{index}]"), arg);
        }
        for (index, path, sha) in &self.argument_files {
            line(&format!("args[{index}] file"), &format!("{} sha256 {sha}", path.to_string_lossy()));
        }
        line("env", &if s.env.is_empty() { "(none)".to_owned() } else { s.env.join(" ") });
        for (name, path) in &s.env_files {
            line("env from file", &format!("{name} <- {}", path.to_string_lossy()));
        }
        line("cwd", &s.cwd.to_string_lossy());
        if s.grants.is_empty() {
            line("grants", "(none)");
        }
        for grant in &s.grants {
            line(
                "grant",
                &format!("{} ({})", grant.path.to_string_lossy(), if grant.rw { "read-write" } else { "read-only" }),
            );
        }
        line("network", if s.network { "yes (the host's network)" } else { "no (its own loopback only)" });
        line("confinement", s.confinement.as_str());
        line(
            "processes",
            &if s.shared {
                "one, shared by every caller".to_owned()
            } else {
                format!("one per caller, at most {}, idle ones stopped after {} s", s.max_processes, s.idle.as_secs())
            },
        );
        line(
            "limits",
            &format!(
                "address space {} MiB, {} processes, {} CPU seconds, {} open files",
                s.limits.memory_bytes / (1024 * 1024),
                s.limits.processes,
                s.limits.cpu_secs,
                s.limits.open_files
            ),
        );
        out
    }
}

/// The pin subject of upstream `upstream_id`'s launch.
pub fn launch_subject(upstream_id: &str, upstream_url: &str) -> PinSubject {
    PinSubject {
        upstream_id: upstream_id.to_owned(),
        upstream_url: upstream_url.to_owned(),
        kind: DefinitionKind::Launch,
        name: String::new(),
    }
}

/// The warning `upstreams show` and every unconfined start print.
pub const EXECUTES_CODE_WARNING: &str = "Approving this launch lets the gateway run this program with these arguments: \
     it executes code on this machine, with the access shown above.";

/// Control characters as `\u{..}` escapes.
fn escape(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { c.escape_unicode().to_string() } else { c.to_string() }).collect()
}

/// `command` resolved: an absolute path as given, a bare name on `path_var`; then canonical,
/// and an executable regular file.
fn find_executable(command: &str, path_var: Option<&str>) -> Result<PathBuf, LaunchError> {
    let fail = |reason: &str| LaunchError::Command { command: command.to_owned(), reason: reason.to_owned() };
    let candidate = if command.contains('/') {
        PathBuf::from(command)
    } else {
        let path_var = path_var.ok_or_else(|| fail("is a bare name and the gateway has no PATH"))?;
        path_var
            .split(':')
            .filter(|dir| dir.starts_with('/'))
            .map(|dir| Path::new(dir).join(command))
            .find(|path| is_executable_file(path))
            .ok_or_else(|| fail("is not found on the gateway's PATH"))?
    };
    let canonical = std::fs::canonicalize(&candidate).map_err(|_| fail("does not exist"))?;
    if !is_executable_file(&canonical) {
        return Err(fail("is not an executable regular file"));
    }
    Ok(canonical)
}

fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.mode() & 0o111 != 0)
}

/// What identifies one version of a file without reading it: a rewrite in place changes its
/// mtime and ctime, a replacement its inode; ctime cannot be set from user space.
type FileIdentity = (u64, u64, u64, i64, i64, i64, i64);

fn identity(meta: &std::fs::Metadata) -> FileIdentity {
    (meta.dev(), meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec(), meta.ctime(), meta.ctime_nsec())
}

/// SHA-256 of a file's bytes, cached by path and [`FileIdentity`] so launching a new process
/// does not re-read an unchanged interpreter.
pub fn file_sha256(path: &Path) -> Result<String, LaunchError> {
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, (FileIdentity, String)>>> = OnceLock::new();
    let unreadable = |error: std::io::Error| LaunchError::Unreadable {
        path: path.display().to_string(),
        reason: error.kind().to_string(),
    };
    let before = std::fs::metadata(path).map_err(unreadable)?;
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let cached = cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(path).cloned();
    if let Some((seen, sha)) = cached
        && seen == identity(&before)
    {
        return Ok(sha);
    }
    let mut file = std::fs::File::open(path).map_err(unreadable)?;
    let mut context = digest::Context::new(&digest::SHA256);
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = file.read(&mut buffer).map_err(unreadable)?;
        if read == 0 {
            break;
        }
        context.update(&buffer[..read]);
    }
    let sha = hex(context.finish().as_ref());
    // Changed while it was read: not cached (the next launch reads it again).
    let after = std::fs::metadata(path).map_err(unreadable)?;
    if identity(&after) == identity(&before) {
        cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(path.to_path_buf(), (identity(&after), sha.clone()));
    }
    Ok(sha)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::settings::{Confinement, Grant, ProcessLimits};
    use std::time::Duration;

    fn settings(command: &str, args: &[&str]) -> StdioSettings {
        StdioSettings {
            command: command.into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: vec!["API_KEY".into()],
            env_files: Default::default(),
            cwd: "/tmp".into(),
            grants: vec![Grant { path: "/srv/data".into(), rw: false }],
            network: false,
            confinement: Confinement::Bubblewrap,
            shared: false,
            max_processes: 4,
            idle: Duration::from_secs(60),
            limits: ProcessLimits { memory_bytes: 1 << 30, processes: 64, cpu_secs: 60, open_files: 256 },
            protected: Vec::new(),
            search_path: None,
        }
    }

    #[test]
    fn an_argument_naming_a_protected_path_is_refused_not_hashed() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("server-secret");
        std::fs::write(&secret, "00".repeat(32)).unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("palisade.db"), "db").unwrap();
        let arg = |path: &Path| path.to_str().unwrap().to_owned();
        let mut s = settings("/bin/sh", &["-c", &arg(&secret)]);
        // Unprotected, the file is hashed into the launch (and shown).
        assert_eq!(spec(&s).argument_files.len(), 1);
        s.protected = vec![secret.clone(), data.clone()];
        let refused = LaunchSpec::resolve_stdio("files", "stdio:files", &s, Some("/usr/bin:/bin")).unwrap_err();
        assert!(matches!(&refused, LaunchError::Protected { index: 1, .. }), "{refused:?}");
        // Inside a protected directory, through a relative path or a symlink: refused the same.
        for named in [arg(&data.join("palisade.db")), arg(&data), "data/../server-secret".to_owned()] {
            let mut s = settings("/bin/sh", &[&named]);
            s.cwd = dir.path().to_owned();
            s.protected = vec![secret.clone(), data.clone()];
            let refused = LaunchSpec::resolve_stdio("files", "stdio:files", &s, Some("/usr/bin:/bin"));
            assert!(matches!(refused, Err(LaunchError::Protected { index: 0, .. })), "{named}: {refused:?}");
        }
        let link = dir.path().join("innocent");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let mut s = settings("/bin/sh", &[&arg(&link)]);
        s.protected = vec![secret.clone()];
        let refused = LaunchSpec::resolve_stdio("files", "stdio:files", &s, Some("/usr/bin:/bin"));
        assert!(matches!(refused, Err(LaunchError::Protected { .. })), "{refused:?}");
    }

    fn spec(s: &StdioSettings) -> LaunchSpec {
        LaunchSpec::resolve_stdio("files", "stdio:files", s, Some("/usr/bin:/bin")).unwrap()
    }

    #[test]
    fn every_field_and_the_executable_bytes_change_the_digest() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("server");
        std::fs::write(&exe, b"#!/bin/sh\necho one\n").unwrap();
        std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let script = dir.path().join("main.js");
        std::fs::write(&script, b"one").unwrap();
        let base = settings(exe.to_str().unwrap(), &["--root", script.to_str().unwrap()]);
        let digest = spec(&base).digest().unwrap();
        assert_eq!(spec(&base).digest().unwrap(), digest, "stable");
        let mut variants = Vec::new();
        let mut with = |change: &dyn Fn(&mut StdioSettings)| {
            let mut s = base.clone();
            change(&mut s);
            variants.push(spec(&s).digest().unwrap());
        };
        with(&|s| s.args.push("--extra".into()));
        with(&|s| s.env.push("OTHER".into()));
        with(&|s| s.cwd = "/srv/data".into());
        with(&|s| s.grants[0].rw = true);
        with(&|s| s.network = true);
        with(&|s| s.confinement = Confinement::None);
        with(&|s| s.shared = true);
        with(&|s| s.limits.cpu_secs = 61);
        for variant in &variants {
            assert_ne!(variant, &digest);
        }
        // The same path with other bytes (a replaced executable, an edited script).
        std::fs::write(&exe, b"#!/bin/sh\necho two\n").unwrap();
        let replaced = spec(&base).digest().unwrap();
        assert_ne!(replaced, digest);
        std::fs::write(&script, b"two").unwrap();
        assert_ne!(spec(&base).digest().unwrap(), replaced);
    }

    #[test]
    fn commands_resolve_on_path_or_fail_clearly() {
        let resolved = spec(&settings("sh", &[]));
        assert!(resolved.executable.is_absolute());
        assert_eq!(resolved.executable_sha256.len(), 64);
        let missing =
            LaunchSpec::resolve_stdio("x", "stdio:x", &settings("no-such-program-here", &[]), Some("/usr/bin"));
        assert!(matches!(missing, Err(LaunchError::Command { .. })), "{missing:?}");
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"data").unwrap();
        std::fs::set_permissions(&plain, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let not_exec = LaunchSpec::resolve_stdio("x", "stdio:x", &settings(plain.to_str().unwrap(), &[]), None);
        assert!(matches!(not_exec, Err(LaunchError::Command { .. })), "{not_exec:?}");
    }

    #[test]
    fn the_rendering_shows_every_argument_and_escapes_control_characters() {
        let text = spec(&settings("sh", &["-c", "echo hi\nrm -rf /", &"a".repeat(500)])).render();
        assert!(text.contains(&"a".repeat(500)), "untruncated");
        assert!(text.contains("echo hi\\u{a}rm -rf /"), "{text}");
        assert!(text.contains("/srv/data (read-only)"));
        assert!(text.contains("no (its own loopback only)"));
    }
}
