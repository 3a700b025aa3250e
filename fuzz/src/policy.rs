//! The argument view of operator policies (`palisade_server::policy::view`): a call's JSON
//! arguments converted to the bounded, typed Cedar record a policy sees. The property: the
//! conversion never panics, and it succeeds exactly when a reference model of the rules says the
//! arguments fit (every declared member of its declared type, no string, set or record over the
//! limits), so nothing over the limits is ever cut to fit.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use palisade_server::policy::view::{ViewLimits, ViewType, arguments_to_cedar};
use serde_json::{Map, Value, json};

const LIMITS: ViewLimits = ViewLimits { max_depth: 2, max_string_bytes: 16, max_entries: 4 };

fn members() -> &'static BTreeMap<String, ViewType> {
    static MEMBERS: OnceLock<BTreeMap<String, ViewType>> = OnceLock::new();
    MEMBERS.get_or_init(|| {
        let schema = json!({ "type": "object", "properties": {
            "path": { "type": "string" }, "count": { "type": "integer" }, "force": { "type": "boolean" },
            "tags": { "type": "array", "items": { "type": "string" } },
            "options": { "type": "object", "properties": {
                "mode": { "type": "string" }, "depth": { "type": "integer" },
                "inner": { "type": "object", "properties": { "x": { "type": "string" } } } } },
            "ratio": { "type": "number" },
        }});
        ViewType::of_properties(&schema, LIMITS.max_depth)
    })
}

/// The reference model: whether `value` fits `ty` within [`LIMITS`].
fn fits(value: &Value, ty: &ViewType) -> bool {
    match (ty, value) {
        (ViewType::String, Value::String(text)) => text.len() <= LIMITS.max_string_bytes,
        (ViewType::Long, Value::Number(number)) => number.as_i64().is_some(),
        (ViewType::Bool, Value::Bool(_)) => true,
        (ViewType::Set(item), Value::Array(items)) => {
            items.len() <= LIMITS.max_entries && items.iter().all(|value| fits(value, item))
        }
        (ViewType::Record(members), Value::Object(object)) => record_fits(object, members),
        _ => false,
    }
}

fn record_fits(object: &Map<String, Value>, members: &BTreeMap<String, ViewType>) -> bool {
    object.len() <= LIMITS.max_entries
        && object.iter().all(|(name, value)| match members.get(name) {
            None => true,
            Some(_) if value.is_null() => true,
            Some(ty) => fits(value, ty),
        })
}

/// One arguments object (any JSON; non-objects are not arguments).
pub fn argument_view(data: &[u8]) {
    let Ok(Value::Object(arguments)) = serde_json::from_slice::<Value>(data) else { return };
    let converted = arguments_to_cedar(&arguments, members(), &LIMITS);
    assert_eq!(converted.is_ok(), record_fits(&arguments, members()), "the view disagrees with its rules: {arguments:?}");
}
