//! The library API: an application registers tools, resources, resource templates, prompts and
//! completions on an [`AppBuilder`]; [`AppBuilder::build`] checks every definition once, so a
//! running server never holds an invalid one.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use palisade_wire::ProtocolError;
use serde_json::{Map, Value, json};

use crate::BoxFuture;
use crate::content::{CallToolResult, GetPromptResult, ResourceContents};
use crate::context::{InputRequired, Outcome, RequestContext};
use crate::handles::{HandleArgument, HandleType, handle_argument_schema};
use crate::method::{Method, Needs, Origin};

pub(crate) type ToolHandler = Arc<
    dyn Fn(RequestContext, Map<String, Value>) -> BoxFuture<Result<Outcome<CallToolResult>, ProtocolError>>
        + Send
        + Sync,
>;
type TaskPrelude = Arc<
    dyn Fn(RequestContext, Map<String, Value>) -> BoxFuture<Result<Option<InputRequired>, ProtocolError>> + Send + Sync,
>;
/// Whether a tool runs as a task. The server decides; the client only says it can take one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskSupport {
    /// Always synchronous.
    #[default]
    Forbidden,
    /// A task when the request declares the extension, synchronous otherwise.
    Optional,
    /// Only as a task: a request without the extension gets `-32021`.
    Required,
}

/// What happens to a `working` task whose instance died.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestartPolicy {
    /// The tool may have had effects: the task fails, saying why.
    #[default]
    Fail,
    /// The tool is idempotent: another instance runs it again from the start.
    Resume,
}

/// What a needs-confirmation tool shows the user for one concrete call (its objects resolved).
pub(crate) type ConfirmationSummary =
    Arc<dyn Fn(&RequestContext, &Map<String, Value>) -> Result<String, ProtocolError> + Send + Sync>;
type ResourceReader =
    Arc<dyn Fn(RequestContext, String, BTreeMap<String, String>) -> BoxFuture<ReadResult> + Send + Sync>;
type PromptHandler = Arc<
    dyn Fn(RequestContext, BTreeMap<String, String>) -> BoxFuture<Result<Outcome<GetPromptResult>, ProtocolError>>
        + Send
        + Sync,
>;
type CompletionHandler = Arc<dyn Fn(&CompletionRef, &str, &str, &BTreeMap<String, String>) -> Completion + Send + Sync>;
/// A completion answered by another server (the gateway): the request's context, the checked
/// reference and the request's params; the result is the `completion/complete` result object.
pub(crate) type RelayedCompletion = Arc<
    dyn Fn(RequestContext, CompletionRef, Map<String, Value>) -> BoxFuture<Result<Value, ProtocolError>> + Send + Sync,
>;
type ReadResult = Result<Outcome<Vec<ResourceContents>>, ProtocolError>;

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

/// A registered tool.
pub struct ToolDef {
    pub(crate) name: String,
    pub(crate) definition: Value,
    pub(crate) required_scopes: Vec<String>,
    pub(crate) effect: Effect,
    pub(crate) needs_confirmation: bool,
    pub(crate) confirmation_summary: Option<ConfirmationSummary>,
    pub(crate) header_params: Vec<(String, String)>,
    pub(crate) handle_args: Vec<HandleArgument>,
    pub(crate) task_support: TaskSupport,
    pub(crate) restart: RestartPolicy,
    pub(crate) task_prelude: Option<TaskPrelude>,
    pub(crate) handler: ToolHandler,
    pub(crate) validator: Option<Arc<jsonschema::Validator>>,
    pub(crate) origin: Option<Arc<Origin>>,
}

/// A tool under construction; [`ToolBuilder::handler`] finishes it.
pub struct ToolBuilder {
    name: String,
    definition: Map<String, Value>,
    required_scopes: Vec<String>,
    effect: Effect,
    needs_confirmation: bool,
    confirmation_summary: Option<ConfirmationSummary>,
    handle_args: Vec<HandleArgument>,
    task_support: TaskSupport,
    restart: RestartPolicy,
    task_prelude: Option<TaskPrelude>,
    origin: Option<Arc<Origin>>,
}

/// What calling a tool does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Effect {
    /// Reads only; no state changes.
    ReadOnly,
    /// Changes state (the default: a tool is side-effecting unless declared otherwise).
    #[default]
    SideEffecting,
}

