//! The gateway's upstream credentials (control C7): static secrets from files and the
//! environment, OAuth client credentials and RFC 8693 token exchange against a real
//! authorization server (node-oidc-provider, `tests/interop/gateway-as.mjs`) and against a
//! recording token endpoint, caching, expiry, step-up, and every failure failing closed without
//! a secret in any text.

// Test helpers unwrap: a failure is the test's failure.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use palisade_base::clock::{Clock, ManualClock, SystemClock};
use palisade_gateway::credentials::{
    CallerContext, ClientAuth, CredentialConfig, CredentialError, SecretSource, UpstreamCredential,
};
use url::Url;

const UPSTREAM: &str = "http://up.test/mcp";
const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
const T0_MS: i64 = 1_800_000_000_000;

fn upstream() -> Url {
    Url::parse(UPSTREAM).unwrap()
}

fn manual_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(T0_MS))
}

fn caller<'a>(partition: &'a str, token: Option<&'a str>) -> CallerContext<'a> {
    CallerContext { partition, subject_token: token, user: None }
}

fn secret_file(dir: &tempfile::TempDir, name: &str, content: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::File::create(&path).unwrap().write_all(content).unwrap();
    path
}

fn build(config: &CredentialConfig, clock: Arc<dyn Clock>) -> Result<UpstreamCredential, CredentialError> {
    UpstreamCredential::from_config(config, &upstream(), clock)
}

/// The single header a credential adds, as (name, value).
async fn one_header(credential: &UpstreamCredential, caller: CallerContext<'_>) -> (String, String) {
    let headers = credential.apply(caller).await.unwrap();
    assert_eq!(headers.len(), 1, "one credential header");
    let (name, value) = &headers[0];
    assert!(value.is_sensitive(), "credential headers are marked sensitive");
    (name.as_str().to_owned(), value.to_str().unwrap().to_owned())
}

fn bearer(value: &str) -> &str {
    value.strip_prefix("Bearer ").expect("a bearer credential")
}

fn jwt_claims(token: &str) -> serde_json::Value {
    let payload = token.split('.').nth(1).expect("a JWT");
    serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

fn scope_set(scope: &serde_json::Value) -> Vec<String> {
    let mut scopes: Vec<String> = scope.as_str().unwrap().split(' ').map(str::to_owned).collect();
    scopes.sort();
    scopes
}

// ---------------------------------------------------------------------------------------------
// Static secrets
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn static_secret_from_a_file_is_trimmed_and_sent_with_its_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let path = secret_file(&dir, "token", b"  s3cret-value-1234\n");
    let config = CredentialConfig::Static {
        header: "Authorization".into(),
        prefix: CredentialConfig::default_prefix("Authorization").into(),
        secret: SecretSource::File(path.clone()),
    };
    let credential = build(&config, Arc::new(SystemClock)).unwrap();
    assert_eq!(credential.kind_name(), "static");
    let (name, value) = one_header(&credential, caller("p", Some("caller-token"))).await;
    assert_eq!(name, "authorization");
    assert_eq!(value, "Bearer s3cret-value-1234");
    assert!(!format!("{credential:?}").contains("s3cret"), "Debug shows no secret");

    let config = CredentialConfig::Static {
        header: "X-Api-Key".into(),
        prefix: CredentialConfig::default_prefix("X-Api-Key").into(),
        secret: SecretSource::File(path),
    };
    let credential = build(&config, Arc::new(SystemClock)).unwrap();
    assert_eq!(one_header(&credential, caller("p", None)).await, ("x-api-key".into(), "s3cret-value-1234".into()));
}

#[tokio::test]
async fn static_secret_from_the_environment() {
    // `cargo test` sets CARGO_PKG_NAME for the test process (the workspace forbids `unsafe`, so
    // the test cannot set a variable of its own).
    let expected = std::env::var("CARGO_PKG_NAME").expect("cargo sets CARGO_PKG_NAME when it runs tests");
    let config = CredentialConfig::Static {
        header: "X-Upstream-Key".into(),
        prefix: "Key ".into(),
        secret: SecretSource::Env("CARGO_PKG_NAME".into()),
    };
    let credential = build(&config, Arc::new(SystemClock)).unwrap();
    assert_eq!(one_header(&credential, caller("p", None)).await, ("x-upstream-key".into(), format!("Key {expected}")));
}

