//! Test fixture: a PKI made with rcgen, key files, signed policies, a running reference authority
//! and a kill switch wired to it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use palisade_base::clock::{Clock, SystemClock};
use palisade_base::time::format_rfc3339_ms;
use palisade_killswitch::authority::{self, AuthorityDb, AuthorityServerConfig};
use palisade_killswitch::envelope::{envelope_bytes, sign_envelope};
use palisade_killswitch::head::{HeadPayload, HeadQuery};
use palisade_killswitch::keys::generate_keypair_files;
use palisade_killswitch::{
    AuthorityClient, AuthorityClientConfig, Ed25519SigningKey, GenerationStore, KillSwitch, KillSwitchConfig, Policy,
    PolicyFiles, SqliteGenerationStore, TargetKey, file_sha256_hex,
};
use palisade_killswitch::{Phase, TargetState};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use zeroize::Zeroizing;

pub const AUTHORITY_ID: &str = "disable-authority.test";
pub const MAX_AGE_MS: u64 = 5_000;
pub const CHECKOUT: &str = "tools/call:basket_checkout";
pub const PRODUCT_GET: &str = "tools/call:product_get";
pub const TOOLS_LIST: &str = "tools/list";
pub const POLICY_READ: &str = "resources/read:shop://policy";
pub const EXPOSED: [&str; 4] = [CHECKOUT, PRODUCT_GET, TOOLS_LIST, POLICY_READ];
pub const RELEASE: &str = "1.0.0";

pub fn now_ms() -> i64 {
    SystemClock.now_ms()
}

/// The system clock shifted by an adjustable offset (the authority's clock in tests).
#[derive(Debug, Default)]
pub struct SkewClock {
    pub offset_ms: AtomicI64,
}

impl Clock for SkewClock {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms() + self.offset_ms.load(Ordering::SeqCst)
    }
}

/// One certificate and its key, PEM.
#[derive(Clone)]
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A CA that can issue server and client certificates.
pub struct TestCa {
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key).unwrap();
        Self { cert_pem: cert.pem(), issuer: Issuer::new(params, key) }
    }

    pub fn issue(&self, names: &[&str], client: bool) -> Identity {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|name| (*name).to_owned()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("client"));
        params.extended_key_usages = vec![if client {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        }];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Identity { cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }
}

/// The PKI of one test: the authority's CA (server and client certificates), and a foreign CA.
pub struct Pki {
    pub ca: TestCa,
    pub server: Identity,
    pub client: Identity,
    pub foreign_ca: TestCa,
}

impl Pki {
    pub fn new() -> Self {
        let ca = TestCa::new("palisade test CA");
        let server = ca.issue(&["localhost", "127.0.0.1"], false);
        let client = ca.issue(&["palisade-server"], true);
        Self { ca, server, client, foreign_ca: TestCa::new("foreign CA") }
    }

    pub fn client_config(&self, url: &str, identity: &Identity, ca_pem: &str) -> AuthorityClientConfig {
        AuthorityClientConfig {
            url: url.to_owned(),
            ca_pem: ca_pem.as_bytes().to_vec(),
            client_cert_pem: identity.cert_pem.as_bytes().to_vec(),
            client_key_pem: Zeroizing::new(identity.key_pem.as_bytes().to_vec()),
            timeout: Duration::from_secs(2),
            max_response_bytes: 64 * 1024,
            envelope: palisade_killswitch::HeadEnvelope::Batched,
        }
    }
}

/// Key files and the policy payload of one test.
pub struct PolicyKit {
    pub dir: tempfile::TempDir,
    pub root_key: Ed25519SigningKey,
    pub root_pub: PathBuf,
    pub trust_root: PathBuf,
    pub authority_key: Arc<Ed25519SigningKey>,
    pub authority_key_sha256: String,
    /// Fixed per kit, so the same generation always signs to the same policy.
    pub not_after: String,
}

