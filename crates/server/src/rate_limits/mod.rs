//! Operator rate limits and quotas (`[[rate_limits]]`): the rules, the immutable set a server
//! enforces ([`RateLimits`], built by [`RateLimits::build`] and swapped whole on a reload), and
//! the decision for one request.
//!
//! - A rule keys its state on any combination of the caller's subject, tenant and client, the
//!   operation's tool and upstream, and the delegated agent ([`Dimension`]); it applies to a
//!   request that has every dimension of its key and passes its filters (methods, tools,
//!   upstreams).
//! - A rule's rate is a GCRA (one timestamp per key: the theoretical arrival time), allowing
//!   `burst` requests at once and then one every `per / requests`; its quota is a count per
//!   fixed window aligned to the Unix epoch (a day quota resets at 00:00 UTC). A request passes
//!   only if every rule that applies lets it; then, and only then, every one of them counts it
//!   (all or nothing, so a refused request costs nothing).
//! - State lives in process ([`local`]) or, across instances, in a [`SharedStore`] (the
//!   deployment's Redis or Valkey, one atomic script per check). When the shared store cannot
//!   answer, [`OnStoreFailure`] decides: refuse (the default, fail closed) or count locally.
//! - A rebuild keeps the state of every rule whose definition did not change (same name, key,
//!   filters, rate and quota): its in-process table is carried over, and its shared keys are
//!   named by a digest of the definition, so they carry over too.
//!
//! Knows the operation key and the verified principal; nothing about transports or stages.

pub mod local;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use palisade_base::hex::hex;

use crate::auth::VerifiedPrincipal;
use crate::method::{Method, OperationKey};

/// What a rule's state is keyed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dimension {
    /// The principal (issuer and subject) the request acts for.
    Subject,
    /// The principal's tenant.
    Tenant,
    /// The OAuth client.
    Client,
    /// The tool of a `tools/call` (the registered name).
    Tool,
    /// The upstream the targeted definition is relayed from (the gateway).
    Upstream,
    /// The agent holding the delegation capability the request runs under.
    Agent,
}

impl Dimension {
    /// Every dimension, in the order a key lists them.
    pub const ALL: [Dimension; 6] =
        [Self::Subject, Self::Tenant, Self::Client, Self::Tool, Self::Upstream, Self::Agent];

    /// Its name in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Subject => "subject",
            Self::Tenant => "tenant",
            Self::Client => "client",
            Self::Tool => "tool",
            Self::Upstream => "upstream",
            Self::Agent => "agent",
        }
    }

    /// The dimension a configuration names.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == name)
    }

    /// The request's value of this dimension, when it has one.
    fn value<'a>(self, operation: &'a OperationKey, principal: &'a VerifiedPrincipal) -> Option<Value<'a>> {
        match self {
            Self::Subject => Some(Value::Pair(principal.issuer(), principal.subject())),
            Self::Tenant => principal.tenant().map(Value::One),
            Self::Client => principal.client_id().map(Value::One),
            Self::Tool => match operation.method() {
                Method::ToolsCall => operation.target().map(Value::One),
                _ => None,
            },
            Self::Upstream => operation.origin().map(|origin| Value::One(origin.upstream.as_str())),
            Self::Agent => principal.delegation().map(|d| Value::One(d.holder().subject.as_str())),
        }
    }
}

/// One dimension's value: one string, or the issuer and subject of a principal.
enum Value<'a> {
    One(&'a str),
    Pair(&'a str, &'a str),
}

/// A rate: `burst` requests at once, then one every `interval_us` microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    /// Microseconds between two requests at the sustained rate (at least 1).
    pub interval_us: u64,
    /// Requests allowed at once (at least 1).
    pub burst: u32,
}

impl Rate {
    /// `requests` per `per_secs` seconds, `burst` at once; `None` when a value is 0 or the
    /// rate is finer than one request a microsecond.
    pub fn new(requests: u32, per_secs: u64, burst: u32) -> Option<Self> {
        if requests == 0 || per_secs == 0 || burst == 0 {
            return None;
        }
        let interval_us = per_secs.checked_mul(1_000_000)? / u64::from(requests);
        (interval_us > 0).then_some(Self { interval_us, burst })
    }
}

