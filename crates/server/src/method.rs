//! The method table, written once: every method the server knows on either wire, the wire it
//! belongs to, what its operation key names ([`TargetFamily`]), the param the `Mcp-Name`
//! routing header carries, and what an application must offer for it to be advertised
//! ([`Needs`]). Classification, the kill switch's list of exposed operations, the envelope's
//! routing-header checks and `App::advertises` all read this one table.
//!
//! Knows nothing of requests, principals, applications or stores: it is the vocabulary the
//! stages share.

/// Which wire a method is served on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// 2026-07-28 only.
    Stateless,
    /// Both wires.
    Both,
    /// The 2025-era session wire only, as a JSON-RPC method.
    Session,
    /// The 2025-era session wire only, and not a JSON-RPC method (a GET stream, a notification,
    /// an answer, a DELETE): never parsed from a method name.
    SessionTransport,
}

/// What an operation key names besides its method: the kind of registered entry it acts on.
/// The one definition both classification (stage 3) and the kill switch's list of exposed
/// operations use, so that the two can never key an operation differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetFamily {
    /// The method alone (`tools/list`).
    None,
    /// A registered tool, by name (`tools/call:product_get`).
    Tool,
    /// A registered prompt, by name.
    Prompt,
    /// A registered resource URI or template (`resources/read:shop://policies/{topic}`).
    Resource,
}

/// What an application must offer for a method to exist (else the method is `-32601`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Always served.
    Nothing,
    /// At least one tool.
    Tools,
    /// At least one resource or template.
    Resources,
    /// Resources, and updates of them to subscribe to.
    ResourceSubscriptions,
    /// At least one prompt.
    Prompts,
    /// A completion handler.
    Completion,
    /// A tool that can run as a task (and the server a task service).
    TaskTools,
}

macro_rules! methods {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, $wire:ident, $family:ident, $header:expr, $needs:ident; )*) => {
        /// Every method the server implements; anything else is `-32601`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Method {
            $( $(#[$doc])* $variant, )*
        }

        impl Method {
            /// Every method, in table order (the kill switch's registry covers each one an
            /// application advertises).
            pub const ALL: &'static [Method] = &[ $( Method::$variant, )* ];

            /// The wire name.
            pub fn as_str(self) -> &'static str {
                match self { $( Self::$variant => $name, )* }
            }

            /// The wire the method is served on.
            pub fn wire(self) -> Wire {
                match self { $( Self::$variant => Wire::$wire, )* }
            }

            /// What the method's operation key names besides the method.
            pub fn target_family(self) -> TargetFamily {
                match self { $( Self::$variant => TargetFamily::$family, )* }
            }

            /// The param the `Mcp-Name` routing header carries, if the method names anything.
            pub fn name_param(self) -> Option<&'static str> {
                match self { $( Self::$variant => $header, )* }
            }

            /// What an application must offer for the method to be advertised.
            pub fn needs(self) -> Needs {
                match self { $( Self::$variant => Needs::$needs, )* }
            }
        }
    };
}

methods! {
    /// `server/discover`
    Discover = "server/discover", Stateless, None, None, Nothing;
    /// `tools/list`
    ToolsList = "tools/list", Both, None, None, Tools;
    /// `tools/call`
    ToolsCall = "tools/call", Both, Tool, Some("name"), Tools;
    /// `resources/list`
    ResourcesList = "resources/list", Both, None, None, Resources;
    /// `resources/templates/list`
    ResourceTemplatesList = "resources/templates/list", Both, None, None, Resources;
    /// `resources/read`
    ResourcesRead = "resources/read", Both, Resource, Some("uri"), Resources;
    /// `prompts/list`
    PromptsList = "prompts/list", Both, None, None, Prompts;
    /// `prompts/get`
    PromptsGet = "prompts/get", Both, Prompt, Some("name"), Prompts;
    /// `completion/complete`
    Complete = "completion/complete", Both, None, None, Completion;
    /// `subscriptions/listen`
    Listen = "subscriptions/listen", Stateless, None, None, Nothing;
    /// `tasks/get` (tasks extension; durable tasks are not served on the 2025-era wire)
    TasksGet = "tasks/get", Stateless, None, Some("taskId"), TaskTools;
    /// `tasks/update` (tasks extension)
    TasksUpdate = "tasks/update", Stateless, None, Some("taskId"), TaskTools;
    /// `tasks/cancel` (tasks extension)
    TasksCancel = "tasks/cancel", Stateless, None, Some("taskId"), TaskTools;
    /// `initialize` (2025-era wire only)
    Initialize = "initialize", Session, None, None, Nothing;
    /// `ping` (2025-era wire only)
    Ping = "ping", Session, None, None, Nothing;
    /// `logging/setLevel` (2025-era wire only)
    SetLogLevel = "logging/setLevel", Session, None, None, Nothing;
    /// `resources/subscribe` (2025-era wire only)
    Subscribe = "resources/subscribe", Session, Resource, None, ResourceSubscriptions;
    /// `resources/unsubscribe` (2025-era wire only)
    Unsubscribe = "resources/unsubscribe", Session, Resource, None, ResourceSubscriptions;
    /// Opening the session's `GET /mcp` stream (2025-era wire only; not a JSON-RPC method).
    SessionStream = "session/stream", SessionTransport, None, None, Nothing;
    /// A client notification POSTed to a session (2025-era wire only).
    SessionNotification = "session/notification", SessionTransport, None, None, Nothing;
    /// A client's answer to a server request of its session (2025-era wire only).
    SessionAnswer = "session/answer", SessionTransport, None, None, Nothing;
    /// `DELETE /mcp` of a session (2025-era wire only).
    SessionDelete = "session/delete", SessionTransport, None, None, Nothing;
}

