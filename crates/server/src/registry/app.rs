//! The application: [`App`], the definitions [`AppBuilder`] collects and freezes, completions,
//! and what the application advertises.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use palisade_wire::ProtocolError;
use serde_json::{Map, Value, json};

use super::checks::{check_handle_arguments, check_tool, check_unique};
use super::error::RegistryError;
use super::prompt::PromptDef;
use super::resource::{ResourceDef, ResourceTemplateDef};
use super::result::{IntoToolResult, State};
use super::tool::{TaskSupport, ToolBuilder, ToolDef};
use crate::BoxFuture;
use crate::context::RequestContext;
use crate::handles::HandleType;
use crate::method::{Method, Needs, Origin};

type CompletionHandler = Arc<dyn Fn(&CompletionRef, &str, &str, &BTreeMap<String, String>) -> Completion + Send + Sync>;
/// A completion answered by another server (the gateway): the request's context, the checked
/// reference and the request's params; the result is the `completion/complete` result object.
pub(crate) type RelayedCompletion = Arc<
    dyn Fn(RequestContext, CompletionRef, Map<String, Value>) -> BoxFuture<Result<Value, ProtocolError>> + Send + Sync,
>;

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
    /// Whether a client may subscribe to resource updates (`resources.subscribe`; 2025
    /// `resources/subscribe`, 2026 listen `resourceSubscriptions`): on by default, off for a
    /// gateway none of whose upstreams serving resources can send updates.
    pub(crate) resource_subscriptions: bool,
    pub(crate) handle_types: Vec<HandleType>,
    pub(crate) list_ttl_ms: u64,
    pub(crate) list_freshness: Option<Arc<ListFreshness>>,
    /// Positions in `tools`, `prompts` and `resources` by name or URI, made by
    /// [`AppBuilder::build`] (a gateway's registry holds a thousand tools: a lookup per call and
    /// per listed definition must not scan them).
    names: Names,
}

/// See [`App`]'s `names`.
#[derive(Default)]
struct Names {
    tools: HashMap<String, usize>,
    prompts: HashMap<String, usize>,
    resources: HashMap<String, usize>,
}

/// A bound on the freshness of what an application lists, moved while it serves: the gateway
/// sets it from its upstreams' own `ttlMs` and `cacheScope` (the most restrictive of them), so
/// its lists never say they stay fresh longer than a part does, nor `public` with a `private`
/// part. Shared between the gateway and every registry it publishes.
#[derive(Debug)]
pub struct ListFreshness {
    /// Until when (ms since the epoch, the server's clock) the lists are fresh; `i64::MAX`: no
    /// bound beyond the application's own `ttlMs`.
    fresh_until_ms: AtomicI64,
    /// A part may vary by authorization: lists say `private` whatever the server's own scope.
    private: AtomicBool,
}

impl Default for ListFreshness {
    fn default() -> Self {
        Self { fresh_until_ms: AtomicI64::new(i64::MAX), private: AtomicBool::new(false) }
    }
}

impl ListFreshness {
    /// Lists are fresh until `fresh_until_ms` (`None`: no bound) and `private` when a part is.
    pub fn set(&self, fresh_until_ms: Option<i64>, private: bool) {
        self.fresh_until_ms.store(fresh_until_ms.unwrap_or(i64::MAX), Ordering::SeqCst);
        self.private.store(private, Ordering::SeqCst);
    }

    /// The `ttlMs` to answer at `now_ms`: what is left of the bound, at most `ceiling`.
    pub fn ttl_ms(&self, now_ms: i64, ceiling: u64) -> u64 {
        let left = self.fresh_until_ms.load(Ordering::SeqCst).saturating_sub(now_ms).max(0);
        u64::try_from(left).unwrap_or(0).min(ceiling)
    }

    /// Whether a part may vary by authorization.
    pub fn private(&self) -> bool {
        self.private.load(Ordering::SeqCst)
    }
}

/// Collects an application's definitions, and the state its handlers share (`S`, none by
/// default; see [`with_state`](Self::with_state)).
pub struct AppBuilder<S = ()> {
    app: App,
    state: Arc<S>,
}

