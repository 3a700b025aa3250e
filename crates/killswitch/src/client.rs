//! The authority client: one mTLS HTTPS query per phase covering every target of an operation,
//! each target's answer a separately signed head checked field by field.
//!
//! Transport: rustls on aws-lc-rs with only the configured CA as trust anchor and the configured
//! client certificate; no redirects, no proxy, https only, one overall timeout, a response size
//! cap counted while reading. Every failure is an [`AuthorityError`]: the caller refuses.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use palisade_base::clock::Clock;
use palisade_base::time::parse_rfc3339_ms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use url::Url;
use zeroize::Zeroizing;

use crate::batch::BATCH_PATH;
use crate::envelope::{EnvelopeError, verify_envelope_fields};
use crate::head::{
    CURRENT_HEAD_PATH, Canonical as _, HEAD_SCHEMA_VERSION, HeadPayload, HeadQuery, HeadResponse,
    MAX_TARGETS_PER_QUERY, Phase, QUERY_SCHEMA_VERSION, REDEEM_PATH, RedeemRequest, TargetState, canonical,
};
use crate::policy::{MAX_SAFE_INTEGER, Policy};
use crate::target::{TargetDigest, hex};

/// Why an authority answer was not usable. Every variant means "refuse".
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthorityError {
    /// The client configuration is unusable (URL not https, unreadable or invalid PEM).
    #[error("authority client configuration rejected: {reason}")]
    Config {
        /// What is wrong (never key material).
        reason: String,
    },
    /// Connecting, TLS, or the HTTP exchange failed.
    #[error("authority unreachable")]
    Unreachable {
        /// The transport error, for operators' logs.
        #[source]
        source: Option<reqwest::Error>,
    },
    /// No complete answer within the timeout.
    #[error("authority did not answer in time")]
    Timeout,
    /// The authority answered with a status other than 200.
    #[error("authority answered HTTP {status}")]
    HttpStatus {
        /// The status code.
        status: u16,
    },
    /// The answer exceeded the size cap.
    #[error("authority answer too large")]
    TooLarge,
    /// A batched answer's item does not prove inclusion under the signed root (index out of
    /// range, path of the wrong length, or a leaf that folds to another root).
    #[error("authority batch item does not fold to the signed root")]
    Inclusion,
    /// The answer is not the expected document.
    #[error("authority answer malformed: {what}")]
    Malformed {
        /// What.
        what: &'static str,
    },
    /// A head's envelope did not verify under the pinned authority key.
    #[error("authority head envelope refused")]
    Envelope(#[from] EnvelopeError),
    /// A signed head does not match the query (authority, policy, nonce, phase, target, …).
    #[error("authority head does not match the query: {field}")]
    HeadMismatch {
        /// The field that differs.
        field: &'static str,
    },
    /// The head was issued longer ago than the policy's freshness bound, or in the future.
    #[error("authority head is not fresh")]
    Stale,
    /// The head's `expires_at` has passed.
    #[error("authority head expired")]
    Expired,
    /// The redeem endpoint refused the commit token.
    #[error("commit token refused by the authority")]
    RedeemRejected,
}

impl AuthorityError {
    /// The same refusal for another caller of one batch (transport sources are not cloneable;
    /// the first caller keeps the source, the others get the kind).
    pub(crate) fn for_another_caller(&self) -> AuthorityError {
        match self {
            AuthorityError::Config { reason } => AuthorityError::Config { reason: reason.clone() },
            AuthorityError::Unreachable { .. } => AuthorityError::Unreachable { source: None },
            AuthorityError::Timeout => AuthorityError::Timeout,
            AuthorityError::HttpStatus { status } => AuthorityError::HttpStatus { status: *status },
            AuthorityError::TooLarge => AuthorityError::TooLarge,
            AuthorityError::Inclusion => AuthorityError::Inclusion,
            AuthorityError::Malformed { what } => AuthorityError::Malformed { what },
            AuthorityError::Envelope(error) => AuthorityError::Envelope(error.clone()),
            AuthorityError::HeadMismatch { field } => AuthorityError::HeadMismatch { field },
            AuthorityError::Stale => AuthorityError::Stale,
            AuthorityError::Expired => AuthorityError::Expired,
            AuthorityError::RedeemRejected => AuthorityError::RedeemRejected,
        }
    }
}

/// Which envelope the client asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeadEnvelope {
    /// One signature over many callers' queries ([`crate::batch`]); the queries waiting at one
    /// moment travel together, the next batch leaves when the previous answer arrived.
    #[default]
    Batched,
    /// One query per request, each head signed on its own (v2; for authorities without the
    /// batch endpoint).
    Single,
}

