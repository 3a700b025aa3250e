//! The library API: an application registers tools, resources, resource templates, prompts and
//! completions on an [`AppBuilder`]; [`AppBuilder::build`] checks every definition once, so a
//! running server never holds an invalid one.
//!
//! One file per kind of definition ([`tool`], [`resource`], [`prompt`]), the application that
//! collects them ([`app`]), the checks its build makes ([`checks`]) and the refusal it gives
//! ([`error`]); [`result`] holds what a tool handler may return and the state it may borrow.

pub mod app;
mod checks;
pub mod error;
pub mod prompt;
pub mod resource;
pub mod result;
pub mod tool;

#[cfg(test)]
mod tests;

pub use app::{App, AppBuilder, Completion, CompletionRef, ListFreshness};
pub use checks::check_tool;
pub use error::RegistryError;
pub use prompt::{PromptArgument, PromptBuilder, PromptDef};
pub use resource::{ResourceBuilder, ResourceDef, ResourceTemplateBuilder, ResourceTemplateDef};
pub use result::{IntoToolResult, Json, State};
pub(crate) use tool::ToolHandler;
pub use tool::{Effect, RestartPolicy, TaskSupport, ToolBuilder, ToolDef};