/// A quota: at most `limit` requests per window of `window_secs` seconds, windows aligned to
/// the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    /// Requests per window (at least 1).
    pub limit: u64,
    /// The window's length in seconds (at least 1).
    pub window_secs: u64,
}

/// One rule, as the configuration states it (validated by its reader).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RateRule {
    /// The rule's name: unique, a metric label and the log's name for it.
    pub name: String,
    /// What its state is keyed on (empty: one state for every request it applies to).
    pub key: Vec<Dimension>,
    /// The methods it applies to (empty: every method).
    pub methods: Vec<Method>,
    /// The tools it applies to (empty: any; non-empty: `tools/call` of these only).
    pub tools: Vec<String>,
    /// The upstreams it applies to (empty: any; non-empty: operations relayed from these only).
    pub upstreams: Vec<String>,
    /// Its rate, if it has one.
    pub rate: Option<Rate>,
    /// Its quota, if it has one.
    pub quota: Option<Quota>,
}

impl RateRule {
    /// Whether the rule applies to this request, and the key of its state if so.
    fn key_for(&self, operation: &OperationKey, principal: &VerifiedPrincipal) -> Option<String> {
        if !self.methods.is_empty() && !self.methods.contains(&operation.method()) {
            return None;
        }
        let listed_tool = || {
            operation.method() == Method::ToolsCall
                && operation.target().is_some_and(|tool| self.tools.iter().any(|t| t == tool))
        };
        if !self.tools.is_empty() && !listed_tool() {
            return None;
        }
        if !self.upstreams.is_empty()
            && !operation.origin().is_some_and(|origin| self.upstreams.contains(&origin.upstream))
        {
            return None;
        }
        // Length-prefixed parts: no two different tuples of values give the same key.
        let mut key = String::new();
        for dimension in &self.key {
            let mut part = |text: &str| {
                key.push_str(&text.len().to_string());
                key.push(':');
                key.push_str(text);
            };
            match dimension.value(operation, principal)? {
                Value::One(text) => part(text),
                Value::Pair(a, b) => {
                    part(a);
                    part(b);
                }
            }
        }
        Some(key)
    }

    /// A digest of the whole definition: the shared store's keys carry it, so a changed rule
    /// starts afresh and an unchanged one keeps its state across a rebuild.
    fn digest(&self) -> String {
        let text = format!("{self:?}");
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, text.as_bytes());
        hex(&digest.as_ref()[..8])
    }
}

/// What one rule asks of one key's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// A GCRA rate.
    Rate(Rate),
    /// A fixed-window quota.
    Quota(Quota),
}

/// One state a shared check reads and, when every one allows, advances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedCell {
    /// The store's key (the deployment's namespace, the rule's digest, the key's digest).
    pub key: String,
    /// What is asked of it.
    pub limit: Limit,
}

/// The answer for a set of states: all allow (and were advanced), or the first that refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every state allowed the request, and counted it.
    Allowed,
    /// The state at `cell` refused; nothing was counted.
    Refused {
        /// Its index in the checked list.
        cell: usize,
        /// Microseconds until it would allow.
        wait_us: u64,
    },
}

/// The shared store could not answer (down, slow, or answered something unexpected).
#[derive(Debug, Clone, thiserror::Error)]
#[error("the rate-limit store did not answer: {0}")]
pub struct StoreUnavailable(pub String);

/// A boxed future of a shared check.
pub type StoreFuture<'a> = Pin<Box<dyn Future<Output = Result<Verdict, StoreUnavailable>> + Send + 'a>>;

/// Rate-limit state shared by every instance: checks and advances `cells` in one atomic step,
/// by the store's own clock. Implemented over Redis/Valkey by the host.
pub trait SharedStore: Send + Sync + 'static {
    /// Checks every cell; advances all of them only if every one allows.
    fn check<'a>(&'a self, cells: &'a [SharedCell]) -> StoreFuture<'a>;
}

