//! The resource-server auth module (seed 004; jwt_tool's playbook where it applies): the 401
//! challenge and its RFC 9728 metadata document, tokens for another resource or expired, JWTs
//! forged from the identity's own (`alg: none`, HS256 keyed with the published public key,
//! `kid`/`jku`/`x5u` injection, a tampered payload or signature), malformed bearer values, the
//! token in the query string, other schemes, and `insufficient_scope`. Every negative case is
//! paired with the identity's own token accepted for the same request; every forged token is
//! added to the run's redactor before it is sent, so no output shows it.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value, json};

use crate::check::{Check, Judgement, Outcome, Verdict, paired};
use crate::identity::Token;
use crate::modules::{Context, Module, cases};
use crate::target::{Auth, Exchange, Probe};

/// The auth module.
pub fn module() -> Module {
    Module {
        name: "auth",
        exclusive: false,
        cases: cases! {
            challenge: "auth.challenge.resource_metadata", "No token: 401 with a Bearer challenge naming resource_metadata",
                "authorization §Protected Resource Metadata; RFC 9728 §5.1; RFC 6750 §3", Critical;
            metadata_resource: "auth.metadata.resource", "The challenge's metadata document is fetchable and names this resource",
                "RFC 9728 §3.3: `resource` MUST equal the resource identifier", High;
            metadata_servers: "auth.metadata.authorization_servers", "The metadata document names at least one authorization server",
                "authorization §Authorization Server Location: authorization_servers MUST be present", High;
            other_resource: "auth.token.other_resource", "A token issued for another resource is refused",
                "authorization §Token Audience Binding: servers MUST validate the audience (RFC 8707)", Critical;
            expired: "auth.token.expired", "An expired token is refused",
                "authorization §Token Handling; RFC 6750 §3.1 invalid_token", Critical;
            alg_none: "auth.jwt.alg_none", "`alg: none` with an empty signature is refused",
                "RFC 8725 §3.1; RFC 7519 §6 (unsecured JWTs are not access tokens)", Critical;
            alg_none_capital: "auth.jwt.alg_none_capitalized", "`alg: \"None\"` with an empty signature is refused",
                "RFC 8725 §3.1 (case variants of none)", Critical;
            alg_none_upper: "auth.jwt.alg_none_uppercase", "`alg: \"NONE\"` with an empty signature is refused",
                "RFC 8725 §3.1 (case variants of none)", Critical;
            alg_none_signed: "auth.jwt.alg_none_signature_kept", "`alg: none` keeping the original signature is refused",
                "RFC 8725 §3.1", Critical;
            hs256_public_key: "auth.jwt.hs256_public_key", "HS256 keyed with the server's published public key is refused",
                "RFC 8725 §3.1 (algorithm confusion), §2.1", Critical;
            kid_unknown: "auth.jwt.kid_unknown", "An unknown `kid` is refused",
                "RFC 7515 §4.1.4; RFC 8725 §3.10", High;
            kid_traversal: "auth.jwt.kid_path_traversal", "A path-traversal `kid` (`../../dev/null`) is refused",
                "RFC 8725 §3.10 (kid injection)", Critical;
            kid_sql: "auth.jwt.kid_sql_injection", "An SQL-injection `kid` is refused",
                "RFC 8725 §3.10 (kid injection)", Critical;
            jku_foreign: "auth.jwt.jku_foreign", "A `jku` header pointing at a foreign key set is refused",
                "RFC 8725 §3.10; RFC 7515 §4.1.2", Critical;
            x5u_foreign: "auth.jwt.x5u_foreign", "An `x5u` header pointing at a foreign certificate is refused",
                "RFC 8725 §3.10; RFC 7515 §4.1.5", Critical;
            payload_sub: "auth.jwt.payload_sub", "The payload's `sub` changed under the original signature is refused",
                "RFC 7515 §5.2 (signature validation)", Critical;
            payload_exp: "auth.jwt.payload_exp", "The payload's `exp` extended under the original signature is refused",
                "RFC 7515 §5.2 (signature validation)", Critical;
            payload_aud: "auth.jwt.payload_aud", "The payload's `aud` changed under the original signature is refused",
                "RFC 7515 §5.2; RFC 8707 audience", Critical;
            signature_flipped: "auth.jwt.signature_flipped", "A signature with its last bytes flipped is refused",
                "RFC 7515 §5.2 (signature validation)", Critical;
            signature_stripped: "auth.jwt.signature_stripped", "The signature stripped (`header.payload.`) is refused",
                "RFC 7515 §5.2 (signature validation)", Critical;
            signature_missing: "auth.jwt.signature_missing", "Two segments only (`header.payload`) is refused",
                "RFC 7515 §7.1 (compact serialization)", High;
            not_jwt: "auth.token.not_jwt", "A bearer value that is not a token of the issuer is refused with 401",
                "RFC 6750 §3.1 invalid_token", High;
            empty: "auth.token.empty", "An empty bearer value is refused",
                "RFC 6750 §2.1 (b64token is non-empty)", High;
            trailing_garbage: "auth.token.trailing_garbage", "The valid token with trailing garbage is refused",
                "RFC 7515 §5.2; RFC 6750 §2.1", High;
            query_string: "auth.token.query_string", "The token in `?access_token=` instead of the header is not accepted",
                "authorization §Token Requirements: MUST NOT be in the URI query string", High;
            scheme_basic: "auth.scheme.basic", "The token under the `Basic` scheme is refused",
                "authorization §Token Requirements: Authorization: Bearer", Medium;
            scheme_token: "auth.scheme.token", "The token under a `Token` scheme is refused",
                "authorization §Token Requirements: Authorization: Bearer", Medium;
            scheme_lowercase: "auth.scheme.lowercase", "`bearer` in lower case is accepted (schemes are case-insensitive)",
                "RFC 9110 §11.1: the auth-scheme is case-insensitive", Low;
            header_repeated: "auth.header.repeated", "Two Authorization headers (valid, then forged) are refused",
                "RFC 9110 §5.3 (Authorization is a singleton field)", Medium;
            insufficient_scope: "auth.scope.insufficient", "A 403 insufficient_scope challenge names the scope needed",
                "authorization §Scope Challenge Handling; RFC 6750 §3.1", Medium;
        },
    }
}

