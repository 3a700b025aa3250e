//! Carries a 2025-era client's answer to a server-to-client request (sampling, elicitation,
//! roots) to the instance that sent the request, when the client's POST landed on another
//! instance of the deployment: the answering instance admits the answer for its session as
//! today (authenticated caller, session owned by it), then publishes it on the deployment's
//! answer channel (`palisade:answers:<digest of public_url>`, beside the event channel of
//! `events_bridge.rs`); every instance hears it and only the one whose pending request
//! has that session digest and that request id takes it.
//!
//! Each message is authenticated with HMAC-SHA256 under a key derived from the server secret
//! (which every instance of a deployment shares; [`ANSWER_RELAY_KEY_LABEL`]), over the session
//! digest, the request id and the answer's exact bytes, so nothing on the Redis side can forge,
//! alter or move an answer to another session or request. Messages are bounded and parsed
//! strictly; an oversized, malformed or unauthenticated one is dropped and counted
//! (`palisade_answer_relay_dropped_total{reason}`), never delivered. A replay finds nothing:
//! request ids are random and each is answered once.

use std::sync::Arc;

use aws_lc_rs::hmac;
use palisade_server::server::Server;
use palisade_server::sessions::{AnswerRelay, RelayedAnswer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use palisade_server::sessions::ANSWER_RELAY_KEY_LABEL;

/// The largest answer (its JSON text) that is relayed; the POST of a larger one is refused
/// (answered as when no request waits for it).
pub const MAX_ANSWER_BYTES: usize = 256 * 1024;
/// The largest message accepted from the channel: the answer text may double when escaped
/// into the message's JSON string.
const MAX_MESSAGE_BYTES: usize = 2 * MAX_ANSWER_BYTES + 1024;
/// Answers waiting for the publisher; with the queue full the POST is refused, not held.
const QUEUE: usize = 256;
/// Request ids this server mints: `palisade-` and 32 lowercase hex digits.
const REQUEST_ID_PREFIX: &str = "palisade-";

/// One message on the answer channel.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Message {
    /// The publishing instance: an instance ignores its own messages.
    origin: String,
    /// SHA-256 of the session id, 64 lowercase hex digits.
    session: String,
    /// The server request's id.
    id: String,
    /// The client's JSON-RPC response, as the exact text the tag covers.
    answer: String,
    /// HMAC-SHA256 over [`signed_bytes`], 64 lowercase hex digits.
    tag: String,
}

/// Why a message was dropped (the metric's `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    Oversized,
    Malformed,
    Forged,
}

impl Dropped {
    fn as_str(self) -> &'static str {
        use palisade_server::metrics::RELAY_DROP_REASONS;
        match self {
            Self::Oversized => RELAY_DROP_REASONS[0],
            Self::Malformed => RELAY_DROP_REASONS[1],
            Self::Forged => RELAY_DROP_REASONS[2],
        }
    }
}

/// The answer channel of the deployment whose events go on `events_channel`.
pub fn channel(events_channel: &str) -> String {
    events_channel.replacen("palisade:events:", "palisade:answers:", 1)
}

/// What the tag covers: a domain label, the session digest, the request id and the answer,
/// each length-prefixed so no two different triples give the same bytes.
fn signed_bytes(session: &[u8; 32], id: &str, answer: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(64 + id.len() + answer.len());
    bytes.extend_from_slice(b"palisade answer relay v1\0");
    bytes.extend_from_slice(session);
    for part in [id.as_bytes(), answer.as_bytes()] {
        bytes.extend_from_slice(&u64::try_from(part.len()).unwrap_or(u64::MAX).to_be_bytes());
        bytes.extend_from_slice(part);
    }
    bytes
}

/// The message for `answer`, or `None` when its text is over [`MAX_ANSWER_BYTES`].
pub fn encode(key: &hmac::Key, origin: &str, answer: &RelayedAnswer) -> Option<String> {
    let text = serde_json::to_string(&answer.answer).ok()?;
    if text.len() > MAX_ANSWER_BYTES {
        return None;
    }
    let tag = hmac::sign(key, &signed_bytes(&answer.session, &answer.id, &text));
    let message = Message {
        origin: origin.to_owned(),
        session: palisade_base::hex::hex(&answer.session),
        id: answer.id.clone(),
        answer: text,
        tag: palisade_base::hex::hex(tag.as_ref()),
    };
    serde_json::to_string(&message).ok()
}

