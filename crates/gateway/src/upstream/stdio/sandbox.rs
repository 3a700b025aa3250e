//! The command line that confines one stdio server: `prlimit` (util-linux) sets its rlimits and
//! `bwrap` (bubblewrap) builds its namespaces and mounts, run as an unprivileged uid of its own
//! when the gateway is root. Nothing is hand-rolled with `unsafe`: the uid and gid switch is the
//! standard library's (`CommandExt::uid`/`gid`, which also drops supplementary groups), every
//! kernel-facing step is one of those two tools'.
//!
//! What the process gets (SECURITY.md, "the gateway → local processes"):
//! - new user, PID, IPC, UTS and cgroup namespaces, and no further user namespace inside
//!   (`--disable-userns`: the kernel surface of nested ones stays closed); a new network
//!   namespace unless `network`;
//! - read-only `/usr`, `/bin`, `/sbin`, `/lib*` and `/etc`, a minimal `/dev`, its own `/proc`,
//!   a private `/tmp`; the package trees the launch hashed (a `node_modules` tree, a virtual
//!   environment and its Python installation), read-only; the executable, its interpreter and
//!   every argument file outside those, each file alone, read-only; each grant at its own path,
//!   read-only unless `rw`; nothing else of the host (no `/home`, `/root`, `/srv`, `/var`, …);
//! - every protected path (the gateway's configuration, data directory and secret files) that
//!   would be visible is masked, and a grant that would expose one is refused;
//! - no capabilities, `no_new_privs` (bubblewrap sets it), a new session (no terminal
//!   injection), `--die-with-parent`;
//! - an environment of `PATH`, `HOME=/tmp`, `TMPDIR=/tmp` and the declared names only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::upstream::launch::LaunchSpec;
use crate::upstream::packages::{SYSTEM_DIRS, in_system_dirs};
use crate::upstream::settings::{Confinement, SandboxSettings};
/// The `PATH` inside the sandbox.
const SANDBOX_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// Where the tools are looked for (never the gateway's `PATH`: a writable directory early on it
/// must not choose what confines the server).
const TOOL_DIRS: &[&str] = &["/usr/bin", "/bin", "/usr/sbin", "/sbin"];

/// Why a sandbox cannot be set up: the upstream does not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxError {
    /// bubblewrap or prlimit is not installed.
    #[error("{0} is not installed; a confined stdio upstream cannot start (install it, or set confinement = \"none\")")]
    Missing(&'static str),
    /// A grant would show a path the gateway protects.
    #[error("grant {grant} would expose {protected}, which the gateway protects")]
    ExposesProtected {
        /// The grant.
        grant: String,
        /// The protected path inside it.
        protected: String,
    },
    /// A grant does not exist or is not a directory.
    #[error("grant {0} is not an existing directory")]
    Grant(String),
    /// A declared environment variable has no value.
    #[error("environment variable {0} (listed in env) is not set in the gateway's environment")]
    EnvMissing(String),
    /// An `env_files` file could not be read.
    #[error("environment variable {name}: its file cannot be read ({reason})")]
    EnvFile {
        /// The variable.
        name: String,
        /// The I/O error's kind.
        reason: String,
    },
    /// Every sandbox uid is in use.
    #[error("every sandbox uid is in use")]
    NoUid,
    /// The sandbox uid could not reach a path the sandbox needs (bubblewrap binds it as that uid).
    #[error(
        "{path} is not reachable by the sandbox uid {uid} (gid {gid}): {blocker}; make every directory on the way \
         searchable by it (POSIX ACLs are not consulted), or move the file"
    )]
    Unreachable {
        /// The executable, grant or working directory.
        path: String,
        /// The sandbox uid.
        uid: u32,
        /// The sandbox gid.
        gid: u32,
        /// The first directory or file that stops it, with its mode and owner.
        blocker: String,
    },
}

/// The uids handed to running processes: one each, so the kernel's per-uid process count
/// (RLIMIT_NPROC) and file ownership in `rw` grants never span two processes. A uid that any
/// process of the host runs as now (another gateway's sandbox, `gateway status` beside a running
/// gateway) is skipped, and the search starts at a random place of the range, so two gateways
/// sharing `sandbox_uid_base` do not hand out the same uids.
#[derive(Debug)]
pub(crate) struct UidPool {
    base: u32,
    in_use: Mutex<BTreeSet<u32>>,
}

