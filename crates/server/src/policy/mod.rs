//! Operator policies: a Cedar policy set ([`Policies`]), validated against the schema generated
//! from the registry ([`schema`]), and the decision of one request ([`Policies::decide`]) that
//! the policy stage (`pipeline/policy.rs`) and `palisade policy test` make. `forbid` wins; with
//! policies configured, a request no policy permits is refused (default deny); a policy that
//! cannot be evaluated refuses too (fail closed). The decision names the policy ids that made
//! it, for the audit record; the refusal sent to the caller never does.
//!
//! **Architecture Invariant:** a [`Policies`] is an immutable value made by exactly one function,
//! [`Policies::load`], from the policy files and the registry it was validated against; the
//! server holds it as a snapshot it can swap ([`crate::Server::publish_policies`]).

mod index;
#[cfg(test)]
mod index_tests;
pub mod schema;
pub mod view;

use std::collections::{HashMap, HashSet};
use std::str::FromStr;

use cedar_policy::{
    Authorizer, Context, Decision as CedarDecision, Entities, Entity, EntityId, EntityTypeName, EntityUid, Policy,
    PolicyId, PolicySet, Request, RestrictedExpression, Schema, ValidationMode, Validator,
};
use miette::Diagnostic;
use serde_json::{Map, Value};

use self::index::{IndexedSet, SliceKey};
use self::schema::{Vocabulary, resource_type};
use self::view::{ViewError, ViewLimits, arguments_to_cedar};
use crate::method::Method;
use crate::registry::App;

/// One policy file: the name errors and default policy ids use, and its text.
#[derive(Debug, Clone)]
pub struct PolicySource {
    /// The file as the operator named it.
    pub name: String,
    /// Its Cedar text.
    pub text: String,
}

/// One problem of a policy set, at its file and line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyProblem {
    /// The file.
    pub file: String,
    /// The line (1-based).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for PolicyProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

/// Every problem [`Policies::load`] found; none of the set is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyErrors(pub Vec<PolicyProblem>);

impl std::fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lines: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&lines.join("\n"))
    }
}

impl std::error::Error for PolicyErrors {}

/// Whether `text` parses as Cedar policies (the syntax alone: [`Policies::load`] validates a
/// set against a registry).
pub fn parses(text: &str) -> Result<(), String> {
    PolicySet::from_str(text).map(drop).map_err(|errors| errors.to_string())
}

/// Who is asking, as a policy sees the principal (`Palisade::User`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrincipalView {
    /// The issuer.
    pub issuer: String,
    /// The subject (the entity id is `issuer#subject`).
    pub subject: String,
    /// The tenant (empty when none).
    pub tenant: String,
    /// The OAuth client (empty when unknown).
    pub client: String,
    /// The scopes held.
    pub scopes: Vec<String>,
    /// The groups and roles from the configured token claims (`Palisade::Group` parents).
    pub groups: Vec<String>,
    /// Under a delegation capability: the agent that called (its subject), else empty.
    pub agent: String,
    /// Under a delegation capability: every agent of the chain, root first.
    pub agents: Vec<String>,
}

/// One request as a policy sees it.
#[derive(Debug, Clone)]
pub struct PolicyRequest<'a> {
    /// The principal.
    pub principal: PrincipalView,
    /// The method (the action).
    pub method: Method,
    /// The registered tool, prompt or resource it targets.
    pub target: Option<&'a str>,
    /// The call's arguments (`tools/call`, `prompts/get`).
    pub arguments: Option<&'a Map<String, Value>>,
    /// The wire: `2026-07-28` or `2025` (the session wire).
    pub era: &'a str,
    /// The caller's network address (`context.source`), when the transport knows it.
    pub source: Option<std::net::IpAddr>,
    /// Now, Unix milliseconds.
    pub now_ms: u64,
}

