//! Delegation (control C10, seed 004): a sub-agent acts for a user under a bounded capability
//! that can only narrow along the delegation graph.
//!
//! - **The ledger is the authority.** A capability is a row of the store's delegation ledger
//!   ([`palisade_store::DelegationStore`]): root, parent, the principal it acts for (never changing
//!   along a chain), the holder agent (its token's issuer, subject and client), the [`Grant`]
//!   (tools, resources and prompts by exposed name or `prefix*` pattern, scopes, handle digests),
//!   expiry, depth and a call budget. What an agent holds is an opaque reference (`pcap_` + 32
//!   random bytes, base64url); only its SHA-256 is stored and it is bound to the holder.
//! - **Minting only narrows** ([`DelegationService::mint`], the `palisade_delegate` tool): every
//!   bound within the parent's (tools ⊆, resources ⊆, prompts ⊆, scopes ⊆, handles ⊆, expiry ≤,
//!   depth < the configured maximum, budget ≤ what the parent has left — reserved from it in the
//!   store's transaction). Every edge is a ledger row and an audit record.
//! - **Enforced in the request path** (`pipeline/delegation.rs`): a request presenting a reference
//!   in `_meta` under [`CAPABILITY_META_KEY`] beside the agent's own token runs as the capability's
//!   principal with the intersection of the token's and the capability's scopes; the chain is read
//!   in one statement and every ancestor must be live; the target must be inside the grant; the
//!   kill switch gets one `agent` target per agent of the chain; a call is spent from the budget
//!   atomically before the allow.
//! - **Approvals bind to the operation.** A needs-confirmation tool under a capability runs only
//!   with an approval the principal's own client recorded for exactly that call
//!   ([`approval_key`]: SHA-256 over capability id, tool, RFC 8785 arguments, holder), taken once.
//!   Text an agent sends ("the user approved") is never an approval: it can only be [`Evidence`].
//!
//! **Architecture Invariant:** a [`Delegated`] value exists only on a principal the delegation
//! stage (or a task's re-check) built from the ledger; nothing a client sends constructs one.

#[cfg(test)]
mod tests;
mod tools;

use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::hmac;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_base::hex::hex;
use palisade_store::{DelegationRow, DelegationStore, MintRefusal, NewDelegation};
use palisade_wire::ProtocolError;
use serde_json::{Map, Value, json};

use crate::auth::VerifiedPrincipal;
use crate::clock::Clock;
pub use crate::delegated::{Delegated, Grant, Holder, VerifiedApproval};
use crate::handles::{PrincipalEvent, sha256};
use crate::secret::{ServerSecret, fill_random};

/// The `_meta` key a request carries its capability reference under.
pub const CAPABILITY_META_KEY: &str = "dev.palisade/capability";
/// The tool that mints a capability (a root from the principal's own client, a child from an
/// agent presenting its capability).
pub const DELEGATE_TOOL: &str = "palisade_delegate";
/// The tool that revokes a capability and, with it, everything minted under it.
pub const REVOKE_TOOL: &str = "palisade_delegation_revoke";
/// The tool the principal's own client records an approval of one concrete delegated call with.
pub const APPROVE_TOOL: &str = "palisade_delegation_approve";

const REFERENCE_PREFIX: &str = "pcap_";
/// Most entries of each list of a grant.
pub const MAX_GRANT_ENTRIES: usize = 64;
/// Longest entry of a grant, agent id or client id.
pub const MAX_GRANT_ENTRY_BYTES: usize = 256;

/// The fixed refusal texts of the delegation stage.
pub(crate) mod refusal {
    pub const NOT_VALID: &str = "the capability is not valid for this caller";
    pub const NOT_ACCEPTED: &str = "this server does not accept delegation capabilities";
    pub const METHOD: &str = "this method is not available under a delegation capability";
    pub const TARGET: &str = "the tool, resource or prompt is outside the capability";
    pub const BUDGET: &str = "the capability's call budget is spent";
    pub const APPROVE_DELEGATED: &str = "approvals come from the principal's own client, never under a capability";
}

