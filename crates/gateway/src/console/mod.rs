//! The operator console on the gateway's web surface ([`crate::web`]): one read-only page an
//! operator signs in to with an account of `[web] operators_file`, showing what the gateway is
//! doing now.
//!
//! ```text
//! GET  /console          sign in (operator name and token), then the console
//! POST /console/login    name and token → a session cookie (__Host-palisade_console, 8 hours)
//! POST /console/logout   ends the session (CSRF token)
//! ```
//!
//! - Sign-in is the review page's ([`crate::web::signin`]): attempts limited per source and
//!   overall before a token is compared, a wrong one costing a second, every sign-in
//!   (`console/signed_in`, `operator=<name>`) and refusal on the audit record. The console's
//!   keys and cookie are its own: a review session is no console session, nor the reverse.
//! - The page: upstreams with health and definition counts (served, held, pending, rejected);
//!   the definitions awaiting a decision with their diffs and review findings, each linking its
//!   form on the review page; the kill switch's state per nameable target (read from the
//!   authority's database when this process shares it); per-user upstream connections (labels,
//!   scopes and times, never the sealed tokens); delegation capabilities; the audit tail with the
//!   chains' last verification; and charts of the server's own metrics ([`samples`],
//!   [`charts`]). It changes nothing: decisions are made on the review page.
//! - Everything an upstream or a user wrote is escaped ([`render`]); the page runs no script.
//!
//! **Architecture Invariant:** the console's only unsafe methods are its sign-in and sign-out;
//! it holds no handle that can change a pin, a kill-switch state, a connection or a delegation.

use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::hmac;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use palisade_base::clock::Clock;
use palisade_killswitch::KillSwitch;
use palisade_killswitch::authority::AuthorityDb;
use palisade_store::Store;
use tokio_util::sync::CancellationToken;

use crate::findings::ToolNames;
use crate::gateway::Gateway;
use crate::secret::{Secret, SecretSource};
use crate::web::signin::{Account, MIN_TOKEN_CHARS, OperatorSignIn, Refused, operator_name_ok};
use crate::web::{Form, PageKeys, SeeOther, WebAudit, error_page};

pub mod charts;
pub mod render;
pub mod samples;

pub use samples::Samples;

/// The server's metrics in the text exposition format (`Server::metrics().render()`).
pub type Exposition = Arc<dyn Fn() -> String + Send + Sync>;

/// The session cookie (`__Host-palisade_console`).
const SESSION_COOKIE: &str = "palisade_console";
/// The label the console's keys derive from (see [`Console::key_label`]).
pub const KEY_LABEL: &str = "palisade/console/v1";
/// Rows shown of the audit tail, the connections and the delegations.
pub const AUDIT_ROWS: u32 = 50;
pub(crate) const LISTED_ROWS: u32 = 200;

/// The kill switch as the console reads it.
pub struct KillSwitchView {
    /// The running kill switch (its target digests).
    pub switch: Arc<KillSwitch>,
    /// The authority's database when this process shares it (development authority,
    /// `killswitch.authority_db`); `None`: the states live at an external authority only.
    pub authority: Option<AuthorityDb>,
    /// The `server_release` target value.
    pub server_release: String,
}

/// Why the console could not be set up. Never carries a token.
#[derive(Debug, thiserror::Error)]
#[error("web.operators_file: {0}")]
pub struct ConsoleError(String);

/// The console's state.
pub struct Console {
    gateway: Gateway,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    names: ToolNames,
    sign_in: OperatorSignIn,
    kill_switch: Option<KillSwitchView>,
    samples: Arc<Samples>,
    review_page: bool,
    sample_secs: u64,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").finish_non_exhaustive()
    }
}

/// Reads the operator accounts of `text`: one `name token` a line (blank lines and `#` comments
/// skipped), names per [`operator_name_ok`] and unique, tokens of at least 16 characters. Errors
/// name the line, never its token.
pub(crate) fn parse_operators(text: &str) -> Result<Vec<Account>, ConsoleError> {
    let mut accounts = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let number = index + 1;
        let mut words = line.split_whitespace();
        let (Some(name), Some(token), None) = (words.next(), words.next(), words.next()) else {
            return Err(ConsoleError(format!("line {number}: write one operator a line as `name token`")));
        };
        if !operator_name_ok(name) {
            return Err(ConsoleError(format!(
                "line {number}: an operator name is 1 to 64 ASCII letters, digits, '.', '_', '-' or '@'"
            )));
        }
        if names.contains(&name) {
            return Err(ConsoleError(format!("line {number}: operator {name} is named twice")));
        }
        if token.chars().count() < MIN_TOKEN_CHARS {
            return Err(ConsoleError(format!(
                "line {number}: the token of operator {name} is shorter than {MIN_TOKEN_CHARS} characters"
            )));
        }
        names.push(name);
        accounts.push(Account::new(name.to_owned(), Secret(zeroize::Zeroizing::new(token.to_owned()))));
    }
    if accounts.is_empty() {
        return Err(ConsoleError("names no operator".into()));
    }
    Ok(accounts)
}

