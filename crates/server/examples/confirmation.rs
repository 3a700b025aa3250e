//! A tool that needs the user's confirmation of each concrete call: the first call answers
//! with a question for the user (an MRTR round) and the handler does not run until the answer
//! comes back bound to exactly these arguments. Confirmations are spent once, in a single-use
//! store. `--self-test` runs the whole round: the first call and the question, the accepted
//! answer (the handler runs once), and the same answer again, refused.

#![allow(clippy::print_stdout)] // the self-test's output is what the example shows

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use palisade_server::auth::EnvironmentPrincipal;
use palisade_server::context::NotificationSink;
use palisade_server::prelude::*;
use palisade_store::SqliteStore;
use palisade_wire::{Request, RequestId};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Transfer {
    to: String,
    cents: u64,
}

#[tokio::main]
async fn main() {
    // How often the handler ran: only the self-test reads it.
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = App::builder("bank", "1.0.0")
        .tool(
            ToolDef::new("transfer")
                .description("Sends money")
                .scopes(&["bank:pay"])
                .confirm_with(|_ctx, args| Ok(format!("Send {} cents to {}?", args["cents"], args["to"])))
                .run(move |_ctx, Transfer { to, cents }: Transfer| {
                    let runs = counted.clone();
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        format!("sent {cents} cents to {to}")
                    }
                }),
        )
        .build()
        .expect("valid definitions");
    let store = Arc::new(SqliteStore::open("sqlite::memory:").await.expect("an in-memory store"));
    let principal = EnvironmentPrincipal {
        subject: "alice".into(),
        tenant: None,
        client_id: None,
        scopes: BTreeSet::from(["bank:pay".to_owned()]),
    };
    let server = Server::new(app)
        .authenticator(Authenticator::Environment(principal))
        .audit(store.clone())
        .once_store(store)
        .build()
        .expect("a consistent server");
    if !std::env::args().any(|arg| arg == "--self-test") {
        let served = palisade_server::stdio::serve(Arc::new(server), tokio::io::stdin(), tokio::io::stdout()).await;
        return served.expect("stdio");
    }
    // 1. The first call: the server asks, the handler does not run.
    let arguments = json!({ "to": "bob", "cents": 500 });
    let asked = call(&server, 1, json!({ "name": "transfer", "arguments": arguments })).await;
    println!("asked: {}", asked["result"]);
    let state = asked["result"]["requestState"].clone();
    // 2. The answer, as a 2026-07-28 client sends it: the same call again with the sealed state
    // and the user's acceptance. The handler runs, once.
    let answer = json!({ "name": "transfer", "arguments": arguments, "requestState": state,
        "inputResponses": { "palisade.confirm": { "action": "accept", "content": { "confirm": true } } } });
    let accepted = call(&server, 2, answer.clone()).await;
    println!("accepted: {}", accepted["result"]["content"][0]["text"].as_str().unwrap_or("?"));
    // 3. The same accepted state again: it was spent, so it is refused and nothing runs.
    let replayed = call(&server, 3, answer).await;
    println!("replayed: {}", replayed.get("error").unwrap_or(&replayed["result"]));
    println!("handler runs: {}", runs.load(Ordering::SeqCst));
}

/// One `tools/call` through every stage of the pipeline, from a client that can be asked.
async fn call(server: &Server, id: i64, mut params: Value) -> Value {
    params["_meta"] = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": { "elicitation": {} } });
    let params = params.as_object().cloned().unwrap_or_default();
    let request = Request { id: RequestId::Number(id), method: "tools/call".into(), params };
    let (sink, _notifications) = NotificationSink::channel(16);
    server.handle_request(request, None, sink, CancellationToken::new()).await.frame
}
