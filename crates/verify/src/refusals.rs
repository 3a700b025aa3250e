//! The operator's "what a refusal looks like" map for one server (`--refusals FILE`): the
//! shapes its refusals take (an HTTP status, a JSON-RPC error code, a tool result with
//! `isError`, or a combination). With a map, a negative case that was refused in a shape the
//! map does not list is a WARNING, not a PASS: the server refused, but not the way its operator
//! says it refuses, which is how an unintended code path (a crash turned 4xx, a handler's own
//! error) shows up. Without a map every refusal shape is accepted.

use serde::Deserialize;

use crate::exchange::Exchange;

/// One refusal shape: every field given must match.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    /// The HTTP status.
    pub status: Option<u16>,
    /// The JSON-RPC error code.
    pub code: Option<i64>,
    /// A `result` with `isError: true` (a tool's own refusal).
    pub tool_error: Option<bool>,
}

/// The map: the shapes a refusal of the target may take.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusalMap {
    /// The shapes (`[[refusal]]` tables).
    #[serde(default, rename = "refusal")]
    pub shapes: Vec<Shape>,
}

impl RefusalMap {
    /// Reads a map file; a file with no shape, or a shape with no field, is refused (it would
    /// match nothing, or everything).
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|error| format!("refusal map {}: {error}", path.display()))?;
        Self::parse(&text).map_err(|why| format!("refusal map {}: {why}", path.display()))
    }

    /// Parses a map.
    pub fn parse(text: &str) -> Result<Self, String> {
        let map: Self = toml::from_str(text).map_err(|error| error.message().to_owned())?;
        if map.shapes.is_empty() {
            return Err("it lists no [[refusal]] shape".into());
        }
        if let Some(i) =
            map.shapes.iter().position(|s| s.status.is_none() && s.code.is_none() && s.tool_error.is_none())
        {
            return Err(format!("refusal[{i}] gives none of status, code, tool_error"));
        }
        Ok(map)
    }

    /// `None` when `exchange` (a refusal) has a listed shape; otherwise its shape, described.
    pub fn unlisted(&self, exchange: &Exchange) -> Option<String> {
        let tool_error =
            exchange.result().and_then(|r| r.get("isError")).and_then(serde_json::Value::as_bool) == Some(true);
        let code = exchange.error_code();
        let matches = |shape: &Shape| {
            shape.status.is_none_or(|status| exchange.status == Some(status))
                && shape.code.is_none_or(|c| code == Some(c))
                && shape.tool_error.is_none_or(|t| t == tool_error)
        };
        if self.shapes.iter().any(matches) {
            return None;
        }
        let status = exchange.status.map_or_else(|| "no status".to_owned(), |s| format!("HTTP {s}"));
        let body = match code {
            Some(code) => format!("error {code}"),
            None if tool_error => "a tool result with isError".to_owned(),
            None => "no JSON-RPC error".to_owned(),
        };
        Some(format!("{status}, {body}"))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn exchange(status: u16, frame: serde_json::Value) -> Exchange {
        Exchange::answered(json!(1), status, vec![frame])
    }

    #[test]
    fn a_refusal_matches_a_shape_only_on_every_field_it_gives() {
        let map = RefusalMap::parse(
            "[[refusal]]\nstatus = 401\n\n[[refusal]]\nstatus = 200\ncode = -32602\n\n[[refusal]]\ntool_error = true\n",
        )
        .unwrap();
        let unauthorized = exchange(401, json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32001 } }));
        assert_eq!(map.unlisted(&unauthorized), None);
        let invalid = exchange(200, json!({ "jsonrpc": "2.0", "id": 1, "error": { "code": -32602 } }));
        assert_eq!(map.unlisted(&invalid), None);
        let tool = exchange(200, json!({ "jsonrpc": "2.0", "id": 1, "result": { "isError": true, "content": [] } }));
        assert_eq!(map.unlisted(&tool), None);
        let odd = exchange(200, json!({ "jsonrpc": "2.0", "id": 1, "error": { "code": -32603 } }));
        assert_eq!(map.unlisted(&odd).as_deref(), Some("HTTP 200, error -32603"));
        let forbidden = exchange(403, json!({ "jsonrpc": "2.0", "id": 1, "error": { "code": -32602 } }));
        assert_eq!(map.unlisted(&forbidden).as_deref(), Some("HTTP 403, error -32602"));
    }

    #[test]
    fn a_map_that_would_match_nothing_or_everything_is_refused() {
        assert!(RefusalMap::parse("").is_err());
        assert!(RefusalMap::parse("[[refusal]]\n").unwrap_err().contains("refusal[0]"));
        assert!(RefusalMap::parse("[[refusal]]\nstatus = 401\nbody = 1\n").is_err());
    }
}