impl ToolDef {
    /// Starts a tool named `name` with an empty-object input schema.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(name: impl Into<String>) -> ToolBuilder {
        let name = name.into();
        let mut definition = Map::new();
        definition.insert("name".into(), json!(name));
        definition.insert("inputSchema".into(), json!({ "type": "object" }));
        ToolBuilder {
            name,
            definition,
            required_scopes: Vec::new(),
            effect: Effect::default(),
            needs_confirmation: false,
            confirmation_summary: None,
            handle_args: Vec::new(),
            task_support: TaskSupport::default(),
            restart: RestartPolicy::default(),
            task_prelude: None,
            origin: None,
        }
    }

    /// Starts a tool from a complete definition another server sent (the gateway): every field
    /// is kept as sent, except `name`, which becomes `name`. The definition's `inputSchema` is
    /// checked like any other when the application is built ([`check_tool`]).
    pub fn relayed(name: impl Into<String>, mut definition: Map<String, Value>, origin: Origin) -> ToolBuilder {
        let name = name.into();
        definition.insert("name".into(), json!(name));
        let mut builder = Self::new(name);
        builder.definition = definition;
        builder.origin = Some(Arc::new(origin));
        builder
    }

    /// Where the tool comes from, when it is relayed.
    pub fn origin(&self) -> Option<&Origin> {
        self.origin.as_deref()
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What calling the tool does.
    pub fn effect(&self) -> Effect {
        self.effect
    }

    /// The definition as listed by `tools/list`.
    pub fn definition(&self) -> &Value {
        &self.definition
    }

    /// The arguments declared as handles.
    pub fn handle_arguments(&self) -> &[HandleArgument] {
        &self.handle_args
    }

    /// Whether the tool runs as a task.
    pub fn task_support(&self) -> TaskSupport {
        self.task_support
    }
}