impl App {
    /// Starts an application with its implementation name and version (sent as serverInfo).
    pub fn builder(name: impl Into<String>, version: impl Into<String>) -> AppBuilder {
        AppBuilder {
            state: Arc::new(()),
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
                resource_subscriptions: true,
                handle_types: Vec::new(),
                list_ttl_ms: 60_000,
                list_freshness: None,
                names: Names::default(),
            },
        }
    }

    /// A builder holding this application's definitions, to add more (every check of
    /// [`AppBuilder::build`] runs again).
    pub fn into_builder(self) -> AppBuilder {
        AppBuilder { app: self, state: Arc::new(()) }
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
        self.names.tools.get(name).map(|&at| &self.tools[at])
    }

    pub(crate) fn prompt(&self, name: &str) -> Option<&PromptDef> {
        self.names.prompts.get(name).map(|&at| &self.prompts[at])
    }

    /// The static resource registered at `uri`.
    pub(crate) fn static_resource(&self, uri: &str) -> Option<&ResourceDef> {
        self.names.resources.get(uri).map(|&at| &self.resources[at])
    }

    /// Scopes needed to read a registered resource or template (by URI or template string).
    pub(crate) fn resource_scopes(&self, target: &str) -> &[String] {
        self.static_resource(target)
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
        self.static_resource(uri).map(|r| (r.uri.as_str(), r.origin.clone())).or_else(|| {
            self.templates.iter().find(|t| t.match_uri(uri).is_some()).map(|t| (t.template.as_str(), t.origin.clone()))
        })
    }

    /// Whether `uri` names a static resource or matches a template.
    pub fn knows_resource(&self, uri: &str) -> bool {
        self.static_resource(uri).is_some() || self.templates.iter().any(|t| t.match_uri(uri).is_some())
    }

    /// Whether the application offers what `method` needs (a method without anything to act on
    /// is `-32601`; the tasks methods also need the server's task service).
    pub fn advertises(&self, method: Method) -> bool {
        match method.needs() {
            Needs::Nothing => true,
            Needs::Tools => self.dynamic || !self.tools.is_empty(),
            Needs::Resources => self.offers_resources(),
            Needs::ResourceSubscriptions => self.resource_subscriptions && self.offers_resources(),
            Needs::Prompts => self.dynamic || !self.prompts.is_empty(),
            Needs::Completion => self.completion.is_some() || self.relayed_completion.is_some(),
            Needs::TaskTools => self.tools.iter().any(|tool| tool.task_support != TaskSupport::Forbidden),
        }
    }

    /// Whether resources are offered (listed, possibly empty).
    fn offers_resources(&self) -> bool {
        self.dynamic || !self.resources.is_empty() || !self.templates.is_empty()
    }

    /// Whether clients may subscribe to resource updates (see
    /// [`AppBuilder::resource_subscriptions`]).
    pub fn offers_resource_subscriptions(&self) -> bool {
        self.advertises(Method::Subscribe)
    }

    /// The server capabilities this application implies (`server/discover` and the 2025
    /// `initialize` answer both).
    pub fn capabilities(&self) -> Value {
        let mut caps = Map::new();
        if self.dynamic || !self.tools.is_empty() {
            caps.insert("tools".into(), json!({ "listChanged": true }));
        }
        if self.offers_resources() {
            caps.insert("resources".into(), json!({ "subscribe": self.resource_subscriptions, "listChanged": true }));
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

impl<S: Send + Sync + 'static> AppBuilder<S> {
    /// Gives the handlers registered with [`tool_with`](Self::tool_with) `state`, shared by
    /// reference ([`State`]) instead of cloned into each closure.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use palisade_server::prelude::*;
    ///
    /// #[derive(Default)]
    /// struct Counter { hits: AtomicU64 }
    ///
    /// #[derive(serde::Deserialize, schemars::JsonSchema)]
    /// struct Hit {}
    ///
    /// let app = App::builder("counter", "1.0.0")
    ///     .with_state(Counter::default())
    ///     .tool_with(ToolDef::new("hit"), |counter: State<Counter>, _ctx, Hit {}: Hit| async move {
    ///         (counter.hits.fetch_add(1, Ordering::Relaxed) + 1).to_string()
    ///     })
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(app.tools()[0].name(), "hit");
    /// ```
    pub fn with_state<T: Send + Sync + 'static>(self, state: T) -> AppBuilder<T> {
        AppBuilder { app: self.app, state: Arc::new(state) }
    }

    /// The shared state, for a reader, prompt or closure registered another way.
    pub fn state(&self) -> State<S> {
        State(self.state.clone())
    }

    /// Registers `tool`, finished with a handler that gets the shared [`State`], the request's
    /// context and the typed arguments (as [`ToolBuilder::run`]).
    pub fn tool_with<A, F, Fut>(self, tool: ToolBuilder, handler: F) -> Self
    where
        A: serde::de::DeserializeOwned + schemars::JsonSchema + Send + 'static,
        F: Fn(State<S>, RequestContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: IntoToolResult,
    {
        let state = self.state.clone();
        self.tool(tool.run(move |ctx, arguments: A| handler(State(state.clone()), ctx, arguments)))
    }

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

    /// Bounds `ttlMs` and `cacheScope` on list results by `freshness` (see [`ListFreshness`]).
    pub fn list_freshness(mut self, freshness: Arc<ListFreshness>) -> Self {
        self.app.list_freshness = Some(freshness);
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

    /// Whether clients may subscribe to resource updates (default on). Off: the capability says
    /// `"subscribe": false`, the 2025 `resources/subscribe` and `resources/unsubscribe` are
    /// `-32601`, and a listen filter's `resourceSubscriptions` are not honoured; for an
    /// application whose resources cannot report updates (a gateway none of whose upstreams
    /// serving resources declares `resources.subscribe`).
    pub fn resource_subscriptions(mut self, on: bool) -> Self {
        self.app.resource_subscriptions = on;
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
        let at = |(n, name): (usize, &String)| (name.clone(), n);
        self.app.names = Names {
            tools: self.app.tools.iter().map(|t| &t.name).enumerate().map(at).collect(),
            prompts: self.app.prompts.iter().map(|p| &p.name).enumerate().map(at).collect(),
            resources: self.app.resources.iter().map(|r| &r.uri).enumerate().map(at).collect(),
        };
        Ok(self.app)
    }
}
