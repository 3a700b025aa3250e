//! The check modules and what they share: a [`Context`] (the target, the identities, the
//! operator's permissions) and a [`Case`] per check. A module is a list of cases; adding one is
//! adding a file here and a line in [`all`].

use std::future::Future;
use std::pin::Pin;

use serde_json::{Value, json};
use tokio::sync::OnceCell;

use crate::callable::{CallableTool, NotCallable};
use crate::check::{Check, Outcome};
use crate::identity::{Identity, Other, OtherCaller};
use crate::target::{Auth, Exchange, Probe, Target};

pub mod access;
pub mod auth;
pub mod definitions;
pub mod handles;
pub mod killswitch;
pub mod listen;
pub mod pinning;
pub mod sessions;
pub mod state;
pub mod tasks;
pub mod transport;

/// What every check runs with.
#[derive(Debug)]
pub struct Context {
    /// The target.
    pub target: Target,
    /// The identities (at least two).
    pub identities: Vec<Identity>,
    /// Whether the operator allowed calls with side effects.
    pub allow_mutations: bool,
    /// The gateway pinning options (`--change-upstream-command`, `--pin-wait-secs`).
    pub pinning: pinning::Options,
    /// How the operator flips a kill-switch target (`--disable-command`, `--enable-command`).
    pub killswitch: killswitch::Switch,
    /// The definitions of an earlier run (`--compare-definitions`).
    pub compared: definitions::Compared,
    named: OnceCell<Option<Probe>>,
    listed: OnceCell<Result<definitions::Listing, String>>,
}

impl Context {
    /// A context for one run.
    pub fn new(
        target: Target,
        identities: Vec<Identity>,
        allow_mutations: bool,
        pinning: pinning::Options,
        killswitch: killswitch::Switch,
        compared: definitions::Compared,
    ) -> Self {
        Self {
            target,
            identities,
            allow_mutations,
            pinning,
            killswitch,
            compared,
            named: OnceCell::new(),
            listed: OnceCell::new(),
        }
    }

    /// The target's definitions as the first identity, listed once per run
    /// ([`definitions::list`]); `Err` says why none could be read.
    pub async fn definitions(&self) -> &Result<definitions::Listing, String> {
        self.listed.get_or_init(|| definitions::list(self)).await
    }

    /// The definitions listed in this run, if a check listed them.
    pub fn listed_definitions(&self) -> Option<&[definitions::Listed]> {
        self.listed.get().and_then(|listed| listed.as_ref().ok()).map(|listing| listing.definitions.as_slice())
    }

    /// The first identity's bearer authentication.
    pub fn auth(&self) -> Auth {
        self.auth_of(0)
    }

    /// Identity `i`'s bearer authentication.
    pub fn auth_of(&self, i: usize) -> Auth {
        self.identities.get(i).map_or(Auth::None, |identity| Auth::Bearer(identity.token.clone()))
    }

    /// Whether a check may call `tool` (an entry of a `tools/list` result) in this run: the one
    /// rule of [`crate::callable::permit`].
    pub fn permit(&self, tool: &Value) -> Result<CallableTool, NotCallable> {
        crate::callable::permit(tool, self.allow_mutations)
    }

    /// The tools of a `tools/list` result a check may call in this run, in listing order.
    pub fn callable_tools<'a>(&self, tools: &'a [Value]) -> Vec<(CallableTool, &'a Value)> {
        crate::callable::permitted(tools, self.allow_mutations)
    }

    /// The identity a cross-identity check calls as ([`Other::find`]); `Err`: why none fits.
    pub fn other(&self, other: Other) -> Result<OtherCaller, &'static str> {
        other.find(&self.identities)
    }

    /// The read-only request every transport case breaks one thing of: `tools/list` as the
    /// first identity.
    pub fn base(&self) -> Probe {
        Probe::request("tools/list", json!({}), self.auth())
    }

    /// A read-only request routed by `Mcp-Name` (`resources/read` of a listed resource, or
    /// `prompts/get` of a prompt without required arguments) that the first identity is
    /// served; `None` when the target offers none.
    pub async fn named(&self) -> Option<Probe> {
        self.named.get_or_init(|| self.find_named()).await.clone()
    }

    async fn find_named(&self) -> Option<Probe> {
        let listed = self.target.send(Probe::request("resources/list", json!({}), self.auth())).await;
        let resources = listed.result().and_then(|r| r.get("resources")).and_then(Value::as_array);
        for uri in resources.into_iter().flatten().filter_map(|r| r.get("uri").and_then(Value::as_str)).take(3) {
            let probe = Probe::request("resources/read", json!({ "uri": uri }), self.auth());
            if self.target.send(probe.clone()).await.accepted() {
                return Some(probe);
            }
        }
        let listed = self.target.send(Probe::request("prompts/list", json!({}), self.auth())).await;
        let prompts = listed.result().and_then(|r| r.get("prompts")).and_then(Value::as_array);
        for prompt in prompts.into_iter().flatten().take(5) {
            let required = prompt
                .get("arguments")
                .and_then(Value::as_array)
                .is_some_and(|args| args.iter().any(|a| a.get("required") == Some(&json!(true))));
            let Some(name) = prompt.get("name").and_then(Value::as_str) else { continue };
            if required {
                continue;
            }
            let probe = Probe::request("prompts/get", json!({ "name": name }), self.auth());
            if self.target.send(probe.clone()).await.accepted() {
                return Some(probe);
            }
        }
        None
    }
}