/// How many uids the pool hands out at most.
const UID_POOL_SIZE: u32 = 65_536;

impl UidPool {
    pub(crate) fn new(base: u32) -> Self {
        Self { base, in_use: Mutex::new(BTreeSet::new()) }
    }

    /// A free uid.
    pub(crate) fn take(&self) -> Result<u32, SandboxError> {
        let running = uids_running();
        let mut offset = [0u8; 4];
        // Without randomness the search starts at the base: still unique within this gateway.
        let _ = aws_lc_rs::rand::fill(&mut offset);
        let start = u32::from_le_bytes(offset) % UID_POOL_SIZE;
        let mut in_use = self.in_use.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let uid = (0..UID_POOL_SIZE)
            .map(|step| self.base.saturating_add((start + step) % UID_POOL_SIZE))
            .find(|uid| !in_use.contains(uid) && !running.contains(uid))
            .ok_or(SandboxError::NoUid)?;
        in_use.insert(uid);
        Ok(uid)
    }

    /// Returns a uid.
    pub(crate) fn give_back(&self, uid: u32) {
        self.in_use.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&uid);
    }
}

/// The real uids of the host's processes now (from `/proc/<pid>/status`; unreadable entries are
/// skipped: a process that vanished meanwhile holds no uid).
fn uids_running() -> BTreeSet<u32> {
    let mut uids = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return uids };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else { continue };
        let uid = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|uid| uid.parse::<u32>().ok());
        uids.extend(uid);
    }
    uids
}

/// Whether the gateway runs as root (then every process gets a uid of its own).
pub(crate) fn running_as_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// How many fixed names [`environment`] puts first (`PATH`, `HOME`, `TMPDIR`).
pub(crate) const FIXED_ENV: usize = 3;

/// The environment a process starts with: the [`FIXED_ENV`] fixed names, then the declared ones.
pub(crate) fn environment(
    spec: &LaunchSpec,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, SandboxError> {
    let mut env = vec![
        ("PATH".to_owned(), SANDBOX_PATH.to_owned()),
        ("HOME".to_owned(), "/tmp".to_owned()),
        ("TMPDIR".to_owned(), "/tmp".to_owned()),
    ];
    for name in &spec.settings.env {
        let value = lookup(name).ok_or_else(|| SandboxError::EnvMissing(name.clone()))?;
        env.push((name.clone(), value));
    }
    for (name, path) in &spec.settings.env_files {
        let value = std::fs::read_to_string(path)
            .map_err(|error| SandboxError::EnvFile { name: name.clone(), reason: error.kind().to_string() })?;
        env.push((name.clone(), value.trim_end_matches(['\n', '\r']).to_owned()));
    }
    Ok(env)
}

/// Whether `uid`/`gid` (no supplementary groups: the process has none) may do `want` (`0o1`
/// search or execute, `0o4` read, `0o2` write, combined) on a file of `meta`, by its mode bits.
fn permits(meta: &std::fs::Metadata, uid: u32, gid: u32, want: u32) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let mode = meta.mode();
    let bits = if meta.uid() == uid {
        mode >> 6
    } else if meta.gid() == gid {
        mode >> 3
    } else {
        mode
    };
    bits & want == want
}

/// Checks that the sandbox uid can reach `path` (search on every directory above it) and do
/// `want` on it, so a process that could not start says why instead of dying in bubblewrap.
fn reachable(path: &Path, uid: u32, gid: u32, want: u32) -> Result<(), SandboxError> {
    use std::os::unix::fs::MetadataExt as _;
    let unreachable = |blocker: &Path, meta: &std::fs::Metadata| SandboxError::Unreachable {
        path: path.display().to_string(),
        uid,
        gid,
        blocker: format!(
            "{} is mode {:04o}, owner {}:{}",
            blocker.display(),
            meta.mode() & 0o7777,
            meta.uid(),
            meta.gid()
        ),
    };
    let missing = || SandboxError::Grant(path.display().to_string());
    for dir in path.ancestors().skip(1) {
        let meta = std::fs::metadata(dir).map_err(|_| missing())?;
        if !permits(&meta, uid, gid, 0o1) {
            return Err(unreachable(dir, &meta));
        }
    }
    let meta = std::fs::metadata(path).map_err(|_| missing())?;
    if !permits(&meta, uid, gid, want) {
        return Err(unreachable(path, &meta));
    }
    Ok(())
}

