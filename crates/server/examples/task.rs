//! A task-capable tool: run as a durable task when the request declares the tasks extension,
//! synchronously otherwise. Tasks live in a store (here in-memory SQLite) and are run by the
//! server's task service, under the same audit log. `--self-test` calls it synchronously and
//! prints the answer.

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
use serde_json::json;
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
    let params = json!({ "name": "monthly_report", "arguments": { "month": "2026-11" },
        "_meta": { "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {} } });
    let params = params.as_object().cloned().unwrap_or_default();
    let request = Request { id: RequestId::Number(1), method: "tools/call".into(), params };
    let (sink, _notifications) = NotificationSink::channel(16);
    let reply = server.handle_request(request, None, sink, CancellationToken::new()).await;
    println!("{}", reply.frame["result"]["structuredContent"]);
}