impl Console {
    /// The console of `gateway` when `[web] operators_file` is set (read now), its keys derived
    /// from `key` ([`palisade_server::secret::ServerSecret::derive`] of [`KEY_LABEL`]), showing
    /// `kill_switch` when one runs; `None` without an operators file. Its figures are sampled
    /// once [`Self::start`] is called.
    pub fn from_gateway(
        gateway: &Gateway,
        key: hmac::Key,
        kill_switch: Option<KillSwitchView>,
    ) -> Result<Option<Arc<Self>>, ConsoleError> {
        let settings = gateway.settings();
        let Some(web) = settings.web.as_ref() else { return Ok(None) };
        let Some(path) = &web.operators_file else { return Ok(None) };
        let text = SecretSource::File(path.clone()).read().map_err(|error| ConsoleError(error.to_string()))?;
        let accounts = parse_operators(text.expose())?;
        Ok(Some(Arc::new(Self::new(gateway, accounts, key, kill_switch, web.review_token.is_some()))))
    }

    pub(crate) fn new(
        gateway: &Gateway,
        accounts: Vec<Account>,
        key: hmac::Key,
        kill_switch: Option<KillSwitchView>,
        review_page: bool,
    ) -> Self {
        let clock = gateway.clock().clone();
        Self {
            gateway: gateway.clone(),
            store: gateway.store().clone(),
            names: ToolNames::new(&gateway.settings()),
            sign_in: OperatorSignIn::new("console", SESSION_COOKIE, accounts, PageKeys::new(key), clock.clone()),
            clock,
            kill_switch,
            samples: Arc::new(Samples::default()),
            review_page,
            sample_secs: gateway.settings().web.as_ref().map_or(10, |web| web.console_sample_secs),
        }
    }

    /// Starts sampling `exposition` every `[web] console_sample_secs` (and verifying the audit
    /// chains) until `shutdown`.
    pub fn start(&self, exposition: Exposition, shutdown: CancellationToken) {
        let every = Duration::from_secs(self.sample_secs);
        samples::spawn_sampler(
            self.samples.clone(),
            exposition,
            self.store.clone(),
            self.clock.clone(),
            every,
            shutdown,
        );
    }

    /// The sampled figures (tests, and the page).
    pub fn samples(&self) -> &Arc<Samples> {
        &self.samples
    }
}

/// The console of `gateway` ([`Console::from_gateway`]) sampling `exposition` until `shutdown`,
/// as routes to be served inside [`crate::web::surface`]; `None` without `[web] operators_file`.
pub fn serve(
    gateway: &Gateway,
    key: hmac::Key,
    kill_switch: Option<KillSwitchView>,
    exposition: Exposition,
    shutdown: CancellationToken,
) -> Result<Option<Router>, ConsoleError> {
    let Some(console) = Console::from_gateway(gateway, key, kill_switch)? else { return Ok(None) };
    console.start(exposition, shutdown);
    Ok(Some(routes(console)))
}

/// The console's routes, to be served inside [`crate::web::surface`].
pub fn routes(console: Arc<Console>) -> Router {
    Router::new()
        .route("/console", get(page))
        .route("/console/login", post(login))
        .route("/console/logout", post(logout))
        .with_state(console)
}

async fn login(State(console): State<Arc<Console>>, audit: WebAudit, form: Form) -> Response {
    let name = form.one("operator").map(str::trim).unwrap_or("");
    match console.sign_in.sign_in(&audit, name, form.one("token").unwrap_or("")).await {
        Ok((cookie, operator)) => {
            tracing::info!(operator, "console: an operator signed in");
            SeeOther::to("/console").cookie(cookie).into_response()
        }
        Err(Refused::RateLimited) => {
            let mut page = render::sign_in_page(
                StatusCode::TOO_MANY_REQUESTS,
                Some("too many sign-in attempts; wait a minute and try again (the token was not checked)"),
            );
            page.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("12"));
            page
        }
        Err(Refused::Wrong) => {
            render::sign_in_page(StatusCode::FORBIDDEN, Some("that operator name and token do not match"))
        }
        Err(Refused::Unavailable(status)) => error_page(status, "the session could not be made; nothing was granted"),
    }
}

async fn logout(State(console): State<Arc<Console>>, audit: WebAudit, headers: HeaderMap, form: Form) -> Response {
    console.sign_in.sign_out("console", "/console", audit, &headers, &form)
}

async fn page(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let Some(session) = console.sign_in.session(&headers) else {
        return render::sign_in_page(StatusCode::OK, None);
    };
    let logout = console.sign_in.csrf(&session, "logout", &[]);
    let view = render::gather(&console).await;
    render::console_page(&view, &session.operator, &logout).into_response()
}

#[cfg(test)]
mod tests;