/// Whether the target speaks 2026-07-28, which every module needs but `sessions`, `definitions` and
/// `access` (see [`needs_current_protocol`]): `None` when
/// it does (or when nothing can be told: no answer, or authentication refused), otherwise the
/// one line saying why not — `server/discover` (which every 2026-07-28 server implements) is
/// refused, or its `supportedVersions` (or a -32022 error's `supported`) lack 2026-07-28.
pub async fn unspoken_protocol(ctx: &Context) -> Option<String> {
    let discover = ctx.target.send(Probe::request("server/discover", json!({}), ctx.auth())).await;
    protocol_gap(&discover)
}

/// Whether the target needs no authentication at all: a `tools/list` with no token is served,
/// or (a target of the 2025-era wire only) an `initialize` with no token opens a session.
/// `Some` says what it got (the root cause [`crate::report::NO_AUTHENTICATION`]).
pub async fn unauthenticated_served(ctx: &Context) -> Option<String> {
    let exchange = ctx.target.send(Probe::request("tools/list", json!({}), Auth::None)).await;
    if exchange.accepted() {
        return Some(format!("tools/list without a token: {}", exchange.summary()));
    }
    sessions::opened_without_token(ctx).await
}

/// [`unspoken_protocol`]'s judgement of a `server/discover` exchange.
pub fn protocol_gap(discover: &Exchange) -> Option<String> {
    let wanted = crate::target::PROTOCOL_VERSION;
    let listed = |versions: Option<&Value>| -> Option<Vec<String>> {
        versions?.as_array().map(|all| {
            all.iter().filter_map(Value::as_str).map(crate::escape::visible).map(|v| v.into_owned()).collect()
        })
    };
    if discover.accepted() {
        let versions = listed(discover.result().and_then(|result| result.get("supportedVersions")))?;
        if versions.iter().any(|version| version == wanted) {
            return None;
        }
        return Some(format!(
            "the target does not speak {wanted}: server/discover lists {} only",
            if versions.is_empty() { "no version".to_owned() } else { versions.join(", ") }
        ));
    }
    let status = discover.status?;
    if status == 401 || status == 403 {
        return None;
    }
    if discover.error_code() == Some(-32022) {
        let supported = listed(discover.error().and_then(|error| error.pointer("/data/supported"))).unwrap_or_default();
        return Some(format!(
            "the target does not speak {wanted}: it refuses the version (-32022) and supports {}",
            if supported.is_empty() { "no version it names".to_owned() } else { supported.join(", ") }
        ));
    }
    Some(format!(
        "the target does not speak {wanted}: server/discover, which every {wanted} server implements, was refused ({})",
        discover.summary()
    ))
}

/// Whether a check needs the 2026-07-28 wire (every check but the 2025-era `sessions.*`, and
/// `definitions.*` and `access.*`, which speak either era).
pub fn needs_current_protocol(check: &Check) -> bool {
    !["sessions.", "definitions.", "access."].iter().any(|prefix| check.id.starts_with(prefix))
}

/// Below this many bits (an upper estimate, [`estimated_bits`]) an id can be enumerated or
/// guessed online: the id checks FAIL under it, and WARN between it and the 128 bits asked for.
pub(crate) const GUESSABLE_BITS: f64 = 64.0;

/// An upper estimate of the bits of entropy of an id: its length times the bits of the
/// smallest common alphabet holding all its characters (a version-4 UUID: 122 bits).
pub(crate) fn estimated_bits(id: &str) -> f64 {
    let bytes = id.as_bytes();
    let uuid = bytes.len() == 36
        && bytes.iter().enumerate().all(
            |(i, b)| {
                if matches!(i, 8 | 13 | 18 | 23) { *b == b'-' } else { b.is_ascii_hexdigit() }
            },
        );
    if uuid {
        return if bytes.get(14) == Some(&b'4') { 122.0 } else { 128.0 };
    }
    let alphabet: f64 = if bytes.iter().all(u8::is_ascii_digit) {
        10.0
    } else if bytes.iter().all(u8::is_ascii_hexdigit)
        && (bytes.iter().all(|b| !b.is_ascii_uppercase()) || bytes.iter().all(|b| !b.is_ascii_lowercase()))
    {
        16.0
    } else if bytes.iter().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase()) {
        36.0
    } else if bytes.iter().all(u8::is_ascii_alphanumeric) {
        62.0
    } else if bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'+' | b'/' | b'=')) {
        64.0
    } else {
        95.0
    };
    bytes.len() as f64 * alphabet.log2()
}

