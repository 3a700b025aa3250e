//! The argument view: the bounded, typed Cedar value a policy sees as `context.arguments`. Its
//! type comes from the tools' (or prompts') declared input schemas ([`ViewType`]), merged across
//! the registry into one record type per action; a call's JSON arguments are converted to it by
//! [`to_cedar`], which refuses (never truncates) what exceeds the limits, so no long or deep
//! value can slip past a `forbid`.
//!
//! Knows JSON Schema's scalar types and Cedar's restricted expressions; nothing about requests.

use std::collections::BTreeMap;

use cedar_policy::RestrictedExpression;
use serde_json::{Map, Value};

/// The bounds of the argument view (`[policies]` `max_argument_depth`, `max_argument_bytes`,
/// `max_argument_entries`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewLimits {
    /// Deepest nesting of records and sets below `context.arguments` (1–8).
    pub max_depth: usize,
    /// Longest string, in bytes.
    pub max_string_bytes: usize,
    /// Most members of one set or record.
    pub max_entries: usize,
}

impl Default for ViewLimits {
    fn default() -> Self {
        Self { max_depth: 3, max_string_bytes: 4096, max_entries: 64 }
    }
}

/// The Cedar type of one argument in the view. JSON numbers that are not integers, `null` and
/// untyped values have no view (a policy cannot name them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewType {
    /// `"type": "string"`.
    String,
    /// `"type": "integer"`.
    Long,
    /// `"type": "boolean"`.
    Bool,
    /// `"type": "array"` with typed `items`.
    Set(Box<ViewType>),
    /// `"type": "object"` with `properties`: each member optional.
    Record(BTreeMap<String, ViewType>),
}

/// Why a call's arguments have no view: the stage refuses the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewError {
    /// A string, set or record is over the limits.
    TooLarge,
    /// A value is not of its declared type.
    Mismatch,
}

impl ViewType {
    /// The view type of a JSON Schema, `None` when it has none (or is deeper than `depth`).
    pub fn of_schema(schema: &Value, depth: usize) -> Option<Self> {
        match schema.get("type").and_then(Value::as_str)? {
            "string" => Some(Self::String),
            "integer" => Some(Self::Long),
            "boolean" => Some(Self::Bool),
            "array" if depth > 0 => Some(Self::Set(Box::new(Self::of_schema(schema.get("items")?, depth - 1)?))),
            "object" if depth > 0 => Some(Self::Record(Self::of_properties(schema, depth - 1))),
            _ => None,
        }
    }

    /// The members of an object schema's `properties` that have a view.
    pub fn of_properties(schema: &Value, depth: usize) -> BTreeMap<String, ViewType> {
        let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return BTreeMap::new() };
        properties.iter().filter_map(|(name, schema)| Some((name.clone(), Self::of_schema(schema, depth)?))).collect()
    }

    /// The type in Cedar's schema syntax (record members optional, names quoted).
    pub fn cedar(&self) -> String {
        match self {
            Self::String => "String".into(),
            Self::Long => "Long".into(),
            Self::Bool => "Bool".into(),
            Self::Set(item) => format!("Set<{}>", item.cedar()),
            Self::Record(members) => record_cedar(members),
        }
    }
}

/// A record type in Cedar's schema syntax, every member optional.
pub fn record_cedar(members: &BTreeMap<String, ViewType>) -> String {
    let fields: Vec<String> = members
        .iter()
        .map(|(name, ty)| format!("{}?: {}", serde_json::Value::from(name.as_str()), ty.cedar()))
        .collect();
    format!("{{{}}}", fields.join(", "))
}

/// Merges `more` into `into`: a member two definitions type differently is dropped from the view
/// and remembered in `conflicts` (records merge member by member).
pub fn merge(into: &mut BTreeMap<String, ViewType>, more: BTreeMap<String, ViewType>, conflicts: &mut Vec<String>) {
    for (name, ty) in more {
        if conflicts.contains(&name) {
            continue;
        }
        match into.get_mut(&name) {
            None => {
                into.insert(name, ty);
            }
            Some(ViewType::Record(existing)) if matches!(ty, ViewType::Record(_)) => {
                if let ViewType::Record(members) = ty {
                    merge(existing, members, conflicts);
                }
            }
            Some(existing) if *existing == ty => {}
            Some(_) => {
                into.remove(&name);
                conflicts.push(name);
            }
        }
    }
}

/// The view of an arguments object under the record type `members`: members without a view
/// are left out, `null` is absent; anything over `limits` or not of its type is an error.
pub fn arguments_to_cedar(
    arguments: &Map<String, Value>,
    members: &BTreeMap<String, ViewType>,
    limits: &ViewLimits,
) -> Result<RestrictedExpression, ViewError> {
    record_to_cedar(arguments, members, limits)
}

