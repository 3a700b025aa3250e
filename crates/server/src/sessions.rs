//! Sessions of the 2025-era wire (`initialize`, `Mcp-Session-Id`), protected like handles and
//! never treated as identity:
//!
//! - an id is 256 bits from the system CSPRNG (base64url, visible ASCII); only its SHA-256 is
//!   stored, with the owner (a keyed digest of issuer + subject, the tenant, the client) of the
//!   principal that sent `initialize`, an idle and an absolute expiry;
//! - every request re-authenticates its bearer token, and the session is looked up by digest
//!   *and* that principal's owner in one statement: a stolen id presented by anyone else, an
//!   expired or deleted id, or an id without a token finds nothing (404, or 401 without a token);
//! - the state (negotiated version, client capabilities, log level, subscriptions) lives in the
//!   store, so any instance serves any request of a session. Only live SSE streams and
//!   server-to-client requests awaiting their answer are per instance ([`PendingRequests`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use aws_lc_rs::hmac;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_store::{LiveSession, NewSession, SessionOwner, SessionStore};
use palisade_wire::ProtocolError;
use serde_json::{Map, Value};
use tokio::sync::oneshot;

use crate::auth::VerifiedPrincipal;
use crate::clock::Clock;
use crate::config::LegacyConfig;

/// Shortest and longest `Mcp-Session-Id` value accepted (ours are 43 characters).
const MIN_ID_LEN: usize = 16;
const MAX_ID_LEN: usize = 128;

/// A session id as the client sent it, checked for shape only.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionId(String);

impl std::fmt::Debug for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionId({})", palisade_store::hex_prefix(&self.digest()))
    }
}

impl SessionId {
    /// Reads a header value: visible ASCII, 16..=128 characters; anything else is `None`.
    pub fn parse(raw: &[u8]) -> Option<Self> {
        let valid = (MIN_ID_LEN..=MAX_ID_LEN).contains(&raw.len()) && raw.iter().all(|b| (0x21..=0x7e).contains(b));
        valid.then(|| Self(String::from_utf8_lossy(raw).into_owned()))
    }

    /// SHA-256 of the id: the only form that is stored or logged (as a prefix).
    pub fn digest(&self) -> [u8; 32] {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, self.0.as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(digest.as_ref());
        out
    }

    /// The id, to send back to its client once in the `initialize` response.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// A session admitted for one request: its digest, owner and stored state.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// SHA-256 of the session id.
    pub digest: [u8; 32],
    /// The owner it was matched against.
    pub owner: SessionOwner,
    /// The stored state, after this request's touch.
    pub state: LiveSession,
}

/// Creates and finds sessions; holds this instance's server-to-client requests in flight.
pub struct SessionService {
    store: Arc<dyn SessionStore>,
    subject_key: hmac::Key,
    config: LegacyConfig,
    pending: PendingRequests,
}