/// Whether `path` lies in one of the operator's grants.
fn in_grants(path: &Path, settings: &crate::upstream::settings::StdioSettings) -> bool {
    settings.grants.iter().any(|grant| path.starts_with(&grant.path))
}

fn find_tool(name: &'static str) -> Result<PathBuf, SandboxError> {
    TOOL_DIRS.iter().map(|dir| Path::new(dir).join(name)).find(|path| path.is_file()).ok_or(SandboxError::Missing(name))
}

/// The command that runs `spec`'s server: confined (prlimit + bwrap) or, with
/// `confinement = "none"`, directly. `uid`: the sandbox uid when the gateway is root.
pub(crate) fn command(
    spec: &LaunchSpec,
    sandbox: &SandboxSettings,
    uid: Option<u32>,
    protected: &[PathBuf],
    env: Vec<(String, String)>,
) -> Result<tokio::process::Command, SandboxError> {
    let settings = &spec.settings;
    let argv = spec.argv();
    if settings.confinement == Confinement::None {
        let mut command = tokio::process::Command::new(&argv[0]);
        command.args(&argv[1..]).env_clear().envs(env).current_dir(&settings.cwd);
        return Ok(command);
    }
    let prlimit = find_tool("prlimit")?;
    let bwrap = find_tool("bwrap")?;
    let protected: Vec<PathBuf> =
        protected.iter().map(|path| std::fs::canonicalize(path).unwrap_or_else(|_| path.clone())).collect();
    let mut args: Vec<String> = Vec::new();
    let limits = &settings.limits;
    args.extend([
        format!("--as={}", limits.memory_bytes),
        format!("--nproc={}", limits.processes),
        format!("--cpu={}", limits.cpu_secs),
        format!("--nofile={}", limits.open_files),
        "--".into(),
        bwrap.to_string_lossy().into_owned(),
    ]);
    let mut push = |parts: &[&str]| args.extend(parts.iter().map(|part| (*part).to_owned()));
    push(&["--die-with-parent", "--new-session", "--unshare-user", "--unshare-ipc", "--unshare-pid"]);
    push(&["--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox", "--disable-userns"]);
    if !settings.network {
        push(&["--unshare-net"]);
    }
    let (inside_uid, inside_gid) = match uid {
        Some(uid) => (uid, sandbox.gid),
        None => (rustix::process::getuid().as_raw(), rustix::process::getgid().as_raw()),
    };
    // As root, bubblewrap runs as the sandbox uid: what it binds must be reachable by that uid.
    if uid.is_some() {
        reachable(&settings.cwd, inside_uid, inside_gid, 0o1).or_else(|error| {
            // The default working directory is the sandbox's private /tmp, not the host's.
            if settings.cwd == Path::new("/tmp") { Ok(()) } else { Err(error) }
        })?;
    }
    push(&["--uid", &inside_uid.to_string(), "--gid", &inside_gid.to_string()]);
    for dir in SYSTEM_DIRS {
        let path = Path::new(dir);
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    push(&["--symlink", &target.to_string_lossy(), dir]);
                }
            }
            Ok(meta) if meta.is_dir() => push(&["--ro-bind", dir, dir]),
            _ => {}
        }
    }
    push(&["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]);
    // The package trees, then each file the launch runs that lies outside them, read-only.
    let mut files: Vec<(&Path, u32)> = vec![(spec.executable.as_path(), 0o5)];
    if let Some(interpreter) = &spec.interpreter {
        files.push((interpreter.executable.as_path(), 0o5));
    }
    files.extend(spec.argument_files.iter().map(|(_, path, _)| (path.as_path(), 0o4)));
    let trees = spec.packages.iter().filter(|tree| !in_system_dirs(&tree.path)).map(|tree| (tree.path.as_path(), 0o5));
    for (path, want) in trees.chain(files.into_iter().filter(|(path, _)| !spec.seen(path))) {
        if uid.is_some() {
            reachable(path, inside_uid, inside_gid, want)?;
        }
        let text = path.to_string_lossy();
        push(&["--ro-bind", &text, &text]);
    }
    // An argument file named through a symlink outside what is visible (`/opt/mcp/bin/NAME`)
    // gets that symlink, so the program resolves it as on the host.
    for (index, canonical, _) in &spec.argument_files {
        let written = Path::new(&settings.args[*index]);
        let written = if written.is_absolute() { written.to_path_buf() } else { settings.cwd.join(written) };
        if written != *canonical && !spec.seen(&written) && !in_grants(&written, settings) {
            push(&["--symlink", &canonical.to_string_lossy(), &written.to_string_lossy()]);
        }
    }
    for grant in &settings.grants {
        let real =
            std::fs::canonicalize(&grant.path).map_err(|_| SandboxError::Grant(grant.path.display().to_string()))?;
        if !real.is_dir() {
            return Err(SandboxError::Grant(grant.path.display().to_string()));
        }
        if uid.is_some() {
            reachable(&real, inside_uid, inside_gid, if grant.rw { 0o3 } else { 0o1 })?;
        }
        if let Some(inside) = protected.iter().find(|p| p.starts_with(&real) || real.starts_with(p)) {
            return Err(SandboxError::ExposesProtected {
                grant: grant.path.display().to_string(),
                protected: inside.display().to_string(),
            });
        }
        let real = real.to_string_lossy().into_owned();
        let at = grant.path.to_string_lossy().into_owned();
        push(&[if grant.rw { "--bind" } else { "--ro-bind" }, &real, &at]);
    }
    // A protected path under a visible system directory is masked: an empty tmpfs over a
    // directory, /dev/null over a file.
    for path in protected.iter().filter(|path| in_system_dirs(path)) {
        let text = path.to_string_lossy().into_owned();
        if path.is_dir() {
            push(&["--tmpfs", &text]);
        } else if path.exists() {
            push(&["--ro-bind", "/dev/null", &text]);
        }
    }
    push(&["--chdir", &settings.cwd.to_string_lossy(), "--cap-drop", "ALL", "--"]);
    args.extend(argv);
    let mut command = tokio::process::Command::new(prlimit);
    command.args(args).env_clear().envs(env).current_dir("/");
    if let Some(uid) = uid {
        command.uid(uid).gid(sandbox.gid);
    }
    Ok(command)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::settings::{Grant, ProcessLimits, StdioSettings};
    use std::time::Duration;

    fn spec(grants: Vec<Grant>, network: bool, confinement: Confinement) -> LaunchSpec {
        LaunchSpec {
            upstream_id: "fx".into(),
            upstream_url: "stdio:fx".into(),
            settings: StdioSettings {
                command: "/usr/bin/env".into(),
                args: vec!["--flag".into()],
                env: vec!["API_KEY".into()],
                env_files: Default::default(),
                cwd: "/tmp".into(),
                grants,
                network,
                confinement,
                shared: false,
                max_processes: 4,
                idle: Duration::from_secs(60),
                limits: ProcessLimits { memory_bytes: 1 << 30, processes: 64, cpu_secs: 60, open_files: 256 },
                protected: Vec::new(),
                search_path: None,
            },
            executable: "/usr/bin/env".into(),
            command_path: "/usr/bin/env".into(),
            executable_sha256: "0".repeat(64),
            interpreter: None,
            argument_files: Vec::new(),
            packages: Vec::new(),
        }
    }

    fn args(command: &tokio::process::Command) -> Vec<String> {
        command.as_std().get_args().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    fn has(args: &[String], window: &[&str]) -> bool {
        args.windows(window.len()).any(|w| w.iter().zip(window).all(|(a, b)| a == b))
    }

    const SANDBOX: SandboxSettings = SandboxSettings { uid_base: 600_000, gid: 65_534 };

    #[test]
    fn the_confined_command_has_every_layer() {
        if find_tool("bwrap").is_err() || find_tool("prlimit").is_err() {
            // The error itself is the fail-closed behaviour: checked below.
            assert_eq!(
                command(&spec(Vec::new(), false, Confinement::Bubblewrap), &SANDBOX, None, &[], Vec::new()).err(),
                Some(if find_tool("prlimit").is_err() {
                    SandboxError::Missing("prlimit")
                } else {
                    SandboxError::Missing("bwrap")
                })
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // The sandbox uid must reach a grant: a temporary directory is 0700 until opened up.
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let grant = dir.path().join("data");
        std::fs::create_dir(&grant).unwrap();
        let grants = vec![Grant { path: grant.clone(), rw: false }];
        let built =
            command(&spec(grants, false, Confinement::Bubblewrap), &SANDBOX, Some(600_001), &[], Vec::new()).unwrap();
        let args = args(&built);
        for layer in [
            &["--as=1073741824"][..],
            &["--nproc=64"],
            &["--cpu=60"],
            &["--nofile=256"],
            &["--die-with-parent"],
            &["--unshare-user"],
            &["--unshare-pid"],
            &["--disable-userns"],
            &["--unshare-net"],
            &["--uid", "600001", "--gid", "65534"],
            &["--ro-bind", "/etc", "/etc"],
            &["--tmpfs", "/tmp"],
            &["--proc", "/proc"],
            &["--cap-drop", "ALL"],
        ] {
            assert!(has(&args, layer), "missing {layer:?} in {args:?}");
        }
        let grant_text = grant.to_string_lossy().into_owned();
        assert!(has(&args, &["--ro-bind", &grant_text, &grant_text]), "a grant is read-only unless rw: {args:?}");
        assert_eq!(args.last().map(String::as_str), Some("--flag"));
        let networked =
            command(&spec(Vec::new(), true, Confinement::Bubblewrap), &SANDBOX, None, &[], Vec::new()).unwrap();
        assert!(!has(&super::tests::args(&networked), &["--unshare-net"]), "network = true shares the network");
    }

    #[test]
    fn package_trees_and_files_outside_them_are_bound_read_only_and_the_argv_runs_last() {
        use crate::upstream::launch::Interpreter;
        use crate::upstream::packages::{PackageTree, TreeKind};
        if find_tool("bwrap").is_err() || find_tool("prlimit").is_err() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let modules = root.join("lib/node_modules");
        let entry = modules.join("srv/index.js");
        std::fs::create_dir_all(entry.parent().unwrap()).unwrap();
        std::fs::write(&entry, "").unwrap();
        let node = root.join("node");
        std::fs::write(&node, "").unwrap();
        let script = root.join("extra.js");
        std::fs::write(&script, "").unwrap();
        let mut launch = spec(Vec::new(), false, Confinement::Bubblewrap);
        launch.executable = entry.clone();
        launch.command_path = root.join("bin/srv");
        launch.interpreter = Some(Interpreter {
            path: node.clone(),
            executable: node.clone(),
            sha256: "0".repeat(64),
            args: Vec::new(),
        });
        launch.settings.args = vec![root.join("via/link.js").to_string_lossy().into_owned()];
        launch.argument_files = vec![(0, script.clone(), "0".repeat(64))];
        launch.packages = vec![PackageTree {
            kind: TreeKind::NodeModules,
            path: modules.clone(),
            sha256: "0".repeat(64),
            entries: 2,
            bytes: 0,
        }];
        let built = command(&launch, &SANDBOX, None, &[], Vec::new()).unwrap();
        let args = args(&built);
        let text = |path: &Path| path.to_string_lossy().into_owned();
        assert!(has(&args, &["--ro-bind", &text(&modules), &text(&modules)]), "the tree, read-only: {args:?}");
        assert!(has(&args, &["--ro-bind", &text(&node), &text(&node)]), "the interpreter: {args:?}");
        assert!(has(&args, &["--ro-bind", &text(&script), &text(&script)]), "the argument file: {args:?}");
        assert!(!has(&args, &["--ro-bind", &text(&entry), &text(&entry)]), "inside the tree, no bind of its own");
        let written = root.join("via/link.js");
        assert!(has(&args, &["--symlink", &text(&script), &text(&written)]), "the argument as written: {args:?}");
        let tail: Vec<&str> = args.iter().rev().take(3).rev().map(String::as_str).collect();
        assert_eq!(tail, [text(&node), text(&entry), text(&written)], "interpreter, script, arguments");
    }

    #[test]
    fn protected_paths_are_never_granted_and_masked_where_visible() {
        if find_tool("bwrap").is_err() || find_tool("prlimit").is_err() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(data.join("inner").join("deeper")).unwrap();
        let protected = vec![data.join("inner")];
        // Above the protected directory, the directory itself, and inside it.
        for grant in [data.clone(), data.join("inner"), data.join("inner").join("deeper")] {
            let grants = vec![Grant { path: grant, rw: true }];
            let refused =
                command(&spec(grants, false, Confinement::Bubblewrap), &SANDBOX, None, &protected, Vec::new());
            assert!(matches!(refused, Err(SandboxError::ExposesProtected { .. })), "{refused:?}");
        }
        // A protected file under a visible system directory is covered by /dev/null.
        let built = command(
            &spec(Vec::new(), false, Confinement::Bubblewrap),
            &SANDBOX,
            None,
            &[PathBuf::from("/etc/hostname")],
            Vec::new(),
        )
        .unwrap();
        assert!(has(&args(&built), &["--ro-bind", "/dev/null", "/etc/hostname"]));
    }

    #[test]
    fn what_the_sandbox_uid_cannot_reach_is_named_before_anything_starts() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let closed = dir.path().join("closed");
        let grant = closed.join("data");
        std::fs::create_dir_all(&grant).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let me = rustix::process::getuid().as_raw();
        let other = if me == 600_001 { 600_002 } else { 600_001 };
        // The owner passes through its own 0700 directory; another uid is stopped there, by name.
        assert_eq!(reachable(&grant, me, u32::MAX, 0o1), Ok(()));
        match reachable(&grant, other, 65_534, 0o1) {
            Err(SandboxError::Unreachable { blocker, uid, .. }) => {
                assert_eq!(uid, other);
                assert!(blocker.starts_with(&format!("{} is mode 0700", closed.display())), "{blocker}");
            }
            unexpected => panic!("{unexpected:?}"),
        }
        // Opened for search but not for writing: a read-only grant passes, a writable one does not.
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o711)).unwrap();
        std::fs::set_permissions(&grant, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(reachable(&grant, other, 65_534, 0o1), Ok(()));
        assert!(matches!(reachable(&grant, other, 65_534, 0o3), Err(SandboxError::Unreachable { .. })));
        assert!(matches!(reachable(&grant.join("missing"), other, 65_534, 0o1), Err(SandboxError::Grant(_))));
        if find_tool("bwrap").is_ok() && find_tool("prlimit").is_ok() {
            std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
            let grants = vec![Grant { path: grant.clone(), rw: false }];
            let refused =
                command(&spec(grants, false, Confinement::Bubblewrap), &SANDBOX, Some(other), &[], Vec::new());
            assert!(matches!(refused, Err(SandboxError::Unreachable { .. })), "{refused:?}");
        }
    }

    #[test]
    fn the_environment_is_the_declared_names_only_and_a_missing_one_fails() {
        let spec = spec(Vec::new(), false, Confinement::None);
        let env = environment(&spec, &|name| (name == "API_KEY").then(|| "k".to_owned())).unwrap();
        let names: Vec<&str> = env.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["PATH", "HOME", "TMPDIR", "API_KEY"]);
        assert_eq!(environment(&spec, &|_| None), Err(SandboxError::EnvMissing("API_KEY".into())));
    }

    #[test]
    fn uids_are_handed_out_once_and_never_one_a_process_runs_as() {
        let pool = UidPool::new(700_000);
        let taken: BTreeSet<u32> = (0..200).map(|_| pool.take().unwrap()).collect();
        assert_eq!(taken.len(), 200, "each uid once");
        assert!(taken.iter().all(|uid| (700_000..700_000 + UID_POOL_SIZE).contains(uid)));
        let first = *taken.first().unwrap();
        pool.give_back(first);
        assert!(!pool.in_use.lock().unwrap().contains(&first));
        // The test's own uid, as a base: the pool skips it.
        let own = rustix::process::getuid().as_raw();
        let pool = UidPool::new(own);
        for _ in 0..50 {
            assert_ne!(pool.take().unwrap(), own, "a uid some process runs as is not handed out");
        }
        assert!(uids_running().contains(&own));
    }
}