/// The answer a channel message carries: `Ok(None)` for one of this instance's own messages,
/// `Err` for one to drop and count.
pub fn decode(key: &hmac::Key, own_origin: &str, payload: &[u8]) -> Result<Option<RelayedAnswer>, Dropped> {
    if payload.len() > MAX_MESSAGE_BYTES {
        return Err(Dropped::Oversized);
    }
    let message: Message = serde_json::from_slice(payload).map_err(|_| Dropped::Malformed)?;
    if message.origin == own_origin {
        return Ok(None);
    }
    let session = lower_hex::<32>(&message.session).ok_or(Dropped::Malformed)?;
    let tag = lower_hex::<32>(&message.tag).ok_or(Dropped::Malformed)?;
    let id_ok = message.id.strip_prefix(REQUEST_ID_PREFIX).is_some_and(|rest| lower_hex::<16>(rest).is_some());
    if !id_ok || message.answer.len() > MAX_ANSWER_BYTES {
        return Err(Dropped::Malformed);
    }
    hmac::verify(key, &signed_bytes(&session, &message.id, &message.answer), &tag).map_err(|_| Dropped::Forged)?;
    // Authentic: what the answering instance admitted. Still parsed strictly, and it must be a
    // response to that very request.
    let answer = match palisade_wire::strict::from_slice(message.answer.as_bytes()) {
        Ok(Value::Object(answer)) => answer,
        _ => return Err(Dropped::Malformed),
    };
    if !is_response_to(&answer, &message.id) {
        return Err(Dropped::Malformed);
    }
    Ok(Some(RelayedAnswer { session, id: message.id, answer }))
}

fn is_response_to(answer: &Map<String, Value>, id: &str) -> bool {
    answer.get("id").and_then(Value::as_str) == Some(id)
        && !answer.contains_key("method")
        && (answer.contains_key("result") || answer.contains_key("error"))
}