/// What to do when the shared store cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnStoreFailure {
    /// Refuse the request (`Unavailable`): fail closed. The default.
    #[default]
    Refuse,
    /// Count it in this instance's own state under the same rules: while the store is down the
    /// deployment as a whole allows up to one rule's limit per instance.
    Local,
}

/// The shared store a set of limits counts in.
#[derive(Clone)]
pub struct Shared {
    /// The store.
    pub store: Arc<dyn SharedStore>,
    /// The deployment's namespace in it (instances that share limits share it).
    pub namespace: String,
    /// What to do when it cannot answer.
    pub on_failure: OnStoreFailure,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("namespace", &self.namespace).field("on_failure", &self.on_failure).finish()
    }
}

/// One rule of a built set, with its in-process state.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub(crate) rule: RateRule,
    digest: String,
    table: Arc<local::Table>,
}

/// Why a set of rules could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// Two rules share a name.
    #[error("rate_limits: two rules are named `{0}`")]
    DuplicateName(String),
    /// A rule has neither a rate nor a quota.
    #[error("rate_limits: rule `{0}` has neither a rate nor a quota")]
    NothingToLimit(String),
}

/// The rate limits a server enforces: an immutable value, built by [`RateLimits::build`] and
/// replaced whole ([`crate::server::Server::set_rate_limits`]).
#[derive(Debug, Default)]
pub struct RateLimits {
    rules: Vec<Compiled>,
    shared: Option<Shared>,
}

/// How one request fared against the limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed; the indexes of the rules that applied (and counted it).
    Allowed(Vec<usize>),
    /// Refused by the rule at this index.
    Refused {
        /// The refusing rule's index.
        rule: usize,
        /// Milliseconds until a retry can pass it (at least 1).
        retry_after_ms: u64,
    },
    /// The shared store did not answer and the limits fail closed.
    StoreUnavailable,
}

/// A decision, and whether it was made in process because the shared store did not answer
/// (`on_store_failure = "local"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The decision.
    pub decision: Decision,
    /// Made by the local allowance while the shared store was unavailable.
    pub fell_back: bool,
}

/// Most keys one rule keeps in process before it drops those that say nothing.
pub const MAX_KEYS_PER_RULE: usize = 100_000;

impl RateLimits {
    /// The set `rules` make, counting in `shared` when given (else in process). The state of
    /// every rule of `previous` whose definition is unchanged is carried over; the rest start
    /// afresh. This is the one function a configuration (or a reload) builds limits with.
    pub fn build(
        rules: Vec<RateRule>,
        shared: Option<Shared>,
        previous: Option<&RateLimits>,
    ) -> Result<Self, RuleError> {
        let mut compiled: Vec<Compiled> = Vec::with_capacity(rules.len());
        for rule in rules {
            if compiled.iter().any(|c| c.rule.name == rule.name) {
                return Err(RuleError::DuplicateName(rule.name));
            }
            if rule.rate.is_none() && rule.quota.is_none() {
                return Err(RuleError::NothingToLimit(rule.name));
            }
            let kept = previous.and_then(|previous| previous.rules.iter().find(|c| c.rule == rule));
            let table = match kept {
                Some(kept) => kept.table.clone(),
                None => Arc::new(local::Table::new(MAX_KEYS_PER_RULE)),
            };
            let digest = rule.digest();
            compiled.push(Compiled { rule, digest, table });
        }
        Ok(Self { rules: compiled, shared })
    }

