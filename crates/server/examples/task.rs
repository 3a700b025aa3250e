//! A task-capable tool: run as a durable task when the request declares the tasks extension,
//! synchronously otherwise. Tasks live in a store (here in-memory SQLite) and are run by the
//! server's task service, under the same audit log. `--self-test` calls it once synchronously,
//! then as a task (declaring the tasks extension), polls the task to completion and prints its
//! result.

#![allow(clippy::print_stdout)] // the self-test's output is what the example shows

use std::collections::BTreeSet;
use std::sync::Arc;

use palisade_server::SubjectKey;
use palisade_server::auth::EnvironmentPrincipal;
use palisade_server::clock::SystemClock;
use palisade_server::context::NotificationSink;
use palisade_server::prelude::*;
use palisade_store::SqliteStore;
use palisade_wire::{Request, RequestId};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Report {
    month: String,
}

#[tokio::main]
async fn main() {
    let app = App::builder("reports", "1.0.0")
        .tool(
            ToolDef::new("monthly_report")
                .description("Builds a month's report (slow: may run as a task)")
                .effect(Effect::ReadOnly)
                .scopes(&["reports"])
                .task_support(TaskSupport::Optional)
                .idempotent()
                .run(|_ctx, Report { month }: Report| async move { Json(json!({ "month": month, "orders": 42 })) }),
        )
        .build()
        .expect("valid definitions");
    let store = Arc::new(SqliteStore::open("sqlite::memory:").await.expect("an in-memory store"));
    let subject_key = SubjectKey::from_bytes(&[1; 32]).expect("a 32-byte key");
    let tasks = TaskService::new(store.clone(), subject_key, TaskConfig::default(), Arc::new(SystemClock));
    let principal = EnvironmentPrincipal {
        subject: "alice".into(),
        tenant: None,
        client_id: None,
        scopes: BTreeSet::from(["reports".to_owned()]),
    };
    let server = Server::new(app)
        .authenticator(Authenticator::Environment(principal))
        .audit(store)
        .tasks(Arc::new(tasks))
        .build()
        .expect("a consistent server");
    if !std::env::args().any(|arg| arg == "--self-test") {
        let served = palisade_server::stdio::serve(Arc::new(server), tokio::io::stdin(), tokio::io::stdout()).await;
        return served.expect("stdio");
    }
    // Without the extension the call is answered synchronously.
    let answered = call(
        &server,
        1,
        "tools/call",
        json!({ "name": "monthly_report", "arguments": { "month": "2026-10" } }),
        json!({}),
    )
    .await;
    println!("synchronous: {}", answered["result"]["structuredContent"]);
    // With it (declared on each request) the call creates a durable task: a flat CreateTaskResult.
    let tasks_caps = json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } });
    let created = call(
        &server,
        2,
        "tools/call",
        json!({ "name": "monthly_report", "arguments": { "month": "2026-11" } }),
        tasks_caps.clone(),
    )
    .await;
    println!("created: {} {}", created["result"]["resultType"], created["result"]["status"]);
    let task_id = created["result"]["taskId"].clone();
    // Poll `tasks/get` until the task is done; a completed task carries its result.
    for attempt in 3..=500 {
        let polled = call(&server, attempt, "tasks/get", json!({ "taskId": task_id }), tasks_caps.clone()).await;
        let status = polled["result"]["status"].as_str().unwrap_or("?").to_owned();
        if !["working", "input_required"].contains(&status.as_str()) {
            println!("{status}: {}", polled["result"]["result"]["structuredContent"]);
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    println!("the task did not finish");
}

/// One request through every stage of the pipeline, as a transport would hand it over.
async fn call(server: &Server, id: i64, method: &str, mut params: Value, capabilities: Value) -> Value {
    params["_meta"] = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities });
    let params = params.as_object().cloned().unwrap_or_default();
    let request = Request { id: RequestId::Number(id), method: method.into(), params };
    let (sink, _notifications) = NotificationSink::channel(16);
    server.handle_request(request, None, sink, CancellationToken::new()).await.frame
}