/// The identity's own JWT, split.
struct Jwt {
    header: Map<String, Value>,
    payload: Map<String, Value>,
    header_b64: String,
    payload_b64: String,
    signature_b64: String,
}

fn decode_segment(segment: &str) -> Option<Map<String, Value>> {
    let bytes = URL_SAFE_NO_PAD.decode(segment.trim_end_matches('=')).ok()?;
    serde_json::from_slice::<Value>(&bytes).ok()?.as_object().cloned()
}

fn encode_json(value: &Map<String, Value>) -> String {
    URL_SAFE_NO_PAD.encode(Value::Object(value.clone()).to_string())
}

impl Jwt {
    fn parse(token: &str) -> Option<Self> {
        let mut parts = token.split('.');
        let (header_b64, payload_b64, signature_b64) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        Some(Self {
            header: decode_segment(header_b64)?,
            payload: decode_segment(payload_b64)?,
            header_b64: header_b64.to_owned(),
            payload_b64: payload_b64.to_owned(),
            signature_b64: signature_b64.to_owned(),
        })
    }

    /// The token with `header` replaced (payload and signature kept).
    fn with_header(&self, change: impl FnOnce(&mut Map<String, Value>)) -> (String, String) {
        let mut header = self.header.clone();
        change(&mut header);
        (encode_json(&header), self.payload_b64.clone())
    }

    /// The token with the payload changed under the original header and signature.
    fn with_payload(&self, change: impl FnOnce(&mut Map<String, Value>)) -> String {
        let mut payload = self.payload.clone();
        change(&mut payload);
        format!("{}.{}.{}", self.header_b64, encode_json(&payload), self.signature_b64)
    }
}

const NOT_A_JWT: &str = "the identity's token is not a JWT (three base64url JSON segments): nothing to forge from";

fn not_testable(check: &Check, why: impl Into<String>) -> Outcome {
    Outcome::new(check, Verdict::NotTestable, why)
}

/// The first identity's own token, as a JWT.
fn own_jwt(ctx: &Context) -> Option<Jwt> {
    ctx.identities.first().and_then(|identity| Jwt::parse(identity.token.expose()))
}

fn name(ctx: &Context) -> String {
    ctx.identities.first().map_or_else(|| "identity".to_owned(), |identity| format!("{}-forged", identity.name))
}

/// `Authorization: <value>` for a forged credential, added to the redactor first.
fn forged(ctx: &Context, value: String) -> Auth {
    ctx.target.redactor().add(&value, &name(ctx));
    Auth::Raw(Token::new(value))
}

/// A forged bearer token, added to the redactor first.
fn forged_bearer(ctx: &Context, token: String) -> Auth {
    ctx.target.redactor().add(&token, &name(ctx));
    Auth::Bearer(Token::new(token))
}

/// Refused is any non-result; 401 is the required way (RFC 6750 §3.1 invalid_token), other
/// refusals are left open by the spec: a WARNING.
fn judge_401(negative: &Exchange) -> Judgement {
    if negative.accepted() {
        return Judgement::Accepted(format!(
            "served ({}): the forged or wrong credential was accepted",
            negative.summary()
        ));
    }
    match negative.status {
        Some(401) => Judgement::Refused,
        _ => Judgement::RefusedOddly(format!("refused, but with {} (401 expected)", negative.summary())),
    }
}

/// Refused in any way (the status is left open): any non-result.
fn judge_any(negative: &Exchange) -> Judgement {
    if negative.accepted() {
        Judgement::Accepted(format!("served ({})", negative.summary()))
    } else if negative.status.is_some() {
        Judgement::Refused
    } else {
        Judgement::RefusedOddly(format!("no answer ({})", negative.summary()))
    }
}

/// The control (the identity's own token) and the same request with `auth`.
async fn against(ctx: &Context, check: Check, auth: Auth) -> Outcome {
    let control = ctx.target.send(ctx.base()).await;
    let mut negative = ctx.base();
    negative.auth = auth;
    let negative = ctx.target.send(negative).await;
    paired(&check, &control, &negative, judge_401(&negative), Verdict::Warning)
}

