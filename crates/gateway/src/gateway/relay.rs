//! The gateway's second job, relaying: a call to a served tool, prompt, resource or completion
//! goes to its upstream (with the gateway's own credential, or the person's own for a
//! `user_oauth` upstream) and its answer comes back checked.

use std::collections::BTreeMap;
use std::sync::Arc;

use palisade_server::{
    CallToolResult, CompletionRef, Content, GetPromptResult, InputRequired, Origin, Outcome, PromptDef, PromptMessage,
    ProtocolError, RequestContext, ResourceContents, ResourceDef, ResourceTemplateDef, TaskSupport, ToolDef,
    check_tool,
};
use serde_json::{Map, Value, json};

use super::{Upstream, asks};
use crate::credentials::CredentialError;
use crate::names::is_ui_uri;
use crate::upstream::{UpstreamError, UpstreamReply};
use crate::user_oauth::{OAuthError, UserOAuth};

/// Scopes as the registry's builders take them.
fn scope_refs(scopes: &[String]) -> Vec<&str> {
    scopes.iter().map(String::as_str).collect()
}

/// The UI contents approved with a served tool, per upstream UI URI (their digests).
pub(super) type ApprovedUi = Arc<BTreeMap<String, String>>;

pub(super) fn relayed_tool(
    upstream: &Arc<Upstream>,
    exposed: &str,
    name: &str,
    mut raw: Map<String, Value>,
    origin: Origin,
) -> Result<ToolDef, String> {
    let settings = &upstream.settings;
    // Its MCP Apps UI link names the UI resource as clients read it through the gateway.
    upstream.namer.expose_ui_link(&mut raw).map_err(|refusal| refusal.to_string())?;
    let mut scopes = settings.scopes.clone();
    scopes.extend(settings.tool_scopes.get(name).cloned().unwrap_or_default());
    let output = match raw.get("outputSchema") {
        Some(schema) => Some(Arc::new(
            jsonschema::draft202012::new(schema).map_err(|_| "its outputSchema does not compile".to_owned())?,
        )),
        None => None,
    };
    // Annotations are information, never policy: `readOnlyHint` grants nothing; a
    // `destructiveHint` only makes the tool stricter (confirmation) unless the operator exempts it.
    let destructive = raw.get("annotations").and_then(|a| a.get("destructiveHint")) == Some(&Value::Bool(true));
    let confirm = settings.confirm.contains(name) || (destructive && !settings.no_confirm.contains(name));
    // A task-capable tool (the operator's `tasks`, or its definition's `execution.taskSupport`)
    // called with the tasks extension runs as a *Palisade* task: the task row is bound to
    // the caller (subject, tenant, client) and authorized on every get/update/cancel, and its
    // worker makes the upstream call, so callers stay partitioned whether or not the upstream
    // partitions its own tasks (the upstream never sees a task the client could name).
    let task_capable = settings.tasks.contains(name)
        || matches!(
            raw.get("execution").and_then(|e| e.get("taskSupport")).and_then(Value::as_str),
            Some("optional" | "required")
        );
    let mut builder = ToolDef::relayed(exposed, raw, origin).scopes(&scope_refs(&scopes));
    if task_capable && !confirm {
        builder = builder.task_support(TaskSupport::Optional);
    }
    if confirm {
        builder = builder.needs_confirmation();
    }
    let upstream = upstream.clone();
    let upstream_name: Arc<str> = Arc::from(name);
    let mut tool = builder.handler(move |ctx, arguments| {
        let upstream = upstream.clone();
        let upstream_name = upstream_name.clone();
        let output = output.clone();
        async move {
            let mut params = Map::new();
            params.insert("name".into(), json!(&*upstream_name));
            params.insert("arguments".into(), Value::Object(arguments));
            match forward(&upstream, &ctx, "tools/call", params).await? {
                Relayed::Result(result) => tool_result(&upstream, result, output.as_deref()).map(Outcome::Complete),
                Relayed::InputRequired(input) => Ok(Outcome::InputRequired(input)),
            }
        }
    });
    check_tool(&mut tool).map_err(|error| format!("the registry refuses it: {error}"))?;
    Ok(tool)
}

