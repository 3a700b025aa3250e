//! Explicit application handles (seed 000): state across calls is an opaque, expiring, revocable
//! handle passed back as an ordinary tool argument, never a session.
//!
//! A handle is 32 bytes from the OS CSPRNG, base64url; the store keeps only its SHA-256. Each row
//! binds the owner (a keyed digest of issuer + subject, the tenant, the OAuth client), the object
//! (type, reference, version), the granted scopes and the object type's policy version.
//!
//! **Per-use authorization.** [`HandleService::resolve`] succeeds only when, all at once: the
//! caller is the owner (subject, tenant and client), the handle is neither revoked nor expired
//! (one store statement), its policy version is still current, it grants the required scope and
//! the caller's token still holds that scope, the object still exists at the recorded version,
//! and the application's authorization callback passes again. Every failure is the same
//! [`HandleError::Denied`]; the pipeline answers one generic error and the handler never runs.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::{digest, hmac};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_store::{
    HandleOwner, HandleStore, HandleSummary, LiveHandle, MAX_HANDLE_SCOPES, NewHandle, Revocation, RevokeSelector,
    StoreError, hex_prefix,
};
use serde_json::{Value, json};

use crate::BoxFuture;
use crate::auth::VerifiedPrincipal;
use crate::clock::Clock;
use crate::secret::fill_random;

/// Length of a handle in characters (32 bytes, base64url without padding).
pub const HANDLE_LENGTH: usize = 43;
/// Longest handle lifetime any policy may set.
pub const MAX_HANDLE_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The JSON Schema of a handle argument: exactly the shape the service mints.
pub fn handle_argument_schema(object_type: &str) -> Value {
    json!({
        "type": "string",
        "minLength": HANDLE_LENGTH,
        "maxLength": HANDLE_LENGTH,
        "pattern": "^[A-Za-z0-9_-]{43}$",
        "description": format!("An opaque {object_type} handle, as returned by the tool that created it."),
    })
}

/// Why a handle operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HandleError {
    /// Resolution refused. One variant for every reason (unknown, foreign, expired, revoked,
    /// policy changed, scope, object changed or gone, authorization): no oracle.
    #[error("the handle is not valid for this call")]
    Denied,
    /// A mint outside the object type's policy or the caller's grant, or a caller without the
    /// tenant and client a handle must be bound to. The text is for the application author.
    #[error("handle not minted: {0}")]
    Refused(&'static str),
    /// The handle store (or the application's object loader) could not be used: fail closed.
    #[error("handle store unavailable")]
    Unavailable,
}

impl From<HandleError> for palisade_wire::ProtocolError {
    fn from(error: HandleError) -> Self {
        match error {
            HandleError::Denied => {
                palisade_wire::ProtocolError::invalid_params("the handle is not valid for this call")
            }
            HandleError::Refused(why) => {
                palisade_wire::ProtocolError::invalid_params(format!("handle not minted: {why}"))
            }
            HandleError::Unavailable => palisade_wire::ProtocolError::Unavailable,
        }
    }
}

impl From<StoreError> for HandleError {
    /// Through the one store-error conversion: an invalid record is a refusal like any other
    /// (one generic answer), anything else an outage.
    fn from(error: StoreError) -> Self {
        match crate::store_errors::store_refusal("handle", &error) {
            palisade_wire::ProtocolError::Unavailable => HandleError::Unavailable,
            _ => HandleError::Denied,
        }
    }
}

/// The policy of one object type (from configuration; applications may ship defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlePolicy {
    /// How long a handle lives.
    pub ttl: Duration,
    /// Scopes a handle of this type may grant.
    pub allowed_scopes: Vec<String>,
    /// Most scopes one handle may grant.
    pub max_scopes: usize,
    /// Raising it invalidates every handle minted under a lower version.
    pub version: i64,
}

impl HandlePolicy {
    /// Checks the policy is usable: a TTL within bounds, unique allowed scopes, a scope count
    /// within both the allowed set and [`MAX_HANDLE_SCOPES`], a positive version.
    pub fn validate(&self) -> Result<(), String> {
        if self.ttl.is_zero() || self.ttl > MAX_HANDLE_TTL {
            return Err("ttl must be between 1 ms and 30 days".into());
        }
        let unique: std::collections::BTreeSet<_> = self.allowed_scopes.iter().collect();
        if self.allowed_scopes.is_empty() || unique.len() != self.allowed_scopes.len() {
            return Err("allowed_scopes must be non-empty and unique".into());
        }
        if self.max_scopes == 0 || self.max_scopes > MAX_HANDLE_SCOPES {
            return Err(format!("max_scopes must be 1..={MAX_HANDLE_SCOPES}"));
        }
        if self.version <= 0 {
            return Err("policy_version must be positive".into());
        }
        Ok(())
    }
}

