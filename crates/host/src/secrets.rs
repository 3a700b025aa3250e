//! The deployment's key files: the server secret and the handle subject key (each 64 hex
//! characters, created readable by the owner only on first use), and the SQLite store's directory.

use std::path::Path;

use anyhow::Context as _;
use palisade_server::SubjectKey;
use palisade_server::secret::ServerSecret;

use crate::settings::Settings;
use crate::settings::options::HANDLES_SUBJECT_KEY;

/// 64 hex characters (either case, surrounding white space ignored) as 32 bytes.
pub fn parse_key_hex(text: &str) -> Option<[u8; 32]> {
    palisade_base::hex::decode32(&text.trim().to_ascii_lowercase())
}

/// Loads a 32-byte key (64 hex characters) or creates it, readable by the owner only.
pub fn load_or_create_key(path: &Path, what: &str) -> anyhow::Result<[u8; 32]> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_key_hex(&text)
            .ok_or_else(|| anyhow::anyhow!("{}: {what} must be 64 hex characters (32 bytes)", path.display())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 32];
            palisade_server::secret::fill_random(&mut bytes)
                .map_err(|_| anyhow::anyhow!("the OS random number generator failed"))?;
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)?;
            }
            let hex: String = palisade_base::hex::hex(&bytes);
            write_private(path, &hex)?;
            Ok(bytes)
        }
        Err(error) => Err(anyhow::anyhow!("{}: {error}", path.display())),
    }
}

fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(path).with_context(|| format!("creating {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}

/// The deployment's server secret (`secret_file`, created on first use).
pub fn server_secret(settings: &Settings) -> anyhow::Result<ServerSecret> {
    Ok(ServerSecret::from_bytes(load_or_create_key(&settings.secret_file, "the server secret")?))
}

/// The deployment's server secret as the server reads it (`secret_file`), for a command that
/// checks or reads what the server wrote (`audit verify`, `audit search --subject`): never
/// created (a new secret would only make every checkpoint look forged and every digest differ).
pub fn existing_server_secret(settings: &Settings) -> anyhow::Result<ServerSecret> {
    let path = &settings.secret_file;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading the server secret {}", path.display()))?;
    let bytes = parse_key_hex(&text)
        .ok_or_else(|| anyhow::anyhow!("{}: the server secret must be 64 hex characters (32 bytes)", path.display()))?;
    Ok(ServerSecret::from_bytes(bytes))
}

/// The handle subject key: `PALISADE_HANDLES_SUBJECT_KEY` (64 hex characters) or the key file
/// (created on first run). Either must hold exactly 32 bytes, or the process does not start.
pub fn handle_subject_key(settings: &Settings) -> anyhow::Result<SubjectKey> {
    SubjectKey::from_bytes(&subject_key_bytes(settings)?).map_err(anyhow::Error::msg)
}

/// The handle subject key's bytes (see [`handle_subject_key`]).
pub fn subject_key_bytes(settings: &Settings) -> anyhow::Result<[u8; 32]> {
    let variable = HANDLES_SUBJECT_KEY.env.unwrap_or("PALISADE_HANDLES_SUBJECT_KEY");
    let bytes = match std::env::var(variable).ok() {
        Some(text) => {
            parse_key_hex(&text).ok_or_else(|| anyhow::anyhow!("{variable} must be 64 hex characters (32 bytes)"))?
        }
        None => load_or_create_key(&settings.handles.subject_key_file, "the handle subject key")?,
    };
    Ok(bytes)
}

/// Creates the directory of a `sqlite:` store's file.
pub fn prepare_sqlite_dir(settings: &Settings) -> anyhow::Result<()> {
    if let Some(path) = settings.store.strip_prefix("sqlite:") {
        let path = path.trim_start_matches("//");
        if let Some(parent) = Path::new(path).parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
    }
    Ok(())
}
