//! The operator's commands (`--disable-command`, `--enable-command`,
//! `--change-upstream-command`) are run without a shell, so their program must be a file: a
//! name without a `/` is looked up on `PATH` before the run (the way a shell would, but a shell
//! function or alias is no program), a path is kept as given, and a program that is not found
//! refuses the run before anything is sent. The run says which program each option runs.

use std::ffi::OsStr;
use std::path::Path;

/// An operator's command with its program resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The command line with its program replaced by the file it names.
    pub line: String,
    /// One line saying which program the option runs and how it was found (never the
    /// arguments, which may carry credentials).
    pub note: String,
}

/// `line` with its program (its first white-space separated word) replaced by the file it
/// names: looked up on `path` (the value of `PATH`) when it has no `/`, kept when it does.
/// `flag` names the option in the error and in the note.
pub fn resolve(flag: &str, line: &str, path: Option<&OsStr>) -> Result<Resolved, String> {
    let mut words = line.split_whitespace();
    let Some(program) = words.next() else {
        return Err(format!("{flag} names no program"));
    };
    let rest: Vec<&str> = words.collect();
    let (resolved, note) = if program.contains('/') {
        if !Path::new(program).is_file() {
            return Err(format!("{flag}: {program} is not a file"));
        }
        (program.to_owned(), format!("{flag} runs {program} (as given)"))
    } else {
        let found = path
            .into_iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join(program))
            .find(|candidate| executable(candidate.as_path()));
        match found.as_deref().and_then(Path::to_str) {
            Some(found) => (found.to_owned(), format!("{flag} runs {found} ({program} found on PATH)")),
            None => {
                return Err(format!(
                    "{flag}: {program} not found on PATH; give an absolute path (the command is run without a shell, so a shell function or alias is not found)"
                ));
            }
        }
    };
    let line = std::iter::once(resolved.as_str()).chain(rest).collect::<Vec<_>>().join(" ");
    Ok(Resolved { line, note })
}

/// [`resolve`] with this process's `PATH`.
pub fn resolve_on_path(flag: &str, line: &str) -> Result<Resolved, String> {
    resolve(flag, line, std::env::var_os("PATH").as_deref())
}

fn executable(candidate: &Path) -> bool {
    let Ok(metadata) = std::fs::metadata(candidate) else { return false };
    if !metadata.is_file() {
        return false;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        metadata.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_name_is_resolved_on_path_and_a_missing_one_refused() {
        let dir = std::env::temp_dir().join(format!("palisade-verify-program-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tool = dir.join("flipper");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let path = std::env::join_paths([Path::new("/nonexistent-dir"), dir.as_path()]).unwrap();
        let resolved = resolve("--disable-command", "flipper disable  --target {target}", Some(&path)).unwrap();
        assert_eq!(resolved.line, format!("{} disable --target {{target}}", tool.display()));
        // The note says which program runs and how it was found, never the arguments.
        assert_eq!(resolved.note, format!("--disable-command runs {} (flipper found on PATH)", tool.display()));
        // A path is kept as given.
        let given = format!("{} x", tool.display());
        let kept = resolve("--enable-command", &given, None).unwrap();
        assert_eq!(kept.line, given);
        assert_eq!(kept.note, format!("--enable-command runs {} (as given)", tool.display()));
        // A name not on PATH (a shell function, say) is refused with what to do.
        let missing = resolve("--disable-command", "palisade authority disable", Some(&path)).unwrap_err();
        assert!(missing.contains("--disable-command: palisade not found on PATH; give an absolute path"), "{missing}");
        assert!(resolve("--disable-command", "palisade x", None).unwrap_err().contains("not found on PATH"));
        assert!(resolve("--enable-command", "/no/such/program x", None).unwrap_err().contains("is not a file"));
        assert!(resolve("--enable-command", "  ", None).unwrap_err().contains("names no program"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