impl ToolBuilder {
    /// Human-readable description.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.definition.insert("description".into(), json!(description.into()));
        self
    }

    /// Display title.
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.definition.insert("title".into(), json!(title.into()));
        self
    }

    /// JSON Schema (2020-12) of the arguments; its root must be `type: object`. Arguments are
    /// validated against it before the handler runs.
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.definition.insert("inputSchema".into(), schema);
        self
    }

    /// JSON Schema of `structuredContent`.
    pub fn output_schema(mut self, schema: Value) -> Self {
        self.definition.insert("outputSchema".into(), schema);
        self
    }

    /// Tool annotations (information for the client, never policy).
    pub fn annotations(mut self, annotations: Value) -> Self {
        self.definition.insert("annotations".into(), annotations);
        self
    }

    /// Scopes the caller must hold to call this tool.
    pub fn scopes(mut self, scopes: &[&str]) -> Self {
        self.required_scopes = owned(scopes);
        self
    }

    /// Declares what calling the tool does. Shown to clients as annotations (information only,
    /// never policy); the kill-switch stage keys its side-effect checks on it.
    pub fn effect(mut self, effect: Effect) -> Self {
        let annotations = self.definition.entry("annotations").or_insert_with(|| json!({}));
        if let Value::Object(annotations) = annotations {
            annotations.insert("readOnlyHint".into(), json!(effect == Effect::ReadOnly));
        }
        self.effect = effect;
        self
    }

    /// Requires the user's confirmation of each concrete call: before the handler runs, the
    /// pipeline asks (an MRTR elicitation showing the arguments) and the answer is bound, through
    /// the sealed request state, to exactly these arguments. Needs the client's elicitation
    /// capability (`-32021` otherwise).
    pub fn needs_confirmation(mut self) -> Self {
        self.needs_confirmation = true;
        self
    }

    /// [`needs_confirmation`](Self::needs_confirmation), showing the user what `summary` says of
    /// the concrete call instead of the raw arguments (it sees the call's resolved handle
    /// objects through the context: a checkout shows the basket's items and total). What it
    /// said is bound to the answer too: if the summary differs when the accepted call comes
    /// back (the basket changed in between), the call is refused and must be confirmed afresh.
    pub fn confirm_with(
        mut self,
        summary: impl Fn(&RequestContext, &Map<String, Value>) -> Result<String, ProtocolError> + Send + Sync + 'static,
    ) -> Self {
        self.needs_confirmation = true;
        self.confirmation_summary = Some(Arc::new(summary));
        self
    }

    /// Declares whether the tool runs as a task (the server decides; a request opts in by
    /// declaring the `io.modelcontextprotocol/tasks` extension). Default: never.
    pub fn task_support(mut self, support: TaskSupport) -> Self {
        self.task_support = support;
        self
    }

    /// Declares the tool idempotent: a task left `working` by an instance that died is run
    /// again by another. Without it such a task fails, saying why.
    pub fn idempotent(mut self) -> Self {
        self.restart = RestartPolicy::Resume;
        self
    }

    /// For a task-capable tool: a synchronous first step that may ask the client for input
    /// (an MRTR round) before any task exists. `Ok(None)` creates the task; its handler then sees
    /// the answers gathered here in [`RequestContext::input_response`].
    pub fn task_prelude<F, Fut>(mut self, prelude: F) -> Self
    where
        F: Fn(RequestContext, Map<String, Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<InputRequired>, ProtocolError>> + Send + 'static,
    {
        self.task_prelude = Some(Arc::new(move |ctx, args| Box::pin(prelude(ctx, args))));
        self
    }

    /// Declares the argument `name` a handle to an `object_type` object that must grant
    /// `required_scope`. The argument is added to the input schema (a required string of the
    /// handle's exact shape). Before the handler runs, the pipeline resolves it with every
    /// per-use check and removes it from the arguments: the handler reads the resolved object
    /// with [`RequestContext::handle`] and never sees the raw handle.
    pub fn handle_argument(mut self, name: &str, object_type: &str, required_scope: &str) -> Self {
        self.handle_args.push(HandleArgument {
            name: name.to_owned(),
            object_type: object_type.to_owned(),
            required_scope: required_scope.to_owned(),
        });
        self
    }

    /// Finishes the tool with a handler taking typed arguments. The input schema is generated
    /// from `A` (JSON Schema 2020-12); arguments are validated against it and deserialized before
    /// the handler runs, and a mismatch is a tool error the model can read.
    pub fn typed_handler<A, F, Fut>(self, handler: F) -> ToolDef
    where
        A: serde::de::DeserializeOwned + schemars::JsonSchema + Send + 'static,
        F: Fn(RequestContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<CallToolResult>, ProtocolError>> + Send + 'static,
    {
        let schema = serde_json::to_value(schemars::schema_for!(A)).unwrap_or_else(|_| json!({ "type": "object" }));
        let handler = Arc::new(handler);
        self.input_schema(schema).handler(move |ctx, arguments| {
            let handler = handler.clone();
            async move {
                match serde_json::from_value::<A>(Value::Object(arguments)) {
                    Ok(typed) => handler(ctx, typed).await,
                    // serde's message would quote the client's values back: logged, not sent.
                    Err(error) => {
                        tracing::debug!(%error, "arguments did not deserialize");
                        Ok(Outcome::Complete(CallToolResult::error(
                            "invalid arguments: they do not fit the tool's input schema",
                        )))
                    }
                }
            }
        })
    }

    /// Finishes the tool with its handler.
    pub fn handler<F, Fut>(self, handler: F) -> ToolDef
    where
        F: Fn(RequestContext, Map<String, Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<CallToolResult>, ProtocolError>> + Send + 'static,
    {
        let mut definition = self.definition;
        if let Some(Value::Object(schema)) = definition.get_mut("inputSchema") {
            for argument in &self.handle_args {
                let properties = schema.entry("properties").or_insert_with(|| json!({}));
                if let Value::Object(properties) = properties {
                    properties.insert(argument.name.clone(), handle_argument_schema(&argument.object_type));
                }
                let required = schema.entry("required").or_insert_with(|| json!([]));
                if let Value::Array(required) = required
                    && !required.iter().any(|r| r == &json!(argument.name))
                {
                    required.push(json!(argument.name));
                }
            }
        }
        ToolDef {
            name: self.name,
            definition: Value::Object(definition),
            required_scopes: self.required_scopes,
            effect: self.effect,
            needs_confirmation: self.needs_confirmation,
            confirmation_summary: self.confirmation_summary,
            header_params: Vec::new(),
            handle_args: self.handle_args,
            task_support: self.task_support,
            restart: self.restart,
            task_prelude: self.task_prelude,
            handler: Arc::new(move |ctx, args| Box::pin(handler(ctx, args))),
            validator: None,
            origin: self.origin,
        }
    }
}

/// A static resource.
pub struct ResourceDef {
    pub(crate) uri: String,
    pub(crate) definition: Value,
    pub(crate) ttl_ms: u64,
    pub(crate) required_scopes: Vec<String>,
    pub(crate) reader: ResourceReader,
    pub(crate) origin: Option<Arc<Origin>>,
}

/// A resource under construction.
pub struct ResourceBuilder {
    uri: String,
    definition: Map<String, Value>,
    ttl_ms: u64,
    required_scopes: Vec<String>,
    origin: Option<Arc<Origin>>,
}

impl ResourceDef {
    /// Starts a resource at `uri` named `name`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(uri: impl Into<String>, name: impl Into<String>) -> ResourceBuilder {
        let uri = uri.into();
        let mut definition = Map::new();
        definition.insert("uri".into(), json!(uri));
        definition.insert("name".into(), json!(name.into()));
        ResourceBuilder { uri, definition, ttl_ms: 0, required_scopes: Vec::new(), origin: None }
    }

    /// Starts a resource from a complete definition another server sent (the gateway), listed
    /// at `uri`: every field kept as sent except `uri`.
    pub fn relayed(uri: impl Into<String>, mut definition: Map<String, Value>, origin: Origin) -> ResourceBuilder {
        let uri = uri.into();
        definition.insert("uri".into(), json!(uri));
        ResourceBuilder { uri, definition, ttl_ms: 0, required_scopes: Vec::new(), origin: Some(Arc::new(origin)) }
    }
}

/// The options resources and resource templates share: scopes, description, MIME type, `ttlMs`.
macro_rules! resource_options {
    ($builder:ty) => {
        impl $builder {
            /// Scopes the caller must hold to read it.
            pub fn scopes(mut self, scopes: &[&str]) -> Self {
                self.required_scopes = owned(scopes);
                self
            }

            /// Description.
            pub fn description(mut self, description: impl Into<String>) -> Self {
                self.definition.insert("description".into(), json!(description.into()));
                self
            }

            /// MIME type.
            pub fn mime_type(mut self, mime_type: impl Into<String>) -> Self {
                self.definition.insert("mimeType".into(), json!(mime_type.into()));
                self
            }

            /// How long a client may cache a read (`ttlMs`), default 0.
            pub fn ttl_ms(mut self, ttl_ms: u64) -> Self {
                self.ttl_ms = ttl_ms;
                self
            }
        }
    };
}

resource_options!(ResourceBuilder);
resource_options!(ResourceTemplateBuilder);

impl ResourceBuilder {
    /// Finishes the resource with its reader.
    pub fn reader<F, Fut>(self, reader: F) -> ResourceDef
    where
        F: Fn(RequestContext, String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ReadResult> + Send + 'static,
    {
        ResourceDef {
            uri: self.uri,
            definition: Value::Object(self.definition),
            ttl_ms: self.ttl_ms,
            required_scopes: self.required_scopes,
            reader: Arc::new(move |ctx, uri, _| Box::pin(reader(ctx, uri))),
            origin: self.origin,
        }
    }
}

/// A resource template (RFC 6570 level 1: `{name}` matches one path segment).
pub struct ResourceTemplateDef {
    pub(crate) template: String,
    pub(crate) definition: Value,
    pub(crate) ttl_ms: u64,
    pub(crate) required_scopes: Vec<String>,
    pub(crate) reader: ResourceReader,
    pub(crate) origin: Option<Arc<Origin>>,
}

/// A resource template under construction.
pub struct ResourceTemplateBuilder {
    template: String,
    definition: Map<String, Value>,
    ttl_ms: u64,
    required_scopes: Vec<String>,
    origin: Option<Arc<Origin>>,
}

impl ResourceTemplateDef {
    /// Starts a template such as `test://template/{id}/data`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(uri_template: impl Into<String>, name: impl Into<String>) -> ResourceTemplateBuilder {
        let template = uri_template.into();
        let mut definition = Map::new();
        definition.insert("uriTemplate".into(), json!(template));
        definition.insert("name".into(), json!(name.into()));
        ResourceTemplateBuilder { template, definition, ttl_ms: 0, required_scopes: Vec::new(), origin: None }
    }

    /// Starts a template from a complete definition another server sent (the gateway), listed
    /// as `uri_template`: every field kept as sent except `uriTemplate`.
    pub fn relayed(
        uri_template: impl Into<String>,
        mut definition: Map<String, Value>,
        origin: Origin,
    ) -> ResourceTemplateBuilder {
        let template = uri_template.into();
        definition.insert("uriTemplate".into(), json!(template));
        ResourceTemplateBuilder {
            template,
            definition,
            ttl_ms: 0,
            required_scopes: Vec::new(),
            origin: Some(Arc::new(origin)),
        }
    }

    /// The variables of `uri` if it matches this template.
    pub fn match_uri(&self, uri: &str) -> Option<BTreeMap<String, String>> {
        match_template(&self.template, uri)
    }
}

impl ResourceTemplateBuilder {
    /// Finishes the template with its reader, which gets the URI and its variables.
    pub fn reader<F, Fut>(self, reader: F) -> ResourceTemplateDef
    where
        F: Fn(RequestContext, String, BTreeMap<String, String>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ReadResult> + Send + 'static,
    {
        ResourceTemplateDef {
            template: self.template,
            definition: Value::Object(self.definition),
            ttl_ms: self.ttl_ms,
            required_scopes: self.required_scopes,
            reader: Arc::new(move |ctx, uri, vars| Box::pin(reader(ctx, uri, vars))),
            origin: self.origin,
        }
    }
}

/// Matches `uri` against a level-1 template; each `{var}` takes one non-empty path segment.
fn match_template(template: &str, uri: &str) -> Option<BTreeMap<String, String>> {
    let mut vars = BTreeMap::new();
    let mut rest_template = template;
    let mut rest_uri = uri;
    while let Some(open) = rest_template.find('{') {
        let literal = &rest_template[..open];
        rest_uri = rest_uri.strip_prefix(literal)?;
        let close = rest_template[open..].find('}')? + open;
        let name = &rest_template[open + 1..close];
        rest_template = &rest_template[close + 1..];
        let next_literal_start = rest_template.find('{').unwrap_or(rest_template.len());
        let next_literal = &rest_template[..next_literal_start];
        let end = if next_literal.is_empty() {
            rest_uri.find('/').unwrap_or(rest_uri.len())
        } else {
            rest_uri.find(next_literal)?
        };
        let value = &rest_uri[..end];
        if value.is_empty() || value.contains('/') {
            return None;
        }
        vars.insert(name.to_owned(), value.to_owned());
        rest_uri = &rest_uri[end..];
    }
    (rest_uri == rest_template).then_some(vars)
}

/// One argument of a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptArgument {
    name: String,
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

/// What `completion/complete` is completing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompletionRef {
    /// An argument of a prompt.
    Prompt(String),
    /// A variable of a resource template.
    Resource(String),
}

/// Completion values (the pipeline caps them at 100).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Completion {
    /// Suggested values.
    pub values: Vec<String>,
    /// Total number of matches, when known.
    pub total: Option<u64>,
    /// Whether more matches exist than returned.
    pub has_more: bool,
}