impl Method {
    /// Looks a method of the 2026-07-28 wire up; removed, unknown and session-only methods are
    /// `None`.
    pub fn parse(method: &str) -> Option<Self> {
        Self::lookup(method).filter(|m| matches!(m.wire(), Wire::Stateless | Wire::Both))
    }

    /// Looks a method of the 2025-era session wire up: the session methods, and every
    /// 2026-07-28 method except `server/discover`, `subscriptions/listen` and `tasks/*`.
    pub fn parse_legacy(method: &str) -> Option<Self> {
        Self::lookup(method).filter(|m| matches!(m.wire(), Wire::Session | Wire::Both))
    }

    fn lookup(method: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|m| m.as_str() == method && m.wire() != Wire::SessionTransport)
    }

    /// Whether the method exists only on the 2025-era session wire.
    pub fn is_session_method(self) -> bool {
        matches!(self.wire(), Wire::Session | Wire::SessionTransport)
    }

    /// Whether the method belongs to the tasks extension.
    pub fn is_tasks_method(self) -> bool {
        self.needs() == Needs::TaskTools
    }
}

/// Where a definition comes from when the application relays another MCP server's (the
/// gateway): the upstream's id (the kill switch's `upstream` target) and the text its audit
/// records carry (upstream id, exposed and upstream names, the pin's digest prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The upstream's id.
    pub upstream: String,
    /// The digest of the approved definition it is served under (its pin), hex.
    pub pin: String,
    /// The audit record's detail for operations on this definition.
    pub audit_detail: String,
}

/// The operation a request performs, derived by the server: the method plus the *registered*
/// name it targets. It is what policy (scopes, the kill switch registry) is keyed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationKey {
    method: Method,
    target: Option<String>,
    /// The upstream a relayed definition comes from (the gateway), from the registry.
    origin: Option<std::sync::Arc<Origin>>,
}

impl OperationKey {
    /// A key for `method` and its registered target (only classification and the session
    /// wire's non-JSON-RPC requests make one).
    pub(crate) fn new(method: Method, target: Option<String>) -> Self {
        Self { method, target, origin: None }
    }

    /// The key of an operation on a relayed definition ([`Origin`]).
    pub(crate) fn with_origin(mut self, origin: Option<std::sync::Arc<Origin>>) -> Self {
        self.origin = origin;
        self
    }

    /// Where the targeted definition comes from, when it is relayed from an upstream.
    pub fn origin(&self) -> Option<&Origin> {
        self.origin.as_deref()
    }

    /// The key of a `tools/call` of a registered tool (task workers re-check their tool with it).
    pub(crate) fn tool_call(tool: &str) -> Self {
        Self { method: Method::ToolsCall, target: Some(tool.to_owned()), origin: None }
    }

    /// Any key, for tests of later stages (the pipeline only ever classifies).
    #[cfg(test)]
    pub(crate) fn for_test(method: Method, target: Option<&str>) -> Self {
        Self { method, target: target.map(str::to_owned), origin: None }
    }

    /// The method.
    pub fn method(&self) -> Method {
        self.method
    }

    /// The registered tool/prompt name or resource URI/template, if the method targets one.
    pub fn target(&self) -> Option<&str> {
        self.target.as_deref()
    }
}

impl std::fmt::Display for OperationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.target {
            Some(target) => write!(f, "{}:{}", self.method.as_str(), target),
            None => f.write_str(self.method.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_wire_name_parses_back_on_its_own_wire_only() {
        for &method in Method::ALL {
            let name = method.as_str();
            let (modern, legacy) = match method.wire() {
                Wire::Stateless => (true, false),
                Wire::Both => (true, true),
                Wire::Session => (false, true),
                Wire::SessionTransport => (false, false),
            };
            assert_eq!(Method::parse(name) == Some(method), modern, "{name}");
            assert_eq!(Method::parse_legacy(name) == Some(method), legacy, "{name}");
        }
        assert_eq!(Method::parse("sampling/createMessage"), None);
        assert_eq!(Method::parse_legacy("session/stream"), None);
    }
}
