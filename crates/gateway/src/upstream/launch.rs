//! The launch of a local stdio server as a reviewer approves it: the exact command, every
//! argument, the environment names, working directory, grants, network, limits, confinement
//! and sharing, and the SHA-256 of the executable file that will run (its resolved path), of
//! the interpreter its `#!` line names, of every argument that names an existing file, and of
//! every package tree those belong to (a `node_modules` tree, a Python virtual environment and
//! its installation: [`super::packages`]). [`LaunchSpec::digest`] covers all of it, so a change
//! to any of it — the executable's bytes or one dependency's included — is a new, unapproved
//! launch.
//!
//! The launch is a pin ([`DefinitionKind::Launch`]) of the upstream: approved, held, rejected
//! and signed exactly like a definition, and its canonical text is what `pins diff` compares.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use palisade_store::PinObservation;
use serde_json::{Value, json};

use super::packages::{
    PackageError, PackageTree, Shebang, TREE_BOUNDS, TreeKind, file_sha256, hash_tree, in_system_dirs, shebang,
    trees_of,
};
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
    /// A package tree the launch runs from lies in, or holds, a path the gateway protects.
    #[error(
        "the {kind} tree {tree} the launch runs from holds or lies in {path}, which the gateway protects; install the \
         server elsewhere"
    )]
    ProtectedTree {
        /// The tree's kind.
        kind: &'static str,
        /// The tree.
        tree: String,
        /// The protected path.
        path: String,
    },
    /// A package tree is too large to be hashed.
    #[error("{0}")]
    TooLarge(String),
    /// The launch could not be written as canonical JSON (it cannot be pinned).
    #[error("the launch cannot be pinned: {0}")]
    Canonical(String),
}

impl From<PackageError> for LaunchError {
    fn from(error: PackageError) -> Self {
        match error {
            PackageError::Unreadable { path, reason } => Self::Unreadable { path, reason },
            too_large @ PackageError::TooLarge { .. } => Self::TooLarge(too_large.to_string()),
        }
    }
}