/// Where and how to reach the authority.
pub struct AuthorityClientConfig {
    /// Base URL, `https://host:port` (a path prefix is allowed).
    pub url: String,
    /// PEM bundle of the CA(s) the authority's certificate must chain to (the only trust anchors).
    pub ca_pem: Vec<u8>,
    /// PEM certificate chain of this server's client identity.
    pub client_cert_pem: Vec<u8>,
    /// PEM private key of that identity (PKCS#8, PKCS#1 or SEC1).
    pub client_key_pem: Zeroizing<Vec<u8>>,
    /// Overall time limit per query (connect, TLS, request, answer).
    pub timeout: Duration,
    /// Largest answer accepted, in bytes (per query: a batch of n queries may be n times this).
    pub max_response_bytes: usize,
    /// Batched (default) or single-query envelope.
    pub envelope: HeadEnvelope,
}

impl std::fmt::Debug for AuthorityClientConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("AuthorityClientConfig")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish_non_exhaustive()
    }
}

impl AuthorityClientConfig {
    /// Default overall timeout.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
    /// Default answer cap (16 signed heads fit many times over).
    pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 64 * 1024;

    /// Reads the three PEM files; default timeout and size cap.
    pub fn from_files(
        url: &str,
        ca_file: &Path,
        client_cert_file: &Path,
        client_key_file: &Path,
    ) -> Result<Self, AuthorityError> {
        let read = |path: &Path| {
            std::fs::read(path)
                .map_err(|_| AuthorityError::Config { reason: format!("cannot read {}", path.display()) })
        };
        Ok(Self {
            url: url.to_owned(),
            ca_pem: read(ca_file)?,
            client_cert_pem: read(client_cert_file)?,
            client_key_pem: Zeroizing::new(read(client_key_file)?),
            timeout: Self::DEFAULT_TIMEOUT,
            max_response_bytes: Self::DEFAULT_MAX_RESPONSE_BYTES,
            envelope: HeadEnvelope::default(),
        })
    }
}

/// A head that verified against the policy and the query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedHead {
    /// The target.
    pub target: TargetDigest,
    /// The target's head generation.
    pub generation: u64,
    /// ENABLE or DISABLE.
    pub state: TargetState,
    /// The authority's reason code.
    pub reason_code: String,
    /// The one-use commit token (pre_side_effect, ENABLE).
    pub commit_token: Option<CommitToken>,
    /// When the authority issued it (epoch ms).
    pub issued_at_ms: i64,
    /// When it expires (epoch ms).
    pub expires_at_ms: i64,
    /// The state digest the generation store keeps ([`HeadPayload::state_digest`]).
    pub state_digest: String,
}

/// A one-use commit token. `Debug` shows only a short SHA-256 prefix.
#[derive(Clone, PartialEq, Eq)]
pub struct CommitToken(String);

impl CommitToken {
    pub(crate) fn new(token: String) -> Self {
        Self(token)
    }

    /// The token, to hand to the backend that redeems it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for CommitToken {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digest = crate::envelope::sha256_hex(self.0.as_bytes());
        write!(formatter, "CommitToken(sha256:{}…)", digest.get(..12).unwrap_or_default())
    }
}

/// The authority client. Cheap to clone (one connection pool).
#[derive(Clone)]
pub struct AuthorityClient {
    http: reqwest::Client,
    head_endpoint: Url,
    batch_endpoint: Url,
    redeem_endpoint: Url,
    envelope: HeadEnvelope,
    timeout: Duration,
    max_response_bytes: usize,
    random: Arc<SystemRandom>,
    /// Where each round trip's latency goes, once a server's metrics give it (shared by clones).
    latency: Arc<std::sync::OnceLock<metrics::Histogram>>,
}

impl std::fmt::Debug for AuthorityClient {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("AuthorityClient")
            .field("endpoint", &self.head_endpoint.as_str())
            .finish_non_exhaustive()
    }
}

fn config_error(reason: impl Into<String>) -> AuthorityError {
    AuthorityError::Config { reason: reason.into() }
}

/// Builds the rustls client configuration: the given CA bundle as the only roots, the given
/// client identity, aws-lc-rs, TLS 1.2+.
fn tls_config(config: &AuthorityClientConfig) -> Result<rustls::ClientConfig, AuthorityError> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(&config.ca_pem) {
        let certificate = certificate.map_err(|_| config_error("CA bundle is not PEM"))?;
        roots.add(certificate).map_err(|_| config_error("CA certificate unusable"))?;
    }
    if roots.is_empty() {
        return Err(config_error("CA bundle holds no certificate"));
    }
    let chain = CertificateDer::pem_slice_iter(&config.client_cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| config_error("client certificate is not PEM"))?;
    if chain.is_empty() {
        return Err(config_error("client certificate file holds no certificate"));
    }
    let key =
        PrivateKeyDer::from_pem_slice(&config.client_key_pem).map_err(|_| config_error("client key is not PEM"))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|_| config_error("TLS versions"))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|_| config_error("client certificate and key do not match"))
}