/// A built application: immutable after [`AppBuilder::build`].
pub struct App {
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) instructions: Option<String>,
    pub(crate) tools: Vec<ToolDef>,
    pub(crate) resources: Vec<ResourceDef>,
    pub(crate) templates: Vec<ResourceTemplateDef>,
    pub(crate) prompts: Vec<PromptDef>,
    pub(crate) completion: Option<CompletionHandler>,
    pub(crate) relayed_completion: Option<RelayedCompletion>,
    /// Tools, prompts and resources are offered (listed, possibly empty) even when there are
    /// none yet: the gateway's registry changes while it serves.
    pub(crate) dynamic: bool,
    pub(crate) handle_types: Vec<HandleType>,
    pub(crate) list_ttl_ms: u64,
}

/// Collects an application's definitions.
pub struct AppBuilder {
    app: App,
}

impl App {
    /// Starts an application with its implementation name and version (sent as serverInfo).
    pub fn builder(name: impl Into<String>, version: impl Into<String>) -> AppBuilder {
        AppBuilder {
            app: App {
                name: name.into(),
                version: version.into(),
                instructions: None,
                tools: Vec::new(),
                resources: Vec::new(),
                templates: Vec::new(),
                prompts: Vec::new(),
                completion: None,
                relayed_completion: None,
                dynamic: false,
                handle_types: Vec::new(),
                list_ttl_ms: 60_000,
            },
        }
    }