/// Limits of the delegation service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelegationConfig {
    /// Deepest chain (a root is depth 0; its child 1). Default 3.
    pub max_depth: u32,
    /// Largest call budget of a root capability. Default 1000.
    pub max_calls: i64,
    /// Longest lifetime of a capability. Default 1 h.
    pub max_lifetime: Duration,
    /// How long a recorded approval stays usable. Default 10 min.
    pub approval_ttl: Duration,
}

impl Default for DelegationConfig {
    fn default() -> Self {
        Self {
            max_depth: 3,
            max_calls: 1000,
            max_lifetime: Duration::from_secs(3600),
            approval_ttl: Duration::from_secs(600),
        }
    }
}

/// What a principal (or an operator) told an agent to do — "summarize North policy". Context for
/// the agent's work, not authority: what the agent may actually do is its capability's
/// [`Grant`], and nothing converts an `Instruction` into one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction(String);

impl Instruction {
    /// Wraps an instruction.
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The text.
    pub fn text(&self) -> &str {
        &self.0
    }
}

/// Something an agent *said* — "the user approved a customer export", a summary, a tool result
/// it relays. It is evidence about the agent's message and nothing more: there is no way from
/// `Evidence` to an approval or any other authority (only the pipeline makes a
/// [`VerifiedApproval`], from the ledger).
///
/// ```compile_fail
/// use palisade_server::delegation::{Evidence, VerifiedApproval};
/// let claim = Evidence::from_agent("the user approved a customer export");
/// let approval: VerifiedApproval = claim.into(); // no such conversion
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence(String);

impl Evidence {
    /// Wraps what an agent said.
    pub fn from_agent(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The text, to show or log as what the agent claimed.
    pub fn text(&self) -> &str {
        &self.0
    }
}

/// An agent's proposal that more authority would help ("export the customers"): something to
/// put before the principal, never something to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// The tool proposed.
    pub tool: String,
    /// Its proposed arguments.
    pub arguments: Map<String, Value>,
    /// Why, as the agent put it.
    pub rationale: Evidence,
}

/// SHA-256 over the capability id, the tool, the RFC 8785 canonical arguments and the holder
/// (each length-prefixed): what an approval is keyed by, so it fits one call of one holder.
pub fn approval_key(capability: &[u8; 32], tool: &str, arguments: &Map<String, Value>, holder: &Holder) -> [u8; 32] {
    let canonical = palisade_base::canonical::canonical_bytes(&Value::Object(arguments.clone()));
    let mut bytes = Vec::with_capacity(256 + canonical.len());
    for part in [
        &capability[..],
        tool.as_bytes(),
        &canonical,
        holder.issuer.as_bytes(),
        holder.subject.as_bytes(),
        holder.client.as_bytes(),
    ] {
        bytes.extend_from_slice(&(part.len() as u64).to_be_bytes());
        bytes.extend_from_slice(part);
    }
    sha256(&bytes)
}

fn arguments_sha256(arguments: &Map<String, Value>) -> String {
    hex(&sha256(&palisade_base::canonical::canonical_bytes(&Value::Object(arguments.clone()))))
}

/// What a caller asks [`DelegationService::mint`] for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MintRequest {
    /// The agent that will hold the capability: its token's subject (the kill switch's agent id).
    pub agent: String,
    /// The agent's OAuth client (its token's `client_id`).
    pub agent_client: String,
    /// What it may do; raw handles are given in `handles` below, not here.
    pub grant: Grant,
    /// Raw handles the agent may present (stored as digests).
    pub handles: Vec<String>,
    /// Lifetime from now.
    pub lifetime: Duration,
    /// Call budget.
    pub calls: i64,
    /// The parent task this delegation serves, if any (recorded).
    pub parent_task: Option<String>,
}

