//! Operator sign-in, shared by the pages an operator opens (the pin review page, the console):
//! named accounts, each a token of at least [`MIN_TOKEN_CHARS`] characters, compared through
//! HMACs in constant time; sign-in attempts limited per source and overall *before* a token is
//! looked at; a wrong token costing the browser a second; and signed `__Host-` session cookies
//! naming the account and when they expire.
//!
//! The review page has one account without a name (the review token); the console has the
//! operators of `[web] operators_file`. The two never share a cookie or a key: each page derives
//! its own [`PageKeys`] and names its own cookie.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use palisade_base::clock::Clock;
use palisade_base::limit::{Limits, SourceLimiter};

use axum::response::{IntoResponse, Response};

use super::{
    Form, PageKeys, SeeOther, WebAudit, clear_host_cookie, error_page, host_cookie, random_token, read_cookie,
};
use crate::secret::Secret;

/// Shortest operator token accepted.
pub const MIN_TOKEN_CHARS: usize = 16;
/// Longest operator name accepted.
pub const MAX_OPERATOR_NAME_CHARS: usize = 64;
/// How long a session lasts.
pub const SESSION_SECS: u64 = 8 * 3600;
/// What a wrong token costs.
const WRONG_TOKEN_DELAY: Duration = Duration::from_secs(1);
/// Sign-in attempts: per source 5 at once, then one every 12 s; over all sources 20 at once,
/// then one every 3 s. An attempt is taken before the token is compared.
pub(crate) const SIGN_IN_LIMITS: Limits =
    Limits { burst: 5, refill_ms: 12_000, total_burst: 20, total_refill_ms: 3_000, max_sources: 4096 };

/// One operator account: a name (empty for the review page's single token) and its token.
pub(crate) struct Account {
    name: String,
    token: Secret,
}

impl Account {
    /// The account `name` signed in with `token`.
    pub(crate) fn new(name: String, token: Secret) -> Self {
        Self { name, token }
    }
}

/// Whether `name` can name an operator: 1 to 64 of ASCII letters, digits, `.`, `_`, `-`, `@`.
pub fn operator_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_OPERATOR_NAME_CHARS
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"._-@".contains(&byte))
}

/// Why a sign-in was not granted (each already on the audit record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Past the attempt limits: the token was not checked (429).
    RateLimited,
    /// No account has that name and token (403, after [`WRONG_TOKEN_DELAY`]).
    Wrong,
    /// The session could not be made or recorded (500/503: nothing granted).
    Unavailable(StatusCode),
}

/// A signed-in browser: its session value (the binding of its CSRF tokens) and the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    /// The cookie's value.
    pub value: String,
    /// The account's name (empty for the review token).
    pub operator: String,
}

/// The sign-in of one set of pages.
pub(crate) struct OperatorSignIn {
    endpoint: &'static str,
    cookie: &'static str,
    accounts: Vec<Account>,
    keys: PageKeys,
    clock: Arc<dyn Clock>,
    attempts: SourceLimiter,
}

impl std::fmt::Debug for OperatorSignIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorSignIn").field("endpoint", &self.endpoint).finish_non_exhaustive()
    }
}

impl OperatorSignIn {
    /// The sign-in of the pages recorded as `endpoint` (`review`, `console`), whose session
    /// cookie is `__Host-<cookie>`, signed with `keys`.
    pub(crate) fn new(
        endpoint: &'static str,
        cookie: &'static str,
        accounts: Vec<Account>,
        keys: PageKeys,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self { endpoint, cookie, accounts, keys, clock, attempts: SourceLimiter::new(SIGN_IN_LIMITS) }
    }

    fn now_secs(&self) -> i64 {
        self.clock.now_ms() / 1000
    }

    fn purpose(&self) -> String {
        format!("{}-session", self.endpoint)
    }

    /// The browser's session, when its cookie is one of ours, unexpired, and names an account
    /// that still exists.
    pub(crate) fn session(&self, headers: &HeaderMap) -> Option<Session> {
        let value = read_cookie(headers, self.cookie)?;
        let payload = String::from_utf8(self.keys.verify(&self.purpose(), &value)?).ok()?;
        let mut parts = payload.splitn(3, '.');
        let (_nonce, expires, operator) = (parts.next()?, parts.next()?, parts.next()?);
        if expires.parse::<i64>().ok()? <= self.now_secs() {
            return None;
        }
        let known = self.accounts.iter().any(|account| account.name == operator);
        known.then(|| Session { value, operator: operator.to_owned() })
    }