    /// A builder holding this application's definitions, to add more (every check of
    /// [`AppBuilder::build`] runs again).
    pub fn into_builder(self) -> AppBuilder {
        AppBuilder { app: self }
    }

    /// The tools, in registration order (which is also `tools/list` order).
    pub fn tools(&self) -> &[ToolDef] {
        &self.tools
    }

    /// The object types handles may refer to.
    pub fn handle_types(&self) -> &[HandleType] {
        &self.handle_types
    }

    pub(crate) fn tool(&self, name: &str) -> Option<&ToolDef> {
        self.tools.iter().find(|t| t.name == name)
    }

    pub(crate) fn prompt(&self, name: &str) -> Option<&PromptDef> {
        self.prompts.iter().find(|p| p.name == name)
    }

    /// Scopes needed to read a registered resource or template (by URI or template string).
    pub(crate) fn resource_scopes(&self, target: &str) -> &[String] {
        self.resources
            .iter()
            .find(|r| r.uri == target)
            .map(|r| r.required_scopes.as_slice())
            .or_else(|| self.templates.iter().find(|t| t.template == target).map(|t| t.required_scopes.as_slice()))
            .unwrap_or(&[])
    }

    /// The registered entry `uri` names: the static resource's URI, else the template it matches.
    pub(crate) fn registered_resource(&self, uri: &str) -> Option<&str> {
        self.registered_resource_origin(uri).map(|(registered, _)| registered)
    }

