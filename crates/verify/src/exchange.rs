//! [`Exchange`]: one request to the target and its answer as the checks read it (status,
//! headers, JSON-RPC frames, the redacted transcript), with the readings every check shares.

use serde_json::Value;

/// One request and its answer.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// The id the request carried.
    pub id: Value,
    /// The HTTP status; `None` when no answer came (connection error, timeout).
    pub status: Option<u16>,
    /// Response headers, names lower-case.
    pub headers: Vec<(String, String)>,
    /// Every JSON-RPC message of the body (one for JSON, each `data:` event for SSE).
    pub frames: Vec<Value>,
    /// Why there is no answer, or why the body could not be read.
    pub failure: Option<String>,
    /// The redacted transcript.
    pub transcript: String,
    /// When the operator gave a refusal map and this answer is a refusal of a shape it does not
    /// list: that shape, described (a negative case refused so is a WARNING, not a PASS).
    pub unlisted_refusal: Option<String>,
}

impl Exchange {
    /// An exchange of a request with `id` answered with `status` and `frames` (no headers).
    pub fn answered(id: Value, status: u16, frames: Vec<Value>) -> Self {
        Self { status: Some(status), frames, ..Self::unanswered(id) }
    }

    /// An exchange of a request with `id` that has no answer yet.
    pub fn unanswered(id: Value) -> Self {
        Self {
            id,
            status: None,
            headers: Vec::new(),
            frames: Vec::new(),
            failure: None,
            transcript: String::new(),
            unlisted_refusal: None,
        }
    }

    /// Whether the body holds a JSON-RPC `result` for the request's id: acceptance is judged
    /// from the body, never from the status.
    pub fn accepted(&self) -> bool {
        self.frames.iter().any(|frame| frame.get("result").is_some() && frame.get("id") == Some(&self.id))
    }

    /// Whether the answer refuses: no `result` for the request's id, or a tool result with
    /// `isError: true`.
    pub fn is_refusal(&self) -> bool {
        !self.accepted() || self.result().and_then(|r| r.get("isError")) == Some(&Value::Bool(true))
    }

    /// The result for the request's id.
    pub fn result(&self) -> Option<&Value> {
        self.frames.iter().find(|frame| frame.get("id") == Some(&self.id)).and_then(|frame| frame.get("result"))
    }

    /// The JSON-RPC error of the answer (for the id, or a null id), if any.
    pub fn error(&self) -> Option<&Value> {
        self.frames
            .iter()
            .filter(|frame| frame.get("method").is_none())
            .find(|frame| {
                matches!(frame.get("id"), Some(id) if *id == self.id || id.is_null()) || frame.get("id").is_none()
            })
            .and_then(|frame| frame.get("error"))
    }

    /// The JSON-RPC error code of the answer, if any.
    pub fn error_code(&self) -> Option<i64> {
        self.error().and_then(|error| error.get("code")).and_then(Value::as_i64)
    }

    /// A response header (first value).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// Whether the status is a 4xx.
    pub fn client_error(&self) -> bool {
        self.status.is_some_and(|status| (400..500).contains(&status))
    }

    /// One line: status and what the body held.
    pub fn summary(&self) -> String {
        let Some(status) = self.status else {
            return format!("no answer: {}", self.failure.as_deref().unwrap_or("unknown"));
        };
        let body = if self.accepted() {
            "a result".to_owned()
        } else if let Some(code) = self.error_code() {
            format!("error {code}")
        } else if self.frames.is_empty() {
            "no JSON-RPC body".to_owned()
        } else {
            "no answer for the request's id".to_owned()
        };
        format!("HTTP {status}, {body}")
    }
}