fn record_to_cedar(
    object: &Map<String, Value>,
    members: &BTreeMap<String, ViewType>,
    limits: &ViewLimits,
) -> Result<RestrictedExpression, ViewError> {
    if object.len() > limits.max_entries {
        return Err(ViewError::TooLarge);
    }
    let mut fields = Vec::new();
    for (name, value) in object {
        let Some(ty) = members.get(name) else { continue };
        if value.is_null() {
            continue;
        }
        fields.push((name.clone(), to_cedar(value, ty, limits)?));
    }
    RestrictedExpression::new_record(fields).map_err(|_| ViewError::Mismatch)
}

/// One JSON value as a Cedar value of type `ty`, within `limits`.
pub fn to_cedar(value: &Value, ty: &ViewType, limits: &ViewLimits) -> Result<RestrictedExpression, ViewError> {
    match (ty, value) {
        (ViewType::String, Value::String(text)) if text.len() > limits.max_string_bytes => Err(ViewError::TooLarge),
        (ViewType::String, Value::String(text)) => Ok(RestrictedExpression::new_string(text.clone())),
        (ViewType::Long, Value::Number(number)) => {
            number.as_i64().map(RestrictedExpression::new_long).ok_or(ViewError::Mismatch)
        }
        (ViewType::Bool, Value::Bool(flag)) => Ok(RestrictedExpression::new_bool(*flag)),
        (ViewType::Set(_), Value::Array(items)) if items.len() > limits.max_entries => Err(ViewError::TooLarge),
        (ViewType::Set(item), Value::Array(items)) => Ok(RestrictedExpression::new_set(
            items.iter().map(|value| to_cedar(value, item, limits)).collect::<Result<Vec<_>, _>>()?,
        )),
        (ViewType::Record(members), Value::Object(object)) => record_to_cedar(object, members, limits),
        _ => Err(ViewError::Mismatch),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn members() -> BTreeMap<String, ViewType> {
        let schema = json!({"type": "object", "properties": {
            "path": {"type": "string"}, "count": {"type": "integer"}, "deep": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "options": {"type": "object", "properties": {"mode": {"type": "string"}}},
            "ratio": {"type": "number"},
        }});
        ViewType::of_properties(&schema, 2)
    }

    #[test]
    fn declared_types_become_the_view_and_undeclared_ones_are_left_out() {
        let members = members();
        assert_eq!(members.get("path"), Some(&ViewType::String));
        assert_eq!(members.get("tags"), Some(&ViewType::Set(Box::new(ViewType::String))));
        assert!(!members.contains_key("ratio"), "a float has no Cedar view");
        let limits = ViewLimits::default();
        let arguments =
            json!({"path": "/srv/a", "count": 3, "tags": ["x"], "options": {"mode": "r"}, "ratio": 0.5, "deep": null});
        let view = arguments_to_cedar(arguments.as_object().unwrap(), &members, &limits).expect("view");
        let text = format!("{view:?}");
        assert!(text.contains("/srv/a") && text.contains("\"mode\"") && !text.contains("ratio"), "{text}");
    }

    #[test]
    fn over_the_limits_or_of_the_wrong_type_is_refused_never_cut() {
        let members = members();
        let limits = ViewLimits { max_depth: 2, max_string_bytes: 8, max_entries: 2 };
        let refuse = |arguments: Value| arguments_to_cedar(arguments.as_object().unwrap(), &members, &limits);
        assert_eq!(refuse(json!({"path": "/srv/public/long"})).unwrap_err(), ViewError::TooLarge);
        assert_eq!(refuse(json!({"tags": ["a", "b", "c"]})).unwrap_err(), ViewError::TooLarge);
        assert_eq!(refuse(json!({"a": 1, "b": 2, "c": 3})).unwrap_err(), ViewError::TooLarge);
        assert_eq!(refuse(json!({"path": 5})).unwrap_err(), ViewError::Mismatch);
        assert_eq!(refuse(json!({"count": 1.5})).unwrap_err(), ViewError::Mismatch);
        assert!(refuse(json!({"path": "/srv"})).is_ok());
    }

    #[test]
    fn conflicting_declarations_drop_the_member() {
        let mut into = BTreeMap::from([("path".to_owned(), ViewType::String)]);
        let mut conflicts = Vec::new();
        merge(&mut into, BTreeMap::from([("path".to_owned(), ViewType::Long)]), &mut conflicts);
        merge(&mut into, BTreeMap::from([("path".to_owned(), ViewType::String)]), &mut conflicts);
        assert!(into.is_empty());
        assert_eq!(conflicts, ["path"]);
    }

    #[test]
    fn depth_is_bounded_by_the_declared_type() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "object", "properties": {
            "b": {"type": "object", "properties": {"c": {"type": "string"}}}}}}});
        let shallow = ViewType::of_properties(&schema, 1);
        assert_eq!(shallow.get("a"), Some(&ViewType::Record(BTreeMap::new())), "{shallow:?}");
    }
}
