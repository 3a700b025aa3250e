//! The development authority: everything a single-machine demo needs to run the kill switch on
//! its default path, generated on first run into one directory (secrets `0600`).
//!
//! - an Ed25519 policy root key and an authority head-signing key (its public key alone in the
//!   key trust root),
//! - a CA with a server certificate for loopback (`localhost`, `127.0.0.1`) and a client
//!   certificate, for mutual TLS between the server and the authority,
//! - a target key,
//! - a signed policy whose registry is the skeleton of the server's own registry (re-signed with
//!   a higher generation whenever the registry changed or the policy nears its expiry),
//! - the authority's SQLite database and the generation store's.
//!
//! **Security:** every key of the chain (policy root, authority signing key, CA) lives in the
//! same directory as the server's own data, so whoever can read it can sign policies and heads.
//! That is fine for a demo on one machine and wrong for production, where the policy root key
//! stays offline and the authority runs elsewhere under other operators.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use palisade_base::clock::{Clock, SystemClock};
use palisade_base::time::{format_rfc3339_ms, parse_rfc3339_ms};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tokio::net::TcpListener;

use crate::authority::{self, AuthorityDb, AuthorityServerConfig, AuthorityServiceError};
use crate::client::{AuthorityClient, AuthorityClientConfig, AuthorityError};
use crate::error::KillSwitchError;
use crate::generation::{GenerationStoreError, SqliteGenerationStore};
use crate::keys::{Ed25519SigningKey, KeyError, write_new_file};
use crate::killswitch::{KillSwitch, KillSwitchConfig};
use crate::policy::{ExposedOperation, Policy, PolicyError, PolicyFiles, PolicyHeader, PolicyPayload, file_sha256_hex};
use crate::target::TargetKey;

/// The development authority's id (the policy's `authority`).
pub const DEV_AUTHORITY_ID: &str = "palisade-dev-authority";
/// How long a dev policy is valid; it is re-signed when less than a day is left.
const POLICY_LIFETIME_MS: i64 = 30 * 86_400_000;
const POLICY_RENEW_MS: i64 = 86_400_000;
/// Freshness bound of authority answers in the dev policy.
const MAX_RESPONSE_AGE_MS: u64 = 5_000;