/// A tool result relayed as sent, its resource blocks' URIs in the gateway's namespace
/// ([`Namer::expose_content`](crate::names::Namer::expose_content)), once it passes the pinned
/// output schema.
fn tool_result(
    from: &Upstream,
    mut result: Map<String, Value>,
    output: Option<&jsonschema::Validator>,
) -> Result<CallToolResult, ProtocolError> {
    let upstream = from.settings.id.as_str();
    let content = match result.remove("content") {
        Some(Value::Array(blocks)) => exposed_blocks(from, blocks).into_iter().map(Content::Raw).collect(),
        None => Vec::new(),
        Some(_) => return Err(upstream_garbage(upstream, "a tool result whose content is not an array")),
    };
    let is_error = result.get("isError") == Some(&Value::Bool(true));
    let structured_content = result.remove("structuredContent");
    if let Some(validator) = output
        && !is_error
    {
        let valid = structured_content.as_ref().is_some_and(|structured| validator.is_valid(structured));
        if !valid {
            tracing::warn!(%upstream, "upstream tool result fails its pinned outputSchema");
            return Err(upstream_garbage(upstream, "a result that does not match the tool's outputSchema"));
        }
    }
    Ok(CallToolResult { content, structured_content, is_error })
}

/// `blocks` with their resource URIs exposed; a block whose URI cannot be is dropped (and logged).
fn exposed_blocks(upstream: &Upstream, blocks: Vec<Value>) -> Vec<Value> {
    let (kept, dropped) = upstream.namer.expose_contents(blocks);
    if dropped > 0 {
        tracing::warn!(upstream = %upstream.settings.id, dropped, "result blocks naming a URI that cannot be exposed were dropped");
    }
    kept
}

fn upstream_garbage(upstream: &str, what: &str) -> ProtocolError {
    tracing::warn!(%upstream, what, "upstream answer refused");
    ProtocolError::Internal
}

pub(super) fn relayed_prompt(
    upstream: &Arc<Upstream>,
    exposed: &str,
    name: &str,
    raw: Map<String, Value>,
    origin: Origin,
) -> PromptDef {
    let scopes = upstream.settings.scopes.clone();
    let builder = PromptDef::relayed(exposed, raw, origin).scopes(&scope_refs(&scopes));
    let upstream = upstream.clone();
    let upstream_name: Arc<str> = Arc::from(name);
    builder.handler(move |ctx, arguments| {
        let upstream = upstream.clone();
        let upstream_name = upstream_name.clone();
        async move {
            let mut params = Map::new();
            params.insert("name".into(), json!(&*upstream_name));
            params.insert("arguments".into(), json!(arguments));
            match forward(&upstream, &ctx, "prompts/get", params).await? {
                Relayed::Result(result) => prompt_result(&upstream, result).map(Outcome::Complete),
                Relayed::InputRequired(input) => Ok(Outcome::InputRequired(input)),
            }
        }
    })
}

/// A prompt's messages, their resource blocks' URIs exposed as a tool result's are (a message
/// whose block cannot be exposed is dropped).
fn prompt_result(from: &Upstream, result: Map<String, Value>) -> Result<GetPromptResult, ProtocolError> {
    let upstream = from.settings.id.as_str();
    let Some(Value::Array(messages)) = result.get("messages") else {
        return Err(upstream_garbage(upstream, "a prompt result without messages"));
    };
    let mut out = Vec::with_capacity(messages.len());
    for message in messages {
        let content = message.get("content").cloned().unwrap_or(Value::Null);
        let Some(content) = exposed_blocks(from, vec![content]).pop() else { continue };
        out.push(match message.get("role").and_then(Value::as_str) {
            Some("user") => PromptMessage::user(Content::Raw(content)),
            Some("assistant") => PromptMessage::assistant(Content::Raw(content)),
            _ => return Err(upstream_garbage(upstream, "a prompt message with an unknown role")),
        });
    }
    let description = result.get("description").and_then(Value::as_str).map(str::to_owned);
    Ok(GetPromptResult { description, messages: out })
}

pub(super) fn relayed_resource(
    upstream: &Arc<Upstream>,
    exposed: &str,
    raw: Map<String, Value>,
    origin: Origin,
    ui: &ApprovedUi,
) -> ResourceDef {
    let scopes = upstream.settings.scopes.clone();
    let builder = ResourceDef::relayed(exposed, raw, origin).scopes(&scope_refs(&scopes));
    let (upstream, ui) = (upstream.clone(), ui.clone());
    builder.reader(move |ctx, uri| {
        let (upstream, ui) = (upstream.clone(), ui.clone());
        async move { read_resource(&upstream, &ctx, &uri, &ui).await }
    })
}