/// The interpreter a script executable's `#!` line names, resolved and hashed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    /// Where it was found (`#!/usr/bin/env NAME`: on the gateway's `PATH`), its directory's
    /// symlinks resolved but not its own: a virtual environment's `bin/python` stays itself.
    pub path: PathBuf,
    /// Its canonical path.
    pub executable: PathBuf,
    /// SHA-256 (hex) of its bytes.
    pub sha256: String,
    /// The arguments the `#!` line gives it before the script.
    pub args: Vec<String>,
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
    /// Where the command was found, its directory's symlinks resolved but not its own (a
    /// virtual environment's `bin/python`, a `node_modules/.bin` link).
    pub command_path: PathBuf,
    /// SHA-256 (hex) of the executable's bytes.
    pub executable_sha256: String,
    /// The interpreter, when the executable is a script with a `#!` line.
    pub interpreter: Option<Interpreter>,
    /// For each argument naming an existing regular file (an absolute path, or relative to the
    /// working directory): its index, canonical path and SHA-256.
    pub argument_files: Vec<(usize, PathBuf, String)>,
    /// The package trees the executable, interpreter and argument files belong to, hashed;
    /// visible read-only inside the sandbox.
    pub packages: Vec<PackageTree>,
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
        let (command_path, executable) = find_executable(&settings.command, path_var)?;
        let executable_sha256 = file_sha256(&executable)?;
        let interpreter = match shebang(&executable)? {
            None => None,
            Some(found) => {
                let (name, args) = match found {
                    Shebang::Direct { interpreter, arg } => (interpreter, arg.into_iter().collect()),
                    Shebang::Env { name, args } => (name, args),
                };
                let (path, executable) = find_executable(&name, path_var).map_err(|error| LaunchError::Command {
                    command: settings.command.clone(),
                    reason: format!("its #! line names an interpreter that cannot run: {error}"),
                })?;
                let sha256 = file_sha256(&executable)?;
                Some(Interpreter { path, executable, sha256, args })
            }
        };
        let mut argument_files = Vec::new();
        let protected: Vec<PathBuf> = settings
            .protected
            .iter()
            .map(|path| std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()))
            .collect();
        let mut sources = vec![command_path.clone(), executable.clone()];
        if let Some(interpreter) = &interpreter {
            sources.extend([interpreter.path.clone(), interpreter.executable.clone()]);
        }
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
                sources.extend([candidate, canonical.clone()]);
                argument_files.push((index, canonical, sha));
            }
        }
        let packages = package_trees(&sources, &protected)?;
        Ok(Self {
            upstream_id: upstream_id.to_owned(),
            upstream_url: upstream_url.to_owned(),
            settings: settings.clone(),
            executable,
            command_path,
            executable_sha256,
            interpreter,
            argument_files,
            packages,
        })
    }

    /// Whether `path` is visible inside the sandbox without a bind of its own: under a system
    /// directory or inside one of the package trees.
    pub fn seen(&self, path: &Path) -> bool {
        in_system_dirs(path) || self.packages.iter().any(|tree| path.starts_with(&tree.path))
    }

    /// What the process is started with: the program and its arguments. A script runs as its
    /// interpreter with the script (as the kernel would), so the interpreter the launch hashed
    /// is the one that runs; a program inside a package tree runs by the path it was found at
    /// (a virtual environment's `bin/python` finds its environment by it).
    pub fn argv(&self) -> Vec<String> {
        let shown = |found: &Path, canonical: &Path| {
            let path = if self.seen(found) { found } else { canonical };
            path.to_string_lossy().into_owned()
        };
        let mut argv = Vec::new();
        if let Some(interpreter) = &self.interpreter {
            argv.push(shown(&interpreter.path, &interpreter.executable));
            argv.extend(interpreter.args.iter().cloned());
        }
        argv.push(shown(&self.command_path, &self.executable));
        argv.extend(self.settings.args.iter().cloned());
        argv
    }

    /// The launch as a JSON object: what is pinned, shown and diffed.
    pub fn definition(&self) -> Value {
        let s = &self.settings;
        let mut definition = json!({
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
        });
        // Present only when there is one, so a launch without them keeps its digest.
        if let Some(interpreter) = &self.interpreter {
            definition["interpreter"] = json!({
                "path": interpreter.path.to_string_lossy(),
                "executable": interpreter.executable.to_string_lossy(),
                "sha256": interpreter.sha256,
                "args": interpreter.args,
            });
        }
        if !self.packages.is_empty() {
            definition["packages"] = self
                .packages
                .iter()
                .map(|tree| {
                    json!({
                        "kind": tree.kind.as_str(), "path": tree.path.to_string_lossy(), "sha256": tree.sha256,
                        "entries": tree.entries, "bytes": tree.bytes,
                    })
                })
                .collect();
        }
        if self.command_path != self.executable {
            definition["command_path"] = json!(self.command_path.to_string_lossy());
        }
        definition
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
        if let Some(interpreter) = &self.interpreter {
            line(
                "interpreter",
                &format!(
                    "{} ({}) sha256 {}",
                    interpreter.path.to_string_lossy(),
                    interpreter.executable.to_string_lossy(),
                    interpreter.sha256
                ),
            );
        }
        line("runs", &self.argv().join(" "));
        for (index, arg) in s.args.iter().enumerate() {
            line(&format!("args[{index}]"), arg);
        }
        for (index, path, sha) in &self.argument_files {
            line(&format!("args[{index}] file"), &format!("{} sha256 {sha}", path.to_string_lossy()));
        }
        for tree in &self.packages {
            line(
                "package tree",
                &format!(
                    "{} ({}, {} entries, {} MiB, read-only) sha256 {}",
                    tree.path.to_string_lossy(),
                    tree.kind.as_str(),
                    tree.entries,
                    tree.bytes.div_ceil(1024 * 1024),
                    tree.sha256
                ),
            );
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

/// `command` resolved: an absolute path as given, a bare name on `path_var`. Returns where it was
/// found (its directory canonical, its own name kept: a symlink stays itself) and its canonical
/// path, which must be an executable regular file.
fn find_executable(command: &str, path_var: Option<&str>) -> Result<(PathBuf, PathBuf), LaunchError> {
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
    let found = match (candidate.parent().map(std::fs::canonicalize), candidate.file_name()) {
        (Some(Ok(dir)), Some(name)) => dir.join(name),
        _ => canonical.clone(),
    };
    Ok((found, canonical))
}

/// The package trees `sources` belong to, each once (one inside another is covered by it),
/// hashed; one that holds or lies in a protected path is refused.
fn package_trees(sources: &[PathBuf], protected: &[PathBuf]) -> Result<Vec<PackageTree>, LaunchError> {
    let mut roots: Vec<(TreeKind, PathBuf)> = Vec::new();
    for source in sources {
        for (kind, root) in trees_of(source) {
            let Ok(root) = std::fs::canonicalize(&root) else { continue };
            if !roots.iter().any(|(_, seen)| root.starts_with(seen)) {
                roots.retain(|(_, seen)| !seen.starts_with(&root));
                roots.push((kind, root));
            }
        }
    }
    roots.sort();
    let mut trees = Vec::new();
    for (kind, root) in roots {
        if let Some(inside) = protected.iter().find(|p| p.starts_with(&root) || root.starts_with(p)) {
            return Err(LaunchError::ProtectedTree {
                kind: kind.as_str(),
                tree: root.display().to_string(),
                path: inside.display().to_string(),
            });
        }
        trees.push(hash_tree(kind, &root, &TREE_BOUNDS)?);
    }
    Ok(trees)
}

fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.mode() & 0o111 != 0)
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

    /// Writes `path` (and its parents) with `text`, executable when `exec`.
    fn put(path: &Path, text: &str, exec: bool) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        let mode = if exec { 0o755 } else { 0o644 };
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
    }

    fn link(target: &str, at: &Path) {
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, at).unwrap();
    }

    /// A Node package at `root/PKG` with a dependency beside it and an entry with
    /// `#!/usr/bin/env node`.
    fn node_package(modules: &Path) {
        put(&modules.join("@scope/srv/package.json"), "{\"name\":\"@scope/srv\"}", false);
        put(&modules.join("@scope/srv/dist/index.js"), "#!/usr/bin/env node\nimport 'dep';\n", true);
        put(&modules.join("@scope/srv/node_modules/dep/index.js"), "export {}", false);
    }

    #[test]
    fn node_installs_resolve_to_their_node_modules_tree_and_the_path_s_node() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let node_bin = root.join("node-22/bin");
        put(&node_bin.join("node"), "\x7fELF a node", true);
        let path_var = format!("{}:/usr/bin:/bin", node_bin.display());
        // `npm install -g --prefix /opt/mcp`, `~/.npm-global`, nvm and volta's package images:
        // PREFIX/bin/NAME -> ../lib/node_modules/@scope/srv/dist/index.js.
        for prefix in [
            "opt/mcp",
            "home/.npm-global",
            "home/.nvm/versions/node/v22.20.0",
            "home/.volta/tools/image/packages/@scope/srv",
        ] {
            let prefix = root.join(prefix);
            let modules = prefix.join("lib/node_modules");
            node_package(&modules);
            link("../lib/node_modules/@scope/srv/dist/index.js", &prefix.join("bin/srv"));
            let command = prefix.join("bin/srv");
            let launch =
                LaunchSpec::resolve_stdio("n", "stdio:n", &settings(command.to_str().unwrap(), &[]), Some(&path_var))
                    .unwrap();
            assert_eq!(launch.packages.len(), 1, "{prefix:?}: {:?}", launch.packages);
            assert_eq!(launch.packages[0].path, modules);
            assert_eq!(launch.packages[0].kind, TreeKind::NodeModules);
            let interpreter = launch.interpreter.as_ref().expect("the #! line's interpreter");
            assert_eq!(interpreter.path, node_bin.join("node"), "`env node` is looked up on the gateway's PATH");
            let entry = modules.join("@scope/srv/dist/index.js");
            assert_eq!(launch.argv(), [node_bin.join("node").to_str().unwrap(), entry.to_str().unwrap()]);
            // One dependency's bytes are part of the launch.
            let digest = launch.digest().unwrap();
            put(&modules.join("@scope/srv/node_modules/dep/index.js"), "export {evil}", false);
            let changed =
                LaunchSpec::resolve_stdio("n", "stdio:n", &settings(command.to_str().unwrap(), &[]), Some(&path_var))
                    .unwrap();
            assert_ne!(changed.digest().unwrap(), digest, "{prefix:?}");
        }
        // A project's `npm ci` tree, named by its `node_modules/.bin` link: the link is run (it is
        // inside the tree), and `node ENTRY` finds the same tree through the argument.
        let modules = root.join("project/node_modules");
        node_package(&modules);
        link("../@scope/srv/dist/index.js", &modules.join(".bin/srv"));
        let bin = modules.join(".bin/srv");
        let launch =
            LaunchSpec::resolve_stdio("n", "stdio:n", &settings(bin.to_str().unwrap(), &["--x"]), Some(&path_var))
                .unwrap();
        assert_eq!(launch.packages.iter().map(|t| t.path.as_path()).collect::<Vec<_>>(), [modules.as_path()]);
        assert_eq!(launch.argv(), [node_bin.join("node").to_str().unwrap(), bin.to_str().unwrap(), "--x"]);
        let entry = modules.join("@scope/srv/dist/index.js");
        let by_argument = settings(node_bin.join("node").to_str().unwrap(), &[entry.to_str().unwrap()]);
        let launch = LaunchSpec::resolve_stdio("n", "stdio:n", &by_argument, None).unwrap();
        assert_eq!(launch.packages[0].path, modules);
        assert!(launch.render().contains(&format!("package tree      {} (node_modules, ", modules.display())));
    }

    #[test]
    fn python_environments_resolve_to_the_venv_and_the_python_it_was_made_from() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        // A uv-managed Python (not a system directory), and a venv `uv venv` made from it.
        let home = root.join("uv/python/cpython-3.12.7-linux-x86_64-gnu");
        put(&home.join("bin/python3.12"), "\x7fELF a python", true);
        put(&home.join("lib/python3.12/os.py"), "# the standard library", false);
        let venv = root.join("srv/.venv");
        put(
            &venv.join("pyvenv.cfg"),
            &format!(
                "home = {}\nimplementation = CPython\nuv = 0.5.11\nversion_info = 3.12.7\n",
                home.join("bin").display()
            ),
            false,
        );
        link(home.join("bin/python3.12").to_str().unwrap(), &venv.join("bin/python"));
        put(&venv.join("lib/python3.12/site-packages/mcp/__init__.py"), "", false);
        put(&venv.join("bin/srv"), &format!("#!{}\nfrom srv import main\n", venv.join("bin/python").display()), true);
        // The interpreter, and a console script whose #! line names it.
        for (command, argv) in [
            (venv.join("bin/python"), vec![venv.join("bin/python"), PathBuf::from("/srv/server.py")]),
            (
                venv.join("bin/srv"),
                vec![venv.join("bin/python"), venv.join("bin/srv"), PathBuf::from("/srv/server.py")],
            ),
        ] {
            let launch = LaunchSpec::resolve_stdio(
                "p",
                "stdio:p",
                &settings(command.to_str().unwrap(), &["/srv/server.py"]),
                None,
            )
            .unwrap();
            let trees: Vec<(TreeKind, PathBuf)> = launch.packages.iter().map(|t| (t.kind, t.path.clone())).collect();
            assert_eq!(trees, [(TreeKind::PythonVenv, venv.clone()), (TreeKind::PythonHome, home.clone())]);
            let argv: Vec<String> = argv.iter().map(|p| p.to_str().unwrap().to_owned()).collect();
            assert_eq!(launch.argv(), argv, "the venv's own bin/python runs: it finds the venv by its path");
            let digest = launch.digest().unwrap();
            put(&home.join("lib/python3.12/os.py"), "# changed", false);
            let changed = LaunchSpec::resolve_stdio(
                "p",
                "stdio:p",
                &settings(command.to_str().unwrap(), &["/srv/server.py"]),
                None,
            )
            .unwrap();
            assert_ne!(changed.digest().unwrap(), digest, "the installation's standard library is part of the launch");
            put(&home.join("lib/python3.12/os.py"), "# the standard library", false);
        }
        // A venv made from the system's Python adds no installation tree (/usr is visible).
        let system = root.join("system-venv");
        put(&system.join("pyvenv.cfg"), "home = /usr/bin\n", false);
        link("/bin/sh", &system.join("bin/python"));
        let launch = LaunchSpec::resolve_stdio(
            "p",
            "stdio:p",
            &settings(system.join("bin/python").to_str().unwrap(), &[]),
            None,
        )
        .unwrap();
        assert_eq!(launch.packages.iter().map(|t| t.kind).collect::<Vec<_>>(), [TreeKind::PythonVenv]);
    }

    #[test]
    fn a_tree_holding_a_protected_path_or_over_its_bound_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let modules = root.join("node_modules");
        node_package(&modules);
        let entry = modules.join("@scope/srv/dist/index.js");
        let mut s = settings("/bin/sh", &[entry.to_str().unwrap()]);
        s.protected = vec![modules.join("@scope/srv/node_modules/dep")];
        let refused = LaunchSpec::resolve_stdio("n", "stdio:n", &s, None).unwrap_err();
        assert!(
            matches!(&refused, LaunchError::ProtectedTree { tree, .. } if *tree == modules.display().to_string()),
            "{refused}"
        );
        let small = crate::upstream::packages::TreeBounds { max_entries: 3, max_bytes: 1 << 20 };
        let over = crate::upstream::packages::hash_tree(TreeKind::NodeModules, &modules, &small).unwrap_err();
        let text = LaunchError::from(over).to_string();
        assert!(
            text.contains(&format!("the node_modules tree {} holds more than 3 entries", modules.display())),
            "{text}"
        );
        let tiny = crate::upstream::packages::TreeBounds { max_entries: 100, max_bytes: 10 };
        let over = crate::upstream::packages::hash_tree(TreeKind::NodeModules, &modules, &tiny).unwrap_err();
        assert!(over.to_string().contains("holds more than 10 bytes"), "{over}");
    }
}
