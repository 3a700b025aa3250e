//! Claim checks on a signature-verified payload, and `VerifiedClaims`, the proof that a token
//! passed every check. Only this crate can construct a `VerifiedClaims`.
//!
//! Time rules (all in milliseconds on the injected clock, with the bounded leeway `L`):
//! valid while `now < exp + L`; refused while `now + L < nbf`; refused if `iat > now + L`.
//! Fractional NumericDates round towards refusal (`exp` down, `nbf`/`iat` up).

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::config::{ValidatedConfig, is_scope_token};
use crate::error::{AuthError, ClaimKind, InvalidTokenReason};

/// Who is calling and what they may do, taken from a token that passed every check.
///
/// The principal is the pair (issuer, subject): a subject alone means nothing across issuers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedClaims {
    issuer: String,
    subject: String,
    tenant: Option<String>,
    client_id: Option<String>,
    scopes: BTreeSet<String>,
    groups: BTreeSet<String>,
    expires_at_ms: u64,
    token_digest: String,
}

impl VerifiedClaims {
    /// The `iss` claim, equal to one configured issuer.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The `sub` claim.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// `iss#sub`: the principal key. Unambiguous because issuers never contain `#` (they are
    /// URLs without fragments).
    pub fn principal(&self) -> String {
        format!("{}#{}", self.issuer, self.subject)
    }

    /// The configured tenant claim, if the token has one.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The configured client claim, else `azp`, if the token has one.
    pub fn client_id(&self) -> Option<&str> {
        self.client_id.as_deref()
    }

    /// Scopes from `scope` (space-delimited) or, if absent, `scp` (array or space-delimited).
    pub fn scopes(&self) -> &BTreeSet<String> {
        &self.scopes
    }

    /// The groups and roles named by the configured group claims.
    pub fn groups(&self) -> &BTreeSet<String> {
        &self.groups
    }

    /// Whether the token carries `scope`.
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.contains(scope)
    }

    /// The token's `exp`, in milliseconds since the Unix epoch.
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at_ms
    }

    /// A short hex prefix of the token's SHA-256: the only form in which a token may be logged.
    pub fn token_digest(&self) -> &str {
        &self.token_digest
    }

    #[cfg(test)]
    pub(crate) fn for_tests(expires_at_ms: u64) -> Self {
        Self {
            issuer: "https://idp.example.com".into(),
            subject: "alice".into(),
            tenant: None,
            client_id: None,
            scopes: BTreeSet::new(),
            groups: BTreeSet::new(),
            expires_at_ms,
            token_digest: "0000000000000000".into(),
        }
    }
}

/// Refuses with [`AuthError::InsufficientScope`] naming *every* scope in `required` (so the
/// client can step up once with the union) unless the token has all of them.
pub fn check_scopes(claims: &VerifiedClaims, required: &[&str]) -> Result<(), AuthError> {
    if required.iter().all(|scope| claims.has_scope(scope)) {
        return Ok(());
    }
    let mut needed: Vec<String> = Vec::with_capacity(required.len());
    for scope in required {
        if !needed.iter().any(|s| s == scope) {
            needed.push((*scope).to_owned());
        }
    }
    Err(AuthError::InsufficientScope { required: needed })
}

/// The unverified `iss`, used only to pick which issuer's keys to try.
pub(crate) fn unverified_issuer(payload: &Map<String, Value>) -> Result<&str, InvalidTokenReason> {
    match payload.get("iss") {
        None => Err(InvalidTokenReason::MissingClaim(ClaimKind::Issuer)),
        Some(Value::String(iss)) => Ok(iss),
        Some(_) => Err(InvalidTokenReason::InvalidClaim(ClaimKind::Issuer)),
    }
}

#[derive(Clone, Copy)]
enum Rounding {
    Down,
    Up,
}

/// A NumericDate (RFC 7519 §2) in milliseconds; non-negative and finite.
fn numeric_date_ms(value: &Value, kind: ClaimKind, rounding: Rounding) -> Result<u64, InvalidTokenReason> {
    let invalid = InvalidTokenReason::InvalidClaim(kind);
    let Value::Number(number) = value else {
        return Err(invalid);
    };
    if let Some(secs) = number.as_u64() {
        return Ok(secs.saturating_mul(1000));
    }
    let secs = number.as_f64().ok_or(invalid)?;
    // Beyond ~31 million years is not a date; below zero is not either.
    if !secs.is_finite() || !(0.0..1e15).contains(&secs) {
        return Err(invalid);
    }
    let ms = secs * 1000.0;
    let ms = match rounding {
        Rounding::Down => ms.floor(),
        Rounding::Up => ms.ceil(),
    };
    // In range by the check above, so the cast is exact.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(ms as u64)
}