/// A minted capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minted {
    /// The reference to hand to the agent (`pcap_…`); shown once, never stored.
    pub capability: String,
    /// Its public id (SHA-256 of the reference, hex).
    pub id: String,
    /// Its depth.
    pub depth: u32,
    /// Expiry (Unix ms).
    pub expires_ms: i64,
    /// Call budget.
    pub calls: i64,
}

/// Why a mint, revocation or approval was refused. Texts are fixed; none quotes a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DelegationError {
    /// The request is malformed or widens the parent.
    #[error("{0}")]
    Refused(&'static str),
    /// The store refused the edge (the parent's state).
    #[error("{}", .0.reason())]
    Ledger(MintRefusal),
    /// The store could not be reached: nothing was done.
    #[error("the delegation ledger is unavailable")]
    Unavailable,
}

impl From<DelegationError> for ProtocolError {
    fn from(error: DelegationError) -> Self {
        match error {
            DelegationError::Unavailable => ProtocolError::Unavailable,
            other => ProtocolError::invalid_params(other.to_string()),
        }
    }
}

/// The delegation service: the ledger, the key principals are digested under, the limits and
/// the clock. Share one per deployment's store; every instance must use the same secret.
pub struct DelegationService {
    store: Arc<dyn DelegationStore>,
    key: hmac::Key,
    config: DelegationConfig,
    clock: Arc<dyn Clock>,
    /// Where every edge (mint), revocation and approval is recorded: the audit log of the server
    /// the service was given to (set once by `ServerBuilder::build`).
    recorder: std::sync::OnceLock<Arc<crate::audit::Recorder>>,
}

impl std::fmt::Debug for DelegationService {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("DelegationService").field("config", &self.config).finish_non_exhaustive()
    }
}

