//! What the verifier's integration tests share: the `palisade` binary (built once if missing),
//! a `palisade serve` demo process killed on drop, dev tokens, identity files and a scratch
//! directory.

#![allow(dead_code)]

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

/// The `palisade` binary next to this test's target directory, built once when missing.
pub fn palisade_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test binary path");
            // <target>/debug/deps/<test> → <target>/debug/palisade
            let dir = exe.parent().and_then(Path::parent).expect("target directory");
            let binary = dir.join("palisade");
            if !binary.exists() {
                let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
                let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
                let status = Command::new(cargo)
                    .args(["build", "-p", "palisade"])
                    .current_dir(root)
                    .status()
                    .expect("run cargo build -p palisade");
                assert!(status.success(), "cargo build -p palisade failed");
            }
            assert!(binary.exists(), "no palisade binary at {}", binary.display());
            binary
        })
        .clone()
}

/// A directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!("palisade-verify-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).expect("scratch dir");
        Self(path)
    }

    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("write scratch file");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `palisade serve --app demo` on a free loopback port, killed on drop. The port is chosen
/// before the start so the server's canonical URL (the audience of its tokens and the
/// `resource` of its metadata) is the URL it is reached at.
pub struct Demo {
    child: Child,
    pub url: String,
    pub data: Scratch,
    listen: String,
}

impl Demo {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// The demo with extra `palisade serve` arguments (`--public-url`, `--allow-host`, …).
    pub fn start_with(extra: &[String]) -> Self {
        let data = Scratch::new("demo");
        let dir = data.0.to_str().expect("utf-8 path").to_owned();
        let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let listen = free.local_addr().expect("its address").to_string();
        drop(free);
        let mut child = Command::new(palisade_binary())
            .args(["serve", "--app", "demo", "--listen", &listen, "--data-dir", &dir])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start palisade serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("listening line");
        let url = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected {line:?}")).to_owned();
        Self { child, url, data, listen }
    }

    /// A dev token for this server (its data directory and listen address).
    pub fn token(&self, subject: &str, tenant: &str, client: &str, scope: &str) -> String {
        self.token_for(&self.url, subject, tenant, client, scope)
    }

    /// A dev token of the same key whose audience is `resource` (another resource's token
    /// when it is not this server's URL).
    pub fn token_for(&self, resource: &str, subject: &str, tenant: &str, client: &str, scope: &str) -> String {
        let dir = self.data.0.to_str().expect("utf-8 path");
        let output = Command::new(palisade_binary())
            .args(["dev", "token", "--subject", subject, "--tenant", tenant, "--client", client, "--scope", scope])
            .envs([("PALISADE_DATA_DIR", dir), ("PALISADE_LISTEN", self.listen.as_str())])
            .env("PALISADE_PUBLIC_URL", resource)
            .output()
            .expect("run palisade dev token");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).expect("utf-8 token").trim().to_owned()
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes an identity file.
pub fn identity(scratch: &Scratch, name: &str, token: &str, tenant: &str, client: &str) -> PathBuf {
    let text = format!(
        "name = \"{name}\"\ntoken = \"{token}\"\ntenant = \"{tenant}\"\nclient = \"{client}\"\nsubject = \"{name}\"\n"
    );
    scratch.file(&format!("{name}.toml"), &text)
}

/// Panics when any 24-character piece of any token occurs in `text`.
pub fn assert_no_token(text: &str, tokens: &[String], what: &str) {
    for token in tokens {
        assert!(token.len() > 24, "a real token");
        let bytes = token.as_bytes();
        for start in 0..=bytes.len() - 24 {
            let window = std::str::from_utf8(&bytes[start..start + 24]).expect("ascii token");
            assert!(!text.contains(window), "{what} contains a piece of a token: {window}");
        }
    }
}

/// Writes an identity file whose subject is not its name (two identities of one subject).
pub fn identity_of(scratch: &Scratch, name: &str, subject: &str, token: &str, tenant: &str, client: &str) -> PathBuf {
    let text = format!(
        "name = \"{name}\"\ntoken = \"{token}\"\ntenant = \"{tenant}\"\nclient = \"{client}\"\nsubject = \"{subject}\"\n"
    );
    scratch.file(&format!("{name}.toml"), &text)
}
