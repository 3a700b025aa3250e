//! The per-request `_meta` object of 2026-07-28: version and capabilities on every request, the
//! optional log level and progress token.

use serde_json::{Map, Value};

use crate::error::ProtocolError;
use crate::meta_keys;

/// RFC 5424 log levels, lowest to highest severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// debug
    Debug,
    /// info
    Info,
    /// notice
    Notice,
    /// warning
    Warning,
    /// error
    Error,
    /// critical
    Critical,
    /// alert
    Alert,
    /// emergency
    Emergency,
}

impl LogLevel {
    /// Parses a wire level name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "debug" => Self::Debug,
            "info" => Self::Info,
            "notice" => Self::Notice,
            "warning" => Self::Warning,
            "error" => Self::Error,
            "critical" => Self::Critical,
            "alert" => Self::Alert,
            "emergency" => Self::Emergency,
            _ => return None,
        })
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Notice => "notice",
            Self::Warning => "warning",
            Self::Error => "error",
            Self::Critical => "critical",
            Self::Alert => "alert",
            Self::Emergency => "emergency",
        }
    }
}

/// A progress token: a string or an integer, echoed with its type.
pub type ProgressToken = crate::jsonrpc::RequestId;

/// The validated `_meta` of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestMeta {
    /// The protocol version the request is written against (already checked as supported).
    pub protocol_version: String,
    /// Capabilities the client declares for this request only.
    pub client_capabilities: Map<String, Value>,
    /// Client implementation info, when sent.
    pub client_info: Option<Value>,
    /// Minimum level of log notifications the client wants on this request's stream.
    pub log_level: Option<LogLevel>,
    /// Progress token, when the client wants progress notifications.
    pub progress_token: Option<ProgressToken>,
}

impl RequestMeta {
    /// Reads and validates the shape of `params._meta`: missing or mistyped keys are `-32602`.
    /// Whether the version is supported is a separate step ([`RequestMeta::check_supported`]),
    /// because a header/body mismatch must be reported before it.
    pub fn from_params(params: &Map<String, Value>) -> Result<Self, ProtocolError> {
        let meta = match params.get("_meta") {
            Some(Value::Object(meta)) => meta,
            Some(_) => return Err(ProtocolError::InvalidMeta("_meta must be an object".into())),
            None => return Err(ProtocolError::InvalidMeta("params._meta is required".into())),
        };
        let protocol_version = match meta.get(meta_keys::PROTOCOL_VERSION) {
            Some(Value::String(version)) => version.clone(),
            Some(_) => {
                return Err(ProtocolError::InvalidMeta(format!("{} must be a string", meta_keys::PROTOCOL_VERSION)));
            }
            None => return Err(ProtocolError::InvalidMeta(format!("{} is required", meta_keys::PROTOCOL_VERSION))),
        };
        let client_capabilities = match meta.get(meta_keys::CLIENT_CAPABILITIES) {
            Some(Value::Object(caps)) => caps.clone(),
            Some(_) => {
                return Err(ProtocolError::InvalidMeta(format!(
                    "{} must be an object",
                    meta_keys::CLIENT_CAPABILITIES
                )));
            }
            None => return Err(ProtocolError::InvalidMeta(format!("{} is required", meta_keys::CLIENT_CAPABILITIES))),
        };
        let client_info = match meta.get(meta_keys::CLIENT_INFO) {
            None => None,
            Some(info @ Value::Object(_)) => Some(info.clone()),
            Some(_) => return Err(ProtocolError::InvalidMeta(format!("{} must be an object", meta_keys::CLIENT_INFO))),
        };
        let log_level = match meta.get(meta_keys::LOG_LEVEL) {
            None => None,
            Some(Value::String(level)) => {
                Some(LogLevel::parse(level).ok_or_else(|| {
                    ProtocolError::InvalidMeta(format!("{} is not a known level", meta_keys::LOG_LEVEL))
                })?)
            }
            Some(_) => return Err(ProtocolError::InvalidMeta(format!("{} must be a string", meta_keys::LOG_LEVEL))),
        };
        let progress_token = match meta.get(meta_keys::PROGRESS_TOKEN) {
            None => None,
            Some(raw) => Some(
                ProgressToken::from_value(raw)
                    .ok_or_else(|| ProtocolError::InvalidMeta("progressToken must be a string or an integer".into()))?,
            ),
        };
        Ok(Self { protocol_version, client_capabilities, client_info, log_level, progress_token })
    }

    /// `-32022` unless the request's version is one this server speaks.
    pub fn check_supported(&self) -> Result<(), ProtocolError> {
        if crate::SUPPORTED_VERSIONS.contains(&self.protocol_version.as_str()) {
            Ok(())
        } else {
            Err(ProtocolError::UnsupportedVersion { requested: self.protocol_version.clone() })
        }
    }

    /// Whether the client declared a top-level capability (e.g. `elicitation`).
    pub fn has_capability(&self, name: &str) -> bool {
        self.client_capabilities.get(name).is_some_and(|v| !v.is_null())
    }

    /// Whether the client declared an extension under `capabilities.extensions`.
    pub fn has_extension(&self, id: &str) -> bool {
        self.client_capabilities
            .get("extensions")
            .and_then(Value::as_object)
            .is_some_and(|extensions| extensions.get(id).is_some_and(|v| !v.is_null()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(meta: Value) -> Map<String, Value> {
        json!({ "_meta": meta }).as_object().cloned().unwrap()
    }

    #[test]
    fn required_keys() {
        let ok = RequestMeta::from_params(&params(json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
            "io.modelcontextprotocol/logLevel": "warning",
            "progressToken": 5
        })))
        .unwrap();
        assert!(ok.has_capability("elicitation"));
        assert!(!ok.has_capability("sampling"));
        assert_eq!(ok.log_level, Some(LogLevel::Warning));
        assert_eq!(ok.progress_token, Some(ProgressToken::Number(5)));

        let missing_caps = params(json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"}));
        assert_eq!(RequestMeta::from_params(&missing_caps).unwrap_err().code(), -32602);
        assert_eq!(RequestMeta::from_params(&Map::new()).unwrap_err().code(), -32602);
        let old = params(json!({
            "io.modelcontextprotocol/protocolVersion": "2024-01-01",
            "io.modelcontextprotocol/clientCapabilities": {}
        }));
        assert_eq!(RequestMeta::from_params(&old).unwrap().check_supported().unwrap_err().code(), -32022);
        let bad_level = params(json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/logLevel": "loud"
        }));
        assert_eq!(RequestMeta::from_params(&bad_level).unwrap_err().code(), -32602);
    }
}