impl SessionService {
    /// A service over `store`; `subject_key` keys the owner digest.
    pub fn new(store: Arc<dyn SessionStore>, subject_key: hmac::Key, config: LegacyConfig) -> Self {
        Self { store, subject_key, config, pending: PendingRequests::default() }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn SessionStore> {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &LegacyConfig {
        &self.config
    }

    /// Server-to-client requests awaiting their answers on this instance.
    pub fn pending(&self) -> &PendingRequests {
        &self.pending
    }

    /// The owner a principal's sessions are bound to.
    pub fn owner(&self, principal: &VerifiedPrincipal) -> SessionOwner {
        let mut input = Vec::new();
        input.extend_from_slice(principal.issuer().as_bytes());
        input.push(0);
        input.extend_from_slice(principal.subject().as_bytes());
        let tag = hmac::sign(&self.subject_key, &input);
        let mut subject_key = [0u8; 32];
        subject_key.copy_from_slice(tag.as_ref());
        SessionOwner {
            subject_key,
            tenant: principal.tenant().unwrap_or_default().to_owned(),
            client: principal.client_id().unwrap_or_default().to_owned(),
        }
    }

    /// Creates a session for `principal`; returns the id, to be sent to the client once.
    pub async fn create(
        &self,
        principal: &VerifiedPrincipal,
        protocol_version: &str,
        client_capabilities: &Value,
        client_info: Option<&Value>,
        clock: &dyn Clock,
    ) -> Result<SessionId, ProtocolError> {
        let mut bytes = [0u8; 32];
        aws_lc_rs::rand::fill(&mut bytes).map_err(|_| {
            tracing::error!("random source failed: refusing to create a session");
            ProtocolError::Unavailable
        })?;
        let id = SessionId(URL_SAFE_NO_PAD.encode(bytes));
        let now = clock.now_ms();
        let idle_ms = to_i64(duration_ms(self.config.idle_timeout)).max(1);
        let expires_ms = now.saturating_add(to_i64(duration_ms(self.config.absolute_timeout)).max(1));
        let session = NewSession {
            digest: id.digest(),
            owner: self.owner(principal),
            protocol_version: protocol_version.to_owned(),
            client_capabilities: client_capabilities.to_string(),
            client_info: client_info.map(Value::to_string),
            created_ms: now,
            idle_ms,
            expires_ms,
        };
        self.store
            .insert_session(session)
            .await
            .map_err(|error| crate::store_errors::store_refusal("insert_session", &error))?;
        Ok(id)
    }

    /// The live session `id` of `principal`, touched now. Unknown, foreign, expired and deleted
    /// sessions are all [`ProtocolError::SessionNotFound`]; a store failure is `Unavailable`.
    pub async fn admit(
        &self,
        principal: &VerifiedPrincipal,
        id: &SessionId,
        clock: &dyn Clock,
    ) -> Result<Admitted, ProtocolError> {
        let owner = self.owner(principal);
        let digest = id.digest();
        let state = self
            .store
            .touch_session(digest, &owner, clock.now_ms())
            .await
            .map_err(|error| crate::store_errors::store_refusal("touch_session", &error))?
            .ok_or(ProtocolError::SessionNotFound)?;
        Ok(Admitted { digest, owner, state })
    }
}

fn duration_ms(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn to_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// The label of the HMAC key ([`crate::secret::ServerSecret::derive`]) that authenticates
/// answers relayed between the instances of one deployment.
pub const ANSWER_RELAY_KEY_LABEL: &str = "palisade/answer-relay/v1";

/// A client's answer that no request on this instance waits for, admitted here for its
/// session (same principal as today's checks), to be carried to the instance that sent the
/// request.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayedAnswer {
    /// SHA-256 of the session id the answer was admitted for.
    pub session: [u8; 32],
    /// The server request's id.
    pub id: String,
    /// The client's whole JSON-RPC response.
    pub answer: Map<String, Value>,
}

/// Carries answers to the other instances of a deployment.
pub trait AnswerRelay: Send + Sync {
    /// Hands `answer` over; `false` when it cannot be (too large to relay, queue full).
    fn forward(&self, answer: RelayedAnswer) -> bool;
}

/// Where a client's answer went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// To a request of this instance.
    Local,
    /// To the relay, for the instance that sent the request.
    Relayed,
    /// Nowhere: no request here, and no relay (or the relay refused it).
    Nowhere,
}

/// Server-to-client requests (sampling, elicitation, roots) sent on a POST's SSE stream and not
/// yet answered, keyed by session digest and request id: an answer counts only when it arrives
/// for the same session (and so from the same principal).
#[derive(Default)]
pub struct PendingRequests {
    waiting: Mutex<HashMap<PendingKey, oneshot::Sender<Value>>>,
    relay: OnceLock<Arc<dyn AnswerRelay>>,
}

/// Session digest and request id.
type PendingKey = ([u8; 32], String);

impl PendingRequests {
    /// Registers a new request for `session`; returns its unguessable id and where the answer
    /// arrives.
    pub fn register(&self, session: [u8; 32]) -> Result<(String, oneshot::Receiver<Value>), ProtocolError> {
        let mut bytes = [0u8; 16];
        aws_lc_rs::rand::fill(&mut bytes).map_err(|_| ProtocolError::Unavailable)?;
        let id: String = format!("palisade-{}", palisade_base::hex::hex(&bytes));
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner).insert((session, id.clone()), tx);
        Ok((id, rx))
    }

