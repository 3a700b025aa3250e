//! The conformance fixture: the tool, resource and prompt surface the official MCP conformance
//! suite calls by name, written against the public library API only. Behaviour follows each
//! scenario's description; the texts are the ones the scenarios look for.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use palisade_server::content::ResourceBody;
use palisade_server::{
    App, CallToolResult, Completion, CompletionRef, Content, GetPromptResult, InputRequired, LogLevel, Outcome,
    PromptArgument, PromptDef, PromptMessage, ProtocolError, RequestContext, ResourceContents, ResourceDef,
    ResourceTemplateDef, TaskSupport, ToolDef,
};
use serde_json::{Value, json};

/// A 1×1 PNG.
const PNG_B64: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A minimal WAV file.
const WAV_B64: &str = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";

fn png() -> Vec<u8> {
    STANDARD.decode(PNG_B64).unwrap_or_default()
}

fn image() -> Content {
    Content::Image { data: png(), mime_type: "image/png".into() }
}

type ToolResult = Result<Outcome<CallToolResult>, ProtocolError>;

fn done(result: CallToolResult) -> ToolResult {
    Ok(Outcome::Complete(result))
}

/// A fixture tool with no arguments.
fn simple(name: &str, description: &str) -> palisade_server::registry::ToolBuilder {
    ToolDef::new(name).description(description).input_schema(json!({ "type": "object", "properties": {} }))
}

/// `content.<field>` of an accepted elicitation answer.
fn elicited<'a>(ctx: &'a RequestContext, key: &str, field: &str) -> Option<&'a Value> {
    let answer = ctx.input_response(key)?;
    (answer.get("action").and_then(Value::as_str) == Some("accept")).then(|| answer.get("content")?.get(field))?
}

fn elicited_str(ctx: &RequestContext, key: &str, field: &str) -> Option<String> {
    elicited(ctx, key, field).and_then(Value::as_str).map(str::to_owned)
}

fn string_schema(field: &str) -> Value {
    json!({ "type": "object", "properties": { field: { "type": "string" } }, "required": [field] })
}

fn sampling_text(ctx: &RequestContext, key: &str) -> Option<String> {
    ctx.input_response(key)?.get("content")?.get("text")?.as_str().map(str::to_owned)
}

fn roots_count(ctx: &RequestContext, key: &str) -> Option<usize> {
    ctx.input_response(key)?.get("roots")?.as_array().map(Vec::len)
}

/// The fixture application.
pub fn app() -> App {
    let builder = App::builder("palisade-conformance-fixture", env!("CARGO_PKG_VERSION"))
        .instructions("Palisade's conformance fixture: the surface the MCP conformance suite exercises.");
    let builder = content_tools(builder);
    let builder = protocol_tools(builder);
    let builder = mrtr_tools(builder);
    let builder = client_request_tools(builder);
    let builder = resources(builder);
    let builder = prompts(builder);
    let builder = task_tools(builder);
    builder
        .completion(|reference, argument, value, _context| {
            let candidates: &[&str] = match (reference, argument) {
                (CompletionRef::Prompt(_), "arg1" | "arg2") => &["test", "testValue1", "testValue2", "other"],
                (CompletionRef::Resource(_), "id") => &["1", "123", "42"],
                _ => &[],
            };
            let values: Vec<String> =
                candidates.iter().filter(|c| c.starts_with(value)).map(|c| (*c).to_owned()).collect();
            Completion { total: Some(values.len() as u64), values, has_more: false }
        })
        .build()
        .expect("the conformance fixture's definitions are valid")
}