fn optional_string(
    payload: &Map<String, Value>,
    name: &str,
    kind: ClaimKind,
) -> Result<Option<String>, InvalidTokenReason> {
    match payload.get(name) {
        None => Ok(None),
        Some(Value::String(value)) if !value.is_empty() && !value.chars().any(char::is_control) => {
            Ok(Some(value.clone()))
        }
        Some(_) => Err(InvalidTokenReason::InvalidClaim(kind)),
    }
}

/// Every group the configured claims name: each claim a string (space-separated) or an array
/// of strings; another shape, an empty or control-character name refuses the token.
fn groups(payload: &Map<String, Value>, claims: &[String]) -> Result<BTreeSet<String>, InvalidTokenReason> {
    let invalid = InvalidTokenReason::InvalidClaim(ClaimKind::Groups);
    let mut out = BTreeSet::new();
    let mut add = |group: &str| {
        if group.is_empty() || group.chars().any(char::is_control) {
            return Err(invalid);
        }
        out.insert(group.to_owned());
        Ok(())
    };
    for claim in claims {
        match payload.get(claim) {
            None => {}
            Some(Value::String(list)) => list.split(' ').filter(|g| !g.is_empty()).try_for_each(&mut add)?,
            Some(Value::Array(items)) => {
                items.iter().try_for_each(|item| add(item.as_str().ok_or(invalid)?))?;
            }
            Some(_) => return Err(invalid),
        }
    }
    Ok(out)
}

fn scopes(payload: &Map<String, Value>) -> Result<BTreeSet<String>, InvalidTokenReason> {
    let invalid = InvalidTokenReason::InvalidClaim(ClaimKind::Scope);
    let mut out = BTreeSet::new();
    let mut add = |scope: &str| {
        if is_scope_token(scope) {
            out.insert(scope.to_owned());
            Ok(())
        } else {
            Err(invalid)
        }
    };
    match payload.get("scope").or_else(|| payload.get("scp")) {
        None => {}
        Some(Value::String(list)) => {
            for scope in list.split(' ').filter(|s| !s.is_empty()) {
                add(scope)?;
            }
        }
        Some(Value::Array(items)) if !payload.contains_key("scope") => {
            for item in items {
                add(item.as_str().ok_or(invalid)?)?;
            }
        }
        Some(_) => return Err(invalid),
    }
    Ok(out)
}

fn audience_contains(payload: &Map<String, Value>, resource: &str) -> Result<(), InvalidTokenReason> {
    let invalid = InvalidTokenReason::InvalidClaim(ClaimKind::Audience);
    match payload.get("aud") {
        None => Err(InvalidTokenReason::MissingClaim(ClaimKind::Audience)),
        Some(Value::String(aud)) => {
            if aud == resource {
                Ok(())
            } else {
                Err(InvalidTokenReason::WrongAudience)
            }
        }
        Some(Value::Array(items)) => {
            let mut found = false;
            for item in items {
                let aud = item.as_str().ok_or(invalid)?;
                found |= aud == resource;
            }
            if found { Ok(()) } else { Err(InvalidTokenReason::WrongAudience) }
        }
        Some(_) => Err(invalid),
    }
}

