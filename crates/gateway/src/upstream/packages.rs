//! What a stdio launch runs besides its executable, found without hand-written grants: the
//! `node_modules` tree a Node entry file (or interpreter) belongs to, the Python virtual
//! environment (`pyvenv.cfg`) an interpreter or console script belongs to and the Python
//! installation that environment was made from, and the interpreter a script's `#!` line names.
//! Each tree is hashed as a whole — every regular file's SHA-256 and mode, every symlink's
//! target, every directory's name — under a bound on its entry count and size
//! ([`TREE_BOUNDS`]), so a changed dependency is a changed launch. File digests are cached by
//! path and file identity, so a new process does not re-read an unchanged tree.

use std::collections::HashMap;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use aws_lc_rs::digest;
use palisade_base::hex::hex;

/// Directories of the host visible, read-only, inside every sandbox (a path under one needs no
/// bind of its own).
pub const SYSTEM_DIRS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"];

/// Whether `path` lies under one of [`SYSTEM_DIRS`].
pub fn in_system_dirs(path: &Path) -> bool {
    SYSTEM_DIRS.iter().any(|dir| path.starts_with(dir))
}

/// Why a file or tree cannot be hashed. Texts name paths, never contents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackageError {
    /// A file or directory could not be read.
    #[error("{path}: cannot be read to compute its digest: {reason}")]
    Unreadable {
        /// The file or directory.
        path: String,
        /// The I/O error's kind.
        reason: String,
    },
    /// A tree is over [`TREE_BOUNDS`].
    #[error(
        "the {kind} tree {tree} holds more than {limit} {what}, the most a launch hashes: install the server into a \
         directory of its own (`npm install -g --prefix /opt/mcp/<name> <package>`, one virtual environment per \
         server)"
    )]
    TooLarge {
        /// The tree's kind.
        kind: &'static str,
        /// The tree.
        tree: String,
        /// `entries` or `bytes`.
        what: &'static str,
        /// The bound.
        limit: u64,
    },
}

/// The kinds of package tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TreeKind {
    /// The outermost `node_modules` directory a path lies in (a global `--prefix`, nvm, volta,
    /// `~/.npm-global` or a project's `npm ci` tree).
    NodeModules,
    /// A Python virtual environment: the directory holding `pyvenv.cfg`.
    PythonVenv,
    /// The Python installation a virtual environment was made from (its `home`'s prefix), when
    /// it is not a system directory (pyenv, a uv-managed Python, a `/opt` build).
    PythonHome,
}

impl TreeKind {
    /// As shown and pinned.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NodeModules => "node_modules",
            Self::PythonVenv => "python-venv",
            Self::PythonHome => "python-home",
        }
    }
}

/// The bound on one tree: more is refused, naming the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeBounds {
    /// Most entries (files, directories, symlinks).
    pub max_entries: u64,
    /// Most bytes of regular files.
    pub max_bytes: u64,
}

/// 100,000 entries and 2 GiB per tree: a Node global prefix with npm, a venv with the MCP SDK
/// and a whole CPython installation each fit many times over; hashing that much is a few
/// seconds once, then a `stat` per file.
pub const TREE_BOUNDS: TreeBounds = TreeBounds { max_entries: 100_000, max_bytes: 2 << 30 };

/// One hashed tree, visible read-only inside the sandbox at its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageTree {
    /// Its kind.
    pub kind: TreeKind,
    /// Its canonical path.
    pub path: PathBuf,
    /// SHA-256 (hex) over every entry's relative name, type, mode and content digest or target.
    pub sha256: String,
    /// Its entries.
    pub entries: u64,
    /// The bytes of its regular files.
    pub bytes: u64,
}

/// The trees `path` (absolute; a file) belongs to: the outermost `node_modules` directory on
/// it; the nearest ancestor holding `pyvenv.cfg`, and the installation its `home` names.
pub fn trees_of(path: &Path) -> Vec<(TreeKind, PathBuf)> {
    let mut found = Vec::new();
    let mut prefix = PathBuf::new();
    for component in path.components() {
        prefix.push(component);
        if component.as_os_str() == "node_modules" && prefix != path {
            found.push((TreeKind::NodeModules, prefix.clone()));
            break;
        }
    }
    if let Some(venv) = path.ancestors().skip(1).find(|dir| dir.join("pyvenv.cfg").is_file()) {
        found.push((TreeKind::PythonVenv, venv.to_owned()));
        if let Some(home) = venv_home(venv) {
            found.push((TreeKind::PythonHome, home));
        }
    }
    found
}