impl DelegationService {
    /// A service over `store`, digesting principals under a key derived from `secret`.
    pub fn new(
        store: Arc<dyn DelegationStore>,
        secret: &ServerSecret,
        config: DelegationConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            store,
            key: secret.derive("palisade/delegation/v1"),
            config,
            clock,
            recorder: std::sync::OnceLock::new(),
        }
    }

    /// Records ledger changes in `recorder`'s audit log from now on (the first server's).
    pub(crate) fn attach(&self, recorder: Arc<crate::audit::Recorder>) {
        let _ = self.recorder.set(recorder);
    }

    /// Records a change to the ledger, before it is made: `operation` (`delegation/mint`, …) by
    /// `by`, with `detail` (digest prefixes and counts only). Without a server's audit log (a
    /// service used on its own) nothing is recorded; a log that cannot be written refuses the
    /// change (fail closed).
    async fn record(&self, operation: &str, by: &VerifiedPrincipal, detail: String) -> Result<(), DelegationError> {
        let Some(recorder) = self.recorder.get() else { return Ok(()) };
        let mut trail = crate::audit::AuditTrail::new(recorder, operation);
        trail.principal(&Arc::new(by.clone()));
        if let Some(delegated) = by.delegation() {
            trail.delegation(delegated, &self.agent_digest(&delegated.holder().subject));
        }
        trail.detail = Some(detail);
        trail.allow(crate::audit::AuditStage::Delegation).await.map_err(|_| DelegationError::Unavailable)?;
        Ok(())
    }

    /// The limits.
    pub fn config(&self) -> &DelegationConfig {
        &self.config
    }

    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The keyed digest of a principal's identity (issuer, subject, tenant, client): what the
    /// ledger keys "the principal it acts for" by.
    pub fn principal_key(&self, principal: &VerifiedPrincipal) -> [u8; 32] {
        let mut context = hmac::Context::with_key(&self.key);
        for part in [
            principal.issuer(),
            principal.subject(),
            principal.tenant().unwrap_or(""),
            principal.client_id().unwrap_or(""),
        ] {
            context.update(&(part.len() as u64).to_be_bytes());
            context.update(part.as_bytes());
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(context.sign().as_ref());
        out
    }

    /// The keyed digest of an agent id, as the audit log names agents (first 16 bytes, hex).
    pub(crate) fn agent_digest(&self, agent: &str) -> String {
        let tag = hmac::sign(&self.key, format!("agent\u{1f}{agent}").as_bytes());
        hex(&tag.as_ref()[..16])
    }

    /// The delegation stage's lookup: the capability `reference` presented by `caller` (an
    /// agent's own, non-delegated principal). Returns the principal the request runs as: the
    /// capability's principal with the scopes both the capability and the agent's token hold.
    /// Any problem with the capability is one answer ([`refusal::NOT_VALID`]); the detail is the
    /// second value, for the audit record only.
    pub(crate) async fn resolve(
        &self,
        reference: &str,
        caller: &VerifiedPrincipal,
    ) -> Result<VerifiedPrincipal, (ProtocolError, &'static str)> {
        let not_valid = |why: &'static str| (ProtocolError::DelegationRefused { reason: refusal::NOT_VALID }, why);
        let digest = parse_reference(reference).ok_or_else(|| not_valid("malformed reference"))?;
        let chain = self.live_chain(&digest).await?;
        let (_, body) = chain.last().ok_or_else(|| not_valid("unknown"))?;
        let holder = holder_of(caller).ok_or_else(|| not_valid("a caller without a client"))?;
        let root =
            body.get("principal").and_then(VerifiedPrincipal::from_stored).ok_or_else(|| not_valid("corrupt row"))?;
        let delegated = verified(digest, &chain, &holder).map_err(not_valid)?;
        Ok(root.delegated(caller, Arc::new(delegated)))
    }

    /// The chain of `digest`, root first, each row with its parsed body; refused unless it is
    /// complete (from a depth-0 root) and every row is live (not revoked, not expired).
    async fn live_chain(
        &self,
        digest: &[u8; 32],
    ) -> Result<Vec<(DelegationRow, Value)>, (ProtocolError, &'static str)> {
        let not_valid = |why: &'static str| (ProtocolError::DelegationRefused { reason: refusal::NOT_VALID }, why);
        let rows = self.store.delegation_chain(*digest).await.map_err(|error| {
            tracing::error!(%error, "delegation ledger unavailable: refusing the delegated request");
            (ProtocolError::Unavailable, "ledger unavailable")
        })?;
        let Some(leaf) = rows.last() else { return Err(not_valid("unknown")) };
        if leaf.digest != *digest || rows[0].depth != 0 || rows.len() != leaf.depth as usize + 1 {
            return Err(not_valid("incomplete chain"));
        }
        let now = self.clock.now_ms();
        if rows.iter().any(|row| row.revoked_ms.is_some()) {
            return Err(not_valid("revoked (it or an ancestor)"));
        }
        if rows.iter().any(|row| row.expires_ms <= now) {
            return Err(not_valid("expired (it or an ancestor)"));
        }
        rows.into_iter()
            .map(|row| {
                let body: Value = serde_json::from_str(&row.body).map_err(|_| not_valid("corrupt row"))?;
                Ok((row, body))
            })
            .collect()
    }

    /// Spends one call of the capability's budget before the allow (one store statement: never
    /// negative under any concurrency, across instances), and one of the tool's own count when
    /// the capability counts `tool` (both in one transaction, or neither).
    pub(crate) async fn spend(&self, delegated: &Delegated, tool: Option<&str>) -> Result<(), ProtocolError> {
        let now = self.clock.now_ms();
        let spent = match tool.filter(|tool| delegated.grant.tool_calls.contains_key(*tool)) {
            Some(tool) => self.store.spend_delegation_tool_call(delegated.digest, tool, now).await,
            None => self.store.spend_delegation_call(delegated.digest, now).await,
        };
        match spent {
            Ok(true) => Ok(()),
            Ok(false) => Err(ProtocolError::DelegationRefused { reason: refusal::BUDGET }),
            Err(error) => {
                tracing::error!(%error, "delegation ledger unavailable: refusing the delegated call");
                Err(ProtocolError::Unavailable)
            }
        }
    }

    /// A task's principal again, when its worker runs: the capability it was created under is
    /// read from the ledger afresh (revoked, expired, or an ancestor revoked: refused).
    pub(crate) async fn recheck(
        &self,
        stored: VerifiedPrincipal,
        digest: [u8; 32],
        holder: &Holder,
    ) -> Result<VerifiedPrincipal, ProtocolError> {
        let chain = self.live_chain(&digest).await.map_err(|(error, _)| error)?;
        let delegated = verified(digest, &chain, holder)
            .map_err(|_| ProtocolError::DelegationRefused { reason: refusal::NOT_VALID })?;
        Ok(stored.with_delegation(Arc::new(delegated)))
    }

    /// Mints a capability for `request.agent`. `minter` is the caller as the pipeline verified
    /// it: the principal itself (a root), or an agent under its own capability (a child, which
    /// must lie within it; the budget is reserved from it).
    pub async fn mint(&self, minter: &VerifiedPrincipal, request: MintRequest) -> Result<Minted, DelegationError> {
        let refused = DelegationError::Refused;
        check_text(&request.agent).ok_or(refused("the agent id must be 1..=256 bytes without control characters"))?;
        check_text(&request.agent_client)
            .ok_or(refused("the agent client must be 1..=256 bytes without control characters"))?;
        let mut grant = request.grant;
        for list in [&grant.tools, &grant.resources, &grant.prompts] {
            if list.len() > MAX_GRANT_ENTRIES || !list.iter().all(|entry| check_entry(entry)) {
                return Err(refused(
                    "each of tools, resources and prompts holds at most 64 names or prefix* patterns of 1..=256 bytes",
                ));
            }
        }
        if grant.scopes.len() > MAX_GRANT_ENTRIES
            || !grant.scopes.iter().all(|s| check_text(s).is_some() && !s.contains(char::is_whitespace))
        {
            return Err(refused("scopes must be at most 64 scope tokens"));
        }
        if grant.tool_calls.len() > MAX_GRANT_ENTRIES
            || !grant.tool_calls.iter().all(|(tool, count)| {
                check_text(tool).is_some()
                    && !tool.contains('*')
                    && grant.allows_tool(tool)
                    && (0..=request.calls).contains(count)
            })
        {
            return Err(refused(
                "each per-tool count names one tool of the capability and is between 0 and its call budget",
            ));
        }
        if request.handles.len() > MAX_GRANT_ENTRIES || request.handles.iter().any(|h| h.is_empty() || h.len() > 512) {
            return Err(refused("handles must be at most 64 handles"));
        }
        grant.handles = request.handles.iter().map(|handle| hex(&crate::handles::handle_digest(handle))).collect();
        let lifetime_ms = i64::try_from(request.lifetime.as_millis()).unwrap_or(i64::MAX);
        let max_ms = i64::try_from(self.config.max_lifetime.as_millis()).unwrap_or(i64::MAX);
        if lifetime_ms <= 0 || lifetime_ms > max_ms {
            return Err(refused("the lifetime must be positive and at most the configured maximum"));
        }
        if request.calls < 0 || request.calls > self.config.max_calls {
            return Err(refused("the call budget must be 0..= the configured maximum"));
        }
        if let Some(task) = &request.parent_task
            && check_text(task).is_none()
        {
            return Err(refused("the parent task id must be 1..=256 bytes without control characters"));
        }
        let now = self.clock.now_ms();
        let (parent, principal, holder_issuer) = match minter.delegation() {
            // A child: within the parent in every bound (the store checks depth, expiry and
            // budget again in the transaction that reserves the budget).
            Some(parent) => {
                if let Some(why) = grant.widens(&parent.grant) {
                    return Err(refused(why));
                }
                if now.saturating_add(lifetime_ms) > parent.expires_ms {
                    return Err(DelegationError::Ledger(MintRefusal::OutlivesParent));
                }
                if parent.depth + 1 > self.config.max_depth {
                    return Err(DelegationError::Ledger(MintRefusal::TooDeep));
                }
                (Some(parent.digest), minter.to_stored(), parent.holder.issuer.clone())
            }
            // A root: the principal delegates at most the scopes its own token holds.
            None => {
                if minter.client_id().is_none() {
                    return Err(refused("delegating needs a principal with an OAuth client"));
                }
                if !grant.scopes.iter().all(|scope| minter.has_scope(scope)) {
                    return Err(refused("a scope is outside the principal's own token"));
                }
                (None, minter.to_stored(), minter.issuer().to_owned())
            }
        };
        let mut principal = principal;
        // The stored principal is the identity the capability acts for; its scopes are the
        // grant's (what any holder down the chain can have at most).
        if let Some(object) = principal.as_object_mut() {
            object.insert("scopes".into(), json!(grant.scopes));
            object.remove("delegation");
        }
        let holder = Holder { issuer: holder_issuer, subject: request.agent.clone(), client: request.agent_client };
        let mut raw = [0u8; 32];
        fill_random(&mut raw).map_err(|_| DelegationError::Unavailable)?;
        let capability = format!("{REFERENCE_PREFIX}{}", URL_SAFE_NO_PAD.encode(raw));
        let digest = sha256(capability.as_bytes());
        let tool_calls = grant.tool_calls.clone();
        let body = json!({ "v": 1, "principal": principal, "holder": holder.to_json(), "grant": grant.to_json(),
                           "parentTask": request.parent_task });
        let parent_prefix = parent.as_ref().map_or_else(|| "root".to_owned(), |p| palisade_store::hex_prefix(p));
        let edge = format!(
            "child={} parent={parent_prefix} agent={} calls={} lifetime_ms={lifetime_ms}",
            palisade_store::hex_prefix(&digest),
            self.agent_digest(&request.agent),
            request.calls
        );
        self.record("delegation/mint", minter, edge).await?;
        let new = NewDelegation {
            digest,
            parent,
            principal_key: self.principal_key(minter),
            agent: request.agent,
            body: body.to_string(),
            expires_ms: now.saturating_add(lifetime_ms),
            calls: request.calls,
            created_ms: now,
        };
        match self.store.mint_delegation_with_tools(new, self.config.max_depth, tool_calls).await {
            Ok(Ok(row)) => Ok(Minted {
                capability,
                id: hex(&row.digest),
                depth: row.depth,
                expires_ms: row.expires_ms,
                calls: row.calls,
            }),
            Ok(Err(refusal)) => Err(DelegationError::Ledger(refusal)),
            Err(error) => {
                tracing::error!(%error, "delegation ledger unavailable: nothing minted");
                Err(DelegationError::Unavailable)
            }
        }
    }

    /// Revokes the capability `id` (and so everything minted under it). The principal may revoke
    /// any capability acting for it; an agent only its own capability or one minted under it.
    pub async fn revoke(&self, by: &VerifiedPrincipal, id: &str) -> Result<bool, DelegationError> {
        let refused = DelegationError::Refused("no such capability of yours");
        let digest = parse_id(id).ok_or(refused.clone())?;
        let chain = self.store.delegation_chain(digest).await.map_err(|_| DelegationError::Unavailable)?;
        let Some(target) = chain.last().filter(|row| row.digest == digest) else { return Err(refused) };
        let allowed = match by.delegation() {
            Some(own) => chain.iter().any(|row| row.digest == own.digest),
            None => target.principal_key == self.principal_key(by),
        };
        if !allowed {
            return Err(refused);
        }
        self.record("delegation/revoke", by, format!("revoked={}", palisade_store::hex_prefix(&digest))).await?;
        self.store.revoke_delegation(digest, self.clock.now_ms()).await.map_err(|_| DelegationError::Unavailable)
    }

    /// Records the principal's approval of one concrete call under capability `id`. `by` must be
    /// the principal itself on its own client (not under any capability).
    pub async fn approve(
        &self,
        by: &VerifiedPrincipal,
        id: &str,
        tool: &str,
        arguments: &Map<String, Value>,
    ) -> Result<String, DelegationError> {
        if by.delegation().is_some() {
            return Err(DelegationError::Refused(refusal::APPROVE_DELEGATED));
        }
        let refused = DelegationError::Refused("no such capability of yours");
        let digest = parse_id(id).ok_or(refused.clone())?;
        let chain = self.store.delegation_chain(digest).await.map_err(|_| DelegationError::Unavailable)?;
        let Some(row) = chain.last().filter(|row| row.digest == digest) else { return Err(refused) };
        if row.principal_key != self.principal_key(by) {
            return Err(refused);
        }
        let body: Value = serde_json::from_str(&row.body).map_err(|_| refused.clone())?;
        let holder = Holder::from_json(&body["holder"]).ok_or(refused)?;
        let key = approval_key(&digest, tool, arguments, &holder);
        let what = format!(
            "approved={} capability={} arguments={}",
            palisade_store::hex_prefix(&key),
            palisade_store::hex_prefix(&digest),
            &arguments_sha256(arguments)[..16]
        );
        self.record("delegation/approve", by, what).await?;
        let ttl_ms = i64::try_from(self.config.approval_ttl.as_millis()).unwrap_or(i64::MAX);
        let expires = self.clock.now_ms().saturating_add(ttl_ms).min(row.expires_ms);
        self.store.put_approval(key, expires).await.map_err(|_| DelegationError::Unavailable)?;
        Ok(hex(&key))
    }

    /// The approval of exactly this call, taken once; without one the call is refused with
    /// what the principal would have to approve.
    pub(crate) async fn take_approval(
        &self,
        delegated: &Delegated,
        tool: &str,
        arguments: &Map<String, Value>,
    ) -> Result<VerifiedApproval, ProtocolError> {
        let key = approval_key(&delegated.digest, tool, arguments, &delegated.holder);
        match self.store.take_approval(key, self.clock.now_ms()).await {
            Ok(true) => Ok(VerifiedApproval::new(key)),
            Ok(false) => Err(ProtocolError::ApprovalRequired {
                capability: delegated.id(),
                tool: tool.to_owned(),
                arguments_sha256: arguments_sha256(arguments),
            }),
            Err(error) => {
                tracing::error!(%error, "delegation ledger unavailable: refusing the delegated call");
                Err(ProtocolError::Unavailable)
            }
        }
    }

    /// The principal-event hook (`Server::principal_event`): revokes every live
    /// capability that acts for the principal (tokens revoked, roles changed, the tenant left)
    /// or that an agent holds whose tokens were revoked, and, for a revoked client, every
    /// capability of that client on either side. Descendants fall with them. Reads at most
    /// [`palisade_store::MAX_DELEGATION_LIST`] rows (newest first) per event. Returns how many
    /// capabilities it revoked.
    pub async fn on_principal_event(&self, event: &PrincipalEvent) -> Result<u64, palisade_store::StoreError> {
        let now = self.clock.now_ms();
        let rows = self.store.delegations(None, palisade_store::MAX_DELEGATION_LIST).await?;
        let mut revoked = 0;
        for row in rows.iter().filter(|row| row.revoked_ms.is_none() && row.expires_ms > now) {
            let Ok(body) = serde_json::from_str::<Value>(&row.body) else { continue };
            let text = |value: &Value, key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
            let principal = &body["principal"];
            let holder = Holder::from_json(&body["holder"]);
            let acts_for = |issuer: &str, subject: &str| {
                text(principal, "issuer").as_deref() == Some(issuer)
                    && text(principal, "subject").as_deref() == Some(subject)
            };
            let held_by = |issuer: &str, subject: &str| {
                holder.as_ref().is_some_and(|holder| holder.issuer == issuer && holder.subject == subject)
            };
            let hit = match event {
                PrincipalEvent::TokensRevoked { issuer, subject } | PrincipalEvent::RoleChanged { issuer, subject } => {
                    acts_for(issuer, subject) || held_by(issuer, subject)
                }
                PrincipalEvent::TenantSwitched { issuer, subject, from_tenant } => {
                    acts_for(issuer, subject) && text(principal, "tenant").as_deref() == Some(from_tenant.as_str())
                }
                PrincipalEvent::ClientRevoked { client } => {
                    text(principal, "client").as_deref() == Some(client.as_str())
                        || holder.as_ref().is_some_and(|holder| &holder.client == client)
                }
            };
            if hit && self.store.revoke_delegation(row.digest, now).await? {
                revoked += 1;
            }
        }
        Ok(revoked)
    }
}

