//! Findings of the adversarial review, through `Server::handle_request`: every refusal after the
//! allow decision is on the record (C11); what a listen stream or a completion only *names*
//! needs the scopes of acting on it; streams per principal and listen filters are bounded.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use palisade_server::auth::{Authenticator, EnvironmentPrincipal};
use palisade_server::context::NotificationSink;
use palisade_server::reply::Reply;
use palisade_server::secret::ServerSecret;
use palisade_server::{
    App, CallToolResult, Completion, Outcome, PromptArgument, PromptDef, ResourceContents, ResourceDef, Server,
    ServerConfig, SubjectKey, TaskConfig, TaskService, TaskSupport, ToolDef,
};
use palisade_store::{AuditStore, Decision, SqliteStore, StoredAuditRecord};
use palisade_wire::{Request, RequestId};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

fn app() -> App {
    let schema = json!({ "type": "object", "properties": { "n": { "type": "integer" } }, "required": ["n"] });
    App::builder("hardening-test", "0")
        .tool(
            ToolDef::new("typed")
                .input_schema(schema)
                .handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("ran"))) }),
        )
        .tool(
            ToolDef::new("confirmed")
                .needs_confirmation()
                .handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("ran"))) }),
        )
        .tool(
            ToolDef::new("task_only")
                .task_support(TaskSupport::Required)
                .handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("ran"))) }),
        )
        .resource(ResourceDef::new("test://secret", "secret").scopes(&["secret:read"]).reader(|_, uri| async move {
            Ok(Outcome::Complete(vec![ResourceContents::text(uri, "text/plain", "s")]))
        }))
        .resource(ResourceDef::new("test://open", "open").reader(|_, uri| async move {
            Ok(Outcome::Complete(vec![ResourceContents::text(uri, "text/plain", "o")]))
        }))
        .prompt(
            PromptDef::new("guarded")
                .argument(PromptArgument::new("topic"))
                .scopes(&["prompt:use"])
                .handler(|_, _| async { Err(palisade_server::ProtocolError::Internal) }),
        )
        .completion(|_, _, _, _| Completion { values: vec!["a".into()], total: None, has_more: false })
        .build()
        .unwrap()
}

struct World {
    server: Arc<Server>,
    audit: Arc<SqliteStore>,
}

async fn world(scopes: &[&str], config: ServerConfig) -> World {
    let audit = Arc::new(SqliteStore::open("sqlite::memory:").await.unwrap());
    let principal = Authenticator::Environment(EnvironmentPrincipal {
        subject: "alice".into(),
        tenant: Some("acme".into()),
        client_id: Some("it".into()),
        scopes: scopes.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>(),
    });
    let key = SubjectKey::from_bytes(&[5u8; 32]).unwrap();
    let clock = Arc::new(palisade_server::clock::SystemClock);
    let tasks = Arc::new(TaskService::new(audit.clone(), key, TaskConfig::default(), clock));
    let server = Server::builder(app(), config, principal, ServerSecret::random())
        .audit(audit.clone())
        .once_store(audit.clone())
        .tasks(tasks)
        .build()
        .unwrap();
    World { server: Arc::new(server), audit }
}

fn request(method: &str, params: Value, capabilities: Value) -> Request {
    let mut params: Map<String, Value> = params.as_object().cloned().unwrap();
    let meta = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities });
    params.insert("_meta".into(), meta);
    Request { id: RequestId::Number(1), method: method.into(), params }
}

impl World {
    async fn send(&self, request: Request) -> Reply {
        let (sink, _receiver) = NotificationSink::channel(16);
        self.server.handle_request(request, None, sink, CancellationToken::new()).await
    }

    /// The records of the last request (those after the newest record of an earlier trace).
    async fn last_trace(&self) -> Vec<StoredAuditRecord> {
        let recent = self.audit.recent(50).await.unwrap();
        let trace = recent.first().unwrap().record.trace_id.clone();
        recent.into_iter().filter(|stored| stored.record.trace_id == trace).collect()
    }
}

