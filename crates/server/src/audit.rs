//! The record of decisions (control C11): the audit trail of one request, written at each
//! decision point; the `Allowed` proof the handler needs; the keyed principal digests every
//! record carries; trace ids.
//!
//! Knows the audit writer, the metrics and the clock, not the stages: a stage tells its trail
//! what it decided. Never records a token, an argument or a raw handle.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use palisade_store::{AuditRecord, AuditWriter, Decision};
use palisade_wire::{ProtocolError, RequestId};

use crate::auth::VerifiedPrincipal;
use crate::clock::Clock;
use crate::delegated::Delegated;
use crate::method::{Method, OperationKey};
use crate::metrics::{CallOutcome, Metrics, ToolSeries};
use crate::reply::Reply;

/// The stages a decision is recorded at (the `stage` of an audit record, a metric label and a
/// trace attribute). The string forms are the audit log's format: never renamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditStage {
    /// The HTTP transport's own refusals (aggregated; see `refusals`).
    Transport,
    /// Stage 1: the message's shape, headers and version.
    Envelope,
    /// Stage 2: the credential.
    Authenticate,
    /// Stage 2b (2025-era wire): the caller's session.
    Session,
    /// Stage 3: the operation key.
    Classify,
    /// Stage 3b: a presented delegation capability (validity, method and target inside it; and,
    /// just before the allow, its call budget).
    Delegation,
    /// Stage 3c: the operator's policies.
    Policy,
    /// Stage 3d: the operator's rate limits and quotas (or their store, failing closed).
    RateLimit,
    /// Stage 4: the kill switch (and, after the handler, a fenced tool's missing fence).
    KillSwitch,
    /// Stage 5: the operation's scopes.
    Authorize,
    /// Stage 6: handle arguments.
    Handles,
    /// The allow decision could not be made durable.
    Audit,
    /// After the allow: the handler, its state and its result.
    Dispatch,
    /// After the allow: arguments refused by the tool's schema (answered as a tool error).
    Arguments,
    /// After the allow: a declined or stale confirmation (answered as a tool error).
    Confirmation,
}

impl AuditStage {
    /// The stage's name in the audit log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transport => "transport",
            Self::Envelope => "envelope",
            Self::Authenticate => "authenticate",
            Self::Session => "session",
            Self::Classify => "classify",
            Self::Delegation => "delegation",
            Self::Policy => "policy",
            Self::RateLimit => "rate_limit",
            Self::KillSwitch => "killswitch",
            Self::Authorize => "authorize",
            Self::Handles => "handles",
            Self::Audit => "audit",
            Self::Dispatch => "dispatch",
            Self::Arguments => "arguments",
            Self::Confirmation => "confirmation",
        }
    }
}

/// Proof that an allow decision is on the record: only [`AuditTrail::allow`] makes one, and
/// every handler runs only with one in hand (`execute.rs`).
#[derive(Debug)]
pub(crate) struct Allowed(());

/// Where one server's decisions go: its hash-chained log (when it has one), its metrics, and the
/// keyed digests of principals. Shared by the request path and the task workers.
pub(crate) struct Recorder {
    pub(crate) writer: Option<Arc<AuditWriter>>,
    pub(crate) digester: PrincipalDigester,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) metrics: Arc<Metrics>,
}

/// What the audit record of one request says, written at each decision point.
pub(crate) struct AuditTrail<'a> {
    recorder: &'a Recorder,
    trace_id: String,
    operation: String,
    principal: Option<Arc<VerifiedPrincipal>>,
    /// Digest prefixes of the handles involved (or the task), and policy versions.
    pub(crate) detail: Option<String>,
    pub(crate) policy_version: Option<String>,
    /// The delegation capability presented (digest prefix, chain depth, agent digest), kept
    /// apart from `detail` so later stages do not overwrite it.
    delegation: Option<String>,
    /// The policy decision (set digest, deciding policy ids), kept apart like `delegation`.
    policy: Option<String>,
    /// The request's trace span (disabled unless trace export is on; see [`crate::telemetry`]).
    span: tracing::Span,
    /// The series of the tool a `tools/call` targets, once classified.
    tool: Option<Arc<ToolSeries>>,
    /// A stage refused the request.
    refused: AtomicBool,
    /// The caller cancelled the request or went away (not a decision).
    cancelled: AtomicBool,
}