impl PolicyKit {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (root_secret, root_pub) = generate_keypair_files(dir.path(), "root").unwrap();
        let trust_root = dir.path().join("trust");
        std::fs::create_dir_all(trust_root.join("keys")).unwrap();
        let (authority_secret, authority_pub) = generate_keypair_files(&trust_root.join("keys"), "authority").unwrap();
        let authority_key_sha256 = file_sha256_hex(&authority_pub).unwrap();
        Self {
            root_key: Ed25519SigningKey::read(&root_secret).unwrap(),
            authority_key: Arc::new(Ed25519SigningKey::read(&authority_secret).unwrap()),
            root_pub,
            trust_root,
            authority_key_sha256,
            not_after: format_rfc3339_ms(now_ms() + 3_600_000),
            dir,
        }
    }

    /// The standard payload as JSON (tests mutate it before signing).
    pub fn payload(&self, generation: u64) -> Value {
        json!({
            "schema_version": "aidefend.mcp-disable-policy.v2",
            "policy_version": "test-1",
            "policy_generation": generation,
            "authority": AUTHORITY_ID,
            "authority_key_path": "keys/authority.pub",
            "authority_key_sha256": self.authority_key_sha256,
            "max_authority_response_age_ms": MAX_AGE_MS,
            "not_after": self.not_after,
            "operations": {
                CHECKOUT: {"coverage": "COVERED", "require_commit_fence": true,
                           "required_target_kinds": ["server_release", "tool"], "technical_reason": null},
                PRODUCT_GET: {"coverage": "COVERED", "require_commit_fence": false,
                              "required_target_kinds": ["tool"], "technical_reason": null},
                TOOLS_LIST: {"coverage": "NOT_APPLICABLE", "require_commit_fence": false, "required_target_kinds": [],
                             "technical_reason": "lists static definitions only; no data access, no effect"},
                POLICY_READ: {"coverage": "COVERED", "require_commit_fence": false,
                              "required_target_kinds": ["resource"], "technical_reason": null},
            }
        })
    }

    /// Signs arbitrary payload bytes with the root key into envelope bytes.
    pub fn sign_bytes(&self, payload: &[u8]) -> Vec<u8> {
        envelope_bytes(&sign_envelope(payload, &self.root_key))
    }

    pub fn sign(&self, payload: &Value) -> Vec<u8> {
        self.sign_bytes(&palisade_base::canonical::canonical_bytes(payload))
    }

    pub fn load(&self, envelope: &[u8]) -> Result<Policy, palisade_killswitch::PolicyError> {
        let path = self.dir.path().join("policy.json");
        std::fs::write(&path, envelope).unwrap();
        Policy::load(
            &PolicyFiles {
                root_public_key: self.root_pub.clone(),
                envelope: path,
                key_trust_root: self.trust_root.clone(),
            },
            now_ms(),
        )
    }

    pub fn policy(&self, generation: u64) -> Policy {
        self.load(&self.sign(&self.payload(generation))).unwrap()
    }
}