/// Each refusal the pipeline makes after it recorded its allow (a forged sealed state, a bogus
/// cursor, a missing tasks capability, arguments that fail the schema, a declined
/// confirmation) leaves a deny record with its stage and code, besides the allow.
#[tokio::test]
async fn refusals_after_the_allow_are_on_the_record() {
    let world = world(&[], ServerConfig::default()).await;
    let elicitation = json!({ "elicitation": {} });
    let cases = [
        (
            "a forged requestState",
            request(
                "tools/call",
                json!({ "name": "confirmed", "arguments": {}, "requestState": "v1.forged.state",
                    "inputResponses": { "palisade.confirm": { "action": "accept", "content": { "confirm": true } } } }),
                elicitation.clone(),
            ),
            "dispatch",
            Some(-32602),
        ),
        ("a bogus cursor", request("tools/list", json!({ "cursor": "bogus" }), json!({})), "dispatch", Some(-32602)),
        (
            "a missing tasks capability",
            request("tools/call", json!({ "name": "task_only", "arguments": {} }), json!({})),
            "dispatch",
            Some(-32021),
        ),
        (
            "invalid arguments",
            request("tools/call", json!({ "name": "typed", "arguments": { "n": "seven" } }), json!({})),
            "arguments",
            Some(-32602),
        ),
    ];
    for (what, request, stage, code) in cases {
        let reply = world.send(request).await;
        let records = world.last_trace().await;
        let deny = records.iter().find(|stored| stored.record.decision == Decision::Deny);
        let deny = deny.unwrap_or_else(|| panic!("{what}: no deny record in {records:?} (reply {})", reply.frame));
        assert_eq!((deny.record.stage.as_str(), deny.record.code), (stage, code), "{what}");
        assert!(records.iter().any(|stored| stored.record.decision == Decision::Allow), "{what}: the allow stays");
    }
    // The schema refusal is a tool error the model can read, naming the schema, not the value.
    let reply =
        world.send(request("tools/call", json!({ "name": "typed", "arguments": { "n": "seven" } }), json!({}))).await;
    let text = reply.frame["result"]["content"][0]["text"].as_str().unwrap();
    assert_eq!(reply.frame["result"]["isError"], true);
    assert!(text.contains("/properties/n/type") && !text.contains("seven"), "{text}");

    // A declined confirmation: asked, then declined; the decline is a deny at `confirmation`.
    let asked =
        world.send(request("tools/call", json!({ "name": "confirmed", "arguments": {} }), elicitation.clone())).await;
    let state = asked.frame["result"]["requestState"].clone();
    let declined = json!({ "name": "confirmed", "arguments": {}, "requestState": state,
        "inputResponses": { "palisade.confirm": { "action": "decline" } } });
    let reply = world.send(request("tools/call", declined, elicitation)).await;
    assert_eq!(reply.frame["result"]["isError"], true, "{}", reply.frame);
    let records = world.last_trace().await;
    assert!(records.iter().any(|s| s.record.stage == "confirmation" && s.record.decision == Decision::Deny));
    assert!(world.audit.verify_chain().await.unwrap().is_intact());
}