impl<'a> AuditTrail<'a> {
    /// A trail without a trace span, named `what` until classification names the operation.
    pub(crate) fn new(recorder: &'a Recorder, what: &str) -> Self {
        Self::traced(recorder, what, tracing::Span::none(), None)
    }

    /// A trail whose trace id is the span's when trace export is on, else a fresh random one.
    pub(crate) fn traced(recorder: &'a Recorder, method: &str, span: tracing::Span, trace_id: Option<String>) -> Self {
        let trace_id = trace_id.unwrap_or_else(fresh_trace_id);
        // Until classification, the operation is the method name as sent, cut to a sane length.
        let operation = method.chars().take(64).collect();
        Self {
            recorder,
            trace_id,
            operation,
            principal: None,
            detail: None,
            policy_version: None,
            delegation: None,
            policy: None,
            span,
            tool: None,
            refused: AtomicBool::new(false),
            cancelled: AtomicBool::new(false),
        }
    }

    /// The authenticated caller the decisions are about.
    pub(crate) fn principal(&mut self, principal: &Arc<VerifiedPrincipal>) {
        self.principal = Some(principal.clone());
    }

    /// The delegation capability the decisions are about, before it was verified: its digest
    /// prefix only.
    pub(crate) fn presented_capability(&mut self, digest: &[u8; 32]) {
        self.delegation = Some(format!("delegation={}", palisade_store::hex_prefix(digest)));
    }

    /// The verified capability the request runs under: digest prefix, depth in the graph, and
    /// the keyed digest of the agent that called (`agent_digest`, the delegation service's).
    pub(crate) fn delegation(&mut self, delegated: &Delegated, agent_digest: &str) {
        self.delegation = Some(format!(
            "delegation={} depth={} agent={}",
            palisade_store::hex_prefix(delegated.digest()),
            delegated.depth(),
            agent_digest
        ));
    }

    /// The operator policies' decision: the set's digest and the ids of the policies that made
    /// it (on this request's every later record, the allow included).
    pub(crate) fn policy(&mut self, decision: String) {
        self.policy = Some(decision);
    }

    /// The classified operation the decisions are about.
    pub(crate) fn operation(&mut self, operation: &OperationKey) {
        self.operation = operation.to_string();
        if let Some(origin) = operation.origin() {
            self.detail = Some(origin.audit_detail.clone());
        }
        if operation.method() == Method::ToolsCall
            && let Some(tool) = operation.target()
        {
            let upstream = operation.origin().map(|origin| origin.upstream.as_str());
            self.tool = Some(self.recorder.metrics.tool(tool, upstream));
        }
        crate::telemetry::operation(&self.span, &self.operation);
    }

    fn record(&self, stage: AuditStage, decision: Decision, code: Option<i64>) -> AuditRecord {
        let principal = self.principal.as_deref();
        let digests = self.recorder.digester.digests(principal);
        AuditRecord {
            at_ms: self.recorder.clock.now_unsigned_ms(),
            trace_id: self.trace_id.clone(),
            stage: stage.as_str().to_owned(),
            decision,
            operation: self.operation.clone(),
            principal_digest: digests.principal,
            tenant_digest: digests.tenant,
            client_digest: digests.client,
            scopes: principal.map(VerifiedPrincipal::scopes).unwrap_or_default(),
            policy_version: self.policy_version.clone(),
            code,
            detail: {
                let parts: Vec<&str> =
                    [&self.detail, &self.delegation, &self.policy].into_iter().flatten().map(String::as_str).collect();
                (!parts.is_empty()).then(|| parts.join(" "))
            },
        }
    }