/// The prefix of the Python a virtual environment was made from (`home = <prefix>/bin` in its
/// `pyvenv.cfg`), canonical; `None` when it is unreadable, relative or a system directory.
fn venv_home(venv: &Path) -> Option<PathBuf> {
    let mut text = String::new();
    std::fs::File::open(venv.join("pyvenv.cfg")).ok()?.take(64 * 1024).read_to_string(&mut text).ok()?;
    let home = text.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim().eq_ignore_ascii_case("home")).then(|| PathBuf::from(value.trim()))
    })?;
    let home = std::fs::canonicalize(home).ok()?;
    let prefix = if home.file_name().is_some_and(|name| name == "bin") { home.parent()?.to_owned() } else { home };
    (prefix.is_absolute() && prefix != Path::new("/") && !in_system_dirs(&prefix)).then_some(prefix)
}

/// What a script's `#!` line names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shebang {
    /// `#!/path/to/interpreter [arg]`.
    Direct {
        /// The interpreter as written.
        interpreter: String,
        /// The one argument the kernel passes, if any.
        arg: Option<String>,
    },
    /// `#!/usr/bin/env NAME` (or `env -S NAME ARGS…`): NAME looked up on a `PATH`.
    Env {
        /// The program name.
        name: String,
        /// Its arguments (`-S` only).
        args: Vec<String>,
    },
}

/// The `#!` line of the file at `path`, `None` when it does not start with one (a binary).
pub fn shebang(path: &Path) -> Result<Option<Shebang>, PackageError> {
    let unreadable = |error: std::io::Error| PackageError::Unreadable {
        path: path.display().to_string(),
        reason: error.kind().to_string(),
    };
    // The kernel reads at most 256 bytes of it.
    let mut head = Vec::with_capacity(256);
    std::fs::File::open(path).map_err(unreadable)?.take(256).read_to_end(&mut head).map_err(unreadable)?;
    let Some(rest) = head.strip_prefix(b"#!") else { return Ok(None) };
    let line = rest.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let line = line.trim();
    let (interpreter, arg) = match line.split_once([' ', '\t']) {
        Some((interpreter, arg)) => (interpreter, Some(arg.trim()).filter(|arg| !arg.is_empty())),
        None => (line, None),
    };
    if interpreter.is_empty() {
        return Ok(None);
    }
    if interpreter.rsplit('/').next() == Some("env")
        && let Some(arg) = arg
    {
        let mut words = arg.split_whitespace();
        let split = arg.starts_with("-S");
        if split {
            words.next();
        }
        if let Some(name) = words.next() {
            let args = if split { words.map(str::to_owned).collect() } else { Vec::new() };
            return Ok(Some(Shebang::Env { name: name.to_owned(), args }));
        }
    }
    Ok(Some(Shebang::Direct { interpreter: interpreter.to_owned(), arg: arg.map(str::to_owned) }))
}

/// Hashes the tree at `root` (canonical) without following symlinks, within `bounds`.
pub fn hash_tree(kind: TreeKind, root: &Path, bounds: &TreeBounds) -> Result<PackageTree, PackageError> {
    let unreadable = |path: &Path, error: std::io::Error| PackageError::Unreadable {
        path: path.display().to_string(),
        reason: error.kind().to_string(),
    };
    let too_large =
        |what, limit| PackageError::TooLarge { kind: kind.as_str(), tree: root.display().to_string(), what, limit };
    let mut context = digest::Context::new(&digest::SHA256);
    let (mut entries, mut bytes) = (0_u64, 0_u64);
    // Depth first, each directory's entries in byte order: the same tree gives the same digest.
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let dir = root.join(&relative);
        let mut names: Vec<std::ffi::OsString> = std::fs::read_dir(&dir)
            .map_err(|error| unreadable(&dir, error))?
            .map(|entry| entry.map(|entry| entry.file_name()))
            .collect::<Result<_, _>>()
            .map_err(|error| unreadable(&dir, error))?;
        names.sort();
        let mut subdirs = Vec::new();
        for name in names {
            entries += 1;
            if entries > bounds.max_entries {
                return Err(too_large("entries", bounds.max_entries));
            }
            let relative = relative.join(&name);
            let path = root.join(&relative);
            let meta = std::fs::symlink_metadata(&path).map_err(|error| unreadable(&path, error))?;
            let name = std::os::unix::ffi::OsStrExt::as_bytes(relative.as_os_str());
            let mode = format!("{:o}", meta.mode() & 0o7777);
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).map_err(|error| unreadable(&path, error))?;
                record(&mut context, &[b"l", name, std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str())]);
            } else if meta.is_dir() {
                record(&mut context, &[b"d", name, mode.as_bytes()]);
                subdirs.push(relative);
            } else if meta.is_file() {
                bytes = bytes.saturating_add(meta.len());
                if bytes > bounds.max_bytes {
                    return Err(too_large("bytes", bounds.max_bytes));
                }
                let sha = file_sha256(&path)?;
                record(&mut context, &[b"f", name, mode.as_bytes(), sha.as_bytes()]);
            } else {
                record(&mut context, &[b"o", name, mode.as_bytes()]);
            }
        }
        // Popped in byte order.
        pending.extend(subdirs.into_iter().rev());
    }
    Ok(PackageTree { kind, path: root.to_owned(), sha256: hex(context.finish().as_ref()), entries, bytes })
}