/// The capability `digest` as its live `chain` (root first) says, if `holder` holds it: the one
/// way a [`Delegated`] is made (the stage's lookup and a task's re-check). The error is the
/// audit record's reason.
fn verified(digest: [u8; 32], chain: &[(DelegationRow, Value)], holder: &Holder) -> Result<Delegated, &'static str> {
    let (leaf, body) = chain.last().ok_or("unknown")?;
    if Holder::from_json(&body["holder"]).as_ref() != Some(holder) {
        return Err("another holder");
    }
    let grant = Grant::from_json(&body["grant"]).ok_or("corrupt row")?;
    Ok(Delegated {
        digest,
        depth: leaf.depth,
        agents: agents_of(chain),
        holder: holder.clone(),
        grant,
        expires_ms: leaf.expires_ms,
    })
}

/// The holder identity of a verified caller (an agent without an OAuth client holds nothing).
fn holder_of(principal: &VerifiedPrincipal) -> Option<Holder> {
    Some(Holder {
        issuer: principal.issuer().to_owned(),
        subject: principal.subject().to_owned(),
        client: principal.client_id()?.to_owned(),
    })
}

/// The agent ids of a chain, root first (duplicates kept out).
fn agents_of(chain: &[(DelegationRow, Value)]) -> Vec<String> {
    let mut agents: Vec<String> = Vec::with_capacity(chain.len());
    for (row, _) in chain {
        if !agents.contains(&row.agent) {
            agents.push(row.agent.clone());
        }
    }
    agents
}