/// A decision and the policies that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Allowed.
    pub allowed: bool,
    /// The ids of the policies that decided (the permits that allowed, the forbids that refused,
    /// the policies that failed); empty for a default deny.
    pub policies: Vec<String>,
    /// A fixed sentence saying why (the refusal's reason).
    pub reason: &'static str,
}

/// Reasons, fixed sentences.
const FORBIDDEN: &str = "a policy forbids this request";
const NOT_PERMITTED: &str = "no policy permits this request";
const FAILED: &str = "a policy could not be evaluated for this request";
const TOO_LARGE: &str = "the arguments exceed the policy view's limits";
const MISMATCH: &str = "an argument is not of its declared type";
const PERMITTED: &str = "permitted";

/// A validated policy set with the vocabulary it was validated against.
pub struct Policies {
    set: IndexedSet,
    /// The set lists are filtered by: a policy whose condition reads `context.arguments` is,
    /// as a permit, its scope alone (some arguments may satisfy it) and, as a forbid, left out
    /// (some arguments may escape it); the call decides with `set`. So a tool no arguments
    /// could make callable is never listed, and nothing callable is hidden.
    listing: IndexedSet,
    vocabulary: Vocabulary,
    limits: ViewLimits,
    digest: String,
    types: Types,
}

impl std::fmt::Debug for Policies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policies").field("policies", &self.len()).field("digest", &self.digest).finish()
    }
}

/// The entity type names, parsed once.
struct Types {
    user: EntityTypeName,
    group: EntityTypeName,
    upstream: EntityTypeName,
    action: EntityTypeName,
    resources: HashMap<&'static str, EntityTypeName>,
}

impl Types {
    fn new() -> Self {
        let name =
            |name: &str| EntityTypeName::from_str(&format!("Palisade::{name}")).unwrap_or_else(|_| unreachable!());
        Self {
            user: name("User"),
            group: name("Group"),
            upstream: name("Upstream"),
            action: name("Action"),
            resources: ["Tool", "Prompt", "Resource", "Server"].into_iter().map(|ty| (ty, name(ty))).collect(),
        }
    }

    fn uid(ty: &EntityTypeName, id: &str) -> EntityUid {
        EntityUid::from_type_name_and_id(ty.clone(), EntityId::new(id))
    }
}

