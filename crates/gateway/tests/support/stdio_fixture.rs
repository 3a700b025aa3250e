//! Locates the built `stdio_fixture` example for the gateway's tests (building it once per test
//! binary when it is missing). Include with `#[path = "support/stdio_fixture.rs"] mod stdio_fixture;`.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The path of the `stdio_fixture` example binary, next to this test binary's directory
/// (`<target>/debug/deps/<test>` → `<target>/debug/examples/stdio_fixture`). Built with
/// `cargo build -p palisade-gateway --example stdio_fixture` the first time it is missing; panics
/// with the reason when it cannot be found or built.
pub fn fixture_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's own path");
        let profile_dir =
            exe.parent().and_then(|deps| deps.parent()).expect("the test binary lives in <target>/<profile>/deps");
        let path = profile_dir.join("examples").join(format!("stdio_fixture{}", std::env::consts::EXE_SUFFIX));
        if !path.is_file() {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("..");
            let status = std::process::Command::new(cargo)
                .args(["build", "-p", "palisade-gateway", "--example", "stdio_fixture"])
                .current_dir(&workspace)
                .status()
                .expect("running cargo build for the stdio fixture");
            assert!(status.success(), "cargo build --example stdio_fixture failed: {status}");
            assert!(path.is_file(), "the stdio fixture was built but is not at {}", path.display());
        }
        reachable_copy(&path)
    })
    .clone()
}

/// A copy of `built` in a directory every uid can search, under the system's temporary
/// directory: a gateway running as root runs confined servers as a sandbox uid of their own,
/// which cannot reach into a checkout under a private (0700) directory. The copy is named by
/// the build's size and modification time, so test binaries share it and a rebuild gets a new one.
fn reachable_copy(built: &std::path::Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let meta = std::fs::metadata(built).expect("the built stdio fixture's metadata");
    let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("palisade-stdio-fixture-{}-{}", meta.len(), mtime.as_nanos()));
    let path = dir.join(built.file_name().expect("a file name"));
    if !path.is_file() {
        std::fs::create_dir_all(&dir).expect("the fixture copy's directory");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("opening it to every uid");
        let partial = dir.join(format!(".partial-{}", std::process::id()));
        std::fs::copy(built, &partial).expect("copying the stdio fixture");
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755)).expect("making it executable");
        std::fs::rename(&partial, &path).expect("publishing the fixture copy");
    }
    path
}
