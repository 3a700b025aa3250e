//! Fetched JWKS against a wiremock IdP on loopback: rotation, outage (fail closed), bounded
//! stale-if-error, unknown-kid refetch rate limit, response cap, no redirects; and the egress guard
//! in front of every fetch (development flag, allow-list, a private name, the proxy).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_auth::{
    Algorithm, AuthError, ConfigError, InvalidTokenReason as Reason, IssuerConfig, JwksPolicy, JwksSource,
    ResourceServerConfig, TokenVerifier,
};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::common::*;

/// What the fake IdP's JWKS endpoint answers.
#[derive(Clone)]
enum Reply {
    Json(Value),
    Status(u16),
    Slow(Duration, Value),
    Raw(String),
    Redirect(String),
}

/// A JWKS endpoint whose answer tests change on the fly, counting the requests it serves.
#[derive(Clone)]
struct Idp {
    reply: Arc<Mutex<Reply>>,
    hits: Arc<AtomicUsize>,
}

impl Respond for Idp {
    fn respond(&self, _request: &Request) -> ResponseTemplate {
        self.hits.fetch_add(1, Ordering::SeqCst);
        let reply = self.reply.lock().expect("lock").clone();
        match reply {
            Reply::Json(body) => ResponseTemplate::new(200).set_body_json(body),
            Reply::Status(code) => ResponseTemplate::new(code),
            Reply::Slow(delay, body) => ResponseTemplate::new(200).set_body_json(body).set_delay(delay),
            Reply::Raw(body) => ResponseTemplate::new(200).set_body_string(body),
            Reply::Redirect(to) => ResponseTemplate::new(302).insert_header("location", to.as_str()),
        }
    }
}

impl Idp {
    fn set(&self, reply: Reply) {
        *self.reply.lock().expect("lock") = reply;
    }
    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

struct Setup {
    _server: MockServer,
    idp: Idp,
    verifier: Arc<TokenVerifier>,
    clock: Arc<ManualClock>,
    server_uri: String,
}

async fn setup(initial: Reply, policy: JwksPolicy) -> Setup {
    let server = MockServer::start().await;
    let idp = Idp { reply: Arc::new(Mutex::new(initial)), hits: Arc::new(AtomicUsize::new(0)) };
    Mock::given(method("GET")).and(path("/jwks")).respond_with(idp.clone()).mount(&server).await;
    let good_keys = json!({"keys": [TestKey::ec("unrelated").jwk]});
    Mock::given(method("GET"))
        .and(path("/elsewhere"))
        .respond_with(ResponseTemplate::new(200).set_body_json(good_keys))
        .mount(&server)
        .await;
    let mut cfg = config(vec![IssuerConfig {
        issuer: ISSUER_A.into(),
        jwks: JwksSource::Url(format!("{}/jwks", server.uri())),
        algorithms: vec![Algorithm::ES256, Algorithm::EdDSA],
    }]);
    // The IdP is a local fixture: the development flag lets the guard reach it over http.
    cfg.jwks_allow_loopback = true;
    let clock = clock();
    let verifier = Arc::new(TokenVerifier::with_clock_and_policy(cfg, clock.clone(), policy).expect("valid config"));
    let server_uri = server.uri();
    Setup { _server: server, idp, verifier, clock, server_uri }
}

fn unavailable() -> AuthError {
    AuthError::IssuerUnavailable { issuer: ISSUER_A.into() }
}

async fn check(verifier: &TokenVerifier, token: &str) -> Result<(), AuthError> {
    verifier.verify(Some(&bearer(token))).await.map(|_| ())
}

#[tokio::test]
async fn fetches_once_and_verifies() {
    let k1 = TestKey::ec("k1");
    let s = setup(Reply::Json(jwk_set(&[&k1])), JwksPolicy::default()).await;
    for _ in 0..5 {
        check(&s.verifier, &token_with(&k1, json!({}), json!({"jti": rand_jti()}))).await.expect("accepted");
    }
    assert_eq!(s.idp.hits(), 1, "one fetch serves many tokens");
    assert_eq!(s.verifier.stats().jwks_fetch_attempts, 1);
}

fn rand_jti() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("jti-{}", N.fetch_add(1, Ordering::SeqCst))
}

