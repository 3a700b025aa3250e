//! What a tool handler may return ([`IntoToolResult`]: text, [`Json`], a [`CallToolResult`], an
//! [`Outcome`], or a `Result` of those) and the application state it may be given ([`State`]).

use std::any::Any;
use std::fmt::Display;
use std::ops::Deref;
use std::sync::Arc;

use palisade_wire::ProtocolError;
use serde::Serialize;

use crate::content::CallToolResult;
use crate::context::Outcome;

/// A tool handler's return value, turned into the answer the pipeline sends.
///
/// - `String` / `&'static str`: a single-text result;
/// - [`Json<T>`]: `structuredContent` plus its text rendering;
/// - [`CallToolResult`] or [`Outcome<CallToolResult>`] (which may ask the client for input);
/// - `Result<T, E>` of any of those: `Err` of a [`ProtocolError`] stays that protocol error
///   (what [`ToolBuilder::handler`](super::ToolBuilder::handler) does with one); any other
///   error is a tool-level failure the model reads (`isError`, its `Display` text).
///
/// ```
/// use palisade_server::prelude::*;
///
/// fn answer(result: impl IntoToolResult) -> serde_json::Value {
///     match result.into_tool_result() {
///         Ok(Outcome::Complete(result)) => result.into_value(),
///         _ => unreachable!(),
///     }
/// }
/// assert_eq!(answer("hi".to_string())["content"][0]["text"], "hi");
/// assert_eq!(answer(Json(serde_json::json!({"n": 3})))["structuredContent"]["n"], 3);
/// let failed: Result<String, std::num::ParseIntError> = "x".parse::<u8>().map(|n| n.to_string());
/// assert_eq!(answer(failed)["isError"], true);
/// let refused: Result<String, ProtocolError> = Err(ProtocolError::Internal);
/// assert!(refused.into_tool_result().is_err());
/// ```
pub trait IntoToolResult {
    /// The answer: a result, a request for input, or a protocol error.
    fn into_tool_result(self) -> Result<Outcome<CallToolResult>, ProtocolError>;
}

impl IntoToolResult for String {
    fn into_tool_result(self) -> Result<Outcome<CallToolResult>, ProtocolError> {
        Ok(Outcome::Complete(CallToolResult::text(self)))
    }
}

impl IntoToolResult for &'static str {
    fn into_tool_result(self) -> Result<Outcome<CallToolResult>, ProtocolError> {
        Ok(Outcome::Complete(CallToolResult::text(self)))
    }
}

impl IntoToolResult for CallToolResult {
    fn into_tool_result(self) -> Result<Outcome<CallToolResult>, ProtocolError> {
        Ok(Outcome::Complete(self))
    }
}

impl IntoToolResult for Outcome<CallToolResult> {
    fn into_tool_result(self) -> Result<Outcome<CallToolResult>, ProtocolError> {
        Ok(self)
    }
}

impl<T: IntoToolResult, E: Display + 'static> IntoToolResult for Result<T, E> {
    fn into_tool_result(self) -> Result<Outcome<CallToolResult>, ProtocolError> {
        match self {
            Ok(value) => value.into_tool_result(),
            Err(error) => match (&error as &dyn Any).downcast_ref::<ProtocolError>() {
                Some(protocol) => Err(protocol.clone()),
                None => Ok(Outcome::Complete(CallToolResult::error(error.to_string()))),
            },
        }
    }
}

/// A serializable value answered as `structuredContent`, also rendered as text
/// ([`CallToolResult::structured`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Json<T>(pub T);

impl<T: Serialize> IntoToolResult for Json<T> {
    fn into_tool_result(self) -> Result<Outcome<CallToolResult>, ProtocolError> {
        match serde_json::to_value(self.0) {
            Ok(value) => Ok(Outcome::Complete(CallToolResult::structured(value))),
            Err(error) => {
                tracing::warn!(%error, "a tool's structured result did not serialize");
                Err(ProtocolError::Internal)
            }
        }
    }
}

/// The application state given to every handler registered with
/// [`AppBuilder::tool_with`](super::AppBuilder::tool_with): shared, never cloned per call.
#[derive(Debug)]
pub struct State<S>(pub Arc<S>);

impl<S> Clone for State<S> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<S> Deref for State<S> {
    type Target = S;

    fn deref(&self) -> &S {
        &self.0
    }
}