    /// No limits at all.
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether there are no rules (the stage then does nothing).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rules' names, in order (one metric series pair each).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|c| c.rule.name.as_str())
    }

    /// The shared store, when the limits count across instances.
    pub fn shared(&self) -> Option<&Shared> {
        self.shared.as_ref()
    }

    /// Whether the state of the rule named `name` is the same object in both sets (a rebuild
    /// carried it over).
    pub fn shares_state_with(&self, other: &RateLimits, name: &str) -> bool {
        let table = |set: &RateLimits| set.rules.iter().find(|c| c.rule.name == name).map(|c| c.table.clone());
        matches!((table(self), table(other)), (Some(a), Some(b)) if Arc::ptr_eq(&a, &b))
    }

    /// Decides one request and, when it is allowed, counts it under every rule that applies.
    /// A shared store decides by its own clock; the in-process state by `now_us`, read only when
    /// it is used (after a failed store's wait, so no request counts at a time already past).
    pub async fn check(
        &self,
        operation: &OperationKey,
        principal: &VerifiedPrincipal,
        now_us: impl Fn() -> u64,
    ) -> Checked {
        let applying: Vec<(usize, String)> = self
            .rules
            .iter()
            .enumerate()
            .filter_map(|(index, compiled)| compiled.rule.key_for(operation, principal).map(|key| (index, key)))
            .collect();
        if applying.is_empty() {
            return Checked { decision: Decision::Allowed(Vec::new()), fell_back: false };
        }
        // One cell per limit of each applying rule: (rule, its key, the limit).
        let cells: Vec<(usize, &str, Limit)> = applying
            .iter()
            .flat_map(|(index, key)| {
                let rule = &self.rules[*index].rule;
                let rate = rule.rate.map(|rate| (*index, key.as_str(), Limit::Rate(rate)));
                rate.into_iter().chain(rule.quota.map(|quota| (*index, key.as_str(), Limit::Quota(quota))))
            })
            .collect();
        let mut fell_back = false;
        if let Some(shared) = &self.shared {
            let shared_cells: Vec<SharedCell> = cells
                .iter()
                .map(|&(index, key, limit)| SharedCell {
                    key: shared_key(&shared.namespace, &self.rules[index], key, &limit),
                    limit,
                })
                .collect();
            match shared.store.check(&shared_cells).await {
                Ok(verdict) => return Checked { decision: decision(verdict, &cells, &applying), fell_back },
                Err(error) => {
                    tracing::warn!(%error, fallback = ?shared.on_failure, "rate-limit store unavailable");
                    if shared.on_failure == OnStoreFailure::Refuse {
                        return Checked { decision: Decision::StoreUnavailable, fell_back };
                    }
                    fell_back = true;
                }
            }
        }
        let local_cells: Vec<local::Cell<'_>> = cells
            .iter()
            .map(|&(index, key, limit)| local::Cell { table: &self.rules[index].table, key, limit })
            .collect();
        let verdict = local::check(&local_cells, now_us());
        Checked { decision: decision(verdict, &cells, &applying), fell_back }
    }
}

/// The decision a verdict over `cells` (of the rules `applying`) makes.
fn decision(verdict: Verdict, cells: &[(usize, &str, Limit)], applying: &[(usize, String)]) -> Decision {
    match verdict {
        Verdict::Allowed => Decision::Allowed(applying.iter().map(|(index, _)| *index).collect()),
        Verdict::Refused { cell, wait_us } => Decision::Refused {
            rule: cells.get(cell).map_or(0, |(index, _, _)| *index),
            retry_after_ms: wait_us.div_ceil(1000).max(1),
        },
    }
}

/// A shared store's key for one state: `<prefix>{<namespace>}:<rule digest>:<r|q>:<key digest>`.
/// The braces make every key of a deployment one Redis Cluster hash slot (one script may touch
/// them together); the key's values are digested, so no subject or tenant is stored in clear.
fn shared_key(namespace: &str, compiled: &Compiled, key: &str, limit: &Limit) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, key.as_bytes());
    let kind = match limit {
        Limit::Rate(_) => "r",
        Limit::Quota(_) => "q",
    };
    format!("palisade:rl:{{{namespace}}}:{}:{kind}:{}", compiled.digest, hex(&digest.as_ref()[..16]))
}

#[cfg(test)]
mod tests;
