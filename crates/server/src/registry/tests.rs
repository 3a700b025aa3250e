//! Unit tests of the registry: template matching and the definitions the build refuses.

use serde_json::{Value, json};

use super::resource::match_template;
use super::*;
use crate::{CallToolResult, Outcome};

#[test]
fn template_matching() {
    let vars = match_template("test://template/{id}/data", "test://template/42/data").unwrap();
    assert_eq!(vars["id"], "42");
    assert!(match_template("test://template/{id}/data", "test://template//data").is_none());
    assert!(match_template("test://template/{id}/data", "test://template/4/2/data").is_none());
    assert!(match_template("test://template/{id}/data", "test://template/42/datax").is_none());
    assert_eq!(match_template("a://{x}", "a://y").unwrap()["x"], "y");
}

fn tool(name: &str, schema: Value) -> ToolDef {
    ToolDef::new(name).input_schema(schema).handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("x"))) })
}

#[test]
fn bad_definitions_are_refused_at_build() {
    let dup = App::builder("a", "1")
        .tool(tool("t", json!({"type":"object"})))
        .tool(tool("t", json!({"type":"object"})))
        .build();
    assert!(matches!(dup, Err(RegistryError::Duplicate { .. })));
    assert!(matches!(
        App::builder("a", "1").tool(tool("bad name", json!({"type":"object"}))).build(),
        Err(RegistryError::InvalidName(_))
    ));
    assert!(matches!(
        App::builder("a", "1").tool(tool("t", json!({"type":"array"}))).build(),
        Err(RegistryError::InvalidSchema { .. })
    ));
    let float_header = json!({"type":"object","properties":{"x":{"type":"number","x-mcp-header":"X"}}});
    assert!(App::builder("a", "1").tool(tool("t", float_header)).build().is_err());
    let dup_header = json!({"type":"object","properties":{"x":{"type":"string","x-mcp-header":"X"},"y":{"type":"string","x-mcp-header":"x"}}});
    assert!(App::builder("a", "1").tool(tool("t", dup_header)).build().is_err());
}
