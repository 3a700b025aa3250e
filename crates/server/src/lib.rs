//! Palisade's server runtime: the library API an application registers its tools, resources and
//! prompts with ([`App`]), the ordered request pipeline every request passes through
//! ([`pipeline`]), and the two transports that feed it (Streamable HTTP and stdio).
//!
//! **Architecture Invariant:** transports only frame bytes and map replies onto HTTP or lines;
//! every protocol and security decision is made in [`pipeline`], in one order, for both.

pub mod auth;
pub mod clock;
pub mod config;
pub mod content;
pub mod context;
pub mod cursor;
pub mod events;
pub mod handles;
pub mod http;
pub mod killswitch;
mod legacy;
pub mod metrics;
pub mod mrtr;
pub mod periodic;
pub mod pipeline;
mod refusals;
pub mod registry;
pub mod secret;
pub mod sessions;
pub mod stdio;
mod streams;
pub mod tasks;
pub mod telemetry;

pub use config::{LegacyConfig, ServerConfig};
pub use content::{CallToolResult, Content, GetPromptResult, PromptMessage, ResourceContents};
pub use context::{InputRequired, Outcome, RequestContext};
pub use events::{EventBus, ServerEvent};
pub use handles::{
    HandleError, HandleObject, HandlePhase, HandlePolicy, HandleService, HandleType, PrincipalEvent, ResolvedHandle,
    SubjectKey,
};
pub use palisade_wire::{LogLevel, ProtocolError, RequestId};
pub use pipeline::Server;
pub use registry::{
    App, AppBuilder, Completion, CompletionRef, Effect, PromptArgument, PromptDef, ResourceDef, ResourceTemplateDef,
    ToolDef,
};
pub use tasks::{RestartPolicy, TaskConfig, TaskService, TaskSupport};

/// A boxed, sendable future: the return type of every registered handler.
pub type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;