pub(super) fn relayed_template(
    upstream: &Arc<Upstream>,
    exposed: &str,
    raw: Map<String, Value>,
    origin: Origin,
    ui: &ApprovedUi,
) -> ResourceTemplateDef {
    let scopes = upstream.settings.scopes.clone();
    let builder = ResourceTemplateDef::relayed(exposed, raw, origin).scopes(&scope_refs(&scopes));
    let (upstream, ui) = (upstream.clone(), ui.clone());
    builder.reader(move |ctx, uri, _| {
        let (upstream, ui) = (upstream.clone(), ui.clone());
        async move { read_resource(&upstream, &ctx, &uri, &ui).await }
    })
}

/// A read relayed to the upstream; its contents come back under exposed URIs, each item's
/// `_meta` (an MCP App's CSP, permissions, domain) relayed as sent. An MCP Apps UI (`ui://`) is
/// relayed only while its contents are the ones approved with a served tool ([`ApprovedUi`]):
/// a page, CSP or permission changed since is refused until a reviewer approves it.
async fn read_resource(
    upstream: &Upstream,
    ctx: &RequestContext,
    exposed_uri: &str,
    approved_ui: &BTreeMap<String, String>,
) -> Result<Outcome<Vec<ResourceContents>>, ProtocolError> {
    let Some(uri) = upstream.namer.upstream_uri(exposed_uri) else {
        return Err(ProtocolError::ResourceNotFound { uri: exposed_uri.to_owned() });
    };
    let uri: &str = &uri;
    let mut params = Map::new();
    params.insert("uri".into(), json!(uri));
    let result = match forward(upstream, ctx, "resources/read", params).await? {
        Relayed::Result(result) => result,
        Relayed::InputRequired(input) => return Ok(Outcome::InputRequired(input)),
    };
    let Some(Value::Array(contents)) = result.get("contents") else {
        return Err(upstream_garbage(&upstream.settings.id, "a read result without contents"));
    };
    if is_ui_uri(uri) {
        let digest = crate::ui::contents_digest(contents).ok();
        if digest.is_none() || digest.as_ref() != approved_ui.get(uri) {
            tracing::warn!(upstream = %upstream.settings.id, uri,
                "MCP App UI read refused: its contents are not the ones approved with a served tool (re-listing will hold the tool until it is reviewed again)");
            return Err(ProtocolError::Unavailable);
        }
    }
    let mut out = Vec::with_capacity(contents.len());
    for item in contents {
        // Contents name URIs in the upstream's space: a URI that is not this upstream's own is
        // refused rather than relabelled.
        let item_uri = item.get("uri").and_then(Value::as_str).unwrap_or(uri);
        let exposed = upstream
            .namer
            .expose_uri(item_uri)
            .map_err(|_| upstream_garbage(&upstream.settings.id, "a content URI"))?;
        let mime = item.get("mimeType").and_then(Value::as_str).unwrap_or("application/octet-stream");
        let mut contents = if let Some(text) = item.get("text").and_then(Value::as_str) {
            ResourceContents::text(exposed, mime, text)
        } else if let Some(blob) = item.get("blob").and_then(Value::as_str) {
            use base64::Engine as _;
            let data = base64::engine::general_purpose::STANDARD
                .decode(blob)
                .map_err(|_| upstream_garbage(&upstream.settings.id, "a blob that is not base64"))?;
            ResourceContents::blob(exposed, mime, data)
        } else {
            return Err(upstream_garbage(&upstream.settings.id, "a content item without text or blob"));
        };
        if let Some(Value::Object(meta)) = item.get("_meta") {
            contents = contents.with_meta(meta.clone());
        }
        out.push(contents);
    }
    Ok(Outcome::Complete(out))
}

/// What a forwarded request came back with.
enum Relayed {
    Result(Map<String, Value>),
    InputRequired(InputRequired),
}

/// An upstream's answer as the caller gets it, or a round the gateway answered entirely itself
/// (its opened state, with the answers), to be sent back to the upstream at once.
enum Reply {
    Relayed(Relayed),
    Answered(Value),
}