/// The current state of an application object, as the application's loader reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct HandleObject {
    /// The application's reference to the object.
    pub object_ref: String,
    /// Its current version: a handle minted at another version is refused.
    pub version: String,
    /// What the handler receives.
    pub value: Value,
}

/// When the application's authorization callback runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlePhase {
    /// Before a handle is minted.
    Mint,
    /// On every use.
    Resolve,
}

type Loader = Arc<dyn Fn(String, String) -> BoxFuture<Result<Option<HandleObject>, HandleError>> + Send + Sync>;
type Authorizer =
    Arc<dyn Fn(Arc<VerifiedPrincipal>, HandleObject, String, HandlePhase) -> BoxFuture<bool> + Send + Sync>;

/// An object type handles may refer to, registered on the application
/// (`AppBuilder::handle_type`).
#[derive(Clone)]
pub struct HandleType {
    pub(crate) name: String,
    pub(crate) default_policy: Option<HandlePolicy>,
    pub(crate) loader: Loader,
    pub(crate) authorizer: Authorizer,
}

impl HandleType {
    /// An object type: `loader(tenant, object_ref)` returns the object's current state (`None`
    /// when it no longer exists); `authorize(principal, object, scope, phase)` decides, at mint and
    /// on every use, whether the principal may act on it.
    pub fn new<L, LF, A, AF>(name: impl Into<String>, loader: L, authorize: A) -> Self
    where
        L: Fn(String, String) -> LF + Send + Sync + 'static,
        LF: Future<Output = Result<Option<HandleObject>, HandleError>> + Send + 'static,
        A: Fn(Arc<VerifiedPrincipal>, HandleObject, String, HandlePhase) -> AF + Send + Sync + 'static,
        AF: Future<Output = bool> + Send + 'static,
    {
        Self {
            name: name.into(),
            default_policy: None,
            loader: Arc::new(move |tenant, object_ref| Box::pin(loader(tenant, object_ref))),
            authorizer: Arc::new(move |principal, object, scope, phase| {
                Box::pin(authorize(principal, object, scope, phase))
            }),
        }
    }

    /// The policy used when the configuration names none for this type.
    pub fn default_policy(mut self, policy: HandlePolicy) -> Self {
        self.default_policy = Some(policy);
        self
    }

    /// The type's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A tool argument declared as a handle (`ToolBuilder::handle_argument`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandleArgument {
    /// The argument's name.
    pub name: String,
    /// The object type it must refer to.
    pub object_type: String,
    /// The scope the handle (and the caller's token) must grant.
    pub required_scope: String,
}

/// A handle the pipeline resolved for the handler. Holds no raw handle: only a digest prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedHandle {
    /// Object type.
    pub object_type: String,
    /// The application's reference to the object.
    pub object_ref: String,
    /// The object's version (unchanged since minting).
    pub version: String,
    /// The object as the loader returned it.
    pub object: Value,
    /// The scopes the handle grants.
    pub scopes: Vec<String>,
    /// The policy version it was minted under (the current one).
    pub policy_version: i64,
    /// The first 8 bytes of the handle's SHA-256, in hex (for logs).
    pub digest_prefix: String,
    pub(crate) digest: [u8; 32],
}

/// A principal-level event that must end the principal's handles (the revocation hook).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrincipalEvent {
    /// The principal's tokens were revoked (logout, compromise).
    TokensRevoked {
        /// Issuer.
        issuer: String,
        /// Subject.
        subject: String,
    },
    /// The principal's roles changed: earlier grants no longer stand.
    RoleChanged {
        /// Issuer.
        issuer: String,
        /// Subject.
        subject: String,
    },
    /// The principal left a tenant.
    TenantSwitched {
        /// Issuer.
        issuer: String,
        /// Subject.
        subject: String,
        /// The tenant left.
        from_tenant: String,
    },
    /// An OAuth client was disabled.
    ClientRevoked {
        /// Client id.
        client: String,
    },
}

/// The 32-byte key owners' subject digests are made with. Every instance of a deployment must
/// share it; it has no `Debug` and is never logged.
pub struct SubjectKey(hmac::Key);