/// A running reference authority.
pub struct RunningAuthority {
    pub url: String,
    pub db: AuthorityDb,
    pub db_path: PathBuf,
    pub clock: Arc<SkewClock>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for RunningAuthority {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

pub async fn start_authority(pki: &Pki, kit: &PolicyKit, db_dir: &Path) -> RunningAuthority {
    let db_path = db_dir.join("authority.db");
    let db = AuthorityDb::open(db_path.to_str().unwrap()).await.unwrap();
    let clock = Arc::new(SkewClock::default());
    let tls = authority::server_tls_config(
        pki.server.cert_pem.as_bytes(),
        pki.server.key_pem.as_bytes(),
        pki.ca.cert_pem.as_bytes(),
    )
    .unwrap();
    let config = AuthorityServerConfig {
        authority_id: AUTHORITY_ID.to_owned(),
        signing_key: kit.authority_key.clone(),
        tls,
        head_ttl: Duration::from_secs(30),
        commit_token_ttl: Duration::from_secs(60),
        clock: clock.clone(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
    let serve_db = db.clone();
    tokio::spawn(async move {
        authority::serve(listener, config, serve_db, async {
            let _ = stop.await;
        })
        .await
        .unwrap();
    });
    RunningAuthority { url: format!("https://localhost:{port}"), db, db_path, clock, shutdown: Some(shutdown) }
}

/// A whole world: PKI, policy, authority, SQLite generation store, kill switch.
pub struct World {
    pub pki: Pki,
    pub kit: PolicyKit,
    pub authority: RunningAuthority,
    pub store: Arc<SqliteGenerationStore>,
    pub kill_switch: KillSwitch,
    pub target_key_bytes: [u8; 32],
}

impl World {
    pub async fn new() -> Self {
        let pki = Pki::new();
        let kit = PolicyKit::new();
        let authority = start_authority(&pki, &kit, kit.dir.path()).await;
        let store = Arc::new(
            SqliteGenerationStore::open(kit.dir.path().join("generations.db").to_str().unwrap()).await.unwrap(),
        );
        let target_key_bytes = [42_u8; 32];
        let client = AuthorityClient::new(pki.client_config(&authority.url, &pki.client, &pki.ca.cert_pem)).unwrap();
        let kill_switch = kill_switch(kit.policy(1), client, store.clone(), &target_key_bytes).await.unwrap();
        Self { pki, kit, authority, store, kill_switch, target_key_bytes }
    }

    pub fn target_key(&self) -> TargetKey {
        TargetKey::from_bytes(&self.target_key_bytes)
    }

    pub fn client(&self) -> AuthorityClient {
        AuthorityClient::new(self.pki.client_config(&self.authority.url, &self.pki.client, &self.pki.ca.cert_pem))
            .unwrap()
    }
}

pub async fn kill_switch(
    policy: Policy,
    client: AuthorityClient,
    store: Arc<dyn GenerationStore>,
    target_key: &[u8; 32],
) -> Result<KillSwitch, palisade_killswitch::KillSwitchError> {
    kill_switch_with_clock(policy, client, store, target_key, Arc::new(SystemClock)).await
}

/// [`kill_switch`] reading the time from `clock` (tests move it instead of sleeping).
pub async fn kill_switch_with_clock(
    policy: Policy,
    client: AuthorityClient,
    store: Arc<dyn GenerationStore>,
    target_key: &[u8; 32],
    clock: Arc<dyn Clock>,
) -> Result<KillSwitch, palisade_killswitch::KillSwitchError> {
    KillSwitch::start(KillSwitchConfig {
        policy,
        exposed_operations: EXPOSED.iter().map(|operation| (*operation).to_owned()).collect(),
        authority: client,
        store,
        target_key: TargetKey::from_bytes(target_key),
        clock,
    })
    .await
}

/// The head an honest authority signs for target `index` of `query` at `now` (ENABLE,
/// generation 1, valid 30 s, a commit token in the second phase).
pub fn honest_head(query: &HeadQuery, index: usize, now: i64) -> HeadPayload {
    HeadPayload {
        authority: AUTHORITY_ID.to_owned(),
        commit_token: (query.phase == Phase::PreSideEffect).then(|| format!("token-{index}-{}", query.query_nonce)),
        expires_at: format_rfc3339_ms(now + 30_000),
        generation: 1,
        issued_at: format_rfc3339_ms(now),
        phase: query.phase,
        policy_digest: query.policy_digest.clone(),
        policy_generation: query.policy_generation,
        query_nonce: query.query_nonce.clone(),
        reason_code: "default_enable".to_owned(),
        schema_version: "aidefend.mcp-disable-head.v2".to_owned(),
        state: TargetState::Enable,
        target: query.targets[index].clone(),
    }
}
