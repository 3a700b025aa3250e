//! The smallest Palisade server: one typed tool with its policy declared (read-only, a scope),
//! the audit log in an in-memory SQLite store, served on stdio — or, with `--self-test`, one
//! call through the whole pipeline, its answer printed.

#![allow(clippy::print_stdout)] // the self-test's output is what the example shows

use std::collections::BTreeSet;
use std::sync::Arc;

use palisade_server::auth::EnvironmentPrincipal;
use palisade_server::context::NotificationSink;
use palisade_server::prelude::*;
use palisade_store::SqliteStore;
use palisade_wire::{Request, RequestId};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Sum {
    a: i64,
    b: i64,
}

#[tokio::main]
async fn main() {
    let app = App::builder("minimal", "1.0.0")
        .tool(
            ToolDef::new("sum")
                .description("Adds two integers")
                .effect(Effect::ReadOnly)
                .scopes(&["calc"])
                .run(|_ctx, Sum { a, b }: Sum| async move { (a + b).to_string() }),
        )
        .build()
        .expect("valid definitions");
    let audit = Arc::new(SqliteStore::open("sqlite::memory:").await.expect("an in-memory audit log"));
    let principal = EnvironmentPrincipal {
        subject: "alice".into(),
        tenant: None,
        client_id: None,
        scopes: BTreeSet::from(["calc".to_owned()]),
    };
    let server = Server::new(app)
        .authenticator(Authenticator::Environment(principal))
        .audit(audit)
        .build()
        .expect("a consistent server");
    if std::env::args().any(|arg| arg == "--self-test") {
        let frame = call(&server, json!({ "name": "sum", "arguments": { "a": 2, "b": 3 } })).await;
        println!("sum = {}", frame["result"]["content"][0]["text"].as_str().unwrap_or("?"));
    } else {
        let served = palisade_server::stdio::serve(Arc::new(server), tokio::io::stdin(), tokio::io::stdout()).await;
        served.expect("stdio");
    }
}

/// One `tools/call` through every stage of the pipeline, as a transport would hand it over.
async fn call(server: &Server, mut params: Value) -> Value {
    params["_meta"] = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {} });
    let params = params.as_object().cloned().unwrap_or_default();
    let request = Request { id: RequestId::Number(1), method: "tools/call".into(), params };
    let (sink, _notifications) = NotificationSink::channel(16);
    server.handle_request(request, None, sink, CancellationToken::new()).await.frame
}
