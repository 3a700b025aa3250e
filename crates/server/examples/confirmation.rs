//! A tool that needs the user's confirmation of each concrete call: the first call answers
//! with a question for the user (an MRTR round) and the handler does not run until the answer
//! comes back bound to exactly these arguments. Confirmations are spent once, in a single-use
//! store. `--self-test` makes the first call and prints what the server asks.

#![allow(clippy::print_stdout)] // the self-test's output is what the example shows

use std::collections::BTreeSet;
use std::sync::Arc;

use palisade_server::auth::EnvironmentPrincipal;
use palisade_server::context::NotificationSink;
use palisade_server::prelude::*;
use palisade_store::SqliteStore;
use palisade_wire::{Request, RequestId};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Transfer {
    to: String,
    cents: u64,
}

#[tokio::main]
async fn main() {
    let app = App::builder("bank", "1.0.0")
        .tool(
            ToolDef::new("transfer")
                .description("Sends money")
                .scopes(&["bank:pay"])
                .confirm_with(|_ctx, args| Ok(format!("Send {} cents to {}?", args["cents"], args["to"])))
                .run(|_ctx, Transfer { to, cents }: Transfer| async move { format!("sent {cents} cents to {to}") }),
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
    let params = json!({ "name": "transfer", "arguments": { "to": "bob", "cents": 500 },
        "_meta": { "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": { "elicitation": {} } } });
    let params = params.as_object().cloned().unwrap_or_default();
    let request = Request { id: RequestId::Number(1), method: "tools/call".into(), params };
    let (sink, _notifications) = NotificationSink::channel(16);
    let reply = server.handle_request(request, None, sink, CancellationToken::new()).await;
    println!("{}", reply.frame["result"]);
}