/// Forwards one request to its upstream, after the kill switch's second phase: both phases
/// run before a byte leaves for the upstream. The caller's credentials never travel: the
/// upstream request is built from `params`, the gateway's own credential and, for token
/// exchange, the caller's token sent to the authorization server only. A retry that answers an
/// upstream's question resumes the parked call instead ([`asks::resume`]).
async fn forward(
    upstream: &Upstream,
    ctx: &RequestContext,
    method: &str,
    params: Map<String, Value>,
) -> Result<Relayed, ProtocolError> {
    let id = &upstream.settings.id;
    admit(upstream, ctx).await?;
    // The binding (a digest over the canonical params) only when a parked call is resumed or
    // one is parked: not on every call.
    let binding = || asks::Binding::of(id, ctx, method, &params);
    let mut running = match asks::resume(upstream, ctx, binding)? {
        Some(running) => running,
        None => {
            let responses = ctx.input_responses().clone();
            let Some(sent) = upstream_params(upstream, ctx, params.clone(), ctx.request_state(), responses)? else {
                return not_connected(method, id);
            };
            asks::Running::start(upstream, ctx, method, sent)
        }
    };
    // A round of the upstream's that the gateway answered entirely itself (the granted roots) is
    // sent back at once, a bounded number of times.
    for _ in 0..asks::MAX_ASKS_PER_CALL {
        let reply = match asks::drive(upstream, ctx, method, &binding, running).await? {
            asks::Driven::Done(reply) => reply,
            asks::Driven::Asked(input) => return Ok(Relayed::InputRequired(input)),
        };
        let state = match relayed_reply(upstream, ctx, reply).await? {
            Reply::Relayed(relayed) => return Ok(relayed),
            Reply::Answered(state) => state,
        };
        let Some(sent) = upstream_params(upstream, ctx, params.clone(), Some(&state), Map::new())? else {
            return not_connected(method, id);
        };
        running = asks::Running::start(upstream, ctx, method, sent);
    }
    tracing::warn!(upstream = %id, cap = asks::MAX_ASKS_PER_CALL, "upstream asked for more rounds than allowed: the call fails");
    Err(ProtocolError::Unavailable)
}

/// Whether the call may leave for the upstream now: the upstream is healthy and, with a kill
/// switch, its fence is obtained.
async fn admit(upstream: &Upstream, ctx: &RequestContext) -> Result<(), ProtocolError> {
    let id = &upstream.settings.id;
    upstream.client.check_health().map_err(|error| error.to_protocol_error(id))?;
    if ctx.has_kill_switch() {
        // The fence cannot be redeemed by a server that is not ours: obtaining it is the
        // last check before the effect (SECURITY.md: the residual window after forwarding).
        let _fence = ctx.pre_side_effect().await?;
    }
    Ok(())
}

/// The params as the upstream gets them: the caller's progress token and log level in `_meta`,
/// and on an MRTR retry (`state`: the gateway's opened state) the upstream's own state and the
/// answers: the caller's `responses` and those the gateway gave itself. `None`: the person
/// declined Palisade's own connect request.
fn upstream_params(
    upstream: &Upstream,
    ctx: &RequestContext,
    mut params: Map<String, Value>,
    state: Option<&Value>,
    mut responses: Map<String, Value>,
) -> Result<Option<Map<String, Value>>, ProtocolError> {
    let id = upstream.settings.id.as_str();
    let mut meta = Map::new();
    if let Some(token) = &ctx.meta().progress_token {
        meta.insert("progressToken".into(), token.to_value());
    }
    if let Some(level) = ctx.meta().log_level {
        meta.insert(palisade_wire::meta_keys::LOG_LEVEL.into(), json!(level.as_str()));
    }
    if !meta.is_empty() {
        params.insert("_meta".into(), Value::Object(meta));
    }
    // An MRTR retry: the upstream's own state travels inside the gateway's sealed state (bound
    // to this caller, method, params and expiry by the pipeline), never as the client sent it.
    let mut connect_round = false;
    if let Some(state) = state {
        if state.get("upstream").and_then(Value::as_str) != Some(id) {
            return Err(ProtocolError::invalid_params("requestState does not belong to this operation"));
        }
        if let Some(upstream_state) = state.get("state") {
            params.insert("requestState".into(), upstream_state.clone());
        }
        connect_round = state.get("connect") == Some(&Value::Bool(true));
    }
    if connect_round {
        // The answer to Palisade's own connect request is not the upstream's to see.
        let action = responses.get(CONNECT_INPUT).and_then(|answer| answer.get("action")).and_then(Value::as_str);
        if matches!(action, Some("decline" | "cancel")) {
            return Ok(None);
        }
    } else {
        // What the gateway answered itself in the round (the granted roots) travels sealed too.
        if let Some(Value::Object(answered)) = state.and_then(|state| state.get("answered")) {
            for (key, answer) in answered {
                responses.insert(key.clone(), answer.clone());
            }
        }
        if !responses.is_empty() {
            params.insert("inputResponses".into(), Value::Object(responses));
        }
    }
    Ok(Some(params))
}