/// Several forgeries of one kind: a FAIL if any is accepted.
async fn against_all(ctx: &Context, check: Check, auths: Vec<Auth>) -> Outcome {
    let control = ctx.target.send(ctx.base()).await;
    let mut worst: Option<Outcome> = None;
    for auth in auths {
        let mut negative = ctx.base();
        negative.auth = auth;
        let negative = ctx.target.send(negative).await;
        let outcome = paired(&check, &control, &negative, judge_401(&negative), Verdict::Warning);
        let rank = |v: Verdict| match v {
            Verdict::Fail => 3,
            Verdict::Inconclusive => 2,
            Verdict::Warning => 1,
            _ => 0,
        };
        if worst.as_ref().is_none_or(|w| rank(outcome.verdict) > rank(w.verdict)) {
            worst = Some(outcome);
        }
    }
    worst.unwrap_or_else(|| not_testable(&check, "no forgery could be built"))
}

async fn challenge(ctx: &Context, check: Check) -> Outcome {
    against_challenge(ctx, check).await.0
}

/// The no-token exchange and the challenge's `resource_metadata` URL, judged.
async fn against_challenge(ctx: &Context, check: Check) -> (Outcome, Exchange, Exchange, Option<String>) {
    let control = ctx.target.send(ctx.base()).await;
    let mut negative = ctx.base();
    negative.auth = Auth::None;
    let negative = ctx.target.send(negative).await;
    let challenge = negative.header("www-authenticate").unwrap_or_default().to_owned();
    let metadata = param(&challenge, "resource_metadata");
    let internal = metadata.as_deref().and_then(|url| internal_elsewhere(ctx, url));
    let judgement = match judge_401(&negative) {
        Judgement::Refused if !challenge.to_ascii_lowercase().starts_with("bearer") => {
            Judgement::RefusedOddly("401 without a Bearer challenge".into())
        }
        Judgement::Refused if metadata.is_none() => {
            Judgement::RefusedOddly("the Bearer challenge names no resource_metadata".into())
        }
        Judgement::Refused if internal.is_some() => {
            let internal = internal.unwrap_or_default();
            Judgement::RefusedOddly(format!(
                "the Bearer challenge's resource_metadata points clients at {internal}, an internal address that is \
                 not the target's: every client that follows it makes a request there (SSRF); not fetched"
            ))
        }
        other => other,
    };
    let outcome = paired(&check, &control, &negative, judgement, Verdict::Fail);
    (outcome, control, negative, metadata)
}

/// An auth-param of a challenge (`name="value"` or `name=token`), case-insensitive name.
fn param(challenge: &str, name: &str) -> Option<String> {
    let lower = challenge.to_ascii_lowercase();
    let mut from = 0;
    while let Some(found) = lower[from..].find(name) {
        let start = from + found;
        from = start + name.len();
        let before = lower[..start].chars().last();
        if !matches!(before, None | Some(',' | ' ' | '\t')) {
            continue;
        }
        let rest = challenge[from..].trim_start();
        let Some(rest) = rest.strip_prefix('=') else { continue };
        let rest = rest.trim_start();
        if let Some(quoted) = rest.strip_prefix('"') {
            return quoted.split('"').next().map(str::to_owned);
        }
        return rest.split([',', ' ']).next().map(str::to_owned).filter(|v| !v.is_empty());
    }
    None
}

/// The host of `raw` when a client following it is lured into its own network (SSRF): a
/// link-local address (a cloud metadata service: `169.254.169.254`, `fe80::/10`, `*.internal`)
/// whatever the target, or another internal address (loopback, private, shared, unique-local,
/// unspecified; `localhost`, `*.local`) named by a target that is not itself internal. `None`
/// for the target's own host, a public URL elsewhere (not fetched, and not judged), and an
/// internal one named by an internal target (a local or private deployment).
fn internal_elsewhere(ctx: &Context, raw: &str) -> Option<String> {
    internal_other_host(raw, ctx.target.url().host_str())
}

/// How far inside a network a host is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// A public host.
    Public,
    /// Loopback, private, shared, unique-local or unspecified.
    Internal,
    /// Link-local: where cloud metadata services answer.
    LinkLocal,
}

fn reach<S: AsRef<str>>(host: &url::Host<S>) -> Reach {
    let (internal, link_local) = match host {
        url::Host::Ipv4(ip) => {
            let [a, b, ..] = ip.octets();
            (
                ip.is_loopback() || ip.is_private() || ip.is_unspecified() || (a == 100 && (64..128).contains(&b)),
                ip.is_link_local(),
            )
        }
        url::Host::Ipv6(ip) => {
            let first = ip.segments()[0];
            (ip.is_loopback() || ip.is_unspecified() || (first & 0xfe00) == 0xfc00, (first & 0xffc0) == 0xfe80)
        }
        url::Host::Domain(name) => {
            let name = name.as_ref().to_ascii_lowercase();
            (
                name == "localhost" || name.ends_with(".localhost") || name.ends_with(".local"),
                name.ends_with(".internal"),
            )
        }
    };
    if link_local {
        Reach::LinkLocal
    } else if internal {
        Reach::Internal
    } else {
        Reach::Public
    }
}