/// A listen filter naming a resource needs that resource's read scopes; a completion needs the
/// scopes of its reference. Refused with 403 and the scopes named; with them it is served.
#[tokio::test]
async fn listen_filters_and_completions_need_the_scopes_of_what_they_name() {
    let bare = world(&[], ServerConfig::default()).await;
    let listen = |uri: &str| {
        request("subscriptions/listen", json!({ "notifications": { "resourceSubscriptions": [uri] } }), json!({}))
    };
    let refused = bare.send(listen("test://secret")).await;
    assert_eq!(
        (refused.status, refused.frame["error"]["data"]["requiredScopes"].clone()),
        (403, json!(["secret:read"]))
    );
    let complete = |reference: Value| {
        request(
            "completion/complete",
            json!({ "ref": reference, "argument": { "name": "topic", "value": "x" } }),
            json!({}),
        )
    };
    let refused = bare.send(complete(json!({ "type": "ref/prompt", "name": "guarded" }))).await;
    assert_eq!(
        (refused.status, refused.frame["error"]["data"]["requiredScopes"].clone()),
        (403, json!(["prompt:use"]))
    );
    let refused = bare.send(complete(json!({ "type": "ref/resource", "uri": "test://secret" }))).await;
    assert_eq!(refused.status, 403, "{}", refused.frame);
    // What needs no scope is served without one.
    let open = bare.send(complete(json!({ "type": "ref/resource", "uri": "test://open" }))).await;
    assert_eq!(open.status, 200, "{}", open.frame);

    let scoped = world(&["secret:read", "prompt:use"], ServerConfig::default()).await;
    let served = scoped.send(complete(json!({ "type": "ref/prompt", "name": "guarded" }))).await;
    assert_eq!(served.frame["result"]["completion"]["values"], json!(["a"]), "{}", served.frame);
    let (sink, mut frames) = NotificationSink::channel(16);
    let server = scoped.server.clone();
    let stream = tokio::spawn(async move {
        server.handle_request(listen("test://secret"), None, sink, CancellationToken::new()).await
    });
    let ack = tokio::time::timeout(Duration::from_secs(5), frames.recv()).await.unwrap().unwrap();
    assert_eq!(ack["params"]["notifications"]["resourceSubscriptions"], json!(["test://secret"]));
    stream.abort();
}

/// A principal holds at most `max_streams_per_principal` open streams; a closed one frees its
/// place. A listen filter longer than `max_listen_filter_entries` is refused before any lookup.
#[tokio::test]
async fn streams_per_principal_and_listen_filters_are_bounded() {
    let config = ServerConfig { max_streams_per_principal: 2, max_listen_filter_entries: 3, ..ServerConfig::default() };
    let world = world(&[], config).await;
    let listen =
        || request("subscriptions/listen", json!({ "notifications": { "toolsListChanged": true } }), json!({}));
    let mut open = Vec::new();
    for _ in 0..2 {
        let (sink, mut frames) = NotificationSink::channel(16);
        let cancel = CancellationToken::new();
        let (server, token) = (world.server.clone(), cancel.clone());
        let task = tokio::spawn(async move { server.handle_request(listen(), None, sink, token).await });
        let ack = tokio::time::timeout(Duration::from_secs(5), frames.recv()).await.unwrap().unwrap();
        assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
        open.push((task, cancel, frames));
    }
    let refused = world.send(listen()).await;
    assert_eq!(refused.frame["error"]["code"], -32600, "{}", refused.frame);
    assert_eq!(refused.frame["error"]["message"], "invalid request: too many open streams for this caller");
    // One closes: a new one opens.
    let (task, cancel, _frames) = open.pop().unwrap();
    cancel.cancel();
    let _ = task.await;
    let (sink, mut frames) = NotificationSink::channel(16);
    let server = world.server.clone();
    let again =
        tokio::spawn(async move { server.handle_request(listen(), None, sink, CancellationToken::new()).await });
    let ack = tokio::time::timeout(Duration::from_secs(5), frames.recv()).await.unwrap().unwrap();
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    again.abort();

    let tasks = json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } });
    let long = request("subscriptions/listen", json!({ "notifications": { "taskIds": ["a", "b", "c", "d"] } }), tasks);
    let refused = world.send(long).await;
    assert_eq!(refused.frame["error"]["code"], -32602, "{}", refused.frame);
    let uris = json!({ "notifications": { "resourceSubscriptions": ["test://open", "test://open", "test://open", "test://open"] } });
    let refused = world.send(request("subscriptions/listen", uris, json!({}))).await;
    assert_eq!(refused.frame["error"]["code"], -32602, "{}", refused.frame);
}
