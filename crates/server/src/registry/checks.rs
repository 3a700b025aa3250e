//! The build-time checks of a tool's definition: its name, input schema, `x-mcp-header`
//! declarations and handle arguments, plus uniqueness of names across the application.

use std::sync::Arc;

use serde_json::{Value, json};

use super::error::RegistryError;
use super::tool::{TaskSupport, ToolDef};
use crate::handles::HandleType;

/// The checks [`AppBuilder::build`] makes of one tool (name, input schema, `x-mcp-header`
/// declarations), which also compile its argument validator. An application that builds its
/// tools from definitions it does not control (the gateway) runs it first, so one bad
/// definition is held alone instead of failing the whole build.
pub fn check_tool(tool: &mut ToolDef) -> Result<(), RegistryError> {
    let valid_name = (1..=128).contains(&tool.name.len())
        && tool.name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if !valid_name {
        return Err(RegistryError::InvalidName(tool.name.clone()));
    }
    let schema = &tool.definition["inputSchema"];
    if schema.get("type") != Some(&json!("object")) {
        return Err(RegistryError::InvalidSchema {
            tool: tool.name.clone(),
            why: "inputSchema root must be type object".into(),
        });
    }
    let validator = jsonschema::draft202012::new(schema)
        .map_err(|e| RegistryError::InvalidSchema { tool: tool.name.clone(), why: e.to_string() })?;
    tool.validator = Some(Arc::new(validator));
    tool.header_params = header_params(&tool.name, schema)?;
    Ok(())
}

/// Each handle argument names a registered type and a scope, and no argument is declared twice.
pub(super) fn check_handle_arguments(tool: &ToolDef, types: &[HandleType]) -> Result<(), RegistryError> {
    for (index, argument) in tool.handle_args.iter().enumerate() {
        let invalid = |why: &str| RegistryError::InvalidHandle {
            tool: tool.name.clone(),
            argument: argument.name.clone(),
            why: why.to_owned(),
        };
        if !types.iter().any(|t| t.name() == argument.object_type) {
            return Err(invalid("its object type is not registered with AppBuilder::handle_type"));
        }
        if argument.required_scope.is_empty() || argument.name.is_empty() {
            return Err(invalid("a handle argument needs a name and a required scope"));
        }
        if tool.handle_args[..index].iter().any(|earlier| earlier.name == argument.name) {
            return Err(invalid("declared twice"));
        }
        if tool.task_support != TaskSupport::Forbidden {
            return Err(invalid("a task-capable tool cannot take handles (a task would have to store the raw handle)"));
        }
    }
    Ok(())
}

pub(super) fn check_unique<'a>(kind: &'static str, names: impl Iterator<Item = &'a str>) -> Result<(), RegistryError> {
    let mut seen = std::collections::HashSet::new();
    for name in names {
        if !seen.insert(name) {
            return Err(RegistryError::Duplicate { kind, name: name.to_owned() });
        }
    }
    Ok(())
}

/// The `x-mcp-header` declarations of a tool's top-level properties, checked for validity
/// (RFC 9110 token, unique case-insensitively, only on string/integer/boolean properties).
fn header_params(tool: &str, schema: &Value) -> Result<Vec<(String, String)>, RegistryError> {
    let mut out: Vec<(String, String)> = Vec::new();
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return Ok(out) };
    for (property, property_schema) in properties {
        let Some(header) = property_schema.get("x-mcp-header") else { continue };
        let invalid = |why: &str| RegistryError::InvalidSchema {
            tool: tool.to_owned(),
            why: format!("x-mcp-header on {property:?}: {why}"),
        };
        let header = header.as_str().ok_or_else(|| invalid("must be a string"))?;
        let is_token =
            !header.is_empty() && header.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !is_token {
            return Err(invalid("not an RFC 9110 token"));
        }
        if !matches!(property_schema.get("type").and_then(Value::as_str), Some("string" | "integer" | "boolean")) {
            return Err(invalid("only string, integer and boolean properties may be mirrored"));
        }
        if out.iter().any(|(h, _)| h.eq_ignore_ascii_case(header)) {
            return Err(invalid("duplicate header name"));
        }
        out.push((header.to_owned(), property.clone()));
    }
    Ok(out)
}