/// A check's future.
pub type CaseFuture<'a> = Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// Runs one check.
pub type CaseFn = for<'a> fn(&'a Context, Check) -> CaseFuture<'a>;

/// One check and the code that runs it.
#[derive(Clone, Copy)]
pub struct Case {
    /// The check's description.
    pub check: Check,
    /// Its code.
    pub run: CaseFn,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case").field("id", &self.check.id).finish_non_exhaustive()
    }
}

/// A named list of cases.
#[derive(Debug)]
pub struct Module {
    /// The module's name (the first label of its check ids).
    pub name: &'static str,
    /// Whether its checks change what the target serves to everyone (a kill-switch target
    /// flipped, an upstream's definition changed): such a module runs after every other one,
    /// alone, so no other check sees the change.
    pub exclusive: bool,
    /// Its cases, in report order.
    pub cases: Vec<Case>,
}

/// Every module, in report order.
pub fn all() -> Vec<Module> {
    vec![
        transport::module(),
        auth::module(),
        access::module(),
        sessions::module(),
        handles::module(),
        tasks::module(),
        listen::module(),
        state::module(),
        definitions::module(),
        killswitch::module(),
        pinning::module(),
    ]
}

/// Builds a module's cases: `function: "id", "title", "requirement", Severity;` each, where
/// `function` is an `async fn(&Context, Check) -> Outcome`.
macro_rules! cases {
    ($($function:ident : $id:literal, $title:literal, $requirement:literal, $severity:ident;)*) => {
        vec![$(
            $crate::modules::Case {
                check: $crate::check::Check {
                    id: $id,
                    title: $title,
                    requirement: $requirement,
                    severity: $crate::check::Severity::$severity,
                },
                run: {
                    fn run<'a>(ctx: &'a $crate::modules::Context, check: $crate::check::Check) -> $crate::modules::CaseFuture<'a> {
                        Box::pin($function(ctx, check))
                    }
                    run
                },
            },
        )*]
    };
}
pub(crate) use cases;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_that_does_not_list_or_answer_2026_07_28_is_told_apart() {
        let id = json!(1);
        let discovered = |result: Value| {
            Exchange::answered(id.clone(), 200, vec![json!({ "jsonrpc": "2.0", "id": 1, "result": result })])
        };
        assert_eq!(protocol_gap(&discovered(json!({ "supportedVersions": ["2025-11-25", "2026-07-28"] }))), None);
        let old = protocol_gap(&discovered(json!({ "supportedVersions": ["2025-11-25"] }))).unwrap();
        assert_eq!(old, "the target does not speak 2026-07-28: server/discover lists 2025-11-25 only");
        // A result without the list tells nothing; nor does an authentication refusal or no answer.
        assert_eq!(protocol_gap(&discovered(json!({ "tools": [] }))), None);
        let error = |status: u16, code: i64, data: Value| {
            let frame =
                json!({ "jsonrpc": "2.0", "id": null, "error": { "code": code, "message": "m", "data": data } });
            Exchange::answered(id.clone(), status, vec![frame])
        };
        assert_eq!(protocol_gap(&error(401, -32600, json!(null))), None);
        assert_eq!(protocol_gap(&error(403, -32600, json!(null))), None);
        assert_eq!(protocol_gap(&Exchange::unanswered(id.clone())), None);
        let refused = protocol_gap(&error(400, -32000, json!(null))).unwrap();
        assert!(refused.starts_with("the target does not speak 2026-07-28: server/discover"), "{refused}");
        assert!(refused.contains("HTTP 400, error -32000"), "{refused}");
        let unsupported =
            protocol_gap(&error(400, -32022, json!({ "requested": "2026-07-28", "supported": ["2025-06-18"] })));
        assert!(unsupported.unwrap().ends_with("supports 2025-06-18"));
    }

    #[test]
    fn entropy_is_estimated_from_length_and_alphabet() {
        // 43 base64url characters: 258 bits; 32 hex digits: 128; 16: 64.
        assert!((estimated_bits("7l6Z_lBxVy-7BBB24QZBI78W2n0HIu4i7PFaKBDNCfE") - 258.0).abs() < 0.01);
        assert_eq!(estimated_bits("0123456789abcdef0123456789abcdef"), 128.0);
        assert_eq!(estimated_bits("0123456789abcdef"), 64.0);
        // A version-4 UUID carries 122 random bits; a counter or a short name almost none.
        assert_eq!(estimated_bits("550e8400-e29b-41d4-a716-446655440000"), 122.0);
        assert!(estimated_bits("12345") < 20.0);
        assert!(estimated_bits("task-42") < 128.0);
        assert!(estimated_bits("7") < 4.0);
        assert_eq!(estimated_bits(""), 0.0);
    }
}