/// [`internal_elsewhere`] for a target whose host is `target`.
fn internal_other_host(raw: &str, target: Option<&str>) -> Option<String> {
    let url = url::Url::parse(raw).ok()?;
    let host = url.host_str()?.to_ascii_lowercase();
    if target.map(str::to_ascii_lowercase).as_deref() == Some(host.as_str()) {
        return None;
    }
    let target_reach = target.and_then(|t| url::Host::parse(t.trim_start_matches('[').trim_end_matches(']')).ok());
    let target_reach = target_reach.map_or(Reach::Public, |t| reach(&t));
    let lured = match reach(&url.host()?) {
        Reach::LinkLocal => true,
        Reach::Internal => target_reach == Reach::Public,
        Reach::Public => false,
    };
    lured.then(|| crate::escape::visible(&host).into_owned())
}

/// Whether `url` is on the target's own origin (scheme, host, port): the only documents the
/// verifier fetches, so a server cannot point it at anything else.
fn same_origin(ctx: &Context, url: &url::Url) -> bool {
    let target = ctx.target.url();
    url.scheme() == target.scheme()
        && url.host_str().map(str::to_ascii_lowercase) == target.host_str().map(str::to_ascii_lowercase)
        && url.port_or_known_default() == target.port_or_known_default()
}

/// Fetches a JSON document on the target's own origin; `Err` is a NOT TESTABLE or INCONCLUSIVE reason.
async fn fetch_json(ctx: &Context, raw: &str) -> Result<(Value, String), (Verdict, String)> {
    let url =
        url::Url::parse(raw).map_err(|_| (Verdict::Fail, "the advertised URL is not an absolute URL".to_owned()))?;
    if !same_origin(ctx, &url) {
        return Err((
            Verdict::NotTestable,
            format!(
                "the document is not on the target's own origin ({}): not fetched, so the verifier cannot be pointed elsewhere",
                url.origin().ascii_serialization()
            ),
        ));
    }
    let (status, body, transcript) = ctx.target.fetch(&url).await;
    match status {
        Some(200) => serde_json::from_slice::<Value>(&body)
            .ok()
            .filter(Value::is_object)
            .map(|document| (document, transcript.clone()))
            .ok_or((Verdict::Fail, format!("the document is not a JSON object\n{transcript}"))),
        Some(status) => Err((Verdict::Fail, format!("the document answered HTTP {status}\n{transcript}"))),
        None => Err((Verdict::Inconclusive, format!("the document could not be fetched\n{transcript}"))),
    }
}

/// The protected resource metadata named by the challenge, with the exchanges that led to it.
async fn metadata(ctx: &Context, check: Check) -> Result<(Value, Outcome), Outcome> {
    let (outcome, control, negative, url) = against_challenge(ctx, check).await;
    if outcome.verdict != Verdict::Pass {
        let detail = format!("no usable challenge: {}", outcome.detail);
        return Err(Outcome::new(&check, outcome.verdict, detail).with(&[&control, &negative]));
    }
    let Some(url) = url else { return Err(outcome) };
    match fetch_json(ctx, &url).await {
        Ok((document, transcript)) => {
            let mut base = Outcome::new(&check, Verdict::Pass, "").with(&[&control, &negative]);
            base.transcript.push(transcript);
            Ok((document, base))
        }
        Err((verdict, why)) => Err(Outcome::new(&check, verdict, why).with(&[&control, &negative])),
    }
}

async fn metadata_resource(ctx: &Context, check: Check) -> Outcome {
    let (document, mut outcome) = match metadata(ctx, check).await {
        Ok(found) => found,
        Err(outcome) => return outcome,
    };
    let resource = document.get("resource").and_then(Value::as_str).unwrap_or_default();
    let target = ctx.target.url().as_str();
    let canonical = |s: &str| s.trim_end_matches('/').to_ascii_lowercase();
    if !resource.is_empty() && canonical(resource) == canonical(target) {
        outcome.detail = "the metadata document names this resource".into();
    } else {
        outcome.verdict = Verdict::Fail;
        outcome.detail = format!("the metadata document's `resource` is {resource:?}, not {target:?}");
    }
    outcome
}

async fn metadata_servers(ctx: &Context, check: Check) -> Outcome {
    let (document, mut outcome) = match metadata(ctx, check).await {
        Ok(found) => found,
        Err(outcome) => return outcome,
    };
    let servers = document.get("authorization_servers").and_then(Value::as_array);
    let named = servers.is_some_and(|servers| !servers.is_empty() && servers.iter().all(Value::is_string));
    if named {
        outcome.detail = "authorization_servers names at least one server".into();
    } else {
        outcome.verdict = Verdict::Fail;
        outcome.detail = "authorization_servers is missing, empty or not a list of URLs".into();
    }
    outcome
}

async fn other_resource(ctx: &Context, check: Check) -> Outcome {
    match ctx.identities.first().and_then(|identity| identity.other_resource_token.clone()) {
        Some(token) => against(ctx, check, Auth::Bearer(token)).await,
        None => not_testable(&check, "the identity file gives no `other_resource_token`"),
    }
}

async fn expired(ctx: &Context, check: Check) -> Outcome {
    match ctx.identities.first().and_then(|identity| identity.expired_token.clone()) {
        Some(token) => against(ctx, check, Auth::Bearer(token)).await,
        None => not_testable(&check, "the identity file gives no `expired_token`"),
    }
}