impl AuthorityClient {
    /// Builds the client (no network access yet).
    pub fn new(config: AuthorityClientConfig) -> Result<Self, AuthorityError> {
        let base = Url::parse(&config.url).map_err(|_| config_error("authority URL unparseable"))?;
        if base.scheme() != "https" || base.host().is_none() {
            return Err(config_error("authority URL must be https://host[:port]"));
        }
        if !base.username().is_empty()
            || base.password().is_some()
            || base.query().is_some()
            || base.fragment().is_some()
        {
            return Err(config_error("authority URL must not carry credentials, a query or a fragment"));
        }
        if config.timeout.is_zero() || config.max_response_bytes == 0 {
            return Err(config_error("timeout and response cap must be positive"));
        }
        let prefix = base.path().trim_end_matches('/').to_owned();
        let endpoint = |path: &str| {
            let mut url = base.clone();
            url.set_path(&format!("{prefix}{path}"));
            url
        };
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls_config(&config)?)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .https_only(true)
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|_| config_error("HTTP client could not be built"))?;
        Ok(Self {
            http,
            head_endpoint: endpoint(CURRENT_HEAD_PATH),
            batch_endpoint: endpoint(BATCH_PATH),
            redeem_endpoint: endpoint(REDEEM_PATH),
            envelope: config.envelope,
            timeout: config.timeout,
            max_response_bytes: config.max_response_bytes,
            random: Arc::new(SystemRandom::new()),
            latency: Arc::default(),
        })
    }

    /// Records every later round trip's latency (answered or not) in `histogram`; the first
    /// histogram given stays.
    pub fn observe_latency(&self, histogram: metrics::Histogram) {
        let _ = self.latency.set(histogram);
    }

    /// The envelope this client asks for.
    pub fn envelope(&self) -> HeadEnvelope {
        self.envelope
    }

    /// POSTs a batch request (`queries` of them) and returns status and body; the size cap
    /// scales with the number of queries.
    pub(crate) async fn post_batch(&self, body: Vec<u8>, queries: usize) -> Result<(u16, Vec<u8>), AuthorityError> {
        self.post_capped(&self.batch_endpoint, body, self.max_response_bytes.saturating_mul(queries.max(1))).await
    }

    /// A fresh 256-bit query nonce, lowercase hex.
    pub(crate) fn nonce(&self) -> Result<String, AuthorityError> {
        let mut bytes = [0_u8; 32];
        self.random.fill(&mut bytes).map_err(|_| config_error("random generator failed"))?;
        Ok(hex(&bytes))
    }

    /// POSTs `body` and returns the 200 answer's bytes, within the timeout and size cap.
    async fn post(&self, url: &Url, body: Vec<u8>) -> Result<(u16, Vec<u8>), AuthorityError> {
        self.post_capped(url, body, self.max_response_bytes).await
    }

    async fn post_capped(&self, url: &Url, body: Vec<u8>, cap: usize) -> Result<(u16, Vec<u8>), AuthorityError> {
        let exchange = async {
            let mut response = self
                .http
                .post(url.clone())
                .header("content-type", "application/json")
                .header("cache-control", "no-store")
                .body(body)
                .send()
                .await
                .map_err(|error| AuthorityError::Unreachable { source: Some(error) })?;
            let status = response.status().as_u16();
            let mut received = Vec::new();
            while let Some(chunk) =
                response.chunk().await.map_err(|error| AuthorityError::Unreachable { source: Some(error) })?
            {
                if received.len() + chunk.len() > cap {
                    return Err(AuthorityError::TooLarge);
                }
                received.extend_from_slice(&chunk);
            }
            Ok((status, received))
        };
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(self.timeout, exchange).await;
        if let Some(latency) = self.latency.get() {
            latency.record(started.elapsed().as_secs_f64());
        }
        match outcome {
            Ok(Err(AuthorityError::Unreachable { source: Some(error) })) if error.is_timeout() => {
                Err(AuthorityError::Timeout)
            }
            Ok(result) => result,
            Err(_) => Err(AuthorityError::Timeout),
        }
    }

    /// Asks for the current head of every target in one round trip and verifies each answer:
    /// the envelope under the policy's pinned authority key; the head's exact field set and
    /// schema; authority id, policy digest and generation, nonce, phase and target equal to the
    /// query; generation positive; reason non-empty; `issued_at` not in the future and no older
    /// than the policy's freshness bound; `expires_at` in the future; a commit token only at
    /// `pre_side_effect`. Heads come back in `targets` order.
    pub async fn current_heads(
        &self,
        policy: &Policy,
        phase: Phase,
        targets: &[TargetDigest],
        clock: &dyn Clock,
    ) -> Result<Vec<VerifiedHead>, AuthorityError> {
        if targets.is_empty() || targets.len() > MAX_TARGETS_PER_QUERY {
            return Err(AuthorityError::Malformed { what: "target count" });
        }
        let query = HeadQuery {
            schema_version: QUERY_SCHEMA_VERSION.to_owned(),
            policy_digest: policy.digest().to_owned(),
            policy_generation: policy.generation(),
            query_nonce: self.nonce()?,
            phase,
            targets: targets.to_vec(),
        };
        let (status, body) = self.post(&self.head_endpoint, query.canonical_bytes()).await?;
        if status != 200 {
            return Err(AuthorityError::HttpStatus { status });
        }
        let response: HeadResponse =
            serde_json::from_slice(&body).map_err(|_| AuthorityError::Malformed { what: "response document" })?;
        if response.heads.len() != targets.len() {
            return Err(AuthorityError::Malformed { what: "head count" });
        }
        response
            .heads
            .iter()
            .zip(targets)
            .map(|(envelope, target)| {
                let verified = verify_envelope_fields(envelope, policy.authority_key())?;
                let head: HeadPayload = serde_json::from_slice(&verified.bytes)
                    .map_err(|_| AuthorityError::Malformed { what: "head schema" })?;
                check_head(&head, policy, &query, target, clock.now_ms())
            })
            .collect()
    }

    /// Redeems a commit token over HTTPS (for a backend that does not share the authority's
    /// database; one that does calls [`crate::authority::redeem_commit_token`] inside its own
    /// commit transaction instead, which closes the race completely).
    pub async fn redeem(&self, request: &RedeemRequest) -> Result<(), AuthorityError> {
        let (status, _) = self.post(&self.redeem_endpoint, canonical(request)).await?;
        match status {
            200 => Ok(()),
            409 => Err(AuthorityError::RedeemRejected),
            status => Err(AuthorityError::HttpStatus { status }),
        }
    }
}