    /// [`Self::registered_resource`] with the definition's origin, when it is relayed.
    pub(crate) fn registered_resource_origin(&self, uri: &str) -> Option<(&str, Option<Arc<Origin>>)> {
        self.resources.iter().find(|r| r.uri == uri).map(|r| (r.uri.as_str(), r.origin.clone())).or_else(|| {
            self.templates.iter().find(|t| t.match_uri(uri).is_some()).map(|t| (t.template.as_str(), t.origin.clone()))
        })
    }

    /// Whether `uri` names a static resource or matches a template.
    pub fn knows_resource(&self, uri: &str) -> bool {
        self.resources.iter().any(|r| r.uri == uri) || self.templates.iter().any(|t| t.match_uri(uri).is_some())
    }

    /// Whether the application offers what `method` needs (a method without anything to act on
    /// is `-32601`; the tasks methods also need the server's task service).
    pub fn advertises(&self, method: Method) -> bool {
        match method.needs() {
            Needs::Nothing => true,
            Needs::Tools => self.dynamic || !self.tools.is_empty(),
            Needs::Resources => self.dynamic || !self.resources.is_empty() || !self.templates.is_empty(),
            Needs::Prompts => self.dynamic || !self.prompts.is_empty(),
            Needs::Completion => self.completion.is_some() || self.relayed_completion.is_some(),
            Needs::TaskTools => self.tools.iter().any(|tool| tool.task_support != TaskSupport::Forbidden),
        }
    }

    /// The server capabilities this application implies.
    pub fn capabilities(&self) -> Value {
        let mut caps = Map::new();
        if self.dynamic || !self.tools.is_empty() {
            caps.insert("tools".into(), json!({ "listChanged": true }));
        }
        if self.dynamic || !self.resources.is_empty() || !self.templates.is_empty() {
            caps.insert("resources".into(), json!({ "subscribe": true, "listChanged": true }));
        }
        if self.dynamic || !self.prompts.is_empty() {
            caps.insert("prompts".into(), json!({ "listChanged": true }));
        }
        if self.completion.is_some() || self.relayed_completion.is_some() {
            caps.insert("completions".into(), json!({}));
        }
        caps.insert("logging".into(), json!({}));
        Value::Object(caps)
    }
}