/// A forgery with the header changed and `signature` as the signature.
async fn header_forgery(
    ctx: &Context,
    check: Check,
    keep_signature: bool,
    change: impl FnOnce(&mut Map<String, Value>),
) -> Outcome {
    let Some(jwt) = own_jwt(ctx) else { return not_testable(&check, NOT_A_JWT) };
    let (header, payload) = jwt.with_header(change);
    let signature = if keep_signature { jwt.signature_b64.as_str() } else { "" };
    let auth = forged_bearer(ctx, format!("{header}.{payload}.{signature}"));
    against(ctx, check, auth).await
}

async fn alg_none(ctx: &Context, check: Check) -> Outcome {
    header_forgery(ctx, check, false, |h| {
        h.insert("alg".into(), json!("none"));
    })
    .await
}

async fn alg_none_capital(ctx: &Context, check: Check) -> Outcome {
    header_forgery(ctx, check, false, |h| {
        h.insert("alg".into(), json!("None"));
    })
    .await
}

async fn alg_none_upper(ctx: &Context, check: Check) -> Outcome {
    header_forgery(ctx, check, false, |h| {
        h.insert("alg".into(), json!("NONE"));
    })
    .await
}

async fn alg_none_signed(ctx: &Context, check: Check) -> Outcome {
    header_forgery(ctx, check, true, |h| {
        h.insert("alg".into(), json!("none"));
    })
    .await
}

async fn kid_unknown(ctx: &Context, check: Check) -> Outcome {
    header_forgery(ctx, check, true, |h| {
        h.insert("kid".into(), json!("palisade-verify-unknown-kid"));
    })
    .await
}

async fn kid_traversal(ctx: &Context, check: Check) -> Outcome {
    // jwt_tool's variant: the key file is /dev/null (an empty HMAC key) and the token is signed so.
    let Some(jwt) = own_jwt(ctx) else { return not_testable(&check, NOT_A_JWT) };
    let mut auths = Vec::new();
    for kid in ["../../../../../../dev/null", "../../dev/null"] {
        let (header, payload) = jwt.with_header(|h| {
            h.insert("kid".into(), json!(kid));
        });
        auths.push(forged_bearer(ctx, format!("{header}.{payload}.{}", jwt.signature_b64)));
        let (header, payload) = jwt.with_header(|h| {
            h.insert("kid".into(), json!(kid));
            h.insert("alg".into(), json!("HS256"));
        });
        auths.push(forged_bearer(ctx, hs256(&header, &payload, b"")));
    }
    against_all(ctx, check, auths).await
}

async fn kid_sql(ctx: &Context, check: Check) -> Outcome {
    let Some(jwt) = own_jwt(ctx) else { return not_testable(&check, NOT_A_JWT) };
    let mut auths = Vec::new();
    for kid in ["' OR 1=1 --", "x' UNION SELECT 'palisade-verify' --"] {
        let (header, payload) = jwt.with_header(|h| {
            h.insert("kid".into(), json!(kid));
        });
        auths.push(forged_bearer(ctx, format!("{header}.{payload}.{}", jwt.signature_b64)));
    }
    // The UNION variant's key is the selected word: sign with it too.
    let (header, payload) = jwt.with_header(|h| {
        h.insert("kid".into(), json!("x' UNION SELECT 'palisade-verify' --"));
        h.insert("alg".into(), json!("HS256"));
    });
    auths.push(forged_bearer(ctx, hs256(&header, &payload, b"palisade-verify")));
    against_all(ctx, check, auths).await
}

async fn jku_foreign(ctx: &Context, check: Check) -> Outcome {
    header_forgery(ctx, check, true, |h| {
        h.insert("jku".into(), json!("https://attacker.palisade-verify.invalid/jwks.json"));
    })
    .await
}

async fn x5u_foreign(ctx: &Context, check: Check) -> Outcome {
    header_forgery(ctx, check, true, |h| {
        h.insert("x5u".into(), json!("https://attacker.palisade-verify.invalid/cert.pem"));
    })
    .await
}