    /// Delivers a client's answer to a request of this instance; `false` when no request of
    /// that session has that id here. A relay's receiving side calls this for answers that
    /// another instance admitted.
    pub fn resolve(&self, session: [u8; 32], id: &str, answer: Value) -> bool {
        let sender = self.waiting.lock().unwrap_or_else(PoisonError::into_inner).remove(&(session, id.to_owned()));
        sender.is_some_and(|sender| sender.send(answer).is_ok())
    }

    /// Delivers an answer admitted on this instance: to its request here, else to the relay.
    pub fn deliver(&self, session: [u8; 32], id: &str, answer: Map<String, Value>) -> Delivery {
        let sender = self.waiting.lock().unwrap_or_else(PoisonError::into_inner).remove(&(session, id.to_owned()));
        if let Some(sender) = sender {
            return if sender.send(Value::Object(answer)).is_ok() { Delivery::Local } else { Delivery::Nowhere };
        }
        match self.relay.get() {
            Some(relay) if relay.forward(RelayedAnswer { session, id: id.to_owned(), answer }) => Delivery::Relayed,
            _ => Delivery::Nowhere,
        }
    }

    /// Sets where answers for requests of other instances go (once; `false` if already set).
    pub fn set_relay(&self, relay: Arc<dyn AnswerRelay>) -> bool {
        self.relay.set(relay).is_ok()
    }

    /// Forgets a request (answered, timed out or cancelled).
    pub fn forget(&self, session: [u8; 32], id: &str) {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner).remove(&(session, id.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_for_shape() {
        assert!(SessionId::parse(b"abcdefghijklmnop").is_some());
        assert!(SessionId::parse(b"short").is_none());
        assert!(SessionId::parse(&[b'a'; 129]).is_none());
        assert!(SessionId::parse(b"abcdefgh ijklmnop").is_none());
        assert!(SessionId::parse("abcdefghijklmnopé".as_bytes()).is_none());
    }

    #[test]
    fn answers_count_only_for_their_session() {
        let pending = PendingRequests::default();
        let (id, mut rx) = pending.register([1; 32]).expect("register");
        assert!(!pending.resolve([2; 32], &id, Value::Null));
        assert!(rx.try_recv().is_err());
        assert!(pending.resolve([1; 32], &id, Value::Bool(true)));
        assert_eq!(rx.try_recv().ok(), Some(Value::Bool(true)));
        assert!(!pending.resolve([1; 32], &id, Value::Null), "an answer is taken once");
    }

    struct Recorder(Mutex<Vec<RelayedAnswer>>, bool);

    impl AnswerRelay for Recorder {
        fn forward(&self, answer: RelayedAnswer) -> bool {
            self.0.lock().unwrap().push(answer);
            self.1
        }
    }

    #[test]
    fn an_answer_no_request_here_waits_for_goes_to_the_relay() {
        let pending = PendingRequests::default();
        let answer = |n: i64| serde_json::from_value::<Map<String, Value>>(serde_json::json!({ "n": n })).unwrap();
        assert_eq!(pending.deliver([1; 32], "x", answer(0)), Delivery::Nowhere, "no relay: as before");
        let (id, mut rx) = pending.register([1; 32]).expect("register");
        let relay = Arc::new(Recorder(Mutex::new(Vec::new()), true));
        assert!(pending.set_relay(relay.clone()));
        assert!(!pending.set_relay(relay.clone()), "set once");
        assert_eq!(pending.deliver([1; 32], &id, answer(1)), Delivery::Local);
        assert_eq!(rx.try_recv().ok(), Some(Value::Object(answer(1))));
        assert_eq!(pending.deliver([2; 32], "other", answer(2)), Delivery::Relayed);
        assert_eq!(
            *relay.0.lock().unwrap(),
            vec![RelayedAnswer { session: [2; 32], id: "other".into(), answer: answer(2) }]
        );
        let refusing = PendingRequests::default();
        assert!(refusing.set_relay(Arc::new(Recorder(Mutex::new(Vec::new()), false))));
        assert_eq!(refusing.deliver([2; 32], "other", answer(3)), Delivery::Nowhere);
    }
}