#[tokio::test]
async fn rotation_new_kid_is_picked_up_and_removed_kid_is_refused() {
    let k1 = TestKey::ec("k1");
    let k2 = TestKey::ed("k2");
    let s = setup(Reply::Json(jwk_set(&[&k1])), JwksPolicy::default()).await;
    let old = token(&k1);
    let new = token(&k2);
    check(&s.verifier, &old).await.expect("k1 accepted");
    assert_eq!(s.idp.hits(), 1);

    // The IdP publishes k2; a token signed with it arrives 31 s later: one refetch, accepted.
    s.idp.set(Reply::Json(jwk_set(&[&k1, &k2])));
    s.clock.advance(Duration::from_secs(31));
    check(&s.verifier, &new).await.expect("k2 accepted after refetch");
    assert_eq!(s.idp.hits(), 2);

    // The IdP retires k1. Until the next refresh the (cached) old token still passes...
    s.idp.set(Reply::Json(jwk_set(&[&k2])));
    s.clock.advance(Duration::from_secs(60));
    check(&s.verifier, &old).await.expect("k1 still trusted before refresh");
    assert_eq!(s.idp.hits(), 2);
    // ...after the refresh interval the set is refetched and the old token is refused,
    // even though it is in the verified-token cache and has not expired.
    s.clock.advance(Duration::from_secs(300));
    assert_eq!(check(&s.verifier, &old).await, Err(AuthError::InvalidToken(Reason::UnknownKeyId)));
    assert_eq!(s.idp.hits(), 3);
    check(&s.verifier, &new).await.expect("k2 still accepted");
    assert_eq!(s.idp.hits(), 3);
}

#[tokio::test]
async fn unknown_kid_refetch_is_rate_limited_per_issuer() {
    let k1 = TestKey::ec("k1");
    let s = setup(Reply::Json(jwk_set(&[&k1])), JwksPolicy::default()).await;
    let stranger = TestKey::ec("stranger");
    // First contact: the initial fetch; the kid is unknown and no second fetch is allowed yet.
    assert_eq!(check(&s.verifier, &token(&stranger)).await, Err(AuthError::InvalidToken(Reason::UnknownKeyId)));
    assert_eq!(s.idp.hits(), 1);
    // A flood of unknown kids within 30 s costs nothing at the IdP.
    for i in 0..20 {
        let forged = TestKey::ec(&format!("forged-{i}"));
        s.clock.advance(Duration::from_secs(1));
        assert_eq!(check(&s.verifier, &token(&forged)).await, Err(AuthError::InvalidToken(Reason::UnknownKeyId)));
    }
    assert_eq!(s.idp.hits(), 1, "no refetch within 30 s of the last attempt");
    // 30 s after the first attempt: exactly one more fetch, then quiet again.
    s.clock.advance(Duration::from_secs(10));
    for _ in 0..5 {
        assert_eq!(check(&s.verifier, &token(&stranger)).await, Err(AuthError::InvalidToken(Reason::UnknownKeyId)));
    }
    assert_eq!(s.idp.hits(), 2);
    // Known kids never trigger fetches.
    check(&s.verifier, &token(&k1)).await.expect("k1 accepted");
    assert_eq!(s.idp.hits(), 2);
}

#[tokio::test]
async fn concurrent_first_requests_share_one_fetch() {
    let k1 = TestKey::ec("k1");
    let s = setup(Reply::Slow(Duration::from_millis(200), jwk_set(&[&k1])), JwksPolicy::default()).await;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let verifier = Arc::clone(&s.verifier);
        let token = token_with(&k1, json!({}), json!({"jti": rand_jti()}));
        tasks.spawn(async move { check(&verifier, &token).await });
    }
    while let Some(result) = tasks.join_next().await {
        result.expect("task").expect("accepted");
    }
    assert_eq!(s.idp.hits(), 1, "single flight");
}

#[tokio::test]
async fn idp_down_from_the_start_fails_closed() {
    let k1 = TestKey::ec("k1");
    let s = setup(Reply::Status(500), JwksPolicy::default()).await;
    assert_eq!(check(&s.verifier, &token(&k1)).await, Err(unavailable()));
    assert_eq!(unavailable().http_status(), 401);
    assert_eq!(s.verifier.stats().jwks_fetch_failures, 1);
    // Retries are rate-limited too: no hammering a failing IdP.
    assert_eq!(check(&s.verifier, &token(&k1)).await, Err(unavailable()));
    assert_eq!(s.idp.hits(), 1);
    // The IdP recovers; the next attempt (30 s later) succeeds.
    s.idp.set(Reply::Json(jwk_set(&[&k1])));
    s.clock.advance(Duration::from_secs(30));
    check(&s.verifier, &token(&k1)).await.expect("accepted after recovery");
    assert_eq!(s.idp.hits(), 2);
}