/// Every claim check after the signature verified and `iss` matched `issuer` exactly.
pub(crate) fn validate_claims(
    payload: &Map<String, Value>,
    cfg: &ValidatedConfig,
    issuer: &str,
    now_ms: u64,
    token_digest: String,
) -> Result<VerifiedClaims, InvalidTokenReason> {
    let leeway = cfg.leeway_ms;
    let exp_ms = match payload.get("exp") {
        None => return Err(InvalidTokenReason::MissingClaim(ClaimKind::ExpiresAt)),
        Some(value) => numeric_date_ms(value, ClaimKind::ExpiresAt, Rounding::Down)?,
    };
    if now_ms >= exp_ms.saturating_add(leeway) {
        return Err(InvalidTokenReason::Expired);
    }
    if let Some(value) = payload.get("nbf") {
        let nbf_ms = numeric_date_ms(value, ClaimKind::NotBefore, Rounding::Up)?;
        if nbf_ms > now_ms.saturating_add(leeway) {
            return Err(InvalidTokenReason::NotYetValid);
        }
    }
    if let Some(value) = payload.get("iat") {
        let iat_ms = numeric_date_ms(value, ClaimKind::IssuedAt, Rounding::Up)?;
        if iat_ms > now_ms.saturating_add(leeway) {
            return Err(InvalidTokenReason::IssuedInFuture);
        }
    }
    let subject = optional_string(payload, "sub", ClaimKind::Subject)?
        .ok_or(InvalidTokenReason::MissingClaim(ClaimKind::Subject))?;
    audience_contains(payload, &cfg.raw.resource)?;
    let scopes = scopes(payload)?;
    let groups = groups(payload, &cfg.raw.group_claims)?;
    let tenant = optional_string(payload, &cfg.raw.tenant_claim, ClaimKind::Tenant)?;
    let client_id = match optional_string(payload, &cfg.raw.client_claim, ClaimKind::ClientId)? {
        Some(client) => Some(client),
        None => optional_string(payload, "azp", ClaimKind::ClientId)?,
    };
    Ok(VerifiedClaims {
        issuer: issuer.to_owned(),
        subject,
        tenant,
        client_id,
        scopes,
        groups,
        expires_at_ms: exp_ms,
        token_digest,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::config::{IssuerConfig, JwksSource, ResourceServerConfig};

    const RESOURCE: &str = "https://mcp.example.com/mcp";
    const ISS: &str = "https://idp.example.com";
    const NOW_MS: u64 = 1_800_000_000_000;
    const NOW: u64 = NOW_MS / 1000;

    fn cfg() -> ValidatedConfig {
        let raw = ResourceServerConfig::new(
            RESOURCE,
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp",
            vec![IssuerConfig {
                issuer: ISS.into(),
                jwks: JwksSource::Url("https://idp.example.com/jwks".into()),
                algorithms: vec![jsonwebtoken::Algorithm::ES256],
            }],
        );
        ValidatedConfig::new(raw).expect("valid")
    }

    fn payload(overrides: Value) -> Map<String, Value> {
        let mut base = json!({"iss": ISS, "sub": "alice", "aud": RESOURCE, "exp": NOW + 60, "iat": NOW, "nbf": NOW});
        for (k, v) in overrides.as_object().expect("object") {
            if v.is_null() {
                base.as_object_mut().expect("object").remove(k);
            } else {
                base[k] = v.clone();
            }
        }
        base.as_object().expect("object").clone()
    }

    fn check(overrides: Value) -> Result<VerifiedClaims, InvalidTokenReason> {
        validate_claims(&payload(overrides), &cfg(), ISS, NOW_MS, "d".into())
    }

    #[test]
    fn groups_come_from_the_configured_claims_only() {
        let mut raw = cfg().raw.clone();
        raw.group_claims = vec!["groups".into(), "roles".into()];
        let configured = ValidatedConfig::new(raw).expect("valid");
        let check = |overrides: Value| validate_claims(&payload(overrides), &configured, ISS, NOW_MS, "d".into());
        let claims = check(json!({"groups": ["oncall", "dev"], "roles": "admin  ops", "teams": ["x"]})).expect("valid");
        assert_eq!(claims.groups().iter().map(String::as_str).collect::<Vec<_>>(), ["admin", "dev", "oncall", "ops"]);
        assert!(check(json!({})).expect("valid").groups().is_empty());
        for bad in
            [json!({"groups": 5}), json!({"groups": [1]}), json!({"groups": ["a\u{0}"]}), json!({"roles": {"a": 1}})]
        {
            assert_eq!(check(bad).unwrap_err(), InvalidTokenReason::InvalidClaim(ClaimKind::Groups));
        }
        // Not configured: the same claim means nothing.
        assert!(
            validate_claims(&payload(json!({"groups": ["oncall"]})), &cfg(), ISS, NOW_MS, "d".into())
                .expect("valid")
                .groups()
                .is_empty()
        );
    }

    #[test]
    fn accepts_and_extracts() {
        let claims = check(json!({"scope": "b a  c", "tenant": "t1", "azp": "app"})).expect("valid");
        assert_eq!(claims.principal(), "https://idp.example.com#alice");
        assert_eq!(claims.tenant(), Some("t1"));
        assert_eq!(claims.client_id(), Some("app"));
        assert_eq!(claims.scopes().iter().map(String::as_str).collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(claims.expires_at_ms(), (NOW + 60) * 1000);

        let claims = check(json!({"scp": ["x", "y"], "client_id": "cid", "azp": "other"})).expect("valid");
        assert!(claims.has_scope("x") && claims.has_scope("y"));
        assert_eq!(claims.client_id(), Some("cid"));
        let claims = check(json!({"scp": "x y"})).expect("valid");
        assert_eq!(claims.scopes().len(), 2);
        let claims = check(json!({"aud": ["other", RESOURCE]})).expect("valid");
        assert_eq!(claims.subject(), "alice");
        // Fractional dates are fine.
        assert!(check(json!({"exp": (NOW + 60) as f64 + 0.5})).is_ok());
    }

    #[test]
    fn claim_refusals() {
        use ClaimKind::*;
        use InvalidTokenReason::*;
        let cases = [
            (json!({"exp": null}), MissingClaim(ExpiresAt)),
            (json!({"exp": "1900000000"}), InvalidClaim(ExpiresAt)),
            (json!({"exp": -5}), InvalidClaim(ExpiresAt)),
            (json!({"exp": true}), InvalidClaim(ExpiresAt)),
            (json!({"exp": 1e300}), InvalidClaim(ExpiresAt)),
            (json!({"nbf": "soon"}), InvalidClaim(NotBefore)),
            (json!({"iat": [1]}), InvalidClaim(IssuedAt)),
            (json!({"sub": null}), MissingClaim(Subject)),
            (json!({"sub": ""}), InvalidClaim(Subject)),
            (json!({"sub": 42}), InvalidClaim(Subject)),
            (json!({"sub": "a\nb"}), InvalidClaim(Subject)),
            (json!({"aud": null}), MissingClaim(Audience)),
            (json!({"aud": "https://other.example.com/mcp"}), WrongAudience),
            (json!({"aud": "https://mcp.example.com/mcp/"}), WrongAudience),
            (json!({"aud": "HTTPS://mcp.example.com/mcp"}), WrongAudience),
            (json!({"aud": []}), WrongAudience),
            (json!({"aud": ["a", "b"]}), WrongAudience),
            (json!({"aud": [RESOURCE, 7]}), InvalidClaim(Audience)),
            (json!({"aud": {"x": RESOURCE}}), InvalidClaim(Audience)),
            (json!({"scope": ["a"]}), InvalidClaim(Scope)),
            (json!({"scope": "a \"b"}), InvalidClaim(Scope)),
            (json!({"scp": [1]}), InvalidClaim(Scope)),
            (json!({"tenant": 5}), InvalidClaim(Tenant)),
            (json!({"tenant": ""}), InvalidClaim(Tenant)),
            (json!({"client_id": {}}), InvalidClaim(ClientId)),
            (json!({"azp": 1}), InvalidClaim(ClientId)),
        ];
        for (overrides, expected) in cases {
            assert_eq!(check(overrides.clone()).err(), Some(expected), "{overrides}");
        }
    }

    #[test]
    fn time_boundaries() {
        let cfg = cfg(); // leeway 30 s
        let p = payload(json!({"exp": NOW, "nbf": null, "iat": null}));
        let edge = (NOW + 30) * 1000;
        assert!(validate_claims(&p, &cfg, ISS, edge - 1, String::new()).is_ok());
        assert_eq!(validate_claims(&p, &cfg, ISS, edge, String::new()).err(), Some(InvalidTokenReason::Expired));

        let p = payload(json!({"nbf": NOW + 100, "iat": null}));
        let start = (NOW + 100 - 30) * 1000;
        assert_eq!(
            validate_claims(&p, &cfg, ISS, start - 1, String::new()).err(),
            Some(InvalidTokenReason::NotYetValid)
        );
        assert!(validate_claims(&p, &cfg, ISS, start, String::new()).is_ok());

        let p = payload(json!({"iat": NOW + 31, "nbf": null}));
        assert_eq!(
            validate_claims(&p, &cfg, ISS, NOW_MS, String::new()).err(),
            Some(InvalidTokenReason::IssuedInFuture)
        );
        let p = payload(json!({"iat": NOW + 30, "nbf": null}));
        assert!(validate_claims(&p, &cfg, ISS, NOW_MS, String::new()).is_ok());
    }

    #[test]
    fn check_scopes_names_every_needed_scope() {
        let claims = check(json!({"scope": "read"})).expect("valid");
        assert!(check_scopes(&claims, &["read"]).is_ok());
        assert!(check_scopes(&claims, &[]).is_ok());
        assert_eq!(
            check_scopes(&claims, &["read", "write", "admin", "write"]),
            Err(AuthError::InsufficientScope { required: vec!["read".into(), "write".into(), "admin".into()] })
        );
    }

    #[test]
    fn issuer_must_be_a_string() {
        assert_eq!(
            unverified_issuer(&payload(json!({"iss": null}))),
            Err(InvalidTokenReason::MissingClaim(ClaimKind::Issuer))
        );
        assert_eq!(
            unverified_issuer(&payload(json!({"iss": [ISS]}))),
            Err(InvalidTokenReason::InvalidClaim(ClaimKind::Issuer))
        );
        assert_eq!(unverified_issuer(&payload(json!({}))), Ok(ISS));
    }
}
