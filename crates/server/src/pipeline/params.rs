//! The request parameter helpers every stage reads `params` with (a string parameter, a map of
//! strings), so each refusal of a malformed parameter reads the same wherever it is made.

use std::collections::BTreeMap;

use palisade_wire::ProtocolError;
use serde_json::{Map, Value};

/// The string parameter `key`, or the refusal naming it.
pub(super) fn string_param<'a>(params: &'a Map<String, Value>, key: &str) -> Result<&'a str, ProtocolError> {
    params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ProtocolError::invalid_params(format!("{key} must be a string")))
}

/// A map of strings (`arguments`, a completion's `context`), or the refusal.
pub(super) fn string_map(value: Option<&Value>) -> Result<BTreeMap<String, String>, ProtocolError> {
    match value {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|v| (k.clone(), v.to_owned()))
                    .ok_or_else(|| ProtocolError::invalid_params("arguments must map to strings"))
            })
            .collect(),
        Some(_) => Err(ProtocolError::invalid_params("arguments must be an object")),
    }
}