impl Policies {
    /// Parses and validates `sources` against the schema generated from `app`: every parse
    /// error, schema error, duplicate id and entity naming no tool, prompt, resource or upstream
    /// of the registry is a problem at its file and line. A policy's id is its `@id("…")`
    /// annotation, else `FILE:N` (its position in the file).
    pub fn load(sources: &[PolicySource], limits: ViewLimits, app: &App) -> Result<Self, PolicyErrors> {
        let vocabulary = Vocabulary::of(app, limits.max_depth);
        let (schema, _warnings) = Schema::from_cedarschema_str(&vocabulary.schema).map_err(|error| {
            PolicyErrors(vec![PolicyProblem {
                file: "(generated schema)".into(),
                line: 1,
                message: format!("the registry's schema does not build: {error}"),
            }])
        })?;
        let mut set = PolicySet::new();
        let mut problems = Vec::new();
        let mut home: HashMap<String, usize> = HashMap::new();
        for (index, source) in sources.iter().enumerate() {
            let parsed = match PolicySet::from_str(&source.text) {
                Ok(parsed) => parsed,
                Err(errors) => {
                    for error in errors.iter() {
                        problems.push(problem(source, first_offset(error), error.to_string()));
                    }
                    continue;
                }
            };
            if parsed.templates().next().is_some() {
                problems.push(problem(
                    source,
                    None,
                    "policy templates are not supported: write static policies".into(),
                ));
            }
            let mut policies: Vec<&Policy> = parsed.policies().collect();
            policies.sort_by_key(|policy| policy_offset(source, policy));
            for (n, policy) in policies.into_iter().enumerate() {
                let id = policy.annotation("id").map_or_else(|| format!("{}:{}", source.name, n + 1), str::to_owned);
                let at = policy_offset(source, policy);
                check_names(policy, &vocabulary, source, at, &mut problems);
                if home.insert(id.clone(), index).is_some() {
                    problems.push(problem(source, Some(at), format!("policy id {id:?} is used twice")));
                    continue;
                }
                if let Err(error) = set.add(policy.new_id(PolicyId::new(&id))) {
                    problems.push(problem(source, Some(at), error.to_string()));
                }
            }
        }
        let validation = Validator::new(schema).validate(&set, ValidationMode::Strict);
        for error in validation.validation_errors() {
            let source = home.get(error.policy_id().to_string().as_str()).map_or(&sources[0], |index| &sources[*index]);
            problems.push(problem(source, first_offset(error), format!("policy {}: {error}", error.policy_id())));
        }
        if !problems.is_empty() {
            return Err(PolicyErrors(problems));
        }
        let digest = {
            let mut all = Vec::new();
            for source in sources {
                all.extend_from_slice(source.name.as_bytes());
                all.push(0);
                all.extend_from_slice(source.text.as_bytes());
                all.push(0);
            }
            let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &all);
            palisade_base::hex::hex_prefix(digest.as_ref())
        };
        let listing = IndexedSet::new(listing_set(&set));
        Ok(Self { set: IndexedSet::new(set), listing, vocabulary, limits, digest, types: Types::new() })
    }

    /// How many policies.
    pub fn len(&self) -> usize {
        self.set.set.policies().count()
    }

    /// Whether there are none (then nothing is permitted).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The text of the policy `id` (for `palisade policy explain`: the operator's view).
    pub fn text(&self, id: &str) -> Option<String> {
        self.set.set.policy(&PolicyId::new(id)).map(ToString::to_string)
    }

    /// A short digest of the files, for the audit record and logs.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The generated Cedar schema the set was validated against.
    pub fn schema(&self) -> &str {
        &self.vocabulary.schema
    }

    /// Argument names left out of the view because two definitions type them differently.
    pub fn conflicts(&self) -> &[String] {
        &self.vocabulary.conflicts
    }

    /// Whether `method` is one policies decide (lists and session methods are not).
    pub fn decides(method: Method) -> bool {
        resource_type(method).is_some()
    }

    /// Whether the request's target is one `app` registers (a case of `palisade policy test`
    /// naming a tool that does not exist is an error, not a deny).
    pub fn check_target(&self, app: &App, request: &PolicyRequest<'_>) -> Result<(), String> {
        let known = match (resource_type(request.method), request.target) {
            (Some("Tool"), Some(name)) => app.tool(name).is_some(),
            (Some("Prompt"), Some(name)) => app.prompt(name).is_some(),
            (Some("Resource"), Some(uri)) => app.registered_resource(uri) == Some(uri),
            (Some("Server"), _) => true,
            (Some(_), None) => return Err(format!("{} needs a resource", request.method.as_str())),
            _ => false,
        };
        match known {
            true => Ok(()),
            false => Err(format!(
                "the registry has no {:?} for {}",
                request.target.unwrap_or_default(),
                request.method.as_str()
            )),
        }
    }

    /// Whether a list shows `request`'s target to its principal: the decision without the call's
    /// arguments, an argument-dependent rule granting (see `listing`).
    pub fn visible(&self, app: &App, request: &PolicyRequest<'_>) -> bool {
        request.target.is_some_and(|target| self.listing(app, request).visible(target))
    }

    /// One principal's view of the lists of `request.method` (its target and arguments are not
    /// read): [`Listing::visible`] for each definition, one decision per class of definitions a
    /// policy cannot tell apart (see [`index`]).
    pub fn listing<'a>(&'a self, app: &'a App, request: &PolicyRequest<'_>) -> Listing<'a> {
        let listed = PolicyRequest { arguments: None, ..request.clone() };
        let context = self.context(&listed).ok().flatten();
        Listing {
            policies: self,
            app,
            method: request.method,
            principal: self.principal(&request.principal),
            context,
            classes: HashMap::new(),
        }
    }

    /// The decision of one request on `app`'s definitions. `forbid` wins, no permit is a deny,
    /// and a policy that errors denies (the ids that failed are named).
    pub fn decide(&self, app: &App, request: &PolicyRequest<'_>) -> Verdict {
        let deny = |reason| Verdict { allowed: false, policies: Vec::new(), reason };
        let (Some(principal), Some(target)) =
            (self.principal(&request.principal), self.target(app, request.method, request.target))
        else {
            return deny(FAILED);
        };
        let context = match self.context(request) {
            Ok(Some(context)) => context,
            Ok(None) => return deny(FAILED),
            Err(ViewError::TooLarge) => return deny(TOO_LARGE),
            Err(ViewError::Mismatch) => return deny(MISMATCH),
        };
        self.authorize(&self.set, request.method, &principal, &target, context)
    }

    /// Cedar's decision on the slice of `indexed` that can apply to `target`.
    fn authorize(
        &self,
        indexed: &IndexedSet,
        method: Method,
        principal: &(EntityUid, Entity),
        target: &Target,
        context: Context,
    ) -> Verdict {
        let deny = |reason| Verdict { allowed: false, policies: Vec::new(), reason };
        let action = Types::uid(&self.types.action, method.as_str());
        let upstream = target.upstream.as_ref().map(|u| Types::uid(&self.types.upstream, u));
        let key = SliceKey {
            method,
            upstream: target.upstream.clone(),
            named: indexed.names(&target.id).then(|| target.id.clone()),
        };
        let slice = indexed.slice(&key, &action, &target.uid, upstream.as_ref());
        let attrs = target.attrs.iter().map(|(name, value)| ((*name).to_owned(), value.cedar())).collect();
        let Ok(resource) = Entity::new(target.uid.clone(), attrs, upstream.into_iter().collect()) else {
            return deny(FAILED);
        };
        let Ok(entities) = Entities::from_entities([principal.1.clone(), resource], None) else {
            return deny(FAILED);
        };
        let Ok(request) = Request::new(principal.0.clone(), action, target.uid.clone(), context, None) else {
            return deny(FAILED);
        };
        let response = Authorizer::new().is_authorized(&request, &slice, &entities);
        let errors: Vec<String> = response
            .diagnostics()
            .errors()
            .map(|cedar_policy::AuthorizationError::PolicyEvaluationError(e)| e.policy_id().to_string())
            .collect();
        if !errors.is_empty() {
            return Verdict { allowed: false, policies: errors, reason: FAILED };
        }
        let mut policies: Vec<String> = response.diagnostics().reason().map(ToString::to_string).collect();
        policies.sort();
        match response.decision() {
            CedarDecision::Allow => Verdict { allowed: true, policies, reason: PERMITTED },
            CedarDecision::Deny if policies.is_empty() => deny(NOT_PERMITTED),
            CedarDecision::Deny => Verdict { allowed: false, policies, reason: FORBIDDEN },
        }
    }

    /// The principal's entity (`Palisade::User`, in its groups), `None` when it cannot be built.
    fn principal(&self, principal: &PrincipalView) -> Option<(EntityUid, Entity)> {
        let uid = Types::uid(&self.types.user, &format!("{}#{}", principal.issuer, principal.subject));
        let groups: HashSet<EntityUid> = principal.groups.iter().map(|g| Types::uid(&self.types.group, g)).collect();
        let text = |value: &str| Attr::Text(value.to_owned()).cedar();
        let texts = |items: &[String]| Attr::Texts(items.to_vec()).cedar();
        let attrs = HashMap::from([
            ("issuer".to_owned(), text(&principal.issuer)),
            ("subject".to_owned(), text(&principal.subject)),
            ("tenant".to_owned(), text(&principal.tenant)),
            ("client".to_owned(), text(&principal.client)),
            ("scopes".to_owned(), texts(&principal.scopes)),
            ("groups".to_owned(), texts(&principal.groups)),
            ("delegated".to_owned(), Attr::Flag(!principal.agents.is_empty()).cedar()),
            ("agent".to_owned(), text(&principal.agent)),
            ("agents".to_owned(), texts(&principal.agents)),
        ]);
        let entity = Entity::new(uid.clone(), attrs, groups).ok()?;
        Some((uid, entity))
    }

    /// The resource `method` acts on as a policy sees it, `None` when the method is not decided
    /// or the registry has no such target.
    fn target(&self, app: &App, method: Method, target: Option<&str>) -> Option<Target> {
        let kind = resource_type(method)?;
        let ty = &self.types.resources[kind];
        let text = |value: &str| Attr::Text(value.to_owned());
        let texts = |items: &[String]| Attr::Texts(items.to_vec());
        let (id, attrs, upstream) = match (kind, target) {
            ("Tool", Some(name)) => {
                let tool = app.tool(name)?;
                let hints = tool.definition.get("annotations");
                let flag = |key: &str, default: bool| {
                    hints.and_then(|h| h.get(key)).and_then(Value::as_bool).unwrap_or(default)
                };
                // The MCP defaults; `destructiveHint` means something only when the tool is
                // not read-only (a read-only tool is never destructive).
                let read_only = flag("readOnlyHint", false);
                let upstream = tool.origin.as_ref().map(|o| o.upstream.clone());
                let attrs = vec![
                    ("name", text(&tool.name)),
                    ("pin", text(tool.origin.as_ref().map_or("", |o| o.pin.as_str()))),
                    ("upstream", text(upstream.as_deref().unwrap_or_default())),
                    ("readOnly", Attr::Flag(read_only)),
                    ("destructive", Attr::Flag(!read_only && flag("destructiveHint", true))),
                    ("idempotent", Attr::Flag(flag("idempotentHint", false))),
                    ("openWorld", Attr::Flag(flag("openWorldHint", true))),
                    ("confirmation", Attr::Flag(tool.needs_confirmation)),
                    ("scopes", texts(&tool.required_scopes)),
                ];
                (name, attrs, upstream)
            }
            ("Prompt", Some(name)) => {
                let prompt = app.prompt(name)?;
                let upstream = prompt.origin.as_ref().map(|o| o.upstream.clone());
                let attrs = vec![
                    ("name", text(&prompt.name)),
                    ("pin", text(prompt.origin.as_ref().map_or("", |o| o.pin.as_str()))),
                    ("upstream", text(upstream.as_deref().unwrap_or_default())),
                    ("scopes", texts(&prompt.required_scopes)),
                ];
                (name, attrs, upstream)
            }
            ("Resource", Some(target)) => {
                let origin = app.registered_resource_origin(target).and_then(|(_, o)| o);
                let upstream = origin.as_ref().map(|o| o.upstream.clone());
                let attrs = vec![
                    ("uri", text(target)),
                    ("pin", text(origin.as_ref().map_or("", |o| o.pin.as_str()))),
                    ("upstream", text(upstream.as_deref().unwrap_or_default())),
                    ("scopes", texts(app.resource_scopes(target))),
                ];
                (target, attrs, upstream)
            }
            ("Server", _) => (app.name.as_str(), vec![("name", text(&app.name))], None),
            _ => return None,
        };
        Some(Target { uid: Types::uid(ty, id), id: id.to_owned(), attrs, upstream })
    }

    /// The request's context, `Ok(None)` when it cannot be built (refused).
    fn context(&self, request: &PolicyRequest<'_>) -> Result<Option<Context>, ViewError> {
        let text = |value: &str| RestrictedExpression::new_string(value.to_owned());
        let secs = request.now_ms / 1000;
        let days = secs / 86_400;
        let long = |value: u64| RestrictedExpression::new_long(i64::try_from(value).unwrap_or(i64::MAX));
        let mut context = vec![
            ("era".to_owned(), text(request.era)),
            ("time".to_owned(), long(secs)),
            ("hour".to_owned(), long(secs / 3600 % 24)),
            // 1970-01-01 was a Thursday; 0 is Sunday.
            ("weekday".to_owned(), long((days + 4) % 7)),
        ];
        if let Some(source) = request.source {
            context.push(("source".to_owned(), source_expression(source)));
        }
        let empty = Map::new();
        let arguments = request.arguments.unwrap_or(&empty);
        match request.method {
            Method::ToolsCall => {
                context.push((
                    "arguments".to_owned(),
                    arguments_to_cedar(arguments, &self.vocabulary.tool_arguments, &self.limits)?,
                ));
            }
            Method::PromptsGet => {
                context.push((
                    "arguments".to_owned(),
                    arguments_to_cedar(arguments, &self.vocabulary.prompt_arguments, &self.limits)?,
                ));
            }
            _ => {}
        }
        Ok(Context::from_pairs(context).ok())
    }
}