#[tokio::test]
async fn outage_after_success_is_bounded_stale_if_error() {
    let k1 = TestKey::ec("k1");
    let s = setup(Reply::Json(jwk_set(&[&k1])), JwksPolicy::default()).await;
    let cached = token(&k1);
    check(&s.verifier, &cached).await.expect("accepted");
    s.idp.set(Reply::Status(503));

    // Past the refresh interval the refresh fails, but the 6-minute-old keys are still usable.
    s.clock.advance(Duration::from_secs(360));
    check(&s.verifier, &cached).await.expect("cached token within the stale bound");
    check(&s.verifier, &token_with(&k1, json!({}), json!({"jti": "fresh"}))).await.expect("new token, known kid");
    assert_eq!(s.idp.hits(), 2);
    // A kid we have never seen cannot be checked while the IdP is down: unavailable, not unknown.
    let rotated = TestKey::ec("k2");
    s.clock.advance(Duration::from_secs(30));
    assert_eq!(check(&s.verifier, &token(&rotated)).await, Err(unavailable()));

    // 15 minutes after the last successful fetch nothing is trusted any more.
    s.clock.set_ms(ms(NOW * 1000 + 900_000));
    assert_eq!(check(&s.verifier, &cached).await, Err(unavailable()));
    assert_eq!(check(&s.verifier, &token_with(&k1, json!({}), json!({"jti": "fresh2"}))).await, Err(unavailable()));
}

#[tokio::test]
async fn idp_timeout_fails_closed() {
    let k1 = TestKey::ec("k1");
    let policy = JwksPolicy { fetch_timeout: Duration::from_millis(300), ..JwksPolicy::default() };
    let s = setup(Reply::Slow(Duration::from_secs(3), jwk_set(&[&k1])), policy).await;
    let started = std::time::Instant::now();
    assert_eq!(check(&s.verifier, &token(&k1)).await, Err(unavailable()));
    assert!(started.elapsed() < Duration::from_secs(2), "the timeout, not the IdP, ended the wait");
}

#[tokio::test]
async fn oversized_non_json_and_redirected_responses_are_failures() {
    let k1 = TestKey::ec("k1");
    let mut padded = jwk_set(&[&k1]);
    padded["padding"] = json!("x".repeat(70 * 1024));
    let s = setup(Reply::Json(padded), JwksPolicy::default()).await;
    assert_eq!(check(&s.verifier, &token(&k1)).await, Err(unavailable()), "over the 64 KiB cap");

    let redirect_to = format!("{}/elsewhere", s.server_uri);
    for reply in [
        Reply::Raw("<html>not json</html>".into()),
        Reply::Json(json!({"not": "a key set"})),
        Reply::Redirect(redirect_to),
        Reply::Status(404),
    ] {
        s.idp.set(reply);
        s.clock.advance(Duration::from_secs(30));
        assert_eq!(check(&s.verifier, &token(&k1)).await, Err(unavailable()));
    }
    assert_eq!(s.verifier.stats().jwks_fetch_failures, 5);

    // Just under the cap is fine.
    let mut under = jwk_set(&[&k1]);
    under["padding"] = json!("x".repeat(60 * 1024));
    s.idp.set(Reply::Json(under));
    s.clock.advance(Duration::from_secs(30));
    check(&s.verifier, &token(&k1)).await.expect("accepted");
}

#[tokio::test]
async fn unusable_keys_in_a_fetched_set_are_skipped() {
    let good = TestKey::ec("good");
    let wrong_alg = TestKey::rsa("rsa"); // RS256 is not allowed for this issuer
    let mut identity = [0u8; 32];
    identity[0] = 1;
    let weak = json!({"kty":"OKP","crv":"Ed25519","kid":"weak","x":b64(&identity)});
    let hmac = json!({"kty":"oct","kid":"hmac","k":b64(b"secret")});
    let set = json!({"keys": [good.jwk, wrong_alg.jwk, weak, hmac]});
    let s = setup(Reply::Json(set), JwksPolicy::default()).await;
    check(&s.verifier, &token(&good)).await.expect("good key usable");
    for kid in ["rsa", "weak", "hmac"] {
        let t = token_with(&good, json!({"kid": kid}), json!({}));
        assert_eq!(check(&s.verifier, &t).await, Err(AuthError::InvalidToken(Reason::UnknownKeyId)), "{kid}");
    }
}

fn jwks_config(url: &str, allow_loopback: bool, allowed_networks: &[&str]) -> ResourceServerConfig {
    let mut cfg = config(vec![IssuerConfig {
        issuer: ISSUER_A.into(),
        jwks: JwksSource::Url(url.into()),
        algorithms: vec![Algorithm::ES256],
    }]);
    cfg.jwks_allow_loopback = allow_loopback;
    cfg.jwks_allowed_networks = allowed_networks.iter().map(|s| (*s).to_owned()).collect();
    cfg
}

