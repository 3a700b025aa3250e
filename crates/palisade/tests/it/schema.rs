//! Validation of wire messages against the official MCP 2026-07-28 JSON schema (draft 2020-12),
//! picking the definition from the method that produced the message.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde_json::{Value, json};

fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../spec/2026-07-28/schema.json");
        serde_json::from_str(&std::fs::read_to_string(path).expect("schema file")).expect("schema JSON")
    })
}

/// The tasks extension's schema (its definitions live in their own document).
fn tasks_document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../spec/2026-07-28/ext-tasks.schema.json");
        serde_json::from_str(&std::fs::read_to_string(path).expect("schema file")).expect("schema JSON")
    })
}

fn validate_against(definition: &str, instance: &Value) {
    validate_in(document(), "core", definition, instance);
}

fn validate_tasks(definition: &str, instance: &Value) {
    validate_in(tasks_document(), "tasks", definition, instance);
}

fn validate_in(document: &Value, name: &str, definition: &str, instance: &Value) {
    static CACHE: OnceLock<Mutex<HashMap<String, std::sync::Arc<jsonschema::Validator>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let validator = {
        let mut cache = cache.lock().unwrap();
        cache
            .entry(format!("{name}:{definition}"))
            .or_insert_with(|| {
                let mut schema = document.clone();
                assert!(schema["$defs"].get(definition).is_some(), "schema has no definition {definition}");
                schema["$ref"] = json!(format!("#/$defs/{definition}"));
                std::sync::Arc::new(jsonschema::draft202012::new(&schema).expect("schema compiles"))
            })
            .clone()
    };
    let errors: Vec<String> =
        validator.iter_errors(instance).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert!(errors.is_empty(), "{definition} violated by {instance}:\n{}", errors.join("\n"));
}

/// Validates a response frame to `method` (result or error) and returns it.
pub fn check_response(method: &str, frame: &Value) {
    if let Some(error) = frame.get("error") {
        let definition = match error["code"].as_i64() {
            Some(-32020) => "HeaderMismatchError",
            Some(-32021) => "MissingRequiredClientCapabilityError",
            Some(-32022) => "UnsupportedProtocolVersionError",
            _ => "JSONRPCErrorResponse",
        };
        if definition == "JSONRPCErrorResponse" {
            validate_against(definition, frame);
        } else {
            validate_against("JSONRPCErrorResponse", frame);
            validate_against(definition, frame);
        }
        return;
    }
    validate_against("JSONRPCResultResponse", frame);
    let result = &frame["result"];
    if result["resultType"] == "input_required" {
        validate_against("InputRequiredResult", result);
        return;
    }
    let task_definition = match method {
        "tools/call" if result["resultType"] == "task" => Some("CreateTaskResult"),
        "tasks/get" => Some("GetTaskResult"),
        "tasks/update" => Some("UpdateTaskResult"),
        "tasks/cancel" => Some("CancelTaskResult"),
        _ => None,
    };
    if let Some(definition) = task_definition {
        validate_tasks(definition, result);
        return;
    }
    let definition = match method {
        "server/discover" => "DiscoverResult",
        "tools/list" => "ListToolsResult",
        "tools/call" => "CallToolResult",
        "resources/list" => "ListResourcesResult",
        "resources/templates/list" => "ListResourceTemplatesResult",
        "resources/read" => "ReadResourceResult",
        "prompts/list" => "ListPromptsResult",
        "prompts/get" => "GetPromptResult",
        "completion/complete" => "CompleteResult",
        "subscriptions/listen" => "SubscriptionsListenResult",
        other => panic!("no schema mapping for {other}"),
    };
    validate_against(definition, result);
}

/// Validates a server notification frame.
pub fn check_notification(frame: &Value) {
    let definition = match frame["method"].as_str().unwrap_or_default() {
        "notifications/progress" => "ProgressNotification",
        "notifications/message" => "LoggingMessageNotification",
        "notifications/subscriptions/acknowledged" => "SubscriptionsAcknowledgedNotification",
        "notifications/tools/list_changed" => "ToolListChangedNotification",
        "notifications/prompts/list_changed" => "PromptListChangedNotification",
        "notifications/resources/list_changed" => "ResourceListChangedNotification",
        "notifications/resources/updated" => "ResourceUpdatedNotification",
        "notifications/tasks" => return validate_tasks("TaskStatusNotification", frame),
        other => panic!("unexpected notification {other}"),
    };
    validate_against(definition, frame);
}