    /// Records the allow decision; an error means it is not durable and the request must stop.
    pub(crate) async fn allow(&self, stage: AuditStage) -> Result<Allowed, ProtocolError> {
        self.recorder.metrics.observe_decision(stage.as_str(), "allow");
        crate::telemetry::decision(&self.span, stage.as_str(), "allow", None);
        // Allows are the common case and are in the audit log: debug level keeps the log cheap.
        tracing::debug!(trace_id = %self.trace_id, stage = stage.as_str(), decision = "allow", operation = %self.operation, "decision");
        let Some(writer) = &self.recorder.writer else { return Ok(Allowed(())) };
        writer.append(self.record(stage, Decision::Allow, None)).await.map_err(|error| {
            self.recorder.metrics.observe_audit_append_failure();
            tracing::error!(trace_id = %self.trace_id, %error, "audit log unavailable: refusing the request");
            ProtocolError::Unavailable
        })?;
        Ok(Allowed(()))
    }

    /// For a task segment that makes no decision of its own (the server runs no kill switch):
    /// the allow its request made durable before the task was created is the one it runs under.
    pub(crate) fn allowed_by_request(&self) -> Allowed {
        Allowed(())
    }

    /// Records a refusal that is answered with a result rather than an error (arguments that
    /// fail the tool's schema, a declined confirmation). It stands even if it cannot be recorded.
    pub(crate) async fn deny(&self, stage: AuditStage, code: Option<i64>) {
        self.recorder.metrics.observe_decision(stage.as_str(), "deny");
        self.refused.store(true, Ordering::Relaxed);
        if let Some(tool) = &self.tool {
            self.recorder.metrics.observe_tool_refusal(tool, stage.as_str());
        }
        crate::telemetry::decision(&self.span, stage.as_str(), "deny", code);
        tracing::info!(trace_id = %self.trace_id, stage = stage.as_str(), decision = "deny", code, operation = %self.operation, "decision");
        if let Some(writer) = &self.recorder.writer
            && let Err(audit_error) = writer.append(self.record(stage, Decision::Deny, code)).await
        {
            self.recorder.metrics.observe_audit_append_failure();
            tracing::error!(trace_id = %self.trace_id, %audit_error, "audit log unavailable while refusing");
        }
    }

    /// The caller cancelled the request or went away before its answer: not a decision (the
    /// allow stands on the record, nothing is refused), so neither a deny nor a log line at
    /// `info`; the transport sends nothing.
    pub(crate) fn cancelled(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
        tracing::debug!(trace_id = %self.trace_id, operation = %self.operation, "request cancelled by its caller");
    }

    /// The kill switch's check took `elapsed`.
    pub(crate) fn observe_killswitch_check(&self, elapsed: std::time::Duration) {
        self.recorder.metrics.observe_killswitch_check(elapsed);
    }

    /// Counts the finished request under its tool (a `tools/call` of a registered tool): its
    /// outcome from the decisions made and the `reply`, and its latency.
    pub(crate) fn finish_tool_call(&self, reply: &Reply, elapsed: std::time::Duration) {
        let Some(tool) = &self.tool else { return };
        let outcome = if self.cancelled.load(Ordering::Relaxed) {
            CallOutcome::Cancelled
        } else if self.refused.load(Ordering::Relaxed) {
            CallOutcome::Refused
        } else if reply.frame.get("error").is_some()
            || reply.frame.pointer("/result/isError").and_then(serde_json::Value::as_bool) == Some(true)
        {
            CallOutcome::Error
        } else {
            CallOutcome::Ok
        };
        self.recorder.metrics.observe_tool_call(tool, outcome, elapsed);
    }

    /// Records a refusal and builds its reply. A refusal stands even if it cannot be recorded.
    pub(crate) async fn refuse(
        &self,
        id: &RequestId,
        stage: AuditStage,
        error: &ProtocolError,
        challenge: Option<String>,
    ) -> Reply {
        self.refuse_any(Some(id), stage, error, challenge).await
    }

