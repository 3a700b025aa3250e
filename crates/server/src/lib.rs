//! Palisade's server runtime: the library API an application registers its tools, resources and
//! prompts with ([`App`]), the server that wires every service together ([`ServerBuilder`]) and
//! publishes application snapshots while serving, the ordered request pipeline every request
//! passes through ([`pipeline`], one module per stage), and the two transports that feed it
//! (Streamable HTTP and stdio).
//!
//! **Architecture Invariant:** transports frame bytes, enforce their own limits (connections,
//! timeouts, sizes, Host/Origin, media types: [`http`]) and map replies onto HTTP or lines;
//! every protocol and security decision about a message is made in [`pipeline`], in one order,
//! for both.
//!
//! Layers, low to high: `clock`, `config`, `secret`, `method`, `content`, `events`, `health`, `periodic`,
//! `store_errors`, `streams`, `refusal_reason`, `clearance`, `delegated` → `auth`, `cursor`,
//! `mrtr`, `metrics` → `sessions`, `handles`, `rate_limits` → `reply`, `context` → `telemetry`, `registry` →
//! `audit`, `policy` → `execute`, `killswitch`, `delegation`, `surface_audit`, `refusals` → `tasks` →
//! `pipeline` → `server`, `stdio` → `http_response` → `legacy` → `http` → `prelude`. A module refers only to
//! modules of its own group or lower ones; within a group no two refer to each other in a circle.

pub mod audit;
pub mod auth;
pub mod clearance;
pub mod clock;
pub mod config;
pub mod content;
pub mod context;
pub mod cursor;
pub mod delegated;
pub mod delegation;
pub mod events;
mod execute;
pub mod handles;
pub mod health;
pub mod http;
mod http_response;
pub mod killswitch;
mod legacy;
pub mod method;
pub mod metrics;
pub mod mrtr;
pub mod periodic;
pub mod pipeline;
pub mod policy;
pub mod prelude;
pub mod rate_limits;
mod refusal_reason;
mod refusals;
pub mod registry;
pub mod reply;
pub mod secret;
pub mod server;
pub mod sessions;
pub mod stdio;
mod store_errors;
mod streams;
pub mod surface_audit;
pub mod tasks;
pub mod telemetry;

pub use auth::BearerToken;
pub use config::{LegacyConfig, ServerConfig};
pub use content::{CallToolResult, Content, GetPromptResult, PromptMessage, ResourceContents};
pub use context::{InputRequired, Outcome, RequestContext};
pub use events::{EventBus, ServerEvent};
pub use handles::{
    HandleError, HandleObject, HandlePhase, HandlePolicy, HandleService, HandleType, PrincipalEvent, ResolvedHandle,
    SubjectKey,
};
pub use method::{Method, OperationKey, Origin};
/// Inline reads of an application's own tables in a SQLite store's file (a primary-key probe on
/// the calling task, as the server's own handle lookup does), with the driver they run on.
pub use palisade_store::{InlineSqlite, StoreError, rusqlite};
pub use palisade_wire::{LogLevel, ProtocolError, RequestId};
pub use registry::{
    App, AppBuilder, Completion, CompletionRef, Effect, IntoToolResult, Json, ListFreshness, PromptArgument, PromptDef,
    ResourceDef, ResourceTemplateDef, RestartPolicy, State, TaskSupport, ToolDef, check_tool,
};
pub use reply::Reply;
pub use server::{BuildError, Published, Server, ServerBuilder};
pub use tasks::{TaskConfig, TaskService};

/// A boxed, sendable future: the return type of every registered handler.
pub type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;
