//! Strict JSON-RPC 2.0 framing: one request or notification per frame, no batches, ids that are
//! strings or integers (never null) and are echoed with their JSON type.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value, json};

use crate::error::ProtocolError;
use crate::strict::{self, StrictJsonError};

/// A JSON-RPC request id: a string or an integer, never null, echoed with its JSON type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RequestId {
    /// An integer id.
    Number(i64),
    /// A string id.
    String(String),
}

impl RequestId {
    /// The id as a JSON value with its original type.
    pub fn to_value(&self) -> Value {
        match self {
            Self::Number(n) => json!(n),
            Self::String(s) => json!(s),
        }
    }

    /// Reads an id; `None` for null, floats, booleans, objects and out-of-range integers.
    pub fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::String(s) => Some(Self::String(s.clone())),
            Value::Number(n) => n.as_i64().map(Self::Number),
            _ => None,
        }
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::String(s) => write!(f, "{s:?}"),
        }
    }
}

impl Serialize for RequestId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RequestId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Self::from_value(&value).ok_or_else(|| serde::de::Error::custom("id must be a string or an integer"))
    }
}

/// A JSON-RPC request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The request id.
    pub id: RequestId,
    /// The method name, as sent.
    pub method: String,
    /// The params object (empty when absent).
    pub params: Map<String, Value>,
}

/// A JSON-RPC notification.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// The method name, as sent.
    pub method: String,
    /// The params object (empty when absent).
    pub params: Map<String, Value>,
}

/// One inbound frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A request that expects a response.
    Request(Request),
    /// A notification that expects none.
    Notification(Notification),
}

/// A frame that could not be accepted, with the id to answer under when one was readable.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameError {
    /// The request id, when the frame carried a valid one.
    pub id: Option<RequestId>,
    /// What was wrong.
    pub error: ProtocolError,
}

/// Parses one frame strictly. Never panics; nesting depth is bounded by `serde_json`.
///
/// A member name repeated in any object, at any depth, refuses the frame as an invalid request
/// without an id (the id may be the repeated member): a first-wins parser in front of us must
/// never see a different request than the one we run. See [`strict`].
pub fn parse_message(bytes: &[u8]) -> Result<Message, FrameError> {
    let value = strict::from_slice(bytes).map_err(|error| FrameError {
        id: None,
        error: match error {
            StrictJsonError::Duplicate => ProtocolError::InvalidRequest("duplicate member name"),
            StrictJsonError::Syntax(_) => ProtocolError::Parse,
        },
    })?;
    message_from_value(value)
}

/// Validates an already-parsed JSON value as one frame.
pub fn message_from_value(value: Value) -> Result<Message, FrameError> {
    let invalid =
        |id: Option<RequestId>, why: &'static str| FrameError { id, error: ProtocolError::InvalidRequest(why) };
    let mut object = match value {
        Value::Object(object) => object,
        Value::Array(_) => return Err(invalid(None, "batches are not supported")),
        _ => return Err(invalid(None, "a frame must be a JSON object")),
    };
    let id = match object.remove("id") {
        None => None,
        Some(raw) => match RequestId::from_value(&raw) {
            Some(id) => Some(id),
            None => return Err(invalid(None, "id must be a string or an integer")),
        },
    };
    if object.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        return Err(invalid(id, "jsonrpc must be \"2.0\""));
    }
    if object.contains_key("result") || object.contains_key("error") {
        return Err(invalid(id, "responses are not accepted here"));
    }
    let method = match object.remove("method") {
        Some(Value::String(method)) if !method.is_empty() => method,
        _ => return Err(invalid(id, "method must be a non-empty string")),
    };
    let params = match object.remove("params") {
        None => Map::new(),
        Some(Value::Object(params)) => params,
        Some(_) => return Err(invalid(id, "params must be an object")),
    };
    object.remove("jsonrpc");
    if !object.is_empty() {
        return Err(invalid(id, "unknown top-level member"));
    }
    Ok(match id {
        Some(id) => Message::Request(Request { id, method, params }),
        None => Message::Notification(Notification { method, params }),
    })
}

