//! Tools: [`ToolDef`] and its builder, with the policy a tool declares (scopes, effect,
//! confirmation, handle arguments, task support) and the handler forms that finish it.

use std::future::Future;
use std::sync::Arc;

use palisade_wire::ProtocolError;
use serde_json::{Map, Value, json};

use super::result::IntoToolResult;
use crate::BoxFuture;
use crate::content::CallToolResult;
use crate::context::{InputRequired, Outcome, RequestContext};
use crate::handles::{HandleArgument, handle_argument_schema};
use crate::method::Origin;

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

    /// Finishes the tool with a handler taking typed arguments (as
    /// [`typed_handler`](Self::typed_handler): schema generated from `A`, arguments validated and
    /// deserialized first) and returning anything [`IntoToolResult`] takes: text, [`Json`](super::Json),
    /// a result, an [`Outcome`], or a `Result` of those.
    ///
    /// ```
    /// use palisade_server::prelude::*;
    ///
    /// #[derive(serde::Deserialize, schemars::JsonSchema)]
    /// struct Sum { a: i64, b: i64 }
    ///
    /// let sum = ToolDef::new("sum")
    ///     .effect(Effect::ReadOnly)
    ///     .run(|_ctx, Sum { a, b }: Sum| async move { (a + b).to_string() });
    /// let app = App::builder("calc", "1.0.0").tool(sum).build().unwrap();
    /// assert_eq!(app.tools()[0].definition()["inputSchema"]["required"], serde_json::json!(["a", "b"]));
    /// ```
    pub fn run<A, F, Fut>(self, handler: F) -> ToolDef
    where
        A: serde::de::DeserializeOwned + schemars::JsonSchema + Send + 'static,
        F: Fn(RequestContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: IntoToolResult,
    {
        self.typed_handler(move |ctx, arguments: A| {
            let answer = handler(ctx, arguments);
            async move { answer.await.into_tool_result() }
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

/// Declared scopes as owned strings.
pub(super) fn owned(scopes: &[&str]) -> Vec<String> {
    scopes.iter().map(|s| (*s).to_owned()).collect()
}