#[test]
fn a_missing_or_bad_secret_is_an_error_naming_its_source_never_its_value() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-secret");
    let static_with = |secret| CredentialConfig::Static { header: "X-Key".into(), prefix: String::new(), secret };

    let error = build(&static_with(SecretSource::File(missing.clone())), Arc::new(SystemClock)).unwrap_err();
    assert!(matches!(error, CredentialError::Secret { .. }), "{error:?}");
    assert!(error.to_string().contains(&missing.display().to_string()), "{error}");

    let error =
        build(&static_with(SecretSource::Env("PALISADE_TEST_NO_SUCH_VARIABLE_7c1".into())), Arc::new(SystemClock))
            .unwrap_err();
    assert!(error.to_string().contains("PALISADE_TEST_NO_SUCH_VARIABLE_7c1"), "{error}");
    assert!(error.to_string().contains("not set"), "{error}");

    let empty = secret_file(&dir, "empty", b" \n\t\n");
    let error = build(&static_with(SecretSource::File(empty)), Arc::new(SystemClock)).unwrap_err();
    assert!(error.to_string().contains("empty"), "{error}");

    let big = secret_file(&dir, "big", &vec![b'z'; 16 * 1024 + 1]);
    let error = build(&static_with(SecretSource::File(big.clone())), Arc::new(SystemClock)).unwrap_err();
    assert!(error.to_string().contains("16 KiB") && error.to_string().contains(&big.display().to_string()));
    assert!(!error.to_string().contains("zzzz"), "{error}");

    let broken = secret_file(&dir, "broken", b"line-one-secret\nline-two-secret");
    let error = build(&static_with(SecretSource::File(broken.clone())), Arc::new(SystemClock)).unwrap_err();
    assert!(error.to_string().contains(&broken.display().to_string()), "{error}");
    assert!(!format!("{error} {error:?}").contains("line-one-secret"), "{error:?}");

    // The client secret of an OAuth credential is read at start too.
    let config = CredentialConfig::ClientCredentials {
        token_url: Url::parse("https://as.example/token").unwrap(),
        client_id: "gw".into(),
        client_secret: SecretSource::File(missing.clone()),
        scopes: vec![],
        max_scopes: vec![],
        auth: ClientAuth::Basic,
    };
    let error = build(&config, Arc::new(SystemClock)).unwrap_err();
    assert!(error.to_string().contains(&missing.display().to_string()), "{error}");
}

#[test]
fn unusable_configurations_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let secret = SecretSource::File(secret_file(&dir, "s", b"abc"));
    let static_header = |header: &str| CredentialConfig::Static {
        header: header.into(),
        prefix: String::new(),
        secret: secret.clone(),
    };
    for header in ["Bad Header", "", "Host", "Content-Length", "Mcp-Method", "Transfer-Encoding"] {
        let error = build(&static_header(header), Arc::new(SystemClock)).unwrap_err();
        assert!(matches!(error, CredentialError::Config(_)), "{header}: {error:?}");
    }
    let oauth = |token_url: &str, scopes: Vec<String>| CredentialConfig::ClientCredentials {
        token_url: Url::parse(token_url).unwrap(),
        client_id: "gw".into(),
        client_secret: secret.clone(),
        scopes,
        max_scopes: vec![],
        auth: ClientAuth::Basic,
    };
    assert!(build(&oauth("https://as.example/token", vec!["a".into()]), Arc::new(SystemClock)).is_ok());
    assert!(build(&oauth("http://127.0.0.1:9/token", vec![]), Arc::new(SystemClock)).is_ok());
    for (url, scopes) in [
        ("http://as.example/token", vec![]),
        ("ftp://127.0.0.1/token", vec![]),
        ("https://user:pw@as.example/token", vec![]),
        ("https://as.example/token", vec!["two words".into()]),
        ("https://as.example/token", vec![String::new()]),
        ("https://as.example/token", vec!["quote\"".into()]),
    ] {
        let error = build(&oauth(url, scopes.clone()), Arc::new(SystemClock)).unwrap_err();
        assert!(matches!(error, CredentialError::Config(_)), "{url} {scopes:?}: {error:?}");
    }
    let fragment = Url::parse("http://up.test/mcp#x").unwrap();
    let error = UpstreamCredential::from_config(&CredentialConfig::None, &fragment, Arc::new(SystemClock)).unwrap_err();
    assert!(matches!(error, CredentialError::Config(_)));
}