/// The field-by-field head checks (the source document's list, per target).
pub(crate) fn check_head(
    head: &HeadPayload,
    policy: &Policy,
    query: &HeadQuery,
    target: &TargetDigest,
    now_ms: i64,
) -> Result<VerifiedHead, AuthorityError> {
    let mismatch = |field| Err(AuthorityError::HeadMismatch { field });
    if head.schema_version != HEAD_SCHEMA_VERSION {
        return mismatch("schema_version");
    }
    if head.authority != policy.authority() {
        return mismatch("authority");
    }
    if head.policy_digest != policy.digest() {
        return mismatch("policy_digest");
    }
    if head.policy_generation != policy.generation() {
        return mismatch("policy_generation");
    }
    if head.query_nonce != query.query_nonce {
        return mismatch("query_nonce");
    }
    if head.phase != query.phase {
        return mismatch("phase");
    }
    if head.target != *target {
        return mismatch("target");
    }
    if head.generation == 0 || head.generation > MAX_SAFE_INTEGER {
        return mismatch("generation");
    }
    if head.reason_code.is_empty() {
        return mismatch("reason_code");
    }
    match &head.commit_token {
        Some(token) if token.is_empty() || query.phase != Phase::PreSideEffect => return mismatch("commit_token"),
        _ => {}
    }
    let issued_at_ms = parse_rfc3339_ms(&head.issued_at).ok_or(AuthorityError::HeadMismatch { field: "issued_at" })?;
    let expires_at_ms =
        parse_rfc3339_ms(&head.expires_at).ok_or(AuthorityError::HeadMismatch { field: "expires_at" })?;
    let max_age = i64::try_from(policy.payload().max_authority_response_age_ms).unwrap_or(i64::MAX);
    if issued_at_ms > now_ms || now_ms.saturating_sub(issued_at_ms) > max_age {
        return Err(AuthorityError::Stale);
    }
    if expires_at_ms <= now_ms {
        return Err(AuthorityError::Expired);
    }
    Ok(VerifiedHead {
        target: head.target.clone(),
        generation: head.generation,
        state: head.state,
        reason_code: head.reason_code.clone(),
        commit_token: head.commit_token.clone().map(CommitToken::new),
        issued_at_ms,
        expires_at_ms,
        state_digest: head.state_digest(),
    })
}
