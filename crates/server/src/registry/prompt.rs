//! Prompts: their definitions, arguments, builder and handler.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use palisade_wire::ProtocolError;
use serde_json::{Map, Value, json};

use super::tool::owned;
use crate::BoxFuture;
use crate::content::GetPromptResult;
use crate::context::{Outcome, RequestContext};
use crate::method::Origin;

type PromptHandler = Arc<
    dyn Fn(RequestContext, BTreeMap<String, String>) -> BoxFuture<Result<Outcome<GetPromptResult>, ProtocolError>>
        + Send
        + Sync,
>;

/// One argument of a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptArgument {
    pub(crate) name: String,
    description: Option<String>,
    required: bool,
}

impl PromptArgument {
    /// An optional argument.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), description: None, required: false }
    }

    /// Description.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Marks the argument required: `prompts/get` without it is `-32602`.
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }

    fn to_value(&self) -> Value {
        let mut out = json!({ "name": self.name, "required": self.required });
        if let Some(description) = &self.description {
            out["description"] = json!(description);
        }
        out
    }
}

/// A registered prompt.
pub struct PromptDef {
    pub(crate) name: String,
    pub(crate) definition: Value,
    pub(crate) required_scopes: Vec<String>,
    pub(crate) arguments: Vec<PromptArgument>,
    pub(crate) handler: PromptHandler,
    pub(crate) origin: Option<Arc<Origin>>,
}

/// A prompt under construction.
pub struct PromptBuilder {
    name: String,
    definition: Map<String, Value>,
    arguments: Vec<PromptArgument>,
    required_scopes: Vec<String>,
    origin: Option<Arc<Origin>>,
    relayed: bool,
}

impl PromptDef {
    /// Starts a prompt named `name`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(name: impl Into<String>) -> PromptBuilder {
        let name = name.into();
        let mut definition = Map::new();
        definition.insert("name".into(), json!(name));
        PromptBuilder {
            name,
            definition,
            arguments: Vec::new(),
            required_scopes: Vec::new(),
            origin: None,
            relayed: false,
        }
    }

    /// Starts a prompt from a complete definition another server sent (the gateway): every
    /// field kept as sent except `name`; its `arguments` are listed as sent, and the required
    /// ones among them are enforced like a registered prompt's.
    pub fn relayed(name: impl Into<String>, mut definition: Map<String, Value>, origin: Origin) -> PromptBuilder {
        let name = name.into();
        definition.insert("name".into(), json!(name));
        let arguments = definition
            .get("arguments")
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(|item| {
                        let name = item.get("name")?.as_str()?;
                        let required = item.get("required").and_then(Value::as_bool).unwrap_or(false);
                        Some(PromptArgument { name: name.to_owned(), description: None, required })
                    })
                    .collect()
            })
            .unwrap_or_default();
        PromptBuilder {
            name,
            definition,
            arguments,
            required_scopes: Vec::new(),
            origin: Some(Arc::new(origin)),
            relayed: true,
        }
    }
}

impl PromptBuilder {
    /// Scopes the caller must hold to get this prompt.
    pub fn scopes(mut self, scopes: &[&str]) -> Self {
        self.required_scopes = owned(scopes);
        self
    }

    /// Description.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.definition.insert("description".into(), json!(description.into()));
        self
    }

    /// Adds an argument.
    pub fn argument(mut self, argument: PromptArgument) -> Self {
        self.arguments.push(argument);
        self
    }

    /// Finishes the prompt with its handler.
    pub fn handler<F, Fut>(self, handler: F) -> PromptDef
    where
        F: Fn(RequestContext, BTreeMap<String, String>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<GetPromptResult>, ProtocolError>> + Send + 'static,
    {
        let mut definition = self.definition;
        if !self.relayed && !self.arguments.is_empty() {
            definition.insert(
                "arguments".into(),
                Value::Array(self.arguments.iter().map(PromptArgument::to_value).collect()),
            );
        }
        PromptDef {
            name: self.name,
            definition: Value::Object(definition),
            required_scopes: self.required_scopes,
            arguments: self.arguments,
            handler: Arc::new(move |ctx, args| Box::pin(handler(ctx, args))),
            origin: self.origin,
        }
    }
}

impl PromptDef {
    /// Names of required arguments missing from `args`.
    pub(crate) fn missing_required(&self, args: &BTreeMap<String, String>) -> Vec<&str> {
        self.arguments.iter().filter(|a| a.required && !args.contains_key(&a.name)).map(|a| a.name.as_str()).collect()
    }
}
