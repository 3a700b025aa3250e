//! The error a refused definition gets from [`super::AppBuilder::build`].

/// A definition the builder refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// Two definitions share a name or URI.
    #[error("duplicate {kind} {name:?}")]
    Duplicate {
        /// tool, prompt, resource or template.
        kind: &'static str,
        /// The name or URI.
        name: String,
    },
    /// A tool name outside 1–128 characters of `[A-Za-z0-9_.-]`.
    #[error("invalid tool name {0:?}")]
    InvalidName(String),
    /// A handle argument or handle type that cannot work.
    #[error("tool {tool:?}: handle argument {argument:?}: {why}")]
    InvalidHandle {
        /// The tool (or the handle type, for a duplicate type).
        tool: String,
        /// The argument.
        argument: String,
        /// What is wrong.
        why: String,
    },
    /// An input or output schema that is not usable.
    #[error("tool {tool:?}: {why}")]
    InvalidSchema {
        /// The tool.
        tool: String,
        /// What is wrong.
        why: String,
    },
}