/// The upstream's answer as the caller gets it: a result, the upstream's input requests (its
/// state sealed in the gateway's), Palisade's connect request when the person has no usable
/// connection, or the upstream's error.
async fn relayed_reply(
    upstream: &Upstream,
    ctx: &RequestContext,
    reply: Result<UpstreamReply, UpstreamError>,
) -> Result<Reply, ProtocolError> {
    let id = &upstream.settings.id;
    let reply = match (reply, &upstream.oauth) {
        (Err(UpstreamError::Credential(CredentialError::UserAuthorizationRequired { scopes })), Some(oauth)) => {
            return connect_request(oauth, id, ctx, scopes.as_deref()).await.map(Reply::Relayed);
        }
        (reply, _) => reply,
    };
    match reply.map_err(|error| error.to_protocol_error(id))? {
        UpstreamReply::Result(result) => Ok(Reply::Relayed(Relayed::Result(result))),
        UpstreamReply::InputRequired { input_requests, request_state } => {
            // A 2026-07-28 upstream's own round: the same rules as its requests during a call.
            let mut input = InputRequired::new();
            let mut answered = Map::new();
            for (key, request) in input_requests {
                match asks::screen_input_request(upstream, ctx, &request)? {
                    Some(answer) => {
                        answered.insert(key, Value::Object(answer));
                    }
                    None => input = input.relay(key, request),
                }
            }
            let mut state = json!({ "upstream": id });
            if let Some(upstream_state) = request_state {
                state["state"] = upstream_state;
            }
            if !answered.is_empty() {
                state["answered"] = Value::Object(answered);
                if input.requests().is_empty() {
                    return Ok(Reply::Answered(state));
                }
            }
            Ok(Reply::Relayed(Relayed::InputRequired(input.with_state(state))))
        }
        UpstreamReply::Error { code, message, required_capabilities } => {
            Err(relayed_error(id, code, &message, required_capabilities))
        }
    }
}

/// The key of Palisade's own connect request among an answer's `inputRequests`.
const CONNECT_INPUT: &str = "palisade_connect";

/// The person has no usable connection to a `user_oauth` upstream: a URL-mode elicitation of
/// Palisade's connect page (a one-time link bound to the person, the MCP client and the scopes),
/// to be answered by retrying once connected. A client that cannot open URLs (no
/// `elicitation.url` capability) is told what it lacks.
async fn connect_request(
    oauth: &UserOAuth,
    id: &str,
    ctx: &RequestContext,
    scopes: Option<&[String]>,
) -> Result<Relayed, ProtocolError> {
    let url_mode = ctx.meta().client_capabilities.get("elicitation").and_then(|elicitation| elicitation.get("url"));
    if !url_mode.is_some_and(Value::is_object) {
        return Err(ProtocolError::MissingCapability { required: json!({ "elicitation": { "url": {} } }) });
    }
    let link = match oauth.connect_link(ctx.principal(), id, scopes).await {
        Ok(link) => link,
        Err(OAuthError::Refused(reason)) => return Err(ProtocolError::DelegationRefused { reason }),
        Err(error) => {
            tracing::warn!(upstream = id, %error, "user_oauth: no connect link");
            return Err(ProtocolError::Unavailable);
        }
    };
    tracing::info!(upstream = id, "user_oauth: the caller is asked to connect");
    let request = json!({ "method": "elicitation/create", "params": {
        "mode": "url",
        "message": format!(
            "The upstream \"{id}\" needs your own authorization. Open the link to sign in and connect your \
             account on the gateway's page, then continue."
        ),
        "url": link.as_str(),
    } });
    let input = InputRequired::new().relay(CONNECT_INPUT, request);
    Ok(Relayed::InputRequired(input.with_state(json!({ "upstream": id, "connect": true }))))
}