/// The digest of a well-formed reference (`pcap_` + 43 base64url characters).
fn parse_reference(reference: &str) -> Option<[u8; 32]> {
    let body = reference.strip_prefix(REFERENCE_PREFIX)?;
    let raw = URL_SAFE_NO_PAD.decode(body).ok()?;
    (raw.len() == 32 && body.len() == 43).then(|| sha256(reference.as_bytes()))
}

/// A capability id (64 lowercase hex digits) as bytes.
fn parse_id(id: &str) -> Option<[u8; 32]> {
    palisade_base::hex::decode32(id)
}

/// The id a stored principal's capability has, and its holder (a task created under one).
pub(crate) fn stored_delegation(stored: &Value) -> Option<([u8; 32], Holder)> {
    let delegation = stored.get("delegation")?;
    Some((parse_id(delegation.get("id")?.as_str()?)?, Holder::from_json(delegation.get("holder")?)?))
}

fn check_text(text: &str) -> Option<()> {
    (!text.is_empty() && text.len() <= MAX_GRANT_ENTRY_BYTES && !text.chars().any(char::is_control)).then_some(())
}

/// A grant entry: a name, or a prefix followed by one `*` at the end.
fn check_entry(entry: &str) -> bool {
    check_text(entry).is_some() && !entry.trim_end_matches('*').contains('*') && entry.matches('*').count() <= 1
}