impl AppBuilder {
    /// Instructions for the client's model, sent in `server/discover`.
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.app.instructions = Some(instructions.into());
        self
    }

    /// `ttlMs` on list results, default 60 s (a `list_changed` event invalidates it).
    pub fn list_ttl_ms(mut self, ttl_ms: u64) -> Self {
        self.app.list_ttl_ms = ttl_ms;
        self
    }

    /// Registers a tool.
    pub fn tool(mut self, tool: ToolDef) -> Self {
        self.app.tools.push(tool);
        self
    }

    /// Registers a static resource.
    pub fn resource(mut self, resource: ResourceDef) -> Self {
        self.app.resources.push(resource);
        self
    }

    /// Registers a resource template.
    pub fn resource_template(mut self, template: ResourceTemplateDef) -> Self {
        self.app.templates.push(template);
        self
    }

    /// Registers a prompt.
    pub fn prompt(mut self, prompt: PromptDef) -> Self {
        self.app.prompts.push(prompt);
        self
    }

    /// Registers an object type that handles may refer to.
    pub fn handle_type(mut self, handle_type: HandleType) -> Self {
        self.app.handle_types.push(handle_type);
        self
    }

    /// Sets the completion provider for prompt arguments and template variables.
    pub fn completion<F>(mut self, handler: F) -> Self
    where
        F: Fn(&CompletionRef, &str, &str, &BTreeMap<String, String>) -> Completion + Send + Sync + 'static,
    {
        self.app.completion = Some(Arc::new(handler));
        self
    }

    /// Offers tools, prompts and resources even while there are none (empty lists, `listChanged`
    /// capabilities): for an application whose definitions arrive while it serves (the gateway),
    /// so clients can list and listen from the start and the kill switch's registry covers the
    /// list methods before the first definition is published.
    pub fn dynamic(mut self) -> Self {
        self.app.dynamic = true;
        self
    }

    /// Answers `completion/complete` by relaying it (the gateway): `handler` gets the request's
    /// context, the reference (already checked to name a registered prompt or resource
    /// template) and the params, and returns the result object (`{"completion": …}`). Replaces a
    /// [`completion`](Self::completion) handler.
    pub fn relayed_completion<F, Fut>(mut self, handler: F) -> Self
    where
        F: Fn(RequestContext, CompletionRef, Map<String, Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ProtocolError>> + Send + 'static,
    {
        self.app.completion = None;
        self.app.relayed_completion =
            Some(Arc::new(move |ctx, reference, params| Box::pin(handler(ctx, reference, params))));
        self
    }

    /// Checks every definition and freezes the application.
    pub fn build(mut self) -> Result<App, RegistryError> {
        check_unique("tool", self.app.tools.iter().map(|t| t.name.as_str()))?;
        check_unique("prompt", self.app.prompts.iter().map(|p| p.name.as_str()))?;
        check_unique("resource", self.app.resources.iter().map(|r| r.uri.as_str()))?;
        check_unique("template", self.app.templates.iter().map(|t| t.template.as_str()))?;
        check_unique("handle type", self.app.handle_types.iter().map(HandleType::name))?;
        for tool in &mut self.app.tools {
            check_tool(tool)?;
            check_handle_arguments(tool, &self.app.handle_types)?;
        }
        Ok(self.app)
    }
}

/// The checks [`AppBuilder::build`] makes of one tool (name, input schema, `x-mcp-header`
/// declarations), which also compile its argument validator. An application that builds its
/// tools from definitions it does not control (the gateway) runs it first, so one bad
/// definition is held alone instead of failing the whole build.
pub fn check_tool(tool: &mut ToolDef) -> Result<(), RegistryError> {
    let valid_name = (1..=128).contains(&tool.name.len())
        && tool.name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if !valid_name {
        return Err(RegistryError::InvalidName(tool.name.clone()));
    }
    let schema = &tool.definition["inputSchema"];
    if schema.get("type") != Some(&json!("object")) {
        return Err(RegistryError::InvalidSchema {
            tool: tool.name.clone(),
            why: "inputSchema root must be type object".into(),
        });
    }
    let validator = jsonschema::draft202012::new(schema)
        .map_err(|e| RegistryError::InvalidSchema { tool: tool.name.clone(), why: e.to_string() })?;
    tool.validator = Some(Arc::new(validator));
    tool.header_params = header_params(&tool.name, schema)?;
    Ok(())
}