/// `header.payload` signed with HMAC-SHA256 under `key`.
fn hs256(header: &str, payload: &str, key: &[u8]) -> String {
    let input = format!("{header}.{payload}");
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key);
    let tag = aws_lc_rs::hmac::sign(&key, input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// The server's published JWK Set: the metadata's first authorization server's RFC 8414
/// document, its `jwks_uri`; everything on the target's own origin only.
async fn published_jwks(ctx: &Context, check: Check) -> Result<(Vec<u8>, Value), String> {
    let (document, _) = metadata(ctx, check).await.map_err(|outcome| outcome.detail)?;
    let issuer = document
        .get("authorization_servers")
        .and_then(Value::as_array)
        .and_then(|servers| servers.first())
        .and_then(Value::as_str)
        .ok_or("the metadata names no authorization server")?;
    let issuer = url::Url::parse(issuer).map_err(|_| "the authorization server is not a URL".to_owned())?;
    let path = issuer.path().trim_end_matches('/');
    let mut candidates = Vec::new();
    for well_known in ["oauth-authorization-server", "openid-configuration"] {
        let mut url = issuer.clone();
        url.set_path(&format!("/.well-known/{well_known}{path}"));
        candidates.push(url.to_string());
    }
    let mut jwks_uri = None;
    for candidate in candidates {
        if let Ok((server, _)) = fetch_json(ctx, &candidate).await
            && let Some(uri) = server.get("jwks_uri").and_then(Value::as_str)
        {
            jwks_uri = Some(uri.to_owned());
            break;
        }
    }
    let jwks_uri = jwks_uri.ok_or("no authorization server metadata with a jwks_uri on the target's own origin")?;
    let url = url::Url::parse(&jwks_uri).map_err(|_| "the jwks_uri is not a URL".to_owned())?;
    if !same_origin(ctx, &url) {
        return Err("the jwks_uri is not on the target's own origin: not fetched".into());
    }
    let (status, body, _) = ctx.target.fetch(&url).await;
    let jwks: Value = serde_json::from_slice(&body).map_err(|_| "the JWK Set is not JSON".to_owned())?;
    if status != Some(200) || jwks.get("keys").and_then(Value::as_array).is_none_or(Vec::is_empty) {
        return Err("no JWK Set with keys at the jwks_uri".into());
    }
    Ok((body, jwks))
}

/// The public key bytes a confused verifier may use as an HMAC secret: the JWK Set as served,
/// the key's JSON, and for a P-256 key its SubjectPublicKeyInfo PEM (with and without the
/// final newline).
fn confusion_keys(body: &[u8], key: &Value) -> Vec<Vec<u8>> {
    let mut keys = vec![body.to_vec(), key.to_string().into_bytes()];
    let coordinate = |name: &str| key.get(name).and_then(Value::as_str).and_then(|v| URL_SAFE_NO_PAD.decode(v).ok());
    if key.get("crv").and_then(Value::as_str) == Some("P-256")
        && let (Some(x), Some(y)) = (coordinate("x"), coordinate("y"))
        && x.len() == 32
        && y.len() == 32
    {
        // SEQUENCE { SEQUENCE { id-ecPublicKey, prime256v1 }, BIT STRING 04 || x || y }
        let mut der = vec![
            0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48,
            0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00, 0x04,
        ];
        der.extend_from_slice(&x);
        der.extend_from_slice(&y);
        let encoded = base64::engine::general_purpose::STANDARD.encode(&der);
        let mut pem = String::from("-----BEGIN PUBLIC KEY-----\n");
        for line in encoded.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END PUBLIC KEY-----");
        keys.push(pem.clone().into_bytes());
        keys.push(format!("{pem}\n").into_bytes());
    }
    keys
}

async fn hs256_public_key(ctx: &Context, check: Check) -> Outcome {
    let Some(jwt) = own_jwt(ctx) else { return not_testable(&check, NOT_A_JWT) };
    let (body, jwks) = match published_jwks(ctx, check).await {
        Ok(found) => found,
        Err(why) => return not_testable(&check, format!("no published JWK Set reachable on the target's host: {why}")),
    };
    let kid = jwt.header.get("kid").cloned();
    let keys = jwks.get("keys").and_then(Value::as_array).cloned().unwrap_or_default();
    let key = keys.iter().find(|key| kid.is_some() && key.get("kid") == kid.as_ref()).or(keys.first());
    let Some(key) = key else { return not_testable(&check, "the JWK Set holds no key") };
    let (header, payload) = jwt.with_header(|h| {
        h.insert("alg".into(), json!("HS256"));
    });
    let auths =
        confusion_keys(&body, key).iter().map(|secret| forged_bearer(ctx, hs256(&header, &payload, secret))).collect();
    against_all(ctx, check, auths).await
}

async fn payload_forgery(ctx: &Context, check: Check, change: impl FnOnce(&mut Map<String, Value>)) -> Outcome {
    let Some(jwt) = own_jwt(ctx) else { return not_testable(&check, NOT_A_JWT) };
    let auth = forged_bearer(ctx, jwt.with_payload(change));
    against(ctx, check, auth).await
}

async fn payload_sub(ctx: &Context, check: Check) -> Outcome {
    let other = ctx.identities.get(1).and_then(|i| i.subject.clone()).unwrap_or_else(|| "palisade-verify-other".into());
    payload_forgery(ctx, check, |p| {
        let same = p.get("sub").and_then(Value::as_str) == Some(other.as_str());
        p.insert("sub".into(), json!(if same { "palisade-verify-other".to_owned() } else { other }));
    })
    .await
}

async fn payload_exp(ctx: &Context, check: Check) -> Outcome {
    payload_forgery(ctx, check, |p| {
        let exp = p.get("exp").and_then(Value::as_i64).unwrap_or(4_102_444_800);
        p.insert("exp".into(), json!(exp + 10 * 365 * 24 * 3600));
    })
    .await
}

async fn payload_aud(ctx: &Context, check: Check) -> Outcome {
    payload_forgery(ctx, check, |p| {
        p.insert("aud".into(), json!("https://other.palisade-verify.invalid/mcp"));
    })
    .await
}

async fn signature_flipped(ctx: &Context, check: Check) -> Outcome {
    let Some(jwt) = own_jwt(ctx) else { return not_testable(&check, NOT_A_JWT) };
    let Ok(mut signature) = URL_SAFE_NO_PAD.decode(&jwt.signature_b64) else {
        return not_testable(&check, "the token's signature is not base64url");
    };
    let n = signature.len();
    if n < 2 {
        return not_testable(&check, "the token's signature is too short to tamper with");
    }
    signature[n - 1] ^= 0xff;
    signature[n - 2] ^= 0x5a;
    let token = format!("{}.{}.{}", jwt.header_b64, jwt.payload_b64, URL_SAFE_NO_PAD.encode(signature));
    let auth = forged_bearer(ctx, token);
    against(ctx, check, auth).await
}

async fn signature_stripped(ctx: &Context, check: Check) -> Outcome {
    let Some(jwt) = own_jwt(ctx) else { return not_testable(&check, NOT_A_JWT) };
    let auth = forged_bearer(ctx, format!("{}.{}.", jwt.header_b64, jwt.payload_b64));
    against(ctx, check, auth).await
}

async fn signature_missing(ctx: &Context, check: Check) -> Outcome {
    let Some(jwt) = own_jwt(ctx) else { return not_testable(&check, NOT_A_JWT) };
    let auth = forged_bearer(ctx, format!("{}.{}", jwt.header_b64, jwt.payload_b64));
    against(ctx, check, auth).await
}

async fn not_jwt(ctx: &Context, check: Check) -> Outcome {
    against(ctx, check, Auth::Bearer(Token::new("palisade-verify-not-a-token"))).await
}

async fn empty(ctx: &Context, check: Check) -> Outcome {
    let control = ctx.target.send(ctx.base()).await;
    // Set as a header: a `Token` is trimmed, and the value must be exactly `Bearer `.
    let mut negative = ctx.base().header("authorization", "Bearer ");
    negative.auth = Auth::None;
    let negative = ctx.target.send(negative).await;
    paired(&check, &control, &negative, judge_401(&negative), Verdict::Warning)
}

async fn trailing_garbage(ctx: &Context, check: Check) -> Outcome {
    let Some(identity) = ctx.identities.first() else { return not_testable(&check, "no identity") };
    let auth = forged_bearer(ctx, format!("{}palisade-verify-garbage", identity.token.expose()));
    against(ctx, check, auth).await
}

async fn query_string(ctx: &Context, check: Check) -> Outcome {
    let Some(identity) = ctx.identities.first() else { return not_testable(&check, "no identity") };
    let control = ctx.target.send(ctx.base()).await;
    let mut negative = ctx.base().query("access_token", identity.token.expose());
    negative.auth = Auth::None;
    let negative = ctx.target.send(negative).await;
    paired(&check, &control, &negative, judge_any(&negative), Verdict::Warning)
}

async fn scheme_basic(ctx: &Context, check: Check) -> Outcome {
    let Some(identity) = ctx.identities.first() else { return not_testable(&check, "no identity") };
    let token = identity.token.expose();
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{token}:"));
    let auths = vec![forged(ctx, format!("Basic {token}")), forged(ctx, format!("Basic {basic}"))];
    against_all(ctx, check, auths).await
}

async fn scheme_token(ctx: &Context, check: Check) -> Outcome {
    let Some(identity) = ctx.identities.first() else { return not_testable(&check, "no identity") };
    let auth = forged(ctx, format!("Token {}", identity.token.expose()));
    against(ctx, check, auth).await
}

async fn scheme_lowercase(ctx: &Context, check: Check) -> Outcome {
    let Some(identity) = ctx.identities.first() else { return not_testable(&check, "no identity") };
    let control = ctx.target.send(ctx.base()).await;
    let mut positive = ctx.base();
    positive.auth = Auth::Raw(Token::new(format!("bearer {}", identity.token.expose())));
    let positive = ctx.target.send(positive).await;
    if !control.accepted() {
        let detail = format!("positive control not accepted ({}): nothing to compare with", control.summary());
        return Outcome::new(&check, Verdict::Inconclusive, detail).with(&[&control, &positive]);
    }
    let (verdict, detail) = if positive.accepted() {
        (Verdict::Pass, "`bearer` in lower case was accepted like `Bearer`".to_owned())
    } else {
        (
            Verdict::Warning,
            format!("`bearer` in lower case was refused ({}): clients that send it break", positive.summary()),
        )
    };
    Outcome::new(&check, verdict, detail).with(&[&control, &positive])
}

async fn header_repeated(ctx: &Context, check: Check) -> Outcome {
    let Some(identity) = ctx.identities.first() else { return not_testable(&check, "no identity") };
    let control = ctx.target.send(ctx.base()).await;
    let garbage = format!("Bearer {}", "palisade-verify-second-credential");
    ctx.target.redactor().add(&garbage, &name(ctx));
    let mut negative = ctx.base().append("authorization", format!("Bearer {}", identity.token.expose()));
    negative.auth = Auth::None;
    let negative = ctx.target.send(negative.append("authorization", garbage)).await;
    // Which of two values a server uses is left open: served is a weakness, not a violation.
    let judgement = match judge_any(&negative) {
        Judgement::Accepted(why) => Judgement::RefusedOddly(format!("two Authorization headers were served: {why}")),
        other => other,
    };
    paired(&check, &control, &negative, judgement, Verdict::Warning)
}

/// The read-only requests probed for a 403 `insufficient_scope` (tool calls only with
/// `--allow-mutations`, and only of tools the one rule lets a check call).
async fn insufficient_scope(ctx: &Context, check: Check) -> Outcome {
    let control = ctx.target.send(ctx.base()).await;
    let mut probes = vec![
        Probe::request("resources/list", json!({}), ctx.auth()),
        Probe::request("prompts/list", json!({}), ctx.auth()),
        Probe::request("server/discover", json!({}), ctx.auth()),
    ];
    let tools = control.result().and_then(|r| r.get("tools")).and_then(Value::as_array).cloned().unwrap_or_default();
    // A tool call may have effects (even one annotated read-only may start a task): only
    // with --allow-mutations, and never of a tool the rule keeps from every check.
    if ctx.allow_mutations {
        for (tool, _) in ctx.callable_tools(&tools).into_iter().take(20) {
            probes.push(Probe::request("tools/call", json!({ "name": tool.name(), "arguments": {} }), ctx.auth()));
        }
    }
    for probe in probes {
        let answer = ctx.target.send(probe).await;
        let challenge = answer.header("www-authenticate").unwrap_or_default().to_owned();
        if answer.status == Some(403) && param(&challenge, "error").as_deref() == Some("insufficient_scope") {
            let judgement = if param(&challenge, "scope").is_some_and(|scope| !scope.trim().is_empty()) {
                Judgement::Refused
            } else {
                Judgement::RefusedOddly("the insufficient_scope challenge names no `scope`".into())
            };
            return paired(&check, &control, &answer, judgement, Verdict::Warning);
        }
    }
    not_testable(&check, "no read-only request of the first identity was refused with 403 insufficient_scope")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metadata_url_at_an_internal_address_other_than_the_targets_is_told_apart() {
        let loopback = Some("127.0.0.1");
        let cloud = "http://169.254.169.254/latest/meta-data/iam/security-credentials/";
        // A cloud metadata address is a lure whatever the target.
        assert_eq!(internal_other_host(cloud, loopback).as_deref(), Some("169.254.169.254"));
        assert_eq!(internal_other_host(cloud, Some("mcp.example.com")).as_deref(), Some("169.254.169.254"));
        assert!(internal_other_host("http://metadata.google.internal/x", loopback).is_some());
        assert!(internal_other_host("http://[fe80::1]/x", Some("10.1.2.3")).is_some());
        // A public target naming an internal address lures its clients inward.
        let public = Some("mcp.example.com");
        assert_eq!(internal_other_host("http://10.0.0.7/.well-known/x", public).as_deref(), Some("10.0.0.7"));
        assert!(internal_other_host("http://[fd00::1]/x", public).is_some());
        assert!(internal_other_host("http://localhost:9000/x", public).is_some());
        assert!(internal_other_host("http://100.100.100.200/x", public).is_some(), "shared address space");
        // A local or private deployment naming another local or private host is not judged;
        // nor is the target's own host, nor a public host elsewhere.
        assert_eq!(internal_other_host("http://localhost:9000/.well-known/x", loopback), None);
        assert_eq!(internal_other_host("http://10.0.0.7/x", Some("10.0.0.5")), None);
        assert_eq!(internal_other_host("http://127.0.0.1:9/.well-known/x", loopback), None);
        assert_eq!(internal_other_host("https://auth.example.com/.well-known/x", loopback), None);
        assert_eq!(internal_other_host("not a url", loopback), None);
    }

    #[test]
    fn challenge_params_are_read_quoted_or_bare() {
        let challenge =
            r#"Bearer error="insufficient_scope", scope="a b", resource_metadata="https://x/.well-known/y""#;
        assert_eq!(param(challenge, "error").as_deref(), Some("insufficient_scope"));
        assert_eq!(param(challenge, "scope").as_deref(), Some("a b"));
        assert_eq!(param(challenge, "resource_metadata").as_deref(), Some("https://x/.well-known/y"));
        assert_eq!(param("Bearer error=invalid_token, x=1", "error").as_deref(), Some("invalid_token"));
        assert_eq!(param("Bearer realm=\"r\"", "scope"), None);
    }

    #[test]
    fn forgeries_keep_what_they_must_and_sign_with_hmac() {
        let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"ES256","kid":"k1"}"#);
        let payload = URL_SAFE_NO_PAD.encode(r#"{"sub":"alice","exp":100}"#);
        let token = format!("{header}.{payload}.c2lnbmF0dXJl");
        let jwt = Jwt::parse(&token).unwrap();
        assert_eq!(jwt.header["kid"], "k1");
        let tampered = jwt.with_payload(|p| {
            p.insert("sub".into(), json!("bob"));
        });
        let parts: Vec<&str> = tampered.split('.').collect();
        assert_eq!((parts[0], parts[2]), (header.as_str(), "c2lnbmF0dXJl"));
        assert_eq!(decode_segment(parts[1]).unwrap()["sub"], "bob");
        assert!(Jwt::parse("a.b").is_none() && Jwt::parse("not-a-jwt").is_none());
        // RFC 4231 test case 2.
        let signed = hs256("", "", b"Jefe");
        assert_eq!(signed.split('.').count(), 3);
        let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, b"Jefe");
        let tag = aws_lc_rs::hmac::sign(&key, b"what do ya want for nothing?");
        assert_eq!(tag.as_ref()[..4], [0x5b, 0xdc, 0xc1, 0x46]);
    }
}