fn content_tools(builder: palisade_server::AppBuilder) -> palisade_server::AppBuilder {
    builder
        .tool(simple("test_simple_text", "Returns a simple text response").handler(|_, _| async {
            done(CallToolResult::text("This is a simple text response for testing."))
        }))
        .tool(simple("test_image_content", "Returns an image").handler(|_, _| async { done(CallToolResult::content(vec![image()])) }))
        .tool(simple("test_audio_content", "Returns audio").handler(|_, _| async {
            let data = STANDARD.decode(WAV_B64).unwrap_or_default();
            done(CallToolResult::content(vec![Content::Audio { data, mime_type: "audio/wav".into() }]))
        }))
        .tool(simple("test_embedded_resource", "Returns an embedded resource").handler(|_, _| async {
            let resource = ResourceContents::text("test://embedded-resource", "text/plain", "This is an embedded resource content.");
            done(CallToolResult::content(vec![Content::Resource(resource)]))
        }))
        .tool(simple("test_multiple_content_types", "Returns text, image and resource content").handler(|_, _| async {
            let resource = ResourceContents::text("test://mixed-content-resource", "application/json", r#"{"test":"data","value":123}"#);
            done(CallToolResult::content(vec![Content::text("Multiple content types test:"), image(), Content::Resource(resource)]))
        }))
        .tool(simple("test_error_handling", "Always fails with a tool error").handler(|_, _| async {
            done(CallToolResult::error("This tool intentionally returns an error for testing"))
        }))
        .tool(
            ToolDef::new("json_schema_2020_12_tool")
                .description("Tool with JSON Schema 2020-12 features")
                .input_schema(json!({
                    "$schema": "https://json-schema.org/draft/2020-12/schema",
                    "type": "object",
                    "$defs": { "address": { "$anchor": "addressDef", "type": "object",
                        "properties": { "street": { "type": "string" }, "city": { "type": "string" } } } },
                    "properties": {
                        "name": { "type": "string" },
                        "address": { "$ref": "#/$defs/address" },
                        "contactMethod": { "type": "string", "enum": ["phone", "email"] },
                        "phone": { "type": "string" },
                        "email": { "type": "string" }
                    },
                    "allOf": [{ "anyOf": [{ "required": ["phone"] }, { "required": ["email"] }] }],
                    "if": { "properties": { "contactMethod": { "const": "phone" } }, "required": ["contactMethod"] },
                    "then": { "required": ["phone"] },
                    "else": { "required": ["email"] },
                    "additionalProperties": false
                }))
                .handler(|_, args| async move { done(CallToolResult::text(format!("JSON Schema 2020-12 tool called with: {}", Value::Object(args)))) }),
        )
        .tool(
            ToolDef::new("test_header_param")
                .description("Echoes a string argument that is mirrored in the Mcp-Param-Region header")
                .input_schema(json!({
                    "type": "object",
                    "properties": { "region": { "type": "string", "x-mcp-header": "Region" } },
                    "required": ["region"]
                }))
                .handler(|_, args| async move {
                    let region = args.get("region").and_then(Value::as_str).unwrap_or_default().to_owned();
                    done(CallToolResult::text(format!("region={region}")))
                }),
        )
        .tool(
            ToolDef::new("echo_structured")
                .description("Echoes its text argument as structured content")
                .input_schema(json!({ "type": "object", "properties": { "text": { "type": "string", "maxLength": 1000 } }, "required": ["text"] }))
                .output_schema(json!({ "type": "object", "properties": { "echo": { "type": "string" } }, "required": ["echo"] }))
                .handler(|_, args| async move {
                    let text = args.get("text").and_then(Value::as_str).unwrap_or_default().to_owned();
                    done(CallToolResult::structured(json!({ "echo": text })))
                }),
        )
}

fn protocol_tools(builder: palisade_server::AppBuilder) -> palisade_server::AppBuilder {
    builder
        .tool(simple("test_tool_with_progress", "Reports progress three times").handler(|ctx, _| async move {
            for (step, progress) in [(1, 0.0), (2, 50.0), (3, 100.0)] {
                ctx.progress(progress, Some(100.0), Some(&format!("Completed step {step} of 100"))).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let token = ctx.meta().progress_token.as_ref().map(|t| t.to_value().to_string()).unwrap_or_default();
            done(CallToolResult::text(format!("Progress test completed {token}")))
        }))
        .tool(simple("test_tool_with_logging", "Logs three messages at info level").handler(|ctx, _| async move {
            for message in ["Tool execution started", "Tool processing data", "Tool execution completed"] {
                ctx.log(LogLevel::Info, None, json!(message)).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            done(CallToolResult::text("Tool with logging executed successfully"))
        }))
        .tool(simple("test_logging_tool", "Logs only when the request opted in with a log level").handler(|ctx, _| async move {
            ctx.log(LogLevel::Info, Some("fixture"), json!("Logging evaluated")).await;
            done(CallToolResult::text("Logging evaluated"))
        }))
        .tool(simple("test_missing_capability", "Needs the client's sampling capability").handler(|ctx, _| async move {
            if !ctx.meta().has_capability("sampling") {
                return Err(ProtocolError::MissingCapability { required: json!({ "sampling": {} }) });
            }
            done(CallToolResult::text("Success"))
        }))
        .tool(simple("test_streaming_elicitation", "Streams a result without any server request").handler(|ctx, _| async move {
            ctx.progress(1.0, Some(1.0), Some("streaming")).await;
            done(CallToolResult::text("Streaming complete"))
        }))
        .tool(simple("test_trigger_tool_change", "Announces a tool list change to listen streams").handler(|ctx, _| async move {
            ctx.events().tools_list_changed();
            done(CallToolResult::text("Mutation triggered"))
        }))
        .tool(simple("test_trigger_prompt_change", "Announces a prompt list change to listen streams").handler(|ctx, _| async move {
            ctx.events().prompts_list_changed();
            done(CallToolResult::text("Mutation triggered"))
        }))
        .tool(simple("test_trigger_resource_update", "Announces an update of test://watched-resource").handler(|ctx, _| async move {
            ctx.events().resource_updated("test://watched-resource");
            ctx.events().resources_list_changed();
            done(CallToolResult::text("Mutation triggered"))
        }))
        .tool(
            ToolDef::new("test_confirmed_action")
                .description("Runs only after the user confirmed this exact call")
                .input_schema(json!({ "type": "object", "properties": { "target": { "type": "string" } }, "required": ["target"] }))
                .needs_confirmation()
                .handler(|_, args| async move {
                    let target = args.get("target").and_then(Value::as_str).unwrap_or_default().to_owned();
                    done(CallToolResult::text(format!("action done on {target}")))
                }),
        )
        .tool(
            ToolDef::new("test_slow")
                .description("Sleeps for the given number of milliseconds (at most 60000), then answers")
                .input_schema(json!({ "type": "object", "properties": { "ms": { "type": "integer", "minimum": 0, "maximum": 60000 } }, "required": ["ms"] }))
                .handler(|ctx, args| async move {
                    let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(ms)) => done(CallToolResult::text(format!("slept {ms} ms"))),
                        () = ctx.cancellation().cancelled() => Err(ProtocolError::Internal),
                    }
                }),
        )
}

/// `Elicitation completed: action=…, content=…` for an answered elicitation.
fn elicitation_summary(answer: &Value) -> String {
    let action = answer.get("action").and_then(Value::as_str).unwrap_or("cancel");
    let content = answer.get("content").cloned().unwrap_or_else(|| json!({}));
    format!("Elicitation completed: action={action}, content={content}")
}

/// The tools the 2025-era scenarios call for server-to-client requests. Written as MRTR
/// handlers: on the 2026-07-28 wire they answer `input_required`; on the session wire the
/// adapter turns that into real `sampling/createMessage` / `elicitation/create` requests.
fn client_request_tools(builder: palisade_server::AppBuilder) -> palisade_server::AppBuilder {
    builder
        .tool(
            ToolDef::new("test_sampling")
                .description("Asks the client's model to answer a prompt (sampling)")
                .input_schema(string_schema("prompt"))
                .handler(|ctx, args| async move {
                    if let Some(text) = sampling_text(&ctx, "llm") {
                        return done(CallToolResult::text(format!("LLM response: {text}")));
                    }
                    let prompt = args.get("prompt").and_then(Value::as_str).unwrap_or_default().to_owned();
                    let params = json!({
                        "messages": [{ "role": "user", "content": { "type": "text", "text": prompt } }],
                        "maxTokens": 100
                    });
                    Ok(Outcome::InputRequired(InputRequired::new().sample("llm", params)))
                }),
        )
        .tool(
            ToolDef::new("test_elicitation")
                .description("Asks the user for a username and an email (elicitation)")
                .input_schema(string_schema("message"))
                .handler(|ctx, args| async move {
                    if let Some(answer) = ctx.input_response("user") {
                        let action = answer.get("action").and_then(Value::as_str).unwrap_or("cancel");
                        let content = answer.get("content").cloned().unwrap_or_else(|| json!({}));
                        return done(CallToolResult::text(format!("User response: action={action}, content={content}")));
                    }
                    let message = args.get("message").and_then(Value::as_str).unwrap_or_default().to_owned();
                    let schema = json!({
                        "type": "object",
                        "properties": {
                            "username": { "type": "string", "description": "User's response" },
                            "email": { "type": "string", "description": "User's email address" }
                        },
                        "required": ["username", "email"]
                    });
                    Ok(Outcome::InputRequired(InputRequired::new().elicit("user", message, schema)))
                }),
        )
        .tool(simple("test_elicitation_sep1034_defaults", "Elicits with a default for every primitive type").handler(|ctx, _| async move {
            if let Some(answer) = ctx.input_response("defaults") {
                return done(CallToolResult::text(elicitation_summary(answer)));
            }
            let schema = json!({
                "type": "object",
                "properties": {
                    "name": { "type": "string", "default": "John Doe" },
                    "age": { "type": "integer", "default": 30 },
                    "score": { "type": "number", "default": 95.5 },
                    "status": { "type": "string", "enum": ["active", "inactive", "pending"], "default": "active" },
                    "verified": { "type": "boolean", "default": true }
                }
            });
            Ok(Outcome::InputRequired(InputRequired::new().elicit("defaults", "Please review the defaults", schema)))
        }))
        .tool(simple("test_elicitation_sep1330_enums", "Elicits with every enum variant").handler(|ctx, _| async move {
            if let Some(answer) = ctx.input_response("enums") {
                return done(CallToolResult::text(elicitation_summary(answer)));
            }
            let titled = |prefix: &str, titles: [&str; 3]| -> Vec<Value> {
                titles.iter().enumerate().map(|(i, title)| json!({ "const": format!("{prefix}{}", i + 1), "title": title })).collect()
            };
            let schema = json!({
                "type": "object",
                "properties": {
                    "untitledSingle": { "type": "string", "enum": ["option1", "option2", "option3"] },
                    "titledSingle": { "type": "string", "oneOf": titled("value", ["First Option", "Second Option", "Third Option"]) },
                    "legacyEnum": { "type": "string", "enum": ["opt1", "opt2", "opt3"], "enumNames": ["Option One", "Option Two", "Option Three"] },
                    "untitledMulti": { "type": "array", "items": { "type": "string", "enum": ["option1", "option2", "option3"] } },
                    "titledMulti": { "type": "array", "items": { "anyOf": titled("value", ["First Choice", "Second Choice", "Third Choice"]) } }
                }
            });
            Ok(Outcome::InputRequired(InputRequired::new().elicit("enums", "Please choose", schema)))
        }))
}

fn mrtr_tools(builder: palisade_server::AppBuilder) -> palisade_server::AppBuilder {
    builder
        .tool(simple("test_input_required_result_elicitation", "Asks for the user's name (MRTR elicitation)").handler(|ctx, _| async move {
            match elicited_str(&ctx, "user_name", "name") {
                Some(name) => done(CallToolResult::text(format!("Hello, {name}!"))),
                None => Ok(Outcome::InputRequired(InputRequired::new().elicit("user_name", "What is your name?", string_schema("name")))),
            }
        }))
        .tool(simple("test_input_required_result_sampling", "Asks the client's model a question (MRTR sampling)").handler(|ctx, _| async move {
            match sampling_text(&ctx, "capital_question") {
                Some(text) => done(CallToolResult::text(format!("Sampling result: {text}"))),
                None => Ok(Outcome::InputRequired(InputRequired::new().sample(
                    "capital_question",
                    json!({ "messages": [{ "role": "user", "content": { "type": "text", "text": "What is the capital of France?" } }], "maxTokens": 100 }),
                ))),
            }
        }))
        .tool(simple("test_input_required_result_list_roots", "Asks for the client's roots (MRTR roots)").handler(|ctx, _| async move {
            match roots_count(&ctx, "client_roots") {
                Some(count) => done(CallToolResult::text(format!("Found {count} root(s)"))),
                None => Ok(Outcome::InputRequired(InputRequired::new().list_roots("client_roots"))),
            }
        }))
        .tool(simple("test_input_required_result_request_state", "Round-trips sealed request state").handler(|ctx, _| async move {
            let state_ok = ctx.request_state() == Some(&json!({ "step": "confirm" }));
            if state_ok && elicited(&ctx, "confirm", "ok").is_some() {
                return done(CallToolResult::text("state-ok: requestState validated"));
            }
            let schema = json!({ "type": "object", "properties": { "ok": { "type": "boolean" } }, "required": ["ok"] });
            Ok(Outcome::InputRequired(InputRequired::new().elicit("confirm", "Please confirm", schema).with_state(json!({ "step": "confirm" }))))
        }))
        .tool(simple("test_input_required_result_multiple_inputs", "Asks for three inputs at once").handler(|ctx, _| async move {
            let answered = (elicited_str(&ctx, "user_name", "name"), sampling_text(&ctx, "greeting"), roots_count(&ctx, "client_roots"));
            if ctx.request_state().is_some()
                && let (Some(name), Some(greeting), Some(roots)) = answered
            {
                return done(CallToolResult::text(format!("Name: {name}; Greeting: {greeting}; Roots: {roots}")));
            }
            let sampling = json!({ "messages": [{ "role": "user", "content": { "type": "text", "text": "Generate a greeting" } }], "maxTokens": 50 });
            Ok(Outcome::InputRequired(
                InputRequired::new()
                    .elicit("user_name", "What is your name?", string_schema("name"))
                    .sample("greeting", sampling)
                    .list_roots("client_roots")
                    .with_state(json!({ "step": "all" })),
            ))
        }))
        .tool(simple("test_input_required_result_multi_round", "Asks two questions in two rounds").handler(|ctx, _| async move {
            let round = ctx.request_state().and_then(|s| s.get("round")).and_then(Value::as_u64);
            match round {
                Some(1) if let Some(name) = elicited_str(&ctx, "step1", "name") => Ok(Outcome::InputRequired(
                    InputRequired::new()
                        .elicit("step2", "Step 2: What is your favorite color?", string_schema("color"))
                        .with_state(json!({ "round": 2, "name": name })),
                )),
                Some(2) if let Some(color) = elicited_str(&ctx, "step2", "color") => {
                    let name = ctx.request_state().and_then(|s| s.get("name")).and_then(Value::as_str).unwrap_or_default();
                    done(CallToolResult::text(format!("Multi-round complete for {name} who likes {color}")))
                }
                _ => Ok(Outcome::InputRequired(
                    InputRequired::new().elicit("step1", "Step 1: What is your name?", string_schema("name")).with_state(json!({ "round": 1 })),
                )),
            }
        }))
        .tool(simple("test_input_required_result_tampered_state", "Refuses request state that was altered").handler(|ctx, _| async move {
            // The pipeline already refused any state whose seal does not verify.
            if ctx.request_state() == Some(&json!({ "step": "integrity" })) && elicited(&ctx, "confirm", "ok").is_some() {
                return done(CallToolResult::text("integrity-ok: state verified"));
            }
            let schema = json!({ "type": "object", "properties": { "ok": { "type": "boolean" } }, "required": ["ok"] });
            Ok(Outcome::InputRequired(InputRequired::new().elicit("confirm", "Please confirm", schema).with_state(json!({ "step": "integrity" }))))
        }))
        .tool(simple("test_input_required_result_capabilities", "Asks only for what the client declared").handler(|ctx, _| async move {
            if !ctx.input_responses().is_empty() {
                let keys: Vec<&str> = ctx.input_responses().keys().map(String::as_str).collect();
                return done(CallToolResult::text(format!("capabilities-ok: received {}", keys.join(", "))));
            }
            let mut input = InputRequired::new();
            if ctx.meta().has_capability("sampling") {
                input = input.sample("sample_input", json!({ "messages": [{ "role": "user", "content": { "type": "text", "text": "Say hello" } }], "maxTokens": 20 }));
            }
            if ctx.meta().has_capability("elicitation") {
                input = input.elicit("elicit_input", "Say something", string_schema("text"));
            }
            if input.requests().is_empty() {
                return done(CallToolResult::text("No supported capabilities declared"));
            }
            Ok(Outcome::InputRequired(input.with_state(json!({ "step": "capabilities" }))))
        }))
}

fn resources(builder: palisade_server::AppBuilder) -> palisade_server::AppBuilder {
    builder
        .resource(
            ResourceDef::new("test://static-text", "static-text")
                .description("A static text resource")
                .mime_type("text/plain")
                .ttl_ms(60_000)
                .reader(|_, uri| async move {
                    Ok(Outcome::Complete(vec![ResourceContents::text(
                        uri,
                        "text/plain",
                        "This is the content of the static text resource.",
                    )]))
                }),
        )
        .resource(
            ResourceDef::new("test://static-binary", "static-binary")
                .description("A static binary resource (a PNG image)")
                .mime_type("image/png")
                .ttl_ms(60_000)
                .reader(|_, uri| async move {
                    Ok(Outcome::Complete(vec![ResourceContents::blob(uri, "image/png", png())]))
                }),
        )
        .resource(
            ResourceDef::new("test://watched-resource", "watched-resource")
                .description("A resource whose updates listen streams can subscribe to")
                .mime_type("text/plain")
                .reader(|_, uri| async move {
                    Ok(Outcome::Complete(vec![ResourceContents::text(uri, "text/plain", "Watched resource content")]))
                }),
        )
        .resource_template(
            ResourceTemplateDef::new("test://template/{id}/data", "template")
                .description("Data for an id")
                .mime_type("application/json")
                .reader(|_, uri, vars| async move {
                    let id = vars.get("id").cloned().unwrap_or_default();
                    let text =
                        json!({ "id": id, "templateTest": true, "data": format!("Data for ID: {id}") }).to_string();
                    Ok(Outcome::Complete(vec![ResourceContents {
                        uri,
                        mime_type: Some("application/json".into()),
                        body: ResourceBody::Text(text),
                        meta: None,
                    }]))
                }),
        )
}

fn prompts(builder: palisade_server::AppBuilder) -> palisade_server::AppBuilder {
    let user_text = |text: String| PromptMessage::user(Content::text(text));
    builder
        .prompt(PromptDef::new("test_simple_prompt").description("A simple prompt").handler(move |_, _| async move {
            Ok(Outcome::Complete(GetPromptResult {
                description: None,
                messages: vec![user_text("This is a simple prompt for testing.".into())],
            }))
        }))
        .prompt(
            PromptDef::new("test_prompt_with_arguments")
                .description("A prompt with two required arguments")
                .argument(PromptArgument::new("arg1").description("First test argument").required())
                .argument(PromptArgument::new("arg2").description("Second test argument").required())
                .handler(move |_, args| async move {
                    let text = format!("Prompt with arguments: arg1='{}', arg2='{}'", args["arg1"], args["arg2"]);
                    Ok(Outcome::Complete(GetPromptResult { description: None, messages: vec![user_text(text)] }))
                }),
        )
        .prompt(
            PromptDef::new("test_prompt_with_embedded_resource")
                .description("A prompt embedding a resource")
                .argument(PromptArgument::new("resourceUri").description("URI of the resource to embed").required())
                .handler(move |_, args| async move {
                    let resource = ResourceContents::text(
                        args["resourceUri"].clone(),
                        "text/plain",
                        "Embedded resource content for testing.",
                    );
                    Ok(Outcome::Complete(GetPromptResult {
                        description: None,
                        messages: vec![
                            PromptMessage::user(Content::Resource(resource)),
                            user_text("Please process the embedded resource above.".into()),
                        ],
                    }))
                }),
        )
        .prompt(PromptDef::new("test_prompt_with_image").description("A prompt with an image").handler(
            move |_, _| async move {
                Ok(Outcome::Complete(GetPromptResult {
                    description: None,
                    messages: vec![PromptMessage::user(image()), user_text("Please analyze the image above.".into())],
                }))
            },
        ))
        .prompt(
            PromptDef::new("test_input_required_result_prompt")
                .description("A prompt that first asks for context (MRTR)")
                .handler(move |ctx, _| async move {
                    match elicited_str(&ctx, "user_context", "context") {
                        Some(context) => Ok(Outcome::Complete(GetPromptResult {
                            description: None,
                            messages: vec![user_text(format!("Prompt with context: {context}"))],
                        })),
                        None => Ok(Outcome::InputRequired(InputRequired::new().elicit(
                            "user_context",
                            "What context should the prompt use?",
                            string_schema("context"),
                        ))),
                    }
                }),
        )
}

/// The tasks extension's fixtures (the `tasks-*` scenarios name them).
fn task_tools(builder: palisade_server::AppBuilder) -> palisade_server::AppBuilder {
    let confirm_schema =
        json!({ "type": "object", "properties": { "confirm": { "type": "boolean" } }, "required": ["confirm"] });
    let multi_schema =
        json!({ "type": "object", "properties": { "name": { "type": "string" }, "confirm": { "type": "boolean" } } });
    builder
        .tool(
            ToolDef::new("greet")
                .description("Greets someone (never a task)")
                .input_schema(
                    json!({ "type": "object", "properties": { "name": { "type": "string" } }, "required": ["name"] }),
                )
                .handler(|_, args| async move {
                    let name = args.get("name").and_then(Value::as_str).unwrap_or("world").to_owned();
                    done(CallToolResult::text(format!("Hello, {name}!")))
                }),
        )
        .tool(
            ToolDef::new("slow_compute")
                .description(
                    "Sleeps `seconds`, then answers; a task when the client can take one; stops when cancelled",
                )
                .input_schema(json!({ "type": "object", "properties": {
                    "seconds": { "type": "number", "minimum": 0, "maximum": 600 }, "label": { "type": "string" } } }))
                .task_support(TaskSupport::Optional)
                .idempotent()
                .handler(|ctx, args| async move {
                    let seconds = args.get("seconds").and_then(Value::as_f64).unwrap_or(1.0).clamp(0.0, 600.0);
                    let label = args.get("label").and_then(Value::as_str).unwrap_or("result").to_owned();
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs_f64(seconds)) => {
                            done(CallToolResult::text(format!("Computed {label} after {seconds} s")))
                        }
                        () = ctx.cancellation().cancelled() => Err(ProtocolError::Internal),
                    }
                }),
        )
        .tool(
            simple("failing_job", "Runs only as a task; reports a tool error after about a second")
                .task_support(TaskSupport::Required)
                .handler(|_, _| async {
                    tokio::time::sleep(Duration::from_millis(800)).await;
                    done(CallToolResult::error("the job failed"))
                }),
        )
        .tool(
            simple("protocol_error_job", "A task whose tool fails with a protocol error")
                .task_support(TaskSupport::Optional)
                .handler(|_, _| async { Err(ProtocolError::Internal) }),
        )
        .tool(
            ToolDef::new("confirm_delete")
                .description("A task that asks the user to confirm before it deletes a file")
                .input_schema(json!({ "type": "object", "properties": { "filename": { "type": "string" } } }))
                .task_support(TaskSupport::Optional)
                .handler(move |ctx, args| {
                    let schema = confirm_schema.clone();
                    async move {
                        let filename = args.get("filename").and_then(Value::as_str).unwrap_or("file").to_owned();
                        match ctx.input_response("confirm") {
                            Some(answer) if answer["action"] == "accept" && answer["content"]["confirm"] == true => {
                                done(CallToolResult::text(format!("Deleted {filename}")))
                            }
                            Some(_) => done(CallToolResult::text(format!("Kept {filename}"))),
                            None => Ok(Outcome::InputRequired(InputRequired::new().elicit(
                                "confirm",
                                format!("Delete {filename}?"),
                                schema,
                            ))),
                        }
                    }
                }),
        )
        .tool(
            simple("multi_input", "A task that asks two questions at once")
                .task_support(TaskSupport::Optional)
                .handler(move |ctx, _| {
                    let schema = multi_schema.clone();
                    async move {
                        let (first, second) = (ctx.input_response("first"), ctx.input_response("second"));
                        if first.is_some() && second.is_some() {
                            return done(CallToolResult::text("Both answers received"));
                        }
                        let mut input = InputRequired::new();
                        if first.is_none() {
                            input = input.elicit("first", "First question", schema.clone());
                        }
                        if second.is_none() {
                            input = input.elicit("second", "Second question", schema);
                        }
                        Ok(Outcome::InputRequired(input))
                    }
                }),
        )
        .tool(
            simple("test_tool_with_task", "Asks for a name (MRTR), then finishes as a task")
                .task_support(TaskSupport::Required)
                .task_prelude(|ctx, _| async move {
                    Ok(elicited_str(&ctx, "user_name", "name")
                        .is_none()
                        .then(|| InputRequired::new().elicit("user_name", "What is your name?", string_schema("name"))))
                })
                .handler(|ctx, _| async move {
                    let name = elicited_str(&ctx, "user_name", "name").unwrap_or_default();
                    done(CallToolResult::text(format!("Hello, {name}! Your task is complete.")))
                }),
        )
}
