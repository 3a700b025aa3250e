//! `ServerBuilder::build` refuses every inconsistent setup, naming what to change.

use std::sync::Arc;

use palisade_server::auth::Authenticator;
use palisade_server::clock::SystemClock;
use palisade_server::secret::ServerSecret;
use palisade_server::{
    App, BuildError, CallToolResult, Outcome, Server, ServerConfig, SubjectKey, TaskConfig, TaskService, TaskSupport,
    ToolDef,
};
use palisade_store::SqliteStore;

fn one_tool(tool: ToolDef) -> App {
    App::builder("builder-test", "0").tool(tool).build().unwrap()
}

fn ran() -> impl Fn(
    palisade_server::RequestContext,
    serde_json::Map<String, serde_json::Value>,
) -> std::future::Ready<Result<Outcome<CallToolResult>, palisade_server::ProtocolError>>
+ Send
+ Sync
+ 'static {
    |_, _| std::future::ready(Ok(Outcome::Complete(CallToolResult::text("ran"))))
}

fn builder(app: App) -> palisade_server::ServerBuilder {
    Server::builder(app, ServerConfig::default(), Authenticator::UnauthenticatedLoopback, ServerSecret::random())
        .without_audit()
}

fn refusal(result: Result<Server, BuildError>) -> BuildError {
    result.err().expect("the build is refused")
}

#[tokio::test]
async fn a_tool_with_handle_arguments_needs_a_handle_service() {
    let app = App::builder("builder-test", "0")
        .handle_type(palisade_server::HandleType::new(
            "doc",
            |_tenant: String, _doc: String| async { Ok(None) },
            |_principal, _object, _scope, _phase| async { true },
        ))
        .tool(ToolDef::new("read").handle_argument("doc", "doc", "docs:read").handler(ran()))
        .build()
        .unwrap();
    let refused = refusal(builder(app).build());
    assert!(matches!(&refused, BuildError::HandlesWithoutService { tool } if tool == "read"), "{refused}");
    assert!(refused.to_string().contains("ServerBuilder::handles"), "{refused}");
}

#[tokio::test]
async fn a_needs_confirmation_tool_needs_a_single_use_store() {
    let refused = refusal(builder(one_tool(ToolDef::new("pay").needs_confirmation().handler(ran()))).build());
    assert!(matches!(&refused, BuildError::ConfirmationWithoutOnceStore { tool } if tool == "pay"), "{refused}");
    let store = Arc::new(SqliteStore::open("sqlite::memory:").await.unwrap());
    builder(one_tool(ToolDef::new("pay").needs_confirmation().handler(ran()))).once_store(store).build().unwrap();
}

#[tokio::test]
async fn a_task_only_tool_needs_a_task_service_of_its_own() {
    let task_only = || one_tool(ToolDef::new("job").task_support(TaskSupport::Required).handler(ran()));
    let refused = refusal(builder(task_only()).build());
    assert!(matches!(&refused, BuildError::TaskToolWithoutService { tool } if tool == "job"), "{refused}");
    let store = Arc::new(SqliteStore::open("sqlite::memory:").await.unwrap());
    let key = SubjectKey::from_bytes(&[1u8; 32]).unwrap();
    let tasks = Arc::new(TaskService::new(store, key, TaskConfig::default(), Arc::new(SystemClock)));
    builder(task_only()).tasks(tasks.clone()).build().unwrap();
    // The same service for a second server: its workers would run with the first's kill switch
    // and audit log.
    let refused = refusal(builder(task_only()).tasks(tasks).build());
    assert!(matches!(refused, BuildError::TaskServiceShared), "{refused}");
}

/// Log lines captured for one test (the build runs on this thread).
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_server_without_audit_says_so_at_build() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let app = App::builder("builder-test", "0").build().unwrap();
    Server::new(app).without_audit().build().expect("no audit log, turned off explicitly");
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(logged.contains("WARN"), "{logged}");
    assert!(
        logged.contains("the audit log is off (ServerBuilder::without_audit): no decision is recorded"),
        "{logged}"
    );
}

#[tokio::test]
async fn a_server_with_neither_an_audit_log_nor_without_audit_is_refused() {
    let app = App::builder("builder-test", "0").build().unwrap();
    let refused = refusal(Server::new(app).build());
    assert!(matches!(refused, BuildError::NoAuditLog), "{refused:?}");
    assert_eq!(
        refused.to_string(),
        "the server has no audit log: give it a store (ServerBuilder::audit) or turn it off explicitly (ServerBuilder::without_audit)"
    );
    let app = App::builder("builder-test", "0").build().unwrap();
    let refused = refusal(
        Server::builder(app, ServerConfig::default(), Authenticator::UnauthenticatedLoopback, ServerSecret::random())
            .build(),
    );
    assert!(matches!(refused, BuildError::NoAuditLog), "{refused:?}");
}