    /// [`refuse`](Self::refuse) for a message that has no JSON-RPC id.
    pub(crate) async fn refuse_any(
        &self,
        id: Option<&RequestId>,
        stage: AuditStage,
        error: &ProtocolError,
        challenge: Option<String>,
    ) -> Reply {
        self.deny(stage, Some(error.code())).await;
        Reply { challenge, ..Reply::error(id, error) }
    }
}

/// The audit record's principal partition: keyed digests (HMAC-SHA-256 under the server's
/// audit-digest key, first 16 bytes in hex) of `issuer#subject`, the tenant and the client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PrincipalDigests {
    pub principal: Option<String>,
    pub tenant: Option<String>,
    pub client: Option<String>,
}

impl PrincipalDigests {
    fn of(key: &aws_lc_rs::hmac::Key, principal: &VerifiedPrincipal) -> Self {
        let digest = |value: &str| keyed_digest(key, value);
        PrincipalDigests {
            principal: Some(principal_digest(key, principal.issuer(), principal.subject())),
            tenant: principal.tenant().map(digest),
            client: principal.client_id().map(digest),
        }
    }
}

/// Principals whose digests a [`PrincipalDigester`] remembers; past this many it starts afresh.
const RECENT_PRINCIPALS: usize = 4096;

/// Computes the audit digests of principals and remembers those of recent ones: a server sees
/// the same principals over and over, and three HMACs per decision were about 2 µs of the read
/// path. A remembered entry is keyed by the principal's whole identity (issuer, subject, tenant,
/// client, length-prefixed), so it can only ever answer for that identity.
pub(crate) struct PrincipalDigester {
    key: aws_lc_rs::hmac::Key,
    recent: std::sync::Mutex<HashMap<String, PrincipalDigests>>,
}

impl PrincipalDigester {
    pub(crate) fn new(key: aws_lc_rs::hmac::Key) -> Self {
        Self { key, recent: std::sync::Mutex::new(HashMap::new()) }
    }

    /// The audit-digest key.
    pub(crate) fn key(&self) -> &aws_lc_rs::hmac::Key {
        &self.key
    }