/// Why the development authority could not be prepared or started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DevAuthorityError {
    /// A file could not be read or written.
    #[error("development authority file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A key could not be generated, read or written.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// Certificate generation failed.
    #[error("development authority certificates: {0}")]
    Certificate(String),
    /// The policy could not be built, signed or loaded.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The authority could not start.
    #[error(transparent)]
    Authority(#[from] AuthorityServiceError),
    /// The authority client could not be built.
    #[error(transparent)]
    Client(#[from] AuthorityError),
    /// The generation store could not be opened.
    #[error(transparent)]
    Store(#[from] GenerationStoreError),
    /// The kill switch refused to start.
    #[error(transparent)]
    KillSwitch(#[from] KillSwitchError),
}

fn file_error(path: &Path, reason: impl ToString) -> DevAuthorityError {
    DevAuthorityError::File { path: path.to_path_buf(), reason: reason.to_string() }
}

/// The files of a development authority directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevAuthorityFiles {
    /// The directory.
    pub dir: PathBuf,
}

impl DevAuthorityFiles {
    /// The files under `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Policy root signing key.
    pub fn root_key(&self) -> PathBuf {
        self.path("policy-root.key")
    }
    /// Policy root public key.
    pub fn root_public_key(&self) -> PathBuf {
        self.path("policy-root.pub")
    }
    /// The key trust root directory (holds the authority's public key only).
    pub fn key_trust_root(&self) -> PathBuf {
        self.path("trust")
    }
    /// The authority's head-signing key.
    pub fn authority_key(&self) -> PathBuf {
        self.path("authority-signing.key")
    }
    /// The authority's public key, inside the trust root.
    pub fn authority_public_key(&self) -> PathBuf {
        self.key_trust_root().join("authority.pub")
    }
    /// The CA certificate (trust anchor of both sides).
    pub fn ca_cert(&self) -> PathBuf {
        self.path("ca.pem")
    }
    /// The authority's server certificate.
    pub fn server_cert(&self) -> PathBuf {
        self.path("authority-server.pem")
    }
    /// The authority's server key.
    pub fn server_key(&self) -> PathBuf {
        self.path("authority-server.key")
    }
    /// The MCP server's client certificate.
    pub fn client_cert(&self) -> PathBuf {
        self.path("authority-client.pem")
    }
    /// The MCP server's client key.
    pub fn client_key(&self) -> PathBuf {
        self.path("authority-client.key")
    }
    /// The target key.
    pub fn target_key(&self) -> PathBuf {
        self.path("target.key")
    }
    /// The unsigned policy payload (JSON), kept to decide when to re-sign.
    pub fn policy_payload(&self) -> PathBuf {
        self.path("policy.payload.json")
    }
    /// The signed policy envelope.
    pub fn policy_envelope(&self) -> PathBuf {
        self.path("policy.json")
    }
    /// The authority's database (also the demo's order database).
    pub fn authority_db(&self) -> PathBuf {
        self.path("authority.db")
    }
    /// The generation store's database.
    pub fn generation_db(&self) -> PathBuf {
        self.path("generations.db")
    }

    /// The policy files for [`Policy::load`].
    pub fn policy_files(&self) -> PolicyFiles {
        PolicyFiles {
            root_public_key: self.root_public_key(),
            envelope: self.policy_envelope(),
            key_trust_root: self.key_trust_root(),
        }
    }

    /// Creates whatever is missing and (re-)signs the policy so that it covers exactly
    /// `exposed`. Existing keys and certificates are kept.
    pub fn prepare(&self, exposed: &[ExposedOperation], now_ms: i64) -> Result<(), DevAuthorityError> {
        create_private_dir(&self.dir)?;
        create_private_dir(&self.key_trust_root())?;
        if !self.root_key().exists() {
            Ed25519SigningKey::generate()?.write_files(&self.root_key(), &self.root_public_key())?;
        }
        if !self.authority_key().exists() {
            Ed25519SigningKey::generate()?.write_files(&self.authority_key(), &self.authority_public_key())?;
        }
        if !self.target_key().exists() {
            crate::keys::generate_secret_key_file(&self.target_key())?;
        }
        let pki = [self.ca_cert(), self.server_cert(), self.server_key(), self.client_cert(), self.client_key()];
        if !pki.iter().all(|path| path.exists()) {
            self.generate_pki()?;
        }
        self.sign_policy_if_needed(exposed, now_ms)
    }

    fn generate_pki(&self) -> Result<(), DevAuthorityError> {
        let cert_error = |error: rcgen::Error| DevAuthorityError::Certificate(error.to_string());
        let ca_key = KeyPair::generate().map_err(cert_error)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(cert_error)?;
        ca_params.distinguished_name.push(DnType::CommonName, "palisade development authority CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca_params.self_signed(&ca_key).map_err(cert_error)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let issue = |names: Vec<String>, common_name: &str, purpose: rcgen::ExtendedKeyUsagePurpose| {
            let key = KeyPair::generate().map_err(cert_error)?;
            let mut params = CertificateParams::new(names).map_err(cert_error)?;
            params.distinguished_name.push(DnType::CommonName, common_name);
            params.extended_key_usages = vec![purpose];
            let cert = params.signed_by(&key, &issuer).map_err(cert_error)?;
            // The private key's PEM is wiped once written.
            Ok::<_, DevAuthorityError>((cert.pem(), zeroize::Zeroizing::new(key.serialize_pem())))
        };
        let (server_cert, server_key) = issue(
            vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
            "palisade development authority",
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let (client_cert, client_key) =
            issue(vec!["palisade-server".to_owned()], "palisade-server", rcgen::ExtendedKeyUsagePurpose::ClientAuth)?;
        // The CA key is not kept: nothing else is ever issued under it.
        for (path, contents, secret) in [
            (self.ca_cert(), zeroize::Zeroizing::new(ca_cert.pem()), false),
            (self.server_cert(), zeroize::Zeroizing::new(server_cert), false),
            (self.server_key(), server_key, true),
            (self.client_cert(), zeroize::Zeroizing::new(client_cert), false),
            (self.client_key(), client_key, true),
        ] {
            replace_file(&path, contents.as_bytes(), secret)?;
        }
        Ok(())
    }

    fn sign_policy_if_needed(&self, exposed: &[ExposedOperation], now_ms: i64) -> Result<(), DevAuthorityError> {
        let previous: Option<PolicyPayload> = match std::fs::read(self.policy_payload()) {
            Ok(bytes) => serde_json::from_slice(&bytes).ok(),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => return Err(file_error(&self.policy_payload(), error)),
        };
        let authority_key_sha256 = file_sha256_hex(&self.authority_public_key())?;
        let header = |generation: u64| PolicyHeader {
            policy_version: format!("dev-{generation}"),
            policy_generation: generation,
            authority: DEV_AUTHORITY_ID.to_owned(),
            authority_key_path: "authority.pub".to_owned(),
            authority_key_sha256: authority_key_sha256.clone(),
            max_authority_response_age_ms: MAX_RESPONSE_AGE_MS,
            not_after: format_rfc3339_ms(now_ms.saturating_add(POLICY_LIFETIME_MS)),
        };
        let fresh = PolicyPayload::skeleton(header(1), exposed.iter().cloned());
        if let Some(previous) = &previous {
            let not_after_ms = parse_rfc3339_ms(&previous.not_after).unwrap_or(0);
            let same = previous.operations == fresh.operations
                && previous.authority_key_sha256 == fresh.authority_key_sha256
                && not_after_ms > now_ms.saturating_add(POLICY_RENEW_MS);
            if same && self.policy_envelope().exists() {
                return Ok(());
            }
        }
        let generation = previous.map_or(1, |previous| previous.policy_generation.saturating_add(1));
        let payload = PolicyPayload::skeleton(header(generation), exposed.iter().cloned());
        let payload_json =
            serde_json::to_vec_pretty(&payload).map_err(|error| file_error(&self.policy_payload(), error))?;
        let root = Ed25519SigningKey::read(&self.root_key())?;
        let envelope = crate::policy::sign_policy(&payload_json, &root, now_ms)?;
        replace_file(&self.policy_payload(), &payload_json, false)?;
        replace_file(&self.policy_envelope(), &envelope, false)?;
        tracing::info!(generation, "development kill-switch policy signed");
        Ok(())
    }

    /// Starts the reference authority on a loopback port with mutual TLS; it runs until the
    /// returned handle is dropped or stopped.
    pub async fn start_authority(&self) -> Result<RunningDevAuthority, DevAuthorityError> {
        let read = |path: PathBuf| std::fs::read(&path).map_err(|error| file_error(&path, error));
        let tls = authority::server_tls_config(
            &read(self.server_cert())?,
            &zeroize::Zeroizing::new(read(self.server_key())?),
            &read(self.ca_cert())?,
        )?;
        let db = AuthorityDb::open(&path_str(&self.authority_db())?).await?;
        let config = AuthorityServerConfig {
            authority_id: DEV_AUTHORITY_ID.to_owned(),
            signing_key: Arc::new(Ed25519SigningKey::read(&self.authority_key())?),
            tls,
            head_ttl: Duration::from_secs(30),
            commit_token_ttl: Duration::from_secs(60),
            clock: Arc::new(SystemClock),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.map_err(AuthorityServiceError::Io)?;
        let port = listener.local_addr().map_err(AuthorityServiceError::Io)?.port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serve_db = db.clone();
        tokio::spawn(async move {
            let result = authority::serve(listener, config, serve_db, async {
                let _ = stopped.await;
            })
            .await;
            if let Err(error) = result {
                tracing::error!(%error, "development authority stopped");
            }
        });
        Ok(RunningDevAuthority { url: format!("https://127.0.0.1:{port}"), db, stop: Some(stop) })
    }

    /// The authority client configuration for `url`, from the generated certificates.
    pub fn client_config(&self, url: &str) -> Result<AuthorityClientConfig, DevAuthorityError> {
        Ok(AuthorityClientConfig::from_files(url, &self.ca_cert(), &self.client_cert(), &self.client_key())?)
    }

    /// Loads the policy and starts a kill switch asking the authority at `url`, refusing a
    /// registry that misses any of `exposed_operations`.
    pub async fn kill_switch(
        &self,
        url: &str,
        exposed_operations: Vec<String>,
    ) -> Result<KillSwitch, DevAuthorityError> {
        self.kill_switch_with_clock(url, exposed_operations, Arc::new(SystemClock)).await
    }

    /// [`Self::kill_switch`] reading the time from `clock` (tests move it instead of sleeping).
    pub async fn kill_switch_with_clock(
        &self,
        url: &str,
        exposed_operations: Vec<String>,
        clock: Arc<dyn Clock>,
    ) -> Result<KillSwitch, DevAuthorityError> {
        let policy = Policy::load(&self.policy_files(), clock.now_ms())?;
        let store = SqliteGenerationStore::open(&path_str(&self.generation_db())?).await?;
        let kill_switch = KillSwitch::start(KillSwitchConfig {
            policy,
            exposed_operations,
            authority: AuthorityClient::new(self.client_config(url)?)?,
            store: Arc::new(store),
            target_key: TargetKey::read(&self.target_key())?,
            clock,
        })
        .await?;
        Ok(kill_switch)
    }
}

/// A running development authority; stops when dropped.
#[derive(Debug)]
pub struct RunningDevAuthority {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// Its database (shared with backends that redeem commit tokens in their own transactions).
    pub db: AuthorityDb,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl RunningDevAuthority {
    /// Stops accepting connections.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for RunningDevAuthority {
    fn drop(&mut self) {
        self.stop();
    }
}

fn path_str(path: &Path) -> Result<String, DevAuthorityError> {
    path.to_str().map(str::to_owned).ok_or_else(|| file_error(path, "path is not UTF-8"))
}

fn create_private_dir(dir: &Path) -> Result<(), DevAuthorityError> {
    std::fs::create_dir_all(dir).map_err(|error| file_error(dir, error))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|error| file_error(dir, error))?;
    }
    Ok(())
}

/// Writes a file afresh (removing an older one first), `0600` when secret.
fn replace_file(path: &Path, contents: &[u8], secret: bool) -> Result<(), DevAuthorityError> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(file_error(path, error)),
    }
    Ok(write_new_file(path, contents, secret)?)
}