impl SubjectKey {
    /// Wraps exactly 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() != 32 {
            return Err(format!("the handle subject key must be exactly 32 bytes, got {}", bytes.len()));
        }
        Ok(Self(hmac::Key::new(hmac::HMAC_SHA256, bytes)))
    }

    /// HMAC-SHA256 of `issuer`, a separator and `subject`.
    pub fn subject_digest(&self, issuer: &str, subject: &str) -> [u8; 32] {
        let mut context = hmac::Context::with_key(&self.0);
        context.update(issuer.as_bytes());
        context.update(&[0x1f]);
        context.update(subject.as_bytes());
        let tag = context.sign();
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }
}

/// A snapshot's handle types with their policies, checked and not yet in force.
pub(crate) struct PreparedTypes(BTreeMap<String, (HandleType, HandlePolicy)>);

impl PreparedTypes {
    /// Whether the snapshot registers `object_type`.
    pub(crate) fn knows(&self, object_type: &str) -> bool {
        self.0.contains_key(object_type)
    }
}

/// Mints, resolves and revokes handles. One per server.
pub struct HandleService {
    store: Arc<dyn HandleStore>,
    subject_key: SubjectKey,
    /// The types and policies in force: part of the application snapshot, replaced when the
    /// server publishes a new one ([`HandleService::republish`]).
    types: arc_swap::ArcSwap<BTreeMap<String, (HandleType, HandlePolicy)>>,
    /// The operator's policy overrides, applied to every published snapshot's types.
    overrides: BTreeMap<String, HandlePolicy>,
    clock: Arc<dyn Clock>,
}

/// The handle types and policies of one application snapshot.
fn resolve_types(
    types: &[HandleType],
    policies: &BTreeMap<String, HandlePolicy>,
) -> Result<BTreeMap<String, (HandleType, HandlePolicy)>, String> {
    if let Some(unknown) = policies.keys().find(|name| !types.iter().any(|t| &t.name == *name)) {
        return Err(format!("a handle policy names the unknown object type `{unknown}`"));
    }
    let mut resolved = BTreeMap::new();
    for handle_type in types {
        let policy = policies
            .get(&handle_type.name)
            .or(handle_type.default_policy.as_ref())
            .ok_or_else(|| format!("no handle policy for object type `{}`", handle_type.name))?;
        policy.validate().map_err(|why| format!("handle policy for `{}`: {why}", handle_type.name))?;
        resolved.insert(handle_type.name.clone(), (handle_type.clone(), policy.clone()));
    }
    Ok(resolved)
}

