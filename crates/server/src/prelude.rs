//! What an application needs, in one import: `use palisade_server::prelude::*;` brings the
//! application builder and its definitions, the handler return forms, the request context, the
//! server builder and its parts.
//!
//! ```
//! use palisade_server::prelude::*;
//!
//! let app = App::builder("hello", "1.0.0")
//!     .tool(ToolDef::new("hello").run(|_ctx, _args: serde_json::Map<String, serde_json::Value>| async {
//!         "hello"
//!     }))
//!     .build()
//!     .unwrap();
//! let server = Server::new(app).without_audit().build().unwrap();
//! assert_eq!(server.app().tools().len(), 1);
//! ```

pub use crate::auth::Authenticator;
pub use crate::config::ServerConfig;
pub use crate::content::{CallToolResult, Content, GetPromptResult, PromptMessage, ResourceContents};
pub use crate::context::{InputRequired, Outcome, RequestContext};
pub use crate::handles::{HandleObject, HandlePolicy, HandleService, HandleType};
pub use crate::registry::{
    App, AppBuilder, Completion, CompletionRef, Effect, IntoToolResult, Json, PromptArgument, PromptDef, ResourceDef,
    ResourceTemplateDef, State, TaskSupport, ToolDef,
};
pub use crate::secret::ServerSecret;
pub use crate::server::{Server, ServerBuilder};
pub use crate::tasks::{TaskConfig, TaskService};
pub use palisade_wire::ProtocolError;