/// The person declined to connect: a tool error for a tool call, otherwise unavailable.
fn not_connected(method: &str, id: &str) -> Result<Relayed, ProtocolError> {
    if method != "tools/call" {
        return Err(ProtocolError::Unavailable);
    }
    let text = format!("Not connected: the upstream \"{id}\" needs your authorization, which was declined.");
    let result = json!({ "content": [{ "type": "text", "text": text }], "isError": true });
    match result {
        Value::Object(map) => Ok(Relayed::Result(map)),
        _ => Err(ProtocolError::Internal),
    }
}

/// A JSON-RPC error the upstream answered, as the caller sees it: invalid params and unknown
/// resources keep their meaning, and so does an upstream's kill switch (-32030: the operation is
/// switched off there, said without detail, as the gateway's own); anything else is the upstream
/// being unavailable for this call (a delegation refusal of the upstream's concerns the gateway's
/// credential, not the caller).
fn relayed_error(upstream: &str, code: i64, message: &str, required_capabilities: Option<Value>) -> ProtocolError {
    tracing::info!(%upstream, code, "upstream answered an error");
    match (code, required_capabilities) {
        (palisade_wire::error::codes::OPERATION_DISABLED, _) => ProtocolError::OperationDisabled,
        (-32602, _) => ProtocolError::invalid_params(format!("upstream {upstream}: {message}")),
        (-32601, _) => ProtocolError::invalid_params(format!("upstream {upstream} does not support this method")),
        // The caller must declare what the upstream needs (elicitation, sampling, roots).
        (-32021, Some(required)) => ProtocolError::MissingCapability { required },
        _ => ProtocolError::Unavailable,
    }
}

/// Which upstream answers completions for each served prompt and resource template.
pub(super) struct CompletionRoutes {
    pub(super) upstreams: Vec<Arc<Upstream>>,
    /// Exposed prompt name → (upstream index, upstream name).
    pub(super) prompts: BTreeMap<String, (usize, String)>,
    /// Exposed template → (upstream index, upstream template).
    pub(super) templates: BTreeMap<String, (usize, String)>,
}

impl CompletionRoutes {
    pub(super) fn is_empty(&self) -> bool {
        self.prompts.is_empty() && self.templates.is_empty()
    }

    /// Relays a `completion/complete` to the upstream of the prompt or template it completes,
    /// with the reference renamed to the upstream's own; one of an upstream that declares no
    /// completions completes to no values.
    pub(super) async fn complete(
        &self,
        ctx: &RequestContext,
        reference: CompletionRef,
        mut params: Map<String, Value>,
    ) -> Result<Value, ProtocolError> {
        // The registry checked that the reference names a served prompt or template: one
        // without a route is of an upstream that declares no completions.
        let route = match &reference {
            CompletionRef::Prompt(name) => self
                .prompts
                .get(name)
                .map(|(index, upstream_name)| (*index, json!({ "type": "ref/prompt", "name": upstream_name }))),
            CompletionRef::Resource(uri) => self
                .templates
                .get(uri)
                .map(|(index, template)| (*index, json!({ "type": "ref/resource", "uri": template }))),
        };
        let Some((index, reference)) = route else {
            return Ok(json!({ "completion": { "values": [], "hasMore": false } }));
        };
        let upstream = self.upstreams.get(index).ok_or(ProtocolError::Internal)?;
        params.insert("ref".into(), reference);
        params.remove("_meta");
        match forward(upstream, ctx, "completion/complete", params).await? {
            Relayed::Result(mut result) => match result.remove("completion") {
                Some(completion @ Value::Object(_)) => Ok(json!({ "completion": completion })),
                _ => Err(upstream_garbage(&upstream.settings.id, "a completion result without completion")),
            },
            Relayed::InputRequired(_) => {
                Err(upstream_garbage(&upstream.settings.id, "input requests for a completion"))
            }
        }
    }
}