impl HandleService {
    /// A service over `store` for the application's `types`, with each type's policy taken from
    /// `policies` or the type's default. Every type must end up with a valid policy.
    pub fn new(
        store: Arc<dyn HandleStore>,
        subject_key: SubjectKey,
        types: &[HandleType],
        policies: &BTreeMap<String, HandlePolicy>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, String> {
        let resolved = resolve_types(types, policies)?;
        Ok(Self {
            store,
            subject_key,
            types: arc_swap::ArcSwap::from_pointee(resolved),
            overrides: policies.clone(),
            clock,
        })
    }

    /// The policy in force for `object_type`.
    pub fn policy(&self, object_type: &str) -> Option<HandlePolicy> {
        self.types.load().get(object_type).map(|(_, policy)| policy.clone())
    }

    /// Whether `object_type` is a registered handle type.
    pub(crate) fn knows_type(&self, object_type: &str) -> bool {
        self.types.load().contains_key(object_type)
    }

    /// The clock the service keeps time by (its server's).
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Checks a new snapshot's handle types against the operator's policies, without applying
    /// them (a publication applies them only once every check passed).
    pub(crate) fn prepare(&self, types: &[HandleType]) -> Result<PreparedTypes, String> {
        resolve_types(types, &self.overrides).map(PreparedTypes)
    }

    /// Puts a prepared snapshot's types and policies in force. Returns the types whose policy
    /// version changed (or that appeared or went away).
    pub(crate) fn republish(&self, prepared: PreparedTypes) -> Vec<String> {
        let new = prepared.0;
        let old = self.types.load_full();
        let version = |types: &BTreeMap<String, (HandleType, HandlePolicy)>, name: &str| {
            types.get(name).map(|(_, policy)| policy.version)
        };
        let changed = old
            .keys()
            .chain(new.keys())
            .filter(|name| version(&old, name) != version(&new, name))
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        self.types.store(Arc::new(new));
        changed
    }

    /// The keyed digest of a principal (what the store's owner column holds).
    pub fn subject_digest(&self, issuer: &str, subject: &str) -> [u8; 32] {
        self.subject_key.subject_digest(issuer, subject)
    }

    fn owner(&self, principal: &VerifiedPrincipal) -> Option<HandleOwner> {
        Some(HandleOwner {
            subject_key: self.subject_digest(principal.issuer(), principal.subject()),
            tenant: principal.tenant().filter(|t| !t.is_empty())?.to_owned(),
            client: principal.client_id().filter(|c| !c.is_empty())?.to_owned(),
        })
    }

    fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Mints a handle for `principal` on an object, granting `scopes`. Refused unless the type
    /// is registered, the scopes (deduplicated) are non-empty, within the policy's allowed set
    /// and count and held by the caller's token, the object exists at `object_version`, and the
    /// application's authorization passes for every scope.
    pub async fn mint(
        &self,
        principal: &Arc<VerifiedPrincipal>,
        object_type: &str,
        object_ref: &str,
        object_version: &str,
        scopes: &[&str],
    ) -> Result<String, HandleError> {
        let types = self.types.load();
        let (handle_type, policy) = types.get(object_type).ok_or(HandleError::Refused("unregistered object type"))?;
        let owner = self.owner(principal).ok_or(HandleError::Refused("the caller has no tenant or client id"))?;
        let mut scopes: Vec<String> = scopes.iter().map(|s| (*s).to_owned()).collect();
        scopes.sort();
        scopes.dedup();
        if scopes.is_empty() || scopes.len() > policy.max_scopes {
            return Err(HandleError::Refused("scope count outside the policy"));
        }
        if scopes.iter().any(|scope| !policy.allowed_scopes.contains(scope)) {
            return Err(HandleError::Refused("a scope outside the policy's allowed set"));
        }
        if scopes.iter().any(|scope| !principal.has_scope(scope)) {
            return Err(HandleError::Refused("a scope the caller's token does not hold"));
        }
        if object_ref.is_empty() || object_version.is_empty() {
            return Err(HandleError::Refused("empty object reference or version"));
        }
        let object = (handle_type.loader)(owner.tenant.clone(), object_ref.to_owned())
            .await?
            .filter(|object| object.version == object_version)
            .ok_or(HandleError::Refused("the object does not exist at that version"))?;
        for scope in &scopes {
            let allowed =
                (handle_type.authorizer)(principal.clone(), object.clone(), scope.clone(), HandlePhase::Mint).await;
            if !allowed {
                return Err(HandleError::Refused("the application refused the object to this caller"));
            }
        }
        let mut raw = [0u8; 32];
        fill_random(&mut raw).map_err(|_| HandleError::Unavailable)?;
        let handle = URL_SAFE_NO_PAD.encode(raw);
        let created_ms = self.now_ms();
        let ttl_ms = i64::try_from(policy.ttl.as_millis()).unwrap_or(i64::MAX);
        self.store
            .insert_handle(NewHandle {
                digest: handle_digest(&handle),
                owner,
                object_type: object_type.to_owned(),
                object_ref: object_ref.to_owned(),
                object_version: object_version.to_owned(),
                scopes,
                policy_version: policy.version,
                created_ms,
                expires_ms: created_ms.saturating_add(ttl_ms),
            })
            .await?;
        Ok(handle)
    }

    /// Resolves `handle` for one use by `principal` as an `object_type` with `required_scope`.
    /// See the module documentation for every check; any failure is [`HandleError::Denied`].
    pub async fn resolve(
        &self,
        principal: &Arc<VerifiedPrincipal>,
        handle: &str,
        object_type: &str,
        required_scope: &str,
    ) -> Result<ResolvedHandle, HandleError> {
        let types = self.types.load();
        let (handle_type, policy) = types.get(object_type).ok_or(HandleError::Denied)?;
        let owner = self.owner(principal).ok_or(HandleError::Denied)?;
        if !is_well_formed(handle) || !policy.allowed_scopes.iter().any(|s| s == required_scope) {
            return Err(HandleError::Denied);
        }
        let digest = handle_digest(handle);
        let record: LiveHandle =
            self.store.lookup_handle(digest, &owner, self.now_ms()).await?.ok_or(HandleError::Denied)?;
        let current = record.object_type == object_type
            && record.policy_version == policy.version
            && record.scopes.iter().any(|s| s == required_scope)
            && principal.has_scope(required_scope);
        if !current {
            return Err(HandleError::Denied);
        }
        let object = (handle_type.loader)(owner.tenant, record.object_ref.clone())
            .await?
            .filter(|object| object.version == record.object_version)
            .ok_or(HandleError::Denied)?;
        let allowed = (handle_type.authorizer)(
            principal.clone(),
            object.clone(),
            required_scope.to_owned(),
            HandlePhase::Resolve,
        )
        .await;
        if !allowed {
            return Err(HandleError::Denied);
        }
        Ok(ResolvedHandle {
            object_type: record.object_type,
            object_ref: record.object_ref,
            version: record.object_version,
            object: object.value,
            scopes: record.scopes,
            policy_version: record.policy_version,
            digest_prefix: hex_prefix(&digest),
            digest,
        })
    }

    /// Revokes a handle the caller resolved in this request (e.g. a basket consumed by checkout).
    pub async fn revoke_resolved(
        &self,
        principal: &VerifiedPrincipal,
        handle: &ResolvedHandle,
        reason: &str,
    ) -> Result<bool, HandleError> {
        let owner = self.owner(principal).ok_or(HandleError::Denied)?;
        let selector = RevokeSelector::Owned { digest: handle.digest, owner };
        Ok(self.revoke(selector, reason, None).await? > 0)
    }

    /// Revokes what `selector` covers; returns how many handles.
    pub async fn revoke(
        &self,
        selector: RevokeSelector,
        reason: &str,
        receipt: Option<&str>,
    ) -> Result<u64, HandleError> {
        let revocation =
            Revocation { reason: reason.to_owned(), receipt: receipt.map(str::to_owned), at_ms: self.now_ms() };
        Ok(self.store.revoke_handles(selector, revocation).await?)
    }

    /// The revocation hook: ends the handles a principal-level event invalidates.
    pub async fn on_principal_event(&self, event: PrincipalEvent) -> Result<u64, HandleError> {
        let (selector, reason) = match event {
            PrincipalEvent::TokensRevoked { issuer, subject } => {
                (RevokeSelector::Subject(self.subject_digest(&issuer, &subject)), "tokens revoked")
            }
            PrincipalEvent::RoleChanged { issuer, subject } => {
                (RevokeSelector::Subject(self.subject_digest(&issuer, &subject)), "role changed")
            }
            PrincipalEvent::TenantSwitched { issuer, subject, from_tenant } => (
                RevokeSelector::SubjectInTenant {
                    subject_key: self.subject_digest(&issuer, &subject),
                    tenant: from_tenant,
                },
                "tenant switched",
            ),
            PrincipalEvent::ClientRevoked { client } => (RevokeSelector::Client(client), "client revoked"),
        };
        self.revoke(selector, reason, None).await
    }

    /// An object was deleted: its handles die with it.
    pub async fn object_deleted(&self, tenant: &str, object_type: &str, object_ref: &str) -> Result<u64, HandleError> {
        let selector = RevokeSelector::Object {
            tenant: tenant.to_owned(),
            object_type: object_type.to_owned(),
            object_ref: object_ref.to_owned(),
        };
        self.revoke(selector, "object deleted", None).await
    }

    /// A subject's handles (digests only), newest first.
    pub async fn list(&self, issuer: &str, subject: &str, limit: u32) -> Result<Vec<HandleSummary>, HandleError> {
        Ok(self.store.list_handles(self.subject_digest(issuer, subject), limit).await?)
    }

    /// One retention pass: deletes rows expired or revoked more than `retention` ago, in batches
    /// of `batch`, at most `max_batches` of them. Returns how many rows went.
    pub async fn purge(&self, retention: Duration, batch: u32, max_batches: u32) -> Result<u64, HandleError> {
        let cutoff = self.now_ms().saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
        let mut total = 0;
        for _ in 0..max_batches {
            let purged = self.store.purge_handles(cutoff, batch).await?;
            total += purged;
            if purged < u64::from(batch) {
                break;
            }
        }
        Ok(total)
    }

    /// Runs [`purge`](Self::purge) every `period` until `shutdown` fires.
    pub fn spawn_retention(
        self: &Arc<Self>,
        period: Duration,
        retention: Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let service = self.clone();
        crate::periodic::spawn_periodic("handle retention", period, shutdown, move || {
            let service = service.clone();
            async move {
                match service.purge(retention, 1_000, 10).await {
                    Ok(0) => {}
                    Ok(purged) => tracing::info!(purged, "handle retention pass"),
                    Err(error) => tracing::warn!(%error, "handle retention pass failed"),
                }
            }
        })
    }
}

/// SHA-256 of a handle.
pub fn handle_digest(handle: &str) -> [u8; 32] {
    sha256(handle.as_bytes())
}

/// SHA-256 of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = digest::digest(&digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

fn is_well_formed(handle: &str) -> bool {
    handle.len() == HANDLE_LENGTH && handle.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}