    /// The digests of `principal` (all absent without one).
    pub(crate) fn digests(&self, principal: Option<&VerifiedPrincipal>) -> PrincipalDigests {
        let Some(principal) = principal else { return PrincipalDigests::default() };
        let identity = identity_key(principal);
        if let Some(known) = self.recent().get(&identity) {
            return known.clone();
        }
        let digests = PrincipalDigests::of(&self.key, principal);
        let mut recent = self.recent();
        if recent.len() >= RECENT_PRINCIPALS {
            recent.clear();
        }
        recent.insert(identity, digests.clone());
        digests
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, HashMap<String, PrincipalDigests>> {
        // The map holds only derived values: a panic elsewhere cannot leave a wrong entry.
        self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An unambiguous key for a principal's identity: each part as `length:text`, an absent part
/// as `-`.
fn identity_key(principal: &VerifiedPrincipal) -> String {
    use std::fmt::Write as _;
    let mut key = String::with_capacity(64);
    for part in [Some(principal.issuer()), Some(principal.subject()), principal.tenant(), principal.client_id()] {
        match part {
            Some(text) => {
                let _ = write!(key, "{}:{text}", text.len());
            }
            None => key.push('-'),
        }
    }
    key
}

/// A random 128-bit trace id in hex. Not a secret: an RNG failure only costs uniqueness.
///
/// The bytes come from a per-thread block of system CSPRNG output, refilled every
/// [`TRACE_ID_BLOCK`] ÷ 16 ids: one `fill` per request cost about 2 µs, a tenth of the
/// pipeline's own work per request.
pub fn fresh_trace_id() -> String {
    thread_local! {
        static BLOCK: std::cell::RefCell<TraceIdBlock> = const {
            std::cell::RefCell::new(TraceIdBlock { bytes: [0; TRACE_ID_BLOCK], used: TRACE_ID_BLOCK })
        };
    }
    BLOCK.with_borrow_mut(|block| {
        if block.used == TRACE_ID_BLOCK {
            let _ = aws_lc_rs::rand::fill(&mut block.bytes);
            block.used = 0;
        }
        let id = &mut block.bytes[block.used..block.used + 16];
        let hex = palisade_base::hex::hex(id);
        // Handed out once: wiped so that the block never holds an id already given.
        id.fill(0);
        block.used += 16;
        hex
    })
}

/// Bytes of randomness fetched at once for trace ids (256 ids).
const TRACE_ID_BLOCK: usize = 4096;

struct TraceIdBlock {
    bytes: [u8; TRACE_ID_BLOCK],
    used: usize,
}

/// The `principal_digest` of audit records made for `subject` of `issuer`, under the
/// audit-digest key ([`ServerSecret::audit_digest_key`](crate::secret::ServerSecret::audit_digest_key)):
/// how a reader holding the server secret finds a person's records.
pub fn principal_digest(key: &aws_lc_rs::hmac::Key, issuer: &str, subject: &str) -> String {
    keyed_digest(key, &format!("{issuer}#{subject}"))
}

pub(crate) fn keyed_digest(key: &aws_lc_rs::hmac::Key, value: &str) -> String {
    let tag = aws_lc_rs::hmac::sign(key, value.as_bytes());
    palisade_base::hex::hex(&tag.as_ref()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(issuer: &str, subject: &str, tenant: Option<&str>, client: Option<&str>) -> VerifiedPrincipal {
        let stored = serde_json::json!({
            "issuer": issuer, "subject": subject, "tenant": tenant, "client": client, "scopes": [],
        });
        VerifiedPrincipal::from_stored(&stored).unwrap()
    }

    #[test]
    fn remembered_principal_digests_answer_only_for_their_own_identity() {
        let key = || aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, b"test audit-digest key");
        let digester = PrincipalDigester::new(key());
        // Identities that a naive concatenation would confuse, and absent vs empty parts.
        let principals = [
            principal("https://a", "x#y", Some("t"), Some("c")),
            principal("https://a#x", "y", Some("t"), Some("c")),
            principal("https://a", "x#y", Some("tc"), None),
            principal("https://a", "x#y", None, Some("tc")),
            principal("https://a", "x#y", Some(""), Some("c")),
            principal("https://a", "x#y", None, Some("c")),
        ];
        let keys: std::collections::HashSet<String> = principals.iter().map(identity_key).collect();
        assert_eq!(keys.len(), principals.len(), "identity keys must be distinct");
        // Twice over: the second round answers from memory, and must equal a fresh computation.
        for _ in 0..2 {
            for principal in &principals {
                assert_eq!(digester.digests(Some(principal)), PrincipalDigests::of(&key(), principal));
            }
        }
        assert_eq!(digester.digests(None), PrincipalDigests::default());
        // Past capacity the memory starts afresh and answers stay right.
        for n in 0..RECENT_PRINCIPALS + 10 {
            let many = principal("https://a", &format!("user{n}"), Some("t"), None);
            assert_eq!(digester.digests(Some(&many)), PrincipalDigests::of(&key(), &many));
        }
        assert!(digester.recent().len() <= RECENT_PRINCIPALS);
        assert_eq!(digester.digests(Some(&principals[0])), PrincipalDigests::of(&key(), &principals[0]));
    }

    #[test]
    fn trace_ids_are_distinct_across_block_refills() {
        // Three blocks' worth, from two threads: every id 32 lowercase hex digits, none repeated,
        // none all zeros (a wiped, re-served slot would be).
        let ids: Vec<String> = (0..3 * TRACE_ID_BLOCK / 16).map(|_| fresh_trace_id()).collect();
        let other = std::thread::spawn(|| (0..300).map(|_| fresh_trace_id()).collect::<Vec<_>>()).join().unwrap();
        let mut seen = std::collections::HashSet::new();
        for id in ids.iter().chain(&other) {
            assert_eq!(id.len(), 32, "{id}");
            assert!(id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)), "{id}");
            assert_ne!(id, &"0".repeat(32));
            assert!(seen.insert(id.clone()), "trace id {id} handed out twice");
        }
    }
}
