//! The control socket `palisade reload` reaches a running instance on: a Unix socket in the
//! instance's data directory (`<data_dir>/control.sock`, mode 0600 in a 0700 directory) that
//! answers only a peer of the instance's own user (or root), checked with the socket's peer
//! credentials. Nothing is served on any network listener. One request per connection: the line
//! `reload`, answered with one JSON line, the [`Outcome`].

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::{Outcome, Reloader, Trigger};

/// The socket's file name in the data directory.
pub const SOCKET_FILE: &str = "control.sock";

/// The one request a connection may make.
const RELOAD: &str = "reload";

/// Longest a peer may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The control socket of an instance whose data directory is `data_dir`.
pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join(SOCKET_FILE)
}

/// Binds the control socket at `path` (its directory created private when missing) and serves
/// it until `shutdown`, then removes it. A socket another running instance answers on is an
/// error: two instances must not share a data directory.
pub async fn bind(path: PathBuf, reloader: Arc<Reloader>, shutdown: CancellationToken) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        let mut private = std::fs::DirBuilder::new();
        std::os::unix::fs::DirBuilderExt::mode(private.recursive(true), 0o700);
        private.create(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if std::fs::symlink_metadata(&path).is_ok() {
        if UnixStream::connect(&path).await.is_ok() {
            anyhow::bail!("another running instance answers on {}: it uses this data directory", path.display());
        }
        // Left by an instance that did not shut down.
        std::fs::remove_file(&path).with_context(|| format!("removing the stale {}", path.display()))?;
    }
    let listener = UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("restricting {}", path.display()))?;
    let owner = std::fs::metadata(&path).with_context(|| format!("reading {}", path.display()))?.uid();
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, _)) => {
                    let reloader = reloader.clone();
                    tokio::spawn(async move { answer(stream, owner, &reloader).await });
                }
                Err(error) => {
                    tracing::warn!(%error, "control socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        let _ = std::fs::remove_file(&path);
    });
    Ok(())
}

/// Answers one connection: a peer of another user is refused before anything is read.
async fn answer(mut stream: UnixStream, owner: u32, reloader: &Reloader) {
    let peer = stream.peer_cred().map(|cred| cred.uid()).ok();
    if !peer.is_some_and(|uid| uid == owner || uid == 0) {
        tracing::warn!(peer_uid = ?peer, "control socket: a peer of another user was refused");
        return;
    }
    let mut line = String::new();
    let read = {
        let mut limited = BufReader::new((&mut stream).take(64));
        tokio::time::timeout(REQUEST_TIMEOUT, limited.read_line(&mut line)).await
    };
    let outcome = match read {
        Ok(Ok(_)) if line.trim() == RELOAD => reloader.reload(Trigger::Command).await,
        _ => Outcome { applied: false, message: format!("unknown request: the control socket answers {RELOAD:?}") },
    };
    let mut text = serde_json::to_string(&outcome).unwrap_or_default();
    text.push('\n');
    let _ = stream.write_all(text.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// The `data_dir` a configuration file names, read from its TOML alone (for `palisade reload`
/// of an edit the full resolution refuses: the instance says why). A file that is not TOML any
/// more is read line by line up to its first table: a top-level `data_dir = "…"` is still found.
pub fn written_data_dir(config: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(config).ok()?;
    let data_dir = |table: toml::Table| table.get("data_dir")?.as_str().map(PathBuf::from);
    if let Ok(table) = text.parse::<toml::Table>() {
        return data_dir(table);
    }
    text.lines()
        .take_while(|line| !line.trim_start().starts_with('['))
        .find_map(|line| line.parse::<toml::Table>().ok().and_then(data_dir))
}

/// Asks the instance listening at `path` to reload and returns its outcome (it waits for the
/// reload to be applied or refused).
pub async fn request(path: &Path) -> anyhow::Result<Outcome> {
    let mut stream = UnixStream::connect(path).await.with_context(|| {
        format!("no running instance answers on {} (is it running with this data directory?)", path.display())
    })?;
    stream.write_all(format!("{RELOAD}\n").as_bytes()).await.context("sending the request")?;
    let mut line = String::new();
    BufReader::new(stream.take(1 << 20)).read_line(&mut line).await.context("reading the answer")?;
    serde_json::from_str(&line).with_context(|| format!("an answer that is not an outcome: {line:?}"))
}
