//! A handle-based object: `note_open` mints a handle to a note for the caller (bound to its
//! subject, tenant and client, granting one scope); `note_read` declares a handle argument, so
//! the pipeline resolves and authorizes it before the handler runs, which then reads the
//! resolved object and never sees the raw handle. `--self-test` opens a note and reads it.

#![allow(clippy::print_stdout)] // the self-test's output is what the example shows

use std::collections::{BTreeMap, BTreeSet};
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
struct NoArguments {}

#[tokio::main]
async fn main() {
    let note = HandleType::new(
        "note",
        |_tenant: String, note_id: String| async move {
            Ok((note_id == "n1").then(|| HandleObject {
                object_ref: note_id,
                version: "1".into(),
                value: json!({ "text": "buy milk" }),
            }))
        },
        |_principal, _object, _scope, _phase| async { true },
    )
    .default_policy(HandlePolicy {
        ttl: std::time::Duration::from_secs(3600),
        allowed_scopes: vec!["note:read".into()],
        max_scopes: 1,
        version: 1,
    });
    let app = App::builder("notes", "1.0.0")
        .handle_type(note)
        .tool(ToolDef::new("note_open").scopes(&["notes"]).run(|ctx, NoArguments {}: NoArguments| async move {
            let handle = ctx.mint_handle("note", "n1", "1", &["note:read"]).await?;
            Ok::<_, palisade_server::HandleError>(Json(json!({ "note": handle })))
        }))
        .tool(ToolDef::new("note_read").effect(Effect::ReadOnly).handle_argument("note", "note", "note:read").run(
            |ctx, NoArguments {}: NoArguments| async move {
                let text = ctx.handle("note").map(|note| note.object["text"].clone());
                text.and_then(|text| text.as_str().map(str::to_owned)).ok_or("the note has no text")
            },
        ))
        .build()
        .expect("valid definitions");
    let store = Arc::new(SqliteStore::open("sqlite::memory:").await.expect("an in-memory store"));
    let subject_key = SubjectKey::from_bytes(&[2; 32]).expect("a 32-byte key");
    let handles =
        HandleService::new(store.clone(), subject_key, app.handle_types(), &BTreeMap::new(), Arc::new(SystemClock))
            .expect("handle types that fit the policies");
    let principal = EnvironmentPrincipal {
        subject: "alice".into(),
        tenant: Some("acme".into()),
        client_id: Some("example".into()),
        scopes: BTreeSet::from(["notes".to_owned(), "note:read".to_owned()]),
    };
    let server = Server::new(app)
        .authenticator(Authenticator::Environment(principal))
        .audit(store)
        .handles(Arc::new(handles))
        .build()
        .expect("a consistent server");
    if !std::env::args().any(|arg| arg == "--self-test") {
        let served = palisade_server::stdio::serve(Arc::new(server), tokio::io::stdin(), tokio::io::stdout()).await;
        return served.expect("stdio");
    }
    let opened = call(&server, json!({ "name": "note_open", "arguments": {} })).await;
    let handle = opened["result"]["structuredContent"]["note"].clone();
    let read = call(&server, json!({ "name": "note_read", "arguments": { "note": handle } })).await;
    println!("note: {}", read["result"]["content"][0]["text"].as_str().unwrap_or("?"));
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