    /// Signs in the account `name` (ignored by a page with one unnamed account) with `token`
    /// for the browser of `audit`: the cookie to set and the operator, once the grant is on the
    /// record. Every refusal is counted on the record before it is returned.
    pub(crate) async fn sign_in(
        &self,
        audit: &WebAudit,
        name: &str,
        token: &str,
    ) -> Result<(HeaderValue, String), Refused> {
        // Taken before the token is looked at, so parallel guesses cannot all be checked.
        if self.attempts.try_take(audit.peer(), self.clock.now_ms()).is_err() {
            audit.refuse(self.endpoint, "rate_limited", StatusCode::TOO_MANY_REQUESTS);
            return Err(Refused::RateLimited);
        }
        // Every account's token is compared, so the time taken says nothing of which name exists.
        let mut matched = None;
        for account in &self.accounts {
            let token_ok = self.keys.same_secret(token, account.token.expose());
            let name_ok = account.name.is_empty() || account.name == name;
            if token_ok && name_ok && matched.is_none() {
                matched = Some(account.name.clone());
            }
        }
        let Some(operator) = matched else {
            audit.refuse(self.endpoint, "token_wrong", StatusCode::FORBIDDEN);
            tokio::time::sleep(WRONG_TOKEN_DELAY).await;
            tracing::warn!(page = self.endpoint, "a sign-in with a wrong name or token");
            return Err(Refused::Wrong);
        };
        self.attempts.refund(audit.peer());
        let expires = self.now_secs() + i64::try_from(SESSION_SECS).unwrap_or(0);
        let cookie = random_token()
            .ok()
            .map(|nonce| self.keys.sign(&self.purpose(), format!("{nonce}.{expires}.{operator}").as_bytes()))
            .and_then(|value| host_cookie(self.cookie, &value, SESSION_SECS).ok())
            .ok_or(Refused::Unavailable(StatusCode::INTERNAL_SERVER_ERROR))?;
        let detail = (!operator.is_empty()).then(|| format!("operator={operator}"));
        audit
            .grant(self.endpoint, "signed_in", None, None, detail)
            .await
            .map_err(|_| Refused::Unavailable(StatusCode::SERVICE_UNAVAILABLE))?;
        Ok((cookie, operator))
    }

    /// Whether `token` is the CSRF token of `purpose` (and `parts`) for `session`.
    pub(crate) fn csrf_ok(&self, session: &Session, purpose: &str, parts: &[&str], token: Option<&str>) -> bool {
        let mut binding = vec![session.value.as_str(), purpose];
        binding.extend_from_slice(parts);
        token.is_some_and(|token| self.keys.csrf().check(&binding, token))
    }

    /// The CSRF token of `purpose` (and `parts`) for `session`.
    pub(crate) fn csrf(&self, session: &Session, purpose: &str, parts: &[&str]) -> String {
        let mut binding = vec![session.value.as_str(), purpose];
        binding.extend_from_slice(parts);
        self.keys.csrf().token(&binding)
    }

    /// The `Set-Cookie` that ends the session.
    pub(crate) fn sign_out_cookie(&self) -> Option<HeaderValue> {
        clear_host_cookie(self.cookie).ok()
    }

    /// The answer to a page's sign-out form (`page` names it in the audit log; `home` is where
    /// the browser goes next): without a session nothing to end, with a wrong CSRF token a
    /// refusal that changes nothing, else the session's cookie cleared.
    pub(crate) fn sign_out(
        &self,
        page: &'static str,
        home: &'static str,
        audit: WebAudit,
        headers: &HeaderMap,
        form: &Form,
    ) -> Response {
        let Some(session) = self.session(headers) else { return SeeOther::to(home).into_response() };
        if !self.csrf_ok(&session, "logout", &[], form.one("csrf")) {
            return audit.refused(
                page,
                "csrf",
                StatusCode::FORBIDDEN,
                "the form's CSRF token is missing or wrong; nothing was done",
            );
        }
        match self.sign_out_cookie() {
            Some(cookie) => SeeOther::to(home).cookie(cookie).into_response(),
            None => error_page(StatusCode::INTERNAL_SERVER_ERROR, "the session could not be ended"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_names_are_short_plain_ascii() {
        for good in ["alice", "ops.bob", "carol_1", "d-e@example.com"] {
            assert!(operator_name_ok(good), "{good}");
        }
        let long = "a".repeat(MAX_OPERATOR_NAME_CHARS + 1);
        for bad in ["", "a b", "<script>", "ünï", "a\u{202E}b", long.as_str()] {
            assert!(!operator_name_ok(bad), "{bad}");
        }
    }
}