/// `ip("…")` of `source`. Cedar's `RestrictedExpression::new_ip` parses the extension's name
/// with its policy parser on every call (a few microseconds, measured on the request path), so
/// each thread keeps the expression of the last address it built one for: a connection's calls
/// come from one address.
fn source_expression(source: std::net::IpAddr) -> RestrictedExpression {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(std::net::IpAddr, RestrictedExpression)>> =
            const { std::cell::RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((address, expression)) if *address == source => expression.clone(),
        _ => {
            let expression = RestrictedExpression::new_ip(source.to_string());
            *last = Some((source, expression.clone()));
            expression
        }
    })
}

/// An attribute of a resource entity, as plain data (a listing's class compares them).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Attr {
    Text(String),
    Flag(bool),
    Texts(Vec<String>),
}

impl Attr {
    fn cedar(&self) -> RestrictedExpression {
        match self {
            Self::Text(value) => RestrictedExpression::new_string(value.clone()),
            Self::Flag(value) => RestrictedExpression::new_bool(*value),
            Self::Texts(items) => {
                RestrictedExpression::new_set(items.iter().cloned().map(RestrictedExpression::new_string))
            }
        }
    }
}

/// A request's resource: its uid, id, attributes and upstream.
struct Target {
    uid: EntityUid,
    id: String,
    attrs: Vec<(&'static str, Attr)>,
    upstream: Option<String>,
}

/// A listing's class: the upstream, the id when a policy names it, the attributes.
type Class = (Option<String>, Option<String>, Vec<(&'static str, Attr)>);

/// One principal's view of one list (see [`Policies::listing`]).
pub struct Listing<'a> {
    policies: &'a Policies,
    app: &'a App,
    method: Method,
    principal: Option<(EntityUid, Entity)>,
    context: Option<Context>,
    /// Decisions made, by class: the upstream, the id when a policy names it, and the
    /// attributes (without the identifying ones when no policy reads them).
    classes: HashMap<Class, bool>,
}

impl Listing<'_> {
    /// Whether the list shows `target` (a tool, prompt, resource or template by its registered
    /// name) to the principal.
    pub fn visible(&mut self, target: &str) -> bool {
        let policies = self.policies;
        let (Some(principal), Some(context)) = (&self.principal, &self.context) else { return false };
        let Some(resource) = policies.target(self.app, self.method, Some(target)) else { return false };
        let indexed = &policies.listing;
        let named = indexed.names(&resource.id).then(|| resource.id.clone());
        let attrs: Vec<(&'static str, Attr)> = resource
            .attrs
            .iter()
            .filter(|(name, _)| indexed.reads_identity() || !matches!(*name, "name" | "uri" | "pin"))
            .cloned()
            .collect();
        let class = (resource.upstream.clone(), named, attrs);
        if let Some(&visible) = self.classes.get(&class) {
            return visible;
        }
        let visible = policies.authorize(indexed, self.method, principal, &resource, context.clone()).allowed;
        self.classes.insert(class, visible);
        visible
    }
}

/// The listing set of `set` (see [`Policies`]'s `listing`).
fn listing_set(set: &PolicySet) -> PolicySet {
    let mut listing = PolicySet::new();
    for policy in set.policies() {
        let Ok(mut json) = policy.to_json() else { continue };
        let conditions = json.get("conditions").map(Value::to_string).unwrap_or_default();
        let reads_arguments = conditions.contains("\"arguments\"");
        let listed = match (reads_arguments, policy.effect()) {
            (false, _) => Some(policy.clone()),
            (true, cedar_policy::Effect::Forbid) => None,
            (true, cedar_policy::Effect::Permit) => {
                json["conditions"] = Value::Array(Vec::new());
                Policy::from_json(Some(policy.id().clone()), json).ok()
            }
        };
        if let Some(listed) = listed {
            // Ids are unique in `set`, so in `listing` too.
            let _ = listing.add(listed);
        }
    }
    listing
}

/// A problem at `offset` (a byte offset into the file) of `source`.
fn problem(source: &PolicySource, offset: Option<usize>, message: String) -> PolicyProblem {
    let line = offset.map_or(1, |offset| source.text[..offset.min(source.text.len())].matches('\n').count() + 1);
    PolicyProblem { file: source.name.clone(), line, message }
}

/// The first labelled offset of a diagnostic, if any.
fn first_offset(diagnostic: &dyn Diagnostic) -> Option<usize> {
    diagnostic.labels().and_then(|mut labels| labels.next()).map(|label| label.offset())
}

/// Where a policy starts in its file (the policy's own text, found in the file).
fn policy_offset(source: &PolicySource, policy: &Policy) -> usize {
    let text = policy.to_cedar().unwrap_or_default();
    source.text.find(text.trim()).unwrap_or(0)
}

/// Every entity literal of `policy` (a tool, prompt, resource, upstream or server) must name
/// one of the registry's: Cedar's validator checks types and attributes, not entity ids.
fn check_names(
    policy: &Policy,
    vocabulary: &Vocabulary,
    source: &PolicySource,
    at: usize,
    problems: &mut Vec<PolicyProblem>,
) {
    let Ok(json) = policy.to_json() else { return };
    let mut literals = Vec::new();
    entity_literals(&json, &mut literals);
    let text = policy.to_cedar().unwrap_or_default();
    for (ty, id) in literals {
        let Some(kind) = ty.strip_prefix("Palisade::") else { continue };
        let Some(known) =
            vocabulary.names.get(kind).map_or(
                matches!(kind, "Tool" | "Prompt" | "Resource" | "Upstream" | "Server").then_some(false),
                |names| Some(names.contains(&id)),
            )
        else {
            continue;
        };
        if !known {
            let quoted = Value::from(id.as_str()).to_string();
            let offset = text.find(&quoted).map_or(at, |within| at + within);
            let what = kind.to_lowercase();
            problems.push(problem(
                source,
                Some(offset),
                format!("unknown {what} {quoted}: the registry has no such {what}"),
            ));
        }
    }
}

/// Every `{"type": …, "id": …}` of a policy's JSON form.
fn entity_literals(json: &Value, out: &mut Vec<(String, String)>) {
    match json {
        Value::Object(object) => {
            if let (Some(Value::String(ty)), Some(Value::String(id))) = (object.get("type"), object.get("id")) {
                out.push((ty.clone(), id.clone()));
            }
            object.values().for_each(|value| entity_literals(value, out));
        }
        Value::Array(items) => items.iter().for_each(|value| entity_literals(value, out)),
        _ => {}
    }
}