/// Each handle argument names a registered type and a scope, and no argument is declared twice.
fn check_handle_arguments(tool: &ToolDef, types: &[HandleType]) -> Result<(), RegistryError> {
    for (index, argument) in tool.handle_args.iter().enumerate() {
        let invalid = |why: &str| RegistryError::InvalidHandle {
            tool: tool.name.clone(),
            argument: argument.name.clone(),
            why: why.to_owned(),
        };
        if !types.iter().any(|t| t.name() == argument.object_type) {
            return Err(invalid("its object type is not registered with AppBuilder::handle_type"));
        }
        if argument.required_scope.is_empty() || argument.name.is_empty() {
            return Err(invalid("a handle argument needs a name and a required scope"));
        }
        if tool.handle_args[..index].iter().any(|earlier| earlier.name == argument.name) {
            return Err(invalid("declared twice"));
        }
        if tool.task_support != TaskSupport::Forbidden {
            return Err(invalid("a task-capable tool cannot take handles (a task would have to store the raw handle)"));
        }
    }
    Ok(())
}

/// Declared scopes as owned strings.
fn owned(scopes: &[&str]) -> Vec<String> {
    scopes.iter().map(|s| (*s).to_owned()).collect()
}

fn check_unique<'a>(kind: &'static str, names: impl Iterator<Item = &'a str>) -> Result<(), RegistryError> {
    let mut seen = std::collections::HashSet::new();
    for name in names {
        if !seen.insert(name) {
            return Err(RegistryError::Duplicate { kind, name: name.to_owned() });
        }
    }
    Ok(())
}

/// The `x-mcp-header` declarations of a tool's top-level properties, checked for validity
/// (RFC 9110 token, unique case-insensitively, only on string/integer/boolean properties).
fn header_params(tool: &str, schema: &Value) -> Result<Vec<(String, String)>, RegistryError> {
    let mut out: Vec<(String, String)> = Vec::new();
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return Ok(out) };
    for (property, property_schema) in properties {
        let Some(header) = property_schema.get("x-mcp-header") else { continue };
        let invalid = |why: &str| RegistryError::InvalidSchema {
            tool: tool.to_owned(),
            why: format!("x-mcp-header on {property:?}: {why}"),
        };
        let header = header.as_str().ok_or_else(|| invalid("must be a string"))?;
        let is_token =
            !header.is_empty() && header.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !is_token {
            return Err(invalid("not an RFC 9110 token"));
        }
        if !matches!(property_schema.get("type").and_then(Value::as_str), Some("string" | "integer" | "boolean")) {
            return Err(invalid("only string, integer and boolean properties may be mirrored"));
        }
        if out.iter().any(|(h, _)| h.eq_ignore_ascii_case(header)) {
            return Err(invalid("duplicate header name"));
        }
        out.push((header.to_owned(), property.clone()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_matching() {
        let vars = match_template("test://template/{id}/data", "test://template/42/data").unwrap();
        assert_eq!(vars["id"], "42");
        assert!(match_template("test://template/{id}/data", "test://template//data").is_none());
        assert!(match_template("test://template/{id}/data", "test://template/4/2/data").is_none());
        assert!(match_template("test://template/{id}/data", "test://template/42/datax").is_none());
        assert_eq!(match_template("a://{x}", "a://y").unwrap()["x"], "y");
    }

    fn tool(name: &str, schema: Value) -> ToolDef {
        ToolDef::new(name)
            .input_schema(schema)
            .handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("x"))) })
    }

    #[test]
    fn bad_definitions_are_refused_at_build() {
        let dup = App::builder("a", "1")
            .tool(tool("t", json!({"type":"object"})))
            .tool(tool("t", json!({"type":"object"})))
            .build();
        assert!(matches!(dup, Err(RegistryError::Duplicate { .. })));
        assert!(matches!(
            App::builder("a", "1").tool(tool("bad name", json!({"type":"object"}))).build(),
            Err(RegistryError::InvalidName(_))
        ));
        assert!(matches!(
            App::builder("a", "1").tool(tool("t", json!({"type":"array"}))).build(),
            Err(RegistryError::InvalidSchema { .. })
        ));
        let float_header = json!({"type":"object","properties":{"x":{"type":"number","x-mcp-header":"X"}}});
        assert!(App::builder("a", "1").tool(tool("t", float_header)).build().is_err());
        let dup_header = json!({"type":"object","properties":{"x":{"type":"string","x-mcp-header":"X"},"y":{"type":"string","x-mcp-header":"x"}}});
        assert!(App::builder("a", "1").tool(tool("t", dup_header)).build().is_err());
    }
}