#[tokio::test]
async fn none_adds_nothing_and_never_steps_up() {
    let credential = build(&CredentialConfig::None, Arc::new(SystemClock)).unwrap();
    assert_eq!(credential.kind_name(), "none");
    assert!(credential.apply(caller("p", Some("caller-token"))).await.unwrap().is_empty());
    assert!(!credential.step_up(&["x".into()]).await);
    assert!(UpstreamCredential::none().apply(caller("p", None)).await.unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------------
// A recording token endpoint
// ---------------------------------------------------------------------------------------------

/// One request the token endpoint received.
#[derive(Debug, Clone)]
struct Recorded {
    headers: HeaderMap,
    form: Vec<(String, String)>,
}

impl Recorded {
    fn param(&self, name: &str) -> Option<&str> {
        self.form.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }
}

type Responder = Box<dyn Fn(usize, &Recorded) -> (u16, String) + Send + Sync>;

struct TokenEndpoint {
    url: Url,
    requests: Arc<Mutex<Vec<Recorded>>>,
    hits: Arc<AtomicUsize>,
}

impl TokenEndpoint {
    /// Serves POST /token, answering the `n`-th request (1-based) with `respond(n, request)`.
    async fn start(respond: impl Fn(usize, &Recorded) -> (u16, String) + Send + Sync + 'static) -> Self {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let hits = Arc::new(AtomicUsize::new(0));
        let respond: Arc<Responder> = Arc::new(Box::new(respond));
        let (requests2, hits2) = (requests.clone(), hits.clone());
        let handler = move |headers: HeaderMap, body: axum::body::Bytes| {
            let (requests, hits, respond) = (requests2.clone(), hits2.clone(), respond.clone());
            async move {
                let form = url::form_urlencoded::parse(&body).into_owned().collect();
                let recorded = Recorded { headers, form };
                requests.lock().unwrap().push(recorded.clone());
                let n = hits.fetch_add(1, Ordering::SeqCst) + 1;
                // A little latency, so concurrent callers really overlap.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let (status, body) = respond(n, &recorded);
                (StatusCode::from_u16(status).unwrap(), [(axum::http::header::CONTENT_TYPE, "application/json")], body)
            }
        };
        let router = axum::Router::new().route("/token", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Self { url: Url::parse(&format!("http://{address}/token")).unwrap(), requests, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    fn request(&self, index: usize) -> Recorded {
        self.requests.lock().unwrap()[index].clone()
    }
}

fn token_json(token: &str, expires_in: Option<u64>) -> String {
    let mut body = serde_json::json!({ "access_token": token, "token_type": "bearer" });
    if let Some(expires_in) = expires_in {
        body["expires_in"] = expires_in.into();
    }
    body.to_string()
}

fn client_credentials(
    endpoint: &TokenEndpoint,
    dir: &tempfile::TempDir,
    scopes: &[&str],
    max_scopes: &[&str],
    auth: ClientAuth,
) -> CredentialConfig {
    CredentialConfig::ClientCredentials {
        token_url: endpoint.url.clone(),
        client_id: "gw client".into(),
        client_secret: SecretSource::File(secret_file(dir, "client-secret", b"cc-secret:&=\n")),
        scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
        max_scopes: max_scopes.iter().map(|s| (*s).to_owned()).collect(),
        auth,
    }
}

#[tokio::test]
async fn client_credentials_are_cached_until_shortly_before_expiry() {
    let endpoint = TokenEndpoint::start(|n, _| (200, token_json(&format!("cc-token-{n}"), Some(120)))).await;
    let dir = tempfile::tempdir().unwrap();
    let clock = manual_clock();
    let credential =
        build(&client_credentials(&endpoint, &dir, &["files:read"], &[], ClientAuth::Basic), clock.clone()).unwrap();
    assert_eq!(credential.kind_name(), "client_credentials");

    assert_eq!(one_header(&credential, caller("a", None)).await, ("authorization".into(), "Bearer cc-token-1".into()));
    // Another caller, the same upstream token: client credentials are the gateway's own.
    assert_eq!(one_header(&credential, caller("b", None)).await.1, "Bearer cc-token-1");
    assert_eq!(endpoint.hits(), 1, "the second apply is served from the cache");

    let request = endpoint.request(0);
    assert_eq!(request.param("grant_type"), Some("client_credentials"));
    assert_eq!(request.param("resource"), Some(UPSTREAM));
    assert_eq!(request.param("scope"), Some("files:read"));
    assert_eq!(request.param("client_secret"), None, "Basic authentication keeps the secret out of the body");
    // RFC 6749 §2.3.1: id and secret form-encoded, then Base64.
    let basic = base64::engine::general_purpose::STANDARD.encode("gw+client:cc-secret%3A%26%3D");
    assert_eq!(request.headers["authorization"].to_str().unwrap(), format!("Basic {basic}"));

    // Used until 30 s before expiry (120 s lifetime): at +89 s still cached, at +91 s refreshed.
    clock.advance(Duration::from_secs(89));
    assert_eq!(one_header(&credential, caller("a", None)).await.1, "Bearer cc-token-1");
    assert_eq!(endpoint.hits(), 1);
    clock.advance(Duration::from_secs(2));
    assert_eq!(one_header(&credential, caller("a", None)).await.1, "Bearer cc-token-2");
    assert_eq!(endpoint.hits(), 2);
    assert!(!format!("{credential:?}").contains("cc-secret"), "Debug shows no client secret");
    assert!(!format!("{credential:?}").contains("cc-token"), "Debug shows no token");
}

#[tokio::test]
async fn expires_in_defaults_to_five_minutes_and_is_capped_at_a_day() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = TokenEndpoint::start(|n, _| (200, token_json(&format!("t{n}"), None))).await;
    let clock = manual_clock();
    let credential = build(&client_credentials(&endpoint, &dir, &[], &[], ClientAuth::Basic), clock.clone()).unwrap();
    assert_eq!(one_header(&credential, caller("a", None)).await.1, "Bearer t1");
    assert_eq!(endpoint.request(0).param("scope"), None, "no scope parameter for an empty scope set");
    clock.advance(Duration::from_secs(269));
    assert_eq!(one_header(&credential, caller("a", None)).await.1, "Bearer t1");
    clock.advance(Duration::from_secs(2));
    assert_eq!(one_header(&credential, caller("a", None)).await.1, "Bearer t2");

    let endpoint = TokenEndpoint::start(|n, _| (200, token_json(&format!("t{n}"), Some(10_000_000)))).await;
    let clock = manual_clock();
    let credential = build(&client_credentials(&endpoint, &dir, &[], &[], ClientAuth::Basic), clock.clone()).unwrap();
    assert_eq!(one_header(&credential, caller("a", None)).await.1, "Bearer t1");
    clock.advance(Duration::from_secs(24 * 3600 - 31));
    assert_eq!(one_header(&credential, caller("a", None)).await.1, "Bearer t1");
    clock.advance(Duration::from_secs(2));
    assert_eq!(one_header(&credential, caller("a", None)).await.1, "Bearer t2");
}

#[tokio::test]
async fn client_secret_post_sends_the_client_in_the_body() {
    let endpoint = TokenEndpoint::start(|_, _| (200, token_json("posted", Some(600)))).await;
    let dir = tempfile::tempdir().unwrap();
    let credential =
        build(&client_credentials(&endpoint, &dir, &["a"], &[], ClientAuth::Post), Arc::new(SystemClock)).unwrap();
    assert_eq!(one_header(&credential, caller("a", None)).await.1, "Bearer posted");
    let request = endpoint.request(0);
    assert_eq!(request.param("client_id"), Some("gw client"));
    assert_eq!(request.param("client_secret"), Some("cc-secret:&="));
    assert!(request.headers.get("authorization").is_none());
}

#[tokio::test]
async fn concurrent_callers_share_one_token_request() {
    let endpoint = TokenEndpoint::start(|n, _| (200, token_json(&format!("shared-{n}"), Some(600)))).await;
    let dir = tempfile::tempdir().unwrap();
    let credential =
        build(&client_credentials(&endpoint, &dir, &["a"], &[], ClientAuth::Basic), Arc::new(SystemClock)).unwrap();
    let partitions: Vec<String> = (0..16).map(|i| format!("p{i}")).collect();
    let results = futures::future::join_all(partitions.iter().map(|p| credential.apply(caller(p, None)))).await;
    for result in results {
        assert_eq!(result.unwrap()[0].1.to_str().unwrap(), "Bearer shared-1");
    }
    assert_eq!(endpoint.hits(), 1, "one fetch for sixteen concurrent callers");

    // A failing fetch is shared too: the callers that waited for it get its error at once
    // instead of asking again one after the other.
    let failing = TokenEndpoint::start(|_, _| (503, r#"{"error":"temporarily_unavailable"}"#.to_owned())).await;
    let credential =
        build(&client_credentials(&failing, &dir, &["a"], &[], ClientAuth::Basic), Arc::new(SystemClock)).unwrap();
    let results = futures::future::join_all(partitions.iter().map(|p| credential.apply(caller(p, None)))).await;
    for result in results {
        assert_eq!(
            result.unwrap_err(),
            CredentialError::Unavailable("the authorization server refused the token request: temporarily_unavailable")
        );
    }
    assert_eq!(failing.hits(), 1, "one fetch, one failure, shared");
    // The next request (not a waiter of that fetch) asks again.
    assert!(credential.apply(caller("later", None)).await.is_err());
    assert_eq!(failing.hits(), 2);
}

#[tokio::test]
async fn step_up_widens_once_per_scope_set_within_the_maximum() {
    let endpoint = TokenEndpoint::start(|n, _| (200, token_json(&format!("s{n}"), Some(600)))).await;
    let dir = tempfile::tempdir().unwrap();
    let credential =
        build(&client_credentials(&endpoint, &dir, &["a"], &["b", "c"], ClientAuth::Basic), Arc::new(SystemClock))
            .unwrap();
    assert_eq!(one_header(&credential, caller("p", None)).await.1, "Bearer s1");

    assert!(!credential.step_up(&[]).await, "nothing named, nothing to ask for");
    assert!(!credential.step_up(&["d".into()]).await, "beyond the maximum");
    assert!(!credential.step_up(&["b".into(), "d".into()]).await, "partly beyond the maximum");
    assert!(!credential.step_up(&["a".into()]).await, "already held: a retry would not change anything");
    assert_eq!(one_header(&credential, caller("p", None)).await.1, "Bearer s1", "refusals keep the cached token");
    assert_eq!(endpoint.hits(), 1);

    assert!(credential.step_up(&["b".into()]).await);
    assert_eq!(one_header(&credential, caller("p", None)).await.1, "Bearer s2", "the cached token was dropped");
    assert_eq!(endpoint.request(1).param("scope"), Some("a b"));
    assert!(!credential.step_up(&["b".into()]).await, "the same set again: no loop");

    assert!(credential.step_up(&["c".into()]).await);
    assert_eq!(one_header(&credential, caller("p", None)).await.1, "Bearer s3");
    assert_eq!(endpoint.request(2).param("scope"), Some("a b c"));
    assert!(!credential.step_up(&["c".into(), "b".into()]).await);
    assert_eq!(endpoint.hits(), 3);
}

// ---------------------------------------------------------------------------------------------
// Token exchange against the recording endpoint
// ---------------------------------------------------------------------------------------------

fn token_exchange(endpoint: &TokenEndpoint, dir: &tempfile::TempDir, scopes: &[&str]) -> CredentialConfig {
    CredentialConfig::TokenExchange {
        token_url: endpoint.url.clone(),
        client_id: "gw".into(),
        client_secret: SecretSource::File(secret_file(dir, "te-secret", b"te-secret-value")),
        scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
        auth: ClientAuth::Basic,
    }
}

fn exchange_responder(n: usize, request: &Recorded) -> (u16, String) {
    let body = serde_json::json!({
        "access_token": format!("exchanged-{n}-for-{}", request.param("subject_token").unwrap_or("none").len()),
        "issued_token_type": ACCESS_TOKEN_TYPE,
        "token_type": "Bearer",
        "expires_in": 600,
    });
    (200, body.to_string())
}

#[tokio::test]
async fn token_exchange_sends_the_callers_token_to_the_token_endpoint_only_and_caches_per_partition() {
    let endpoint = TokenEndpoint::start(exchange_responder).await;
    let dir = tempfile::tempdir().unwrap();
    let credential = build(&token_exchange(&endpoint, &dir, &["files:read"]), Arc::new(SystemClock)).unwrap();
    assert_eq!(credential.kind_name(), "token_exchange");
    let alice = "alice-caller-token-0123456789";
    let bob = "bob-caller-token-9876543210";

    let (name, value) = one_header(&credential, caller("alice", Some(alice))).await;
    assert_eq!(name, "authorization");
    assert!(value.starts_with("Bearer exchanged-1-"), "{value}");
    assert!(!value.contains(alice), "the upstream credential is not the caller's token");

    let request = endpoint.request(0);
    assert_eq!(request.param("grant_type"), Some(TOKEN_EXCHANGE));
    assert_eq!(request.param("subject_token"), Some(alice));
    assert_eq!(request.param("subject_token_type"), Some(ACCESS_TOKEN_TYPE));
    assert_eq!(request.param("resource"), Some(UPSTREAM));
    assert_eq!(request.param("scope"), Some("files:read"));
    // The caller's token travels in the form only: not as the request's credential.
    let basic = base64::engine::general_purpose::STANDARD.encode("gw:te-secret-value");
    assert_eq!(request.headers["authorization"].to_str().unwrap(), format!("Basic {basic}"));
    for (header, value) in &request.headers {
        assert!(!value.as_bytes().windows(alice.len()).any(|w| w == alice.as_bytes()), "{header} carries it");
    }

    // Same partition: cached. Another partition: its own exchange.
    assert_eq!(one_header(&credential, caller("alice", Some(alice))).await.1, value);
    assert_eq!(endpoint.hits(), 1);
    let (_, bob_value) = one_header(&credential, caller("bob", Some(bob))).await;
    assert!(bob_value.starts_with("Bearer exchanged-2-"), "{bob_value}");
    assert_eq!(endpoint.request(1).param("subject_token"), Some(bob));
    assert_eq!(one_header(&credential, caller("bob", Some(bob))).await.1, bob_value);
    assert_eq!(one_header(&credential, caller("alice", Some(alice))).await.1, value);
    assert_eq!(endpoint.hits(), 2);

    let debug = format!("{credential:?}");
    assert!(!debug.contains(alice) && !debug.contains("exchanged-") && !debug.contains("te-secret"), "{debug}");

    // Concurrent first requests of one partition share one exchange.
    let carol = "carol-caller-token";
    let results = futures::future::join_all((0..8).map(|_| credential.apply(caller("carol", Some(carol))))).await;
    assert!(results.iter().all(|r| r.as_ref().unwrap()[0].1.to_str().unwrap().starts_with("Bearer exchanged-3-")));
    assert_eq!(endpoint.hits(), 3);
}

#[tokio::test]
async fn token_exchange_without_a_caller_token_fails_closed() {
    let endpoint = TokenEndpoint::start(exchange_responder).await;
    let dir = tempfile::tempdir().unwrap();
    let credential = build(&token_exchange(&endpoint, &dir, &[]), Arc::new(SystemClock)).unwrap();
    assert_eq!(credential.apply(caller("anonymous", None)).await.unwrap_err(), CredentialError::NoCallerToken);
    assert_eq!(credential.apply(caller("anonymous", Some(""))).await.unwrap_err(), CredentialError::NoCallerToken);
    assert_eq!(endpoint.hits(), 0, "nothing was asked of the authorization server");
    assert!(!credential.step_up(&["x".into()]).await, "token exchange does not step up");
}

/// The gateway's own requests (partition "": its listings) are made as the gateway, with a
/// client-credentials grant: never a token exchange without a subject, never anyone's token.
#[tokio::test]
async fn token_exchange_lists_as_the_gateway_itself() {
    let endpoint = TokenEndpoint::start(exchange_responder).await;
    let dir = tempfile::tempdir().unwrap();
    let credential = build(&token_exchange(&endpoint, &dir, &["files:read"]), Arc::new(SystemClock)).unwrap();
    let (_, own) = one_header(&credential, caller("", None)).await;
    assert!(own.starts_with("Bearer exchanged-1-"), "{own}");
    let request = endpoint.request(0);
    assert_eq!(request.param("grant_type"), Some("client_credentials"));
    assert_eq!(request.param("subject_token"), None);
    assert_eq!(request.param("resource"), Some(UPSTREAM));
    assert_eq!(one_header(&credential, caller("", None)).await.1, own, "cached");
    assert_eq!(endpoint.hits(), 1);
    // A caller still gets an exchange of its own token, not the gateway's.
    let (_, alice) = one_header(&credential, caller("alice", Some("alice-token-0123"))).await;
    assert_ne!(alice, own);
    assert_eq!(endpoint.request(1).param("grant_type"), Some(TOKEN_EXCHANGE));
}

#[tokio::test]
async fn an_exchanged_token_is_not_used_past_the_callers_token() {
    let endpoint = TokenEndpoint::start(exchange_responder).await;
    let dir = tempfile::tempdir().unwrap();
    let clock = manual_clock();
    let credential = build(&token_exchange(&endpoint, &dir, &[]), clock.clone()).unwrap();
    // The caller's (already verified) JWT expires in 100 s; the exchanged token would live 600 s.
    let claims = serde_json::json!({ "sub": "alice", "exp": T0_MS / 1000 + 100 }).to_string();
    let encode = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let jwt = format!("{}.{}.{}", encode(br#"{"alg":"RS256"}"#), encode(claims.as_bytes()), encode(b"sig"));
    let first = one_header(&credential, caller("alice", Some(&jwt))).await.1;
    clock.advance(Duration::from_secs(69));
    assert_eq!(one_header(&credential, caller("alice", Some(&jwt))).await.1, first);
    clock.advance(Duration::from_secs(2));
    assert_ne!(one_header(&credential, caller("alice", Some(&jwt))).await.1, first);
    assert_eq!(endpoint.hits(), 2);
}

// ---------------------------------------------------------------------------------------------
// Failures: each one fails closed, with a fixed text, and nothing is cached
// ---------------------------------------------------------------------------------------------

async fn failure_of(respond: impl Fn(usize, &Recorded) -> (u16, String) + Send + Sync + 'static) -> CredentialError {
    let endpoint = TokenEndpoint::start(respond).await;
    let dir = tempfile::tempdir().unwrap();
    let credential =
        build(&client_credentials(&endpoint, &dir, &["a"], &[], ClientAuth::Basic), Arc::new(SystemClock)).unwrap();
    let first = credential.apply(caller("p", None)).await.unwrap_err();
    let second = credential.apply(caller("p", None)).await.unwrap_err();
    assert_eq!(first, second);
    assert_eq!(endpoint.hits(), 2, "a failure is not cached");

    let exchange = build(&token_exchange(&endpoint, &dir, &[]), Arc::new(SystemClock)).unwrap();
    let exchanged = exchange.apply(caller("p", Some("caller-token-xyz"))).await.unwrap_err();
    assert!(matches!(exchanged, CredentialError::Unavailable(_)), "{exchanged:?}");
    assert!(!exchanged.to_string().contains("caller-token-xyz"));
    for text in [first.to_string(), format!("{first:?}")] {
        assert!(!text.contains("cc-secret") && !text.contains("leaky"), "{text}");
    }
    first
}

fn unavailable_text(error: &CredentialError) -> &'static str {
    match error {
        CredentialError::Unavailable(text) => text,
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn a_refusal_names_a_registered_error_code_but_never_the_description() {
    let error = failure_of(|_, _| {
        (400, r#"{"error":"invalid_scope","error_description":"leaky detail: cc-secret"}"#.to_owned())
    })
    .await;
    assert_eq!(unavailable_text(&error), "the authorization server refused the token request: invalid_scope");

    let error = failure_of(|_, _| (401, r#"{"error":"invalid_client"}"#.to_owned())).await;
    assert!(unavailable_text(&error).ends_with(": invalid_client"));

    // An unregistered code (it could be anything the server chose) is not repeated.
    let error = failure_of(|_, _| (400, r#"{"error":"leaky_code_cc_secret"}"#.to_owned())).await;
    assert_eq!(unavailable_text(&error), "the authorization server refused the token request");

    let error = failure_of(|_, _| (503, "<html>down</html>".to_owned())).await;
    assert_eq!(unavailable_text(&error), "the authorization server refused the token request");

    let error = failure_of(|_, _| (302, String::new())).await;
    assert!(unavailable_text(&error).contains("redirect"));
}

#[tokio::test]
async fn garbage_and_oversized_token_responses_are_refused() {
    let malformed = "the token response is malformed";
    assert_eq!(unavailable_text(&failure_of(|_, _| (200, "not json".to_owned())).await), malformed);
    assert_eq!(unavailable_text(&failure_of(|_, _| (200, "{}".to_owned())).await), malformed);
    let no_type = |_: usize, _: &Recorded| (200, r#"{"access_token":"abc"}"#.to_owned());
    assert_eq!(unavailable_text(&failure_of(no_type).await), malformed);
    let spaced = |_: usize, _: &Recorded| (200, r#"{"access_token":"a b","token_type":"Bearer"}"#.to_owned());
    assert_eq!(unavailable_text(&failure_of(spaced).await), malformed);
    let empty = |_: usize, _: &Recorded| (200, r#"{"access_token":"","token_type":"Bearer"}"#.to_owned());
    assert_eq!(unavailable_text(&failure_of(empty).await), malformed);
    let negative =
        |_: usize, _: &Recorded| (200, r#"{"access_token":"abc","token_type":"Bearer","expires_in":-5}"#.to_owned());
    assert_eq!(unavailable_text(&failure_of(negative).await), malformed);
    let mac = |_: usize, _: &Recorded| (200, r#"{"access_token":"abc","token_type":"mac"}"#.to_owned());
    assert_eq!(unavailable_text(&failure_of(mac).await), "the token response is not a bearer token");
    let huge = |_: usize, _: &Recorded| (200, token_json(&"x".repeat(70 * 1024), Some(60)));
    assert_eq!(unavailable_text(&failure_of(huge).await), "the token response is too large");
    let wrong_type = |_: usize, _: &Recorded| {
        let body = serde_json::json!({
            "access_token": "abc", "token_type": "Bearer",
            "issued_token_type": "urn:ietf:params:oauth:token-type:refresh_token",
        });
        (200, body.to_string())
    };
    assert!(unavailable_text(&failure_of(wrong_type).await).contains("other than an access token"));
}

#[tokio::test]
async fn an_authorization_server_that_is_down_fails_closed() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let dir = tempfile::tempdir().unwrap();
    let secret = SecretSource::File(secret_file(&dir, "s", b"down-secret"));
    let token_url = Url::parse(&format!("http://127.0.0.1:{port}/token")).unwrap();
    for config in [
        CredentialConfig::ClientCredentials {
            token_url: token_url.clone(),
            client_id: "gw".into(),
            client_secret: secret.clone(),
            scopes: vec!["a".into()],
            max_scopes: vec![],
            auth: ClientAuth::Basic,
        },
        CredentialConfig::TokenExchange {
            token_url: token_url.clone(),
            client_id: "gw".into(),
            client_secret: secret.clone(),
            scopes: vec![],
            auth: ClientAuth::Post,
        },
    ] {
        let credential = build(&config, Arc::new(SystemClock)).unwrap();
        let started = std::time::Instant::now();
        let error = credential.apply(caller("p", Some("caller-token"))).await.unwrap_err();
        assert_eq!(error, CredentialError::Unavailable("the authorization server could not be reached"));
        assert!(started.elapsed() < Duration::from_secs(30), "did not hang");
        assert!(!error.to_string().contains("down-secret"));
    }
}

// ---------------------------------------------------------------------------------------------
// A real authorization server: node-oidc-provider (tests/interop/gateway-as.mjs)
// ---------------------------------------------------------------------------------------------

/// The authorization-server process; killed when dropped (and it exits when our end of its
/// standard input closes, should this process die first).
struct AuthorizationServer {
    child: Child,
    issuer: String,
}

impl Drop for AuthorizationServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl AuthorizationServer {
    async fn start() -> Self {
        let tools = std::env::var_os("PALISADE_TEST_TOOLS").map(PathBuf::from).unwrap_or_else(|| {
            panic!(
                "PALISADE_TEST_TOOLS is not set: the credential tests run node-oidc-provider and need the \
                 tools folder scripts/test installs (Node 22 at bin/node, npm packages in npm/node_modules)"
            )
        });
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let mut child = Command::new(tools.join("bin/node"))
            .arg(root.join("tests/interop/gateway-as.mjs"))
            .arg(port.to_string())
            .env("INTEROP_NODE_MODULES", tools.join("npm/node_modules"))
            .env("EXIT_WITH_STDIN", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", tools.join("bin/node").display()));
        let stdout = child.stdout.take().unwrap();
        let ready = tokio::task::spawn_blocking(move || {
            for line in BufReader::new(stdout).lines() {
                let line = line.ok()?;
                if let Some(issuer) = line.strip_prefix("READY ") {
                    return Some(issuer.to_owned());
                }
            }
            None
        });
        let issuer = tokio::time::timeout(Duration::from_secs(60), ready).await;
        let mut server = Self { child, issuer: String::new() };
        match issuer {
            Ok(Ok(Some(issuer))) => server.issuer = issuer,
            _ => panic!("gateway-as.mjs did not become ready"),
        }
        server
    }

    fn token_url(&self) -> Url {
        Url::parse(&format!("{}/token", self.issuer)).unwrap()
    }

    /// A caller's own access token (client `caller`), for the gateway's resource.
    async fn caller_token(&self, audience: &str) -> String {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "client_credentials")
            .append_pair("scope", "files:read")
            .append_pair("resource", audience)
            .finish();
        let response = reqwest::Client::new()
            .post(self.token_url())
            .basic_auth("caller", Some("caller-secret"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
        let body: serde_json::Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        body["access_token"].as_str().unwrap().to_owned()
    }
}

#[tokio::test]
async fn client_credentials_against_oidc_provider_mint_a_jwt_for_the_upstream() {
    let server = AuthorizationServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = |client_id: &str, secret: &[u8], auth| CredentialConfig::ClientCredentials {
        token_url: server.token_url(),
        client_id: client_id.into(),
        client_secret: SecretSource::File(secret_file(&dir, client_id, secret)),
        scopes: vec!["files:read".into()],
        max_scopes: vec!["files:write".into()],
        auth,
    };
    let credential = build(&config("gateway", b"gateway-secret\n", ClientAuth::Basic), Arc::new(SystemClock)).unwrap();

    let (name, value) = one_header(&credential, caller("p", None)).await;
    assert_eq!(name, "authorization");
    let token = bearer(&value).to_owned();
    let claims = jwt_claims(&token);
    assert_eq!(claims["aud"], UPSTREAM, "RFC 8707: the audience is the upstream's resource");
    assert_eq!(claims["scope"], "files:read", "the minimal scopes");
    assert_eq!(claims["iss"], server.issuer.as_str());
    assert_eq!(claims["client_id"], "gateway");
    let header: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token.split('.').next().unwrap()).unwrap(),
    )
    .unwrap();
    assert_eq!(header["typ"], "at+jwt", "an RFC 9068 access token");
    assert_eq!(one_header(&credential, caller("q", None)).await.1, value, "cached");

    // Step-up within the maximum: a token with the wider scope set; beyond it: refused.
    assert!(credential.step_up(&["files:write".into()]).await);
    let wider = jwt_claims(bearer(&one_header(&credential, caller("p", None)).await.1));
    assert_eq!(scope_set(&wider["scope"]), ["files:read", "files:write"]);
    assert_eq!(wider["aud"], UPSTREAM);
    assert!(!credential.step_up(&["files:admin".into()]).await);

    // client_secret_post with the other client.
    let post = build(&config("gateway-post", b"gateway-post-secret", ClientAuth::Post), Arc::new(SystemClock)).unwrap();
    let claims = jwt_claims(bearer(&one_header(&post, caller("p", None)).await.1));
    assert_eq!((claims["client_id"].as_str(), claims["aud"].as_str()), (Some("gateway-post"), Some(UPSTREAM)));

    // A wrong secret: refused by the server, named by its error code, no secret in the text.
    let wrong = build(&config("gateway", b"not-the-secret", ClientAuth::Basic), Arc::new(SystemClock)).unwrap();
    let error = wrong.apply(caller("p", None)).await.unwrap_err();
    assert_eq!(
        error,
        CredentialError::Unavailable("the authorization server refused the token request: invalid_client")
    );
    assert!(!format!("{error} {error:?}").contains("not-the-secret"));
}

#[tokio::test]
async fn token_exchange_against_oidc_provider_speaks_for_the_caller_at_the_upstream() {
    let server = AuthorizationServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = CredentialConfig::TokenExchange {
        token_url: server.token_url(),
        client_id: "gateway".into(),
        client_secret: SecretSource::File(secret_file(&dir, "gateway", b"gateway-secret")),
        scopes: vec!["files:read".into()],
        auth: ClientAuth::Basic,
    };
    let credential = build(&config, Arc::new(SystemClock)).unwrap();
    let caller_token = server.caller_token("http://gateway.test/mcp").await;
    assert_eq!(jwt_claims(&caller_token)["aud"], "http://gateway.test/mcp");

    let value = one_header(&credential, caller("caller-partition", Some(&caller_token))).await.1;
    let exchanged = bearer(&value);
    assert_ne!(exchanged, caller_token, "the upstream never sees the caller's token");
    let claims = jwt_claims(exchanged);
    assert_eq!(claims["aud"], UPSTREAM);
    assert_eq!(claims["sub"], "caller", "the exchanged token speaks for the caller");
    assert_eq!(claims["act"]["sub"], "gateway", "with the gateway as the actor");
    assert_eq!(claims["scope"], "files:read");
    assert_eq!(one_header(&credential, caller("caller-partition", Some(&caller_token))).await.1, value, "cached");

    // A token the server did not issue for the gateway is refused (invalid_grant), in a new
    // partition so nothing cached answers.
    let other_audience = server.caller_token("http://other.test/mcp").await;
    let error = credential.apply(caller("other", Some(&other_audience))).await.unwrap_err();
    assert_eq!(
        error,
        CredentialError::Unavailable("the authorization server refused the token request: invalid_grant")
    );
    let error = credential.apply(caller("forged", Some("forged.token.value"))).await.unwrap_err();
    assert!(matches!(error, CredentialError::Unavailable(_)));
}