#[test]
fn plain_http_jwks_only_on_loopback_with_the_development_flag() {
    for (url, with_flag, without_flag) in [
        ("http://127.0.0.1:9/jwks", true, false),
        ("http://localhost:9/jwks", true, false),
        ("http://[::1]:9/jwks", true, false),
        ("http://2130706433:9/jwks", true, false),
        ("https://127.0.0.1:9/jwks", true, false),
        ("https://idp.example.com/jwks", true, true),
        ("http://idp.example.com/jwks", false, false),
        ("http://192.168.1.10/jwks", false, false),
        ("https://192.168.1.10/jwks", false, false),
        ("https://169.254.169.254/jwks", false, false),
        ("https://[::ffff:169.254.169.254]/jwks", false, false),
    ] {
        assert_eq!(TokenVerifier::new(jwks_config(url, true, &[])).is_ok(), with_flag, "{url} with the flag");
        assert_eq!(TokenVerifier::new(jwks_config(url, false, &[])).is_ok(), without_flag, "{url}");
    }
    let refusal = TokenVerifier::new(jwks_config("http://127.0.0.1:9/jwks", false, &[])).err().expect("refused");
    assert!(matches!(refusal, ConfigError::JwksNotAllowed { .. }), "{refusal}");
    assert!(refusal.to_string().contains("jwks_allow_loopback"), "{refusal}");
}

#[test]
fn jwks_allowed_networks_admit_a_deliberately_internal_issuer() {
    let internal = "https://10.20.0.5/jwks";
    let refusal = TokenVerifier::new(jwks_config(internal, false, &[])).err().expect("refused");
    assert!(refusal.to_string().contains("jwks_allowed_networks"), "{refusal}");
    assert!(TokenVerifier::new(jwks_config(internal, false, &["10.20.0.0/16"])).is_ok());
    assert!(TokenVerifier::new(jwks_config("https://10.21.0.5/jwks", false, &["10.20.0.0/16"])).is_err());
    assert!(TokenVerifier::new(jwks_config("https://[fd00:1::5]/jwks", false, &["fd00:1::/48"])).is_ok());
    // Only the listed network: loopback and the metadata service stay refused.
    assert!(TokenVerifier::new(jwks_config("https://127.0.0.1/jwks", false, &["10.20.0.0/16"])).is_err());
    assert!(TokenVerifier::new(jwks_config("https://169.254.169.254/", false, &["10.20.0.0/16"])).is_err());
    for bad in ["10.20.0.0", "10.20.0.0/33", "internal"] {
        let refusal = TokenVerifier::new(jwks_config(internal, false, &[bad])).err().expect("refused");
        assert!(matches!(refusal, ConfigError::InvalidNetwork(ref s) if s == bad), "{refusal}");
    }
    let mut with_proxy = jwks_config(internal, false, &[]);
    with_proxy.jwks_proxy = Some("http://user:pw@proxy.example:3128".into());
    assert!(matches!(TokenVerifier::new(with_proxy).err(), Some(ConfigError::InvalidProxy(_))));
}

#[tokio::test]
async fn a_jwks_host_resolving_to_a_private_address_is_never_contacted() {
    let listener = Listener::start("127.0.0.1", 0, None).await;
    let (resolver, lookups) = table_resolver(&[("idp.internal.test", &["127.0.0.1"])]);
    let cfg = jwks_config(&format!("https://idp.internal.test:{}/jwks", listener.port), false, &[]);
    let policy = JwksPolicy { resolver: Some(resolver), ..JwksPolicy::default() };
    let verifier = TokenVerifier::with_clock_and_policy(cfg, clock(), policy).expect("valid config");
    let key = TestKey::ec("k1");
    assert_eq!(check(&verifier, &token(&key)).await, Err(unavailable()));
    assert_eq!(verifier.stats().jwks_fetch_failures, 1);
    assert_eq!(lookups.lock().expect("lock").as_slice(), ["idp.internal.test"]);
    assert_eq!(listener.connections(), 0);
}

#[tokio::test]
async fn jwks_fetches_go_through_the_configured_proxy() {
    let proxy = ConnectProxy::start().await;
    let (resolver, lookups) = table_resolver(&[]);
    let mut cfg = jwks_config("https://idp.example.com/jwks", false, &[]);
    cfg.jwks_proxy = Some(format!("http://127.0.0.1:{}", proxy.port));
    let policy = JwksPolicy { resolver: Some(resolver), ..JwksPolicy::default() };
    let verifier = TokenVerifier::with_clock_and_policy(cfg, clock(), policy).expect("valid config");
    let key = TestKey::ec("k1");
    // The fixture proxy closes the tunnel: the fetch fails, closed.
    assert_eq!(check(&verifier, &token(&key)).await, Err(unavailable()));
    assert_eq!(proxy.requests().len(), 1);
    assert!(proxy.requests()[0].starts_with("CONNECT idp.example.com:443 "), "{:?}", proxy.requests());
    assert!(lookups.lock().expect("lock").is_empty());
}