/// One entry of a tree digest: each field preceded by its length, so no name or link target
/// (which may hold any byte but NUL) can pass for another entry.
fn record(context: &mut digest::Context, fields: &[&[u8]]) {
    for field in fields {
        context.update(&u64::try_from(field.len()).unwrap_or(u64::MAX).to_le_bytes());
        context.update(field);
    }
}

/// What identifies one version of a file without reading it: a rewrite in place changes its
/// mtime and ctime, a replacement its inode; ctime cannot be set from user space.
type FileIdentity = (u64, u64, u64, i64, i64, i64, i64);

fn identity(meta: &std::fs::Metadata) -> FileIdentity {
    (meta.dev(), meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec(), meta.ctime(), meta.ctime_nsec())
}

/// SHA-256 of a file's bytes, cached by path and [`FileIdentity`] so launching a new process
/// does not re-read an unchanged interpreter or tree.
pub fn file_sha256(path: &Path) -> Result<String, PackageError> {
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, (FileIdentity, String)>>> = OnceLock::new();
    let unreadable = |error: std::io::Error| PackageError::Unreadable {
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

    fn script(dir: &Path, first_line: &str) -> Result<Option<Shebang>, PackageError> {
        let path = dir.join("script");
        std::fs::write(&path, format!("{first_line}\nbody\n")).unwrap();
        shebang(&path)
    }

    #[test]
    fn shebang_lines_name_their_interpreter_as_the_kernel_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let env = |name: &str, args: &[&str]| {
            Some(Shebang::Env { name: name.to_owned(), args: args.iter().map(|a| (*a).to_owned()).collect() })
        };
        assert_eq!(script(dir.path(), "#!/usr/bin/env node").unwrap(), env("node", &[]));
        assert_eq!(
            script(dir.path(), "#!/usr/bin/env -S node --max-old-space-size=512").unwrap(),
            env("node", &["--max-old-space-size=512"])
        );
        assert_eq!(
            script(dir.path(), "#!/opt/mcp/py/bin/python3 -u").unwrap(),
            Some(Shebang::Direct { interpreter: "/opt/mcp/py/bin/python3".into(), arg: Some("-u".into()) })
        );
        assert_eq!(
            script(dir.path(), "#! /bin/sh").unwrap(),
            Some(Shebang::Direct { interpreter: "/bin/sh".into(), arg: None })
        );
        assert_eq!(script(dir.path(), "\u{7f}ELF").unwrap(), None, "a binary has none");
        assert_eq!(script(dir.path(), "#!").unwrap(), None);
        assert!(matches!(shebang(&dir.path().join("missing")), Err(PackageError::Unreadable { .. })));
    }

    #[test]
    fn a_tree_digest_changes_with_any_byte_mode_name_or_link_and_not_otherwise() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("node_modules");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/index.js"), "one").unwrap();
        std::os::unix::fs::symlink("a/b/index.js", root.join("link")).unwrap();
        let digest = || hash_tree(TreeKind::NodeModules, &root, &TREE_BOUNDS).unwrap();
        let first = digest();
        assert_eq!((first.entries, first.bytes), (4, 3));
        assert_eq!(digest(), first, "stable");
        let mut seen = vec![first.sha256.clone()];
        let mut changed = |what: &str| {
            let sha = digest().sha256;
            assert!(!seen.contains(&sha), "{what} did not change the digest");
            seen.push(sha);
        };
        std::fs::write(root.join("a/b/index.js"), "two").unwrap();
        changed("a file's bytes");
        std::fs::set_permissions(root.join("a/b/index.js"), std::fs::Permissions::from_mode(0o755)).unwrap();
        changed("a file's mode");
        std::fs::remove_file(root.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        changed("a symlink's target");
        std::fs::rename(root.join("a/b/index.js"), root.join("a/b/main.js")).unwrap();
        changed("a file's name");
        std::fs::create_dir(root.join("a/empty")).unwrap();
        changed("a new directory");
    }
}
