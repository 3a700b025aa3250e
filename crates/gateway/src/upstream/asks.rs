//! Server-to-client requests an upstream sends while it serves a caller's call (on that call's
//! event stream, or on the caller's own stdio process): the transport hands each to the call's
//! [`Asks`] channel and writes back whatever the gateway answers ([`answer_frame`]). Without a
//! channel (the change stream, a shared stdio process, the gateway's own listings) the request
//! is refused with -32601, as a client that supports none of it would. `ping` is answered at once.

use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};

/// Most questions one call's channel holds before the gateway takes them (more are refused).
pub const ASKS_QUEUE: usize = 4;

/// One server-to-client request of an upstream, to be answered through `answer`.
#[derive(Debug)]
pub struct ServerAsk {
    /// `elicitation/create`, `sampling/createMessage`, `roots/list` or anything else the
    /// upstream sent (the gateway refuses what it does not relay).
    pub method: String,
    /// Its params, as sent (an object; `{}` when it sent none).
    pub params: Map<String, Value>,
    /// Where the gateway's answer goes; dropping it answers the upstream with an error.
    pub answer: oneshot::Sender<AskAnswer>,
}

/// The gateway's answer to one [`ServerAsk`].
#[derive(Debug, Clone, PartialEq)]
pub enum AskAnswer {
    /// A result object.
    Result(Map<String, Value>),
    /// A JSON-RPC error.
    Error {
        /// Its code.
        code: i64,
        /// Its message.
        message: String,
    },
}

impl AskAnswer {
    /// The refusal of a request the gateway does not relay.
    pub fn not_relayed() -> Self {
        Self::Error {
            code: palisade_wire::error::codes::METHOD_NOT_FOUND,
            message: "not supported through this gateway".into(),
        }
    }
}

/// Where one call's server-to-client requests go.
pub type Asks = mpsc::Sender<ServerAsk>;

/// The client capabilities the gateway's own session (or process) declares to an upstream: what
/// its configuration relays (`elicitation`, `sampling`, `roots` when some are granted or the
/// caller's are relayed), so a
/// server that offers tools by its client's capabilities lists them for review. A request on
/// that session itself is refused: it has no caller.
pub fn own_capabilities(requests: &super::settings::ClientRequests) -> Value {
    let mut capabilities = Map::new();
    if requests.elicitation {
        capabilities.insert("elicitation".into(), json!({}));
    }
    if requests.sampling {
        capabilities.insert("sampling".into(), json!({}));
    }
    if !requests.roots.is_empty() || requests.caller_roots {
        capabilities.insert("roots".into(), json!({}));
    }
    Value::Object(capabilities)
}

/// The response frame to the upstream's request `id`: `ping` answered at once, anything else
/// asked of `asks` (when the call has one and its queue has room) and awaited, otherwise
/// refused. The returned future owns what it needs, so a transport can await it in the
/// background while it keeps reading.
pub(super) fn answer_frame(
    id: Value,
    method: &str,
    params: Option<&Value>,
    asks: Option<&Asks>,
) -> impl Future<Output = Value> + Send + 'static {
    let frame = move |answer: AskAnswer| match answer {
        AskAnswer::Result(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        AskAnswer::Error { code, message } => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
    };
    let waiting = if method == "ping" {
        Err(AskAnswer::Result(Map::new()))
    } else if let Some(asks) = asks {
        let (answer, received) = oneshot::channel();
        let params = params.and_then(Value::as_object).cloned().unwrap_or_default();
        match asks.try_send(ServerAsk { method: method.to_owned(), params, answer }) {
            Ok(()) => Ok(received),
            Err(_) => Err(AskAnswer::not_relayed()),
        }
    } else {
        Err(AskAnswer::not_relayed())
    };
    async move {
        match waiting {
            Ok(received) => frame(received.await.unwrap_or_else(|_| AskAnswer::Error {
                code: palisade_wire::error::codes::INTERNAL_ERROR,
                message: "the request was not answered".into(),
            })),
            Err(answer) => frame(answer),
        }
    }
}

/// Where what an upstream sends during one call goes: its progress and log notifications, and
/// its server-to-client requests (this module's [`Asks`]).
#[derive(Clone, Copy)]
pub(crate) struct Relays<'a> {
    pub(crate) notifications: Option<&'a mpsc::Sender<Value>>,
    pub(crate) asks: Option<&'a Asks>,
}

impl Relays<'_> {
    /// Nothing relayed (the gateway's own exchanges): notifications dropped, requests refused.
    pub(crate) const NONE: Relays<'static> = Relays { notifications: None, asks: None };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ping_is_answered_and_requests_without_a_channel_refused() {
        let ping = answer_frame(json!(1), "ping", None, None).await;
        assert_eq!(ping, json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
        let refused = answer_frame(json!("a"), "sampling/createMessage", Some(&json!({})), None).await;
        assert_eq!(refused["error"]["code"], json!(-32601));
        assert_eq!(refused["id"], json!("a"));
    }

    #[tokio::test]
    async fn an_ask_is_answered_through_the_channel_and_a_full_queue_refuses() {
        let (asks, mut taken) = mpsc::channel(1);
        let first = answer_frame(json!(7), "roots/list", Some(&json!({"x": 1})), Some(&asks));
        let second = answer_frame(json!(8), "roots/list", None, Some(&asks));
        assert_eq!(second.await["error"]["code"], json!(-32601), "the queue was full");
        let ask = taken.recv().await.unwrap();
        assert_eq!((ask.method.as_str(), ask.params.get("x")), ("roots/list", Some(&json!(1))));
        let mut result = Map::new();
        result.insert("roots".into(), json!([]));
        ask.answer.send(AskAnswer::Result(result)).unwrap();
        assert_eq!(first.await, json!({"jsonrpc": "2.0", "id": 7, "result": {"roots": []}}));
        let dropped = answer_frame(json!(9), "elicitation/create", None, Some(&asks));
        drop(taken.recv().await.unwrap());
        assert_eq!(dropped.await["error"]["code"], json!(-32603), "an unanswered ask is an error to the upstream");
    }
}