/// Exactly `2 * N` lowercase hex digits.
fn lower_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let bytes = text.as_bytes();
    if bytes.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (slot, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *slot = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

/// The sending side: [`AnswerRelay`] for the session service, feeding [`publish_loop`].
struct RedisRelay {
    key: hmac::Key,
    origin: String,
    queue: mpsc::Sender<String>,
}

impl AnswerRelay for RedisRelay {
    fn forward(&self, answer: RelayedAnswer) -> bool {
        let Some(message) = encode(&self.key, &self.origin, &answer) else {
            tracing::info!(stage = "session", "a client answer too large to relay to another instance was refused");
            return false;
        };
        self.queue.try_send(message).is_ok()
    }
}

/// Installs the relay on `server`'s sessions and starts publishing; the receiving side is
/// [`receive`], called by the event bridge's subscriber for messages on [`channel`].
pub fn start(
    server: &Server,
    key: hmac::Key,
    origin: String,
    client: redis::Client,
    connection: redis::aio::MultiplexedConnection,
    channel: String,
    shutdown: CancellationToken,
) {
    let Some(sessions) = server.sessions() else { return };
    let (queue, messages) = mpsc::channel(QUEUE);
    if !sessions.pending().set_relay(Arc::new(RedisRelay { key, origin, queue })) {
        tracing::warn!("an answer relay was already installed; keeping it");
        return;
    }
    tokio::spawn(publish_loop(client, connection, channel, messages, shutdown));
}

async fn publish_loop(
    client: redis::Client,
    mut connection: redis::aio::MultiplexedConnection,
    channel: String,
    mut messages: mpsc::Receiver<String>,
    shutdown: CancellationToken,
) {
    loop {
        let message = tokio::select! {
            () = shutdown.cancelled() => return,
            message = messages.recv() => message,
        };
        let Some(message) = message else { return };
        if !crate::redis_publish::publish(&client, &mut connection, &channel, &message, &shutdown, "a client answer")
            .await
        {
            return;
        }
    }
}

/// A message heard on the answer channel: delivered to this instance's pending request of the
/// same session and id, if there is one; dropped and counted if it is not authentic.
pub fn receive(server: &Server, key: &hmac::Key, own_origin: &str, payload: &[u8]) {
    match decode(key, own_origin, payload) {
        Ok(Some(answer)) => {
            if let Some(sessions) = server.sessions() {
                // Every instance hears every answer; only the one holding the request takes it.
                let _ = sessions.pending().resolve(answer.session, &answer.id, Value::Object(answer.answer));
            }
        }
        Ok(None) => {}
        Err(reason) => {
            tracing::warn!(reason = reason.as_str(), "a message on the answer relay channel was dropped");
            server.metrics().observe_relay_drop(reason.as_str());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> hmac::Key {
        palisade_server::secret::ServerSecret::from_bytes([byte; 32]).derive(ANSWER_RELAY_KEY_LABEL)
    }

    fn answer(id: &str) -> RelayedAnswer {
        let body = serde_json::json!({ "jsonrpc": "2.0", "id": id, "result": { "action": "accept" } });
        RelayedAnswer { session: [3; 32], id: id.to_owned(), answer: serde_json::from_value(body).unwrap() }
    }

    const ID: &str = "palisade-0123456789abcdef0123456789abcdef";

    #[test]
    fn an_authentic_answer_of_another_instance_is_taken_as_sent() {
        let message = encode(&key(1), "a", &answer(ID)).unwrap();
        assert_eq!(decode(&key(1), "b", message.as_bytes()), Ok(Some(answer(ID))));
        assert_eq!(decode(&key(1), "a", message.as_bytes()), Ok(None), "its own message");
    }

    #[test]
    fn anything_not_signed_by_the_deployment_is_dropped() {
        let message = encode(&key(1), "a", &answer(ID)).unwrap();
        assert_eq!(decode(&key(2), "b", message.as_bytes()), Err(Dropped::Forged), "another secret");
        let mut fields: Map<String, Value> = serde_json::from_str(&message).unwrap();
        // Moved to another session, or to another request, the tag no longer matches.
        let mut moved = fields.clone();
        moved.insert("session".into(), Value::String("04".repeat(32)));
        let moved = serde_json::to_vec(&moved).unwrap();
        assert_eq!(decode(&key(1), "b", &moved), Err(Dropped::Forged));
        let other_id = "palisade-ffffffffffffffffffffffffffffffff";
        let mut retargeted = fields.clone();
        retargeted.insert("id".into(), Value::String(other_id.into()));
        assert_eq!(decode(&key(1), "b", &serde_json::to_vec(&retargeted).unwrap()), Err(Dropped::Forged));
        let mut altered = fields.clone();
        let text = altered["answer"].as_str().unwrap().replace("accept", "decline");
        altered.insert("answer".into(), Value::String(text));
        assert_eq!(decode(&key(1), "b", &serde_json::to_vec(&altered).unwrap()), Err(Dropped::Forged));
        // Shape: unknown fields, bad hex, foreign ids, not JSON.
        fields.insert("extra".into(), Value::Bool(true));
        assert_eq!(decode(&key(1), "b", &serde_json::to_vec(&fields).unwrap()), Err(Dropped::Malformed));
        assert_eq!(decode(&key(1), "b", b"not json"), Err(Dropped::Malformed));
        let upper = message.replace(&"03".repeat(32), &"0A".repeat(32));
        assert_eq!(decode(&key(1), "b", upper.as_bytes()), Err(Dropped::Malformed));
        assert!(
            encode(&key(1), "a", &answer("not-ours"))
                .is_some_and(|m| decode(&key(1), "b", m.as_bytes()) == Err(Dropped::Malformed))
        );
        let huge = vec![b' '; MAX_MESSAGE_BYTES + 1];
        assert_eq!(decode(&key(1), "b", &huge), Err(Dropped::Oversized));
    }

    #[test]
    fn an_authentic_message_must_still_be_a_response_to_its_request() {
        let mut wrong = answer(ID);
        wrong.answer.insert("id".into(), Value::String("palisade-ffffffffffffffffffffffffffffffff".into()));
        let message = encode(&key(1), "a", &wrong).unwrap();
        assert_eq!(decode(&key(1), "b", message.as_bytes()), Err(Dropped::Malformed));
        let mut request = answer(ID);
        request.answer.insert("method".into(), Value::String("x".into()));
        let message = encode(&key(1), "a", &request).unwrap();
        assert_eq!(decode(&key(1), "b", message.as_bytes()), Err(Dropped::Malformed));
    }

    #[test]
    fn large_answers_are_not_relayed() {
        let mut big = answer(ID);
        big.answer.insert("pad".into(), Value::String("x".repeat(MAX_ANSWER_BYTES)));
        assert_eq!(encode(&key(1), "a", &big), None);
    }

    #[test]
    fn the_answer_channel_sits_beside_the_event_channel() {
        assert_eq!(channel("palisade:events:00ff"), "palisade:answers:00ff");
    }
}