/// A success response frame.
pub fn result_frame(id: &RequestId, result: Value) -> Value {
    // Built by hand: `json!` would serialize `result` into a second tree (a deep copy).
    let mut frame = Map::new();
    frame.insert("jsonrpc".into(), Value::String("2.0".into()));
    frame.insert("id".into(), id.to_value());
    frame.insert("result".into(), result);
    Value::Object(frame)
}

/// An error response frame; `id` is omitted when the request's id could not be read.
pub fn error_frame(id: Option<&RequestId>, error: &ProtocolError) -> Value {
    let mut frame = Map::new();
    frame.insert("jsonrpc".into(), json!("2.0"));
    if let Some(id) = id {
        frame.insert("id".into(), id.to_value());
    }
    frame.insert("error".into(), error.to_wire());
    Value::Object(frame)
}

/// A notification frame.
pub fn notification_frame(method: &str, params: Value) -> Value {
    let mut frame = Map::new();
    frame.insert("jsonrpc".into(), Value::String("2.0".into()));
    frame.insert("method".into(), Value::String(method.into()));
    frame.insert("params".into(), params);
    Value::Object(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(frame: &str) -> ProtocolError {
        parse_message(frame.as_bytes()).unwrap_err().error
    }

    #[test]
    fn ids_keep_their_type() {
        let Message::Request(r) = parse_message(br#"{"jsonrpc":"2.0","id":"7","method":"m"}"#).unwrap() else {
            panic!("not a request")
        };
        assert_eq!(result_frame(&r.id, json!({}))["id"], json!("7"));
        let Message::Request(r) = parse_message(br#"{"jsonrpc":"2.0","id":7,"method":"m"}"#).unwrap() else {
            panic!("not a request")
        };
        assert_eq!(result_frame(&r.id, json!({}))["id"], json!(7));
    }

    #[test]
    fn bad_frames_are_refused() {
        assert_eq!(err("{"), ProtocolError::Parse);
        assert_eq!(err("[]"), ProtocolError::InvalidRequest("batches are not supported"));
        assert_eq!(err("3"), ProtocolError::InvalidRequest("a frame must be a JSON object"));
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#).code(), -32600);
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":1.5,"method":"m"}"#).code(), -32600);
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":true,"method":"m"}"#).code(), -32600);
        assert_eq!(err(r#"{"jsonrpc":"1.0","id":1,"method":"m"}"#).code(), -32600);
        assert_eq!(err(r#"{"id":1,"method":"m"}"#).code(), -32600);
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":1,"method":""}"#).code(), -32600);
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":1,"method":3}"#).code(), -32600);
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":1,"method":"m","params":[]}"#).code(), -32600);
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#).code(), -32600);
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":1,"method":"m","extra":1}"#).code(), -32600);
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"m"}"#).code(), -32600);
    }

    #[test]
    fn the_id_survives_into_the_error_when_readable() {
        let e = parse_message(br#"{"jsonrpc":"2.0","id":"a","method":"m","params":1}"#).unwrap_err();
        assert_eq!(e.id, Some(RequestId::String("a".into())));
        let frame = error_frame(e.id.as_ref(), &e.error);
        assert_eq!(frame["id"], json!("a"));
        assert!(error_frame(None, &ProtocolError::Parse).get("id").is_none());
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(err(&deep), ProtocolError::Parse);
    }

    /// A valid `tools/call` frame with `insert` spliced in right after `"{at}":{` — or, when `at`
    /// is empty, right after the frame's opening brace.
    fn tools_call_with(at: &str, insert: &str) -> String {
        let frame = concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"product_get","#,
            r#""arguments":{"sku":"TEA-001","filter":{"tags":[{"k":"a","v":"b"}]}},"#,
            r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","#,
            r#""io.modelcontextprotocol/clientCapabilities":{}}}}"#
        );
        let marker = if at.is_empty() { "{".to_owned() } else { format!(r#""{at}":{{"#) };
        let split = frame.find(&marker).expect("marker in the frame") + marker.len();
        format!("{}{insert}{}", &frame[..split], &frame[split..])
    }

    fn refused_as_duplicate(frame: &str) {
        let refusal = parse_message(frame.as_bytes()).expect_err(frame);
        assert_eq!(refusal.error, ProtocolError::InvalidRequest("duplicate member name"), "{frame}");
        assert_eq!(refusal.error.code(), -32600);
        assert_eq!(refusal.id, None, "{frame}");
        assert!(error_frame(refusal.id.as_ref(), &refusal.error).get("id").is_none());
    }

    #[test]
    fn the_test_frame_is_accepted() {
        let Message::Request(request) = parse_message(tools_call_with("", "").as_bytes()).unwrap() else {
            panic!("not a request")
        };
        assert_eq!(request.method, "tools/call");
        assert_eq!(request.params["arguments"]["filter"]["tags"][0]["k"], json!("a"));
    }

    #[test]
    fn duplicate_top_level_members_are_refused() {
        refused_as_duplicate(&tools_call_with("", r#""method":"tools/list","#));
        refused_as_duplicate(&tools_call_with("", r#""params":{},"#));
        refused_as_duplicate(&tools_call_with("", r#""id":2,"#));
        refused_as_duplicate(&tools_call_with("", r#""id":1,"#));
        refused_as_duplicate(&tools_call_with("", r#""jsonrpc":"2.0","#));
        // Last-wins would have made this a valid request.
        refused_as_duplicate(r#"{"jsonrpc":"1.0","jsonrpc":"2.0","id":1,"method":"m"}"#);
        refused_as_duplicate(r#"{"jsonrpc":"2.0","id":null,"id":"a","method":"m"}"#);
    }

    #[test]
    fn duplicate_members_inside_params_are_refused() {
        refused_as_duplicate(&tools_call_with("params", r#""name":"admin_delete","#));
        refused_as_duplicate(&tools_call_with("params", r#""arguments":{"sku":"TEA-002"},"#));
        refused_as_duplicate(&tools_call_with("_meta", r#""io.modelcontextprotocol/protocolVersion":"2025-06-18","#));
        refused_as_duplicate(&tools_call_with("arguments", r#""sku":"TEA-002","#));
        refused_as_duplicate(&tools_call_with("filter", r#""tags":[],"#));
        refused_as_duplicate(&tools_call_with(
            "io.modelcontextprotocol/clientCapabilities",
            r#""sampling":{},"sampling":{}"#,
        ));
        let deep = tools_call_with("arguments", r#""deep":[[{"x":{"y":[{"z":1,"z":2}]}}]],"#);
        refused_as_duplicate(&deep);
    }

    #[test]
    fn escaped_equal_member_names_are_duplicates() {
        refused_as_duplicate(&tools_call_with("", r#""\u006dethod":"tools/list","#));
        refused_as_duplicate(&tools_call_with("params", r#""n\u0061me":"admin_delete","#));
        refused_as_duplicate(&tools_call_with("_meta", r#""io.modelcontextprotocol\/protocolVersion":"2025-06-18","#));
        refused_as_duplicate(r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1,"\u0061":2}}"#);
    }

    #[test]
    fn equal_names_in_different_objects_are_accepted() {
        let frame = tools_call_with(
            "arguments",
            r#""name":"x","params":{"name":"y","params":{"name":"z"}},"list":[{"id":1},{"id":1}],"#,
        );
        let Message::Request(request) = parse_message(frame.as_bytes()).unwrap() else { panic!("not a request") };
        assert_eq!(request.params["name"], json!("product_get"));
        assert_eq!(request.params["arguments"]["params"]["params"]["name"], json!("z"));
    }

    #[test]
    fn syntax_errors_stay_parse_errors() {
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":1,,"method":"m"}"#), ProtocolError::Parse);
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":1,"method":"m"} {}"#), ProtocolError::Parse);
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":1,"id":"#), ProtocolError::Parse);
        // Parsing stops at the first problem: a duplicate read before the text breaks off.
        assert_eq!(err(r#"{"id":1,"id":2"#), ProtocolError::InvalidRequest("duplicate member name"));
    }

    #[test]
    fn notifications_have_no_id() {
        let m =
            parse_message(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#).unwrap();
        assert!(matches!(m, Message::Notification(n) if n.method == "notifications/cancelled"));
    }
}
