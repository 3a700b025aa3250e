//! The OAuth client against hostile servers: one TLS fixture (a test CA, served on
//! 127.0.0.1) plays the upstream's protected-resource metadata and its authorization servers,
//! and a trap listener on 127.0.0.2 (the same port) counts every connection made to the
//! forbidden address. The egress policy is production's (no development flag) with the fixture's
//! address as the operator's one allowed network; names resolve through a test resolver.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use palisade_auth::egress::{EgressPolicy, Resolver};
use palisade_base::clock::SystemClock;
use palisade_store::SqliteStore;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::pages::AuthorizeFlow;
use super::*;

/// What the fixture answers on one path: status, extra headers, body.
#[derive(Clone)]
struct Answer {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
}

fn json_answer(body: Value) -> Answer {
    Answer { status: 200, headers: vec![("content-type", "application/json".into())], body: body.to_string() }
}

#[derive(Default)]
struct Served {
    answers: Mutex<HashMap<String, Answer>>,
    hits: Mutex<HashMap<String, usize>>,
}

struct Fixture {
    port: u16,
    ca_pem: String,
    served: Arc<Served>,
    trapped: Arc<AtomicUsize>,
    rebind_lookups: Arc<AtomicUsize>,
    shutdown: CancellationToken,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The fixture's names: each resolves to the fixture (127.0.0.1) except `private.test`
/// (10.1.2.3) and `rebind.test` (the fixture once, then the trap).
const NAMES: [&str; 4] = ["files.test", "as.test", "rebind.test", "private.test"];

impl Fixture {
    async fn start() -> Self {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let mut names: Vec<String> = NAMES.iter().map(|name| (*name).to_owned()).collect();
        names.extend(["127.0.0.1".to_owned(), "127.0.0.2".to_owned()]);
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(names).unwrap().signed_by(&leaf_key, &issuer).unwrap();
        let tls = crate::web::tls_config(
            format!("{}{}", leaf.pem(), ca_cert.pem()).as_bytes(),
            leaf_key.serialize_pem().as_bytes(),
        )
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let trap = TcpListener::bind(("127.0.0.2", port)).await.unwrap();
        let trapped = Arc::new(AtomicUsize::new(0));
        let count = trapped.clone();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    accepted = trap.accept() => if accepted.is_ok() { count.fetch_add(1, Ordering::SeqCst); },
                }
            }
        });
        let served = Arc::new(Served::default());
        let router = axum::Router::new().fallback(answer).with_state(served.clone());
        tokio::spawn(crate::web::serve_web(listener, tls, router, shutdown.clone()));
        Self { port, ca_pem: ca_cert.pem(), served, trapped, rebind_lookups: Arc::new(AtomicUsize::new(0)), shutdown }
    }

    fn url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.port)
    }

    fn set(&self, path: &str, answer: Answer) {
        lock(&self.served.answers).insert(path.to_owned(), answer);
    }

    fn hits(&self, path: &str) -> usize {
        lock(&self.served.hits).get(path).copied().unwrap_or(0)
    }

    fn policy(&self) -> EgressPolicy {
        let lookups = self.rebind_lookups.clone();
        let fixture = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let trap = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
        EgressPolicy {
            allow_loopback: false,
            allowed_networks: vec![palisade_auth::egress::parse_network("127.0.0.1/32").unwrap()],
            extra_roots_pem: Some(self.ca_pem.clone().into_bytes()),
            resolver: Some(Resolver::new(move |host| match host {
                "files.test" | "as.test" => vec![fixture],
                "private.test" => vec![IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3))],
                "rebind.test" if lookups.fetch_add(1, Ordering::SeqCst) == 0 => vec![fixture],
                "rebind.test" => vec![trap],
                _ => Vec::new(),
            })),
            ..EgressPolicy::default()
        }
    }

    /// The upstream's metadata names `issuer` as its authorization server.
    fn upstream_names(&self, issuer: &str) {
        self.set(
            "/.well-known/oauth-protected-resource/mcp",
            json_answer(json!({ "resource": self.url("files.test", "/mcp"), "authorization_servers": [issuer] })),
        );
    }

    /// Authorization-server metadata for `issuer` (at `path`), its endpoints under `base`.
    fn server_metadata(&self, path: &str, issuer: &str, base: &str) {
        self.set(
            path,
            json_answer(json!({
                "issuer": issuer,
                "authorization_endpoint": format!("{base}/authorize"),
                "token_endpoint": format!("{base}/token"),
                "code_challenge_methods_supported": ["S256"],
                "response_types_supported": ["code"],
                "client_id_metadata_document_supported": true,
                "authorization_response_iss_parameter_supported": true,
            })),
        );
    }
}

/// Every answer closes its connection, so each request resolves its host again (what a
/// rebinding attacker needs, and what the guard must survive).
async fn answer(State(served): State<Arc<Served>>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    *lock(&served.hits).entry(path.clone()).or_default() += 1;
    let found = lock(&served.answers).get(&path).cloned();
    let mut response = match found {
        Some(answer) => {
            let mut response = (StatusCode::from_u16(answer.status).unwrap(), answer.body).into_response();
            for (name, value) in answer.headers {
                response.headers_mut().insert(name, HeaderValue::from_str(&value).unwrap());
            }
            response
        }
        None => StatusCode::NOT_FOUND.into_response(),
    };
    response.headers_mut().insert("connection", HeaderValue::from_static("close"));
    response
}

fn unsigned_jwt(claims: &Value) -> String {
    let part = |value: &Value| URL_SAFE_NO_PAD.encode(value.to_string());
    format!("{}.{}.c2ln", part(&json!({ "alg": "RS256", "typ": "at+jwt" })), part(claims))
}

struct Client {
    oauth: Arc<UserOAuth>,
    config: UpstreamOAuth,
    store: Arc<dyn Store>,
    dir: tempfile::TempDir,
}

async fn client(fixture: &Fixture) -> Client {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("palisade.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(path.to_str().unwrap()).await.unwrap());
    let config = UpstreamOAuth {
        id: "files".into(),
        resource: Url::parse(&fixture.url("files.test", "/mcp")).unwrap(),
        scopes: ["files:read".to_owned()].into(),
        max_scopes: ["files:read".to_owned(), "files:write".to_owned()].into(),
    };
    let settings = UserOAuthSettings {
        public_url: Url::parse("https://gateway.test/").unwrap(),
        sign_in: SignInSettings {
            issuer: "https://idp.test".into(),
            client_id: "palisade".into(),
            client_secret: None,
        },
        egress: fixture.policy(),
        flow_ttl_secs: 600,
        client_name: "Palisade gateway".into(),
    };
    let secret = ServerSecret::from_bytes([7; 32]);
    let oauth = UserOAuth::new(settings, vec![config.clone()], store.clone(), &secret, Arc::new(SystemClock)).unwrap();
    Client { oauth, config, store, dir }
}

fn alice() -> Person {
    Person { issuer: "https://idp.test".into(), subject: "alice".into(), tenant: None }
}

fn refused_text(result: Result<Arc<Discovered>, OAuthError>) -> String {
    match result {
        Ok(_) => panic!("discovery was not refused"),
        Err(error) => error.to_string(),
    }
}

#[tokio::test]
async fn hostile_discovery_is_refused_and_nothing_reaches_the_forbidden_address() {
    let fixture = Fixture::start().await;
    let client = client(&fixture).await;
    let port = fixture.port;
    // (what the upstream names as its authorization server, what the refusal must say)
    let cases = [
        ("https://169.254.169.254".to_owned(), "cloud metadata"),
        (format!("https://127.0.0.2:{port}"), "loopback"),
        (format!("https://[::ffff:127.0.0.2]:{port}"), "IPv4-mapped"),
        (format!("https://2130706434:{port}"), "loopback"),
        (format!("https://0x7f000002:{port}"), "loopback"),
        (format!("https://0177.0.0.2:{port}"), "loopback"),
        (format!("https://private.test:{port}"), "private-use"),
        (format!("http://as.test:{port}"), "https"),
        ("javascript:alert(1)".to_owned(), "the issuer"),
        ("file:///etc/passwd".to_owned(), "the issuer"),
    ];
    for (issuer, expected) in cases {
        fixture.upstream_names(&issuer);
        let text = refused_text(client.oauth.discover(&client.config, true).await);
        assert!(text.contains(expected), "{issuer}: {text}");
    }
    assert_eq!(fixture.hits("/.well-known/oauth-protected-resource/mcp"), 10, "each case read the upstream's metadata");
    assert_eq!(fixture.trapped.load(Ordering::SeqCst), 0, "nothing connected to the forbidden address");
}

#[tokio::test]
async fn hostile_authorization_server_metadata_is_refused() {
    let fixture = Fixture::start().await;
    let client = client(&fixture).await;
    let issuer = fixture.url("as.test", "");
    fixture.upstream_names(&issuer);
    let metadata_path = "/.well-known/oauth-authorization-server";
    // The metadata claims another issuer.
    fixture.server_metadata(metadata_path, &fixture.url("evil.test", ""), &issuer);
    let text = refused_text(client.oauth.discover(&client.config, true).await);
    assert!(text.contains("its issuer is not the one the upstream named"), "{text}");
    // Endpoints Palisade calls at the forbidden address, and browser URLs that are not https.
    for (field, value, expected) in [
        ("token_endpoint", format!("https://127.0.0.2:{}/token", fixture.port), "loopback"),
        ("token_endpoint", "https://169.254.169.254/token".to_owned(), "cloud metadata"),
        ("authorization_endpoint", "javascript:alert(document.cookie)".to_owned(), "authorization_endpoint"),
        ("authorization_endpoint", "file:///etc/passwd".to_owned(), "authorization_endpoint"),
    ] {
        fixture.server_metadata(metadata_path, &issuer, &issuer);
        let mut answer = lock(&fixture.served.answers).get(metadata_path).cloned().unwrap();
        let mut document: Value = serde_json::from_str(&answer.body).unwrap();
        document[field] = json!(value);
        answer.body = document.to_string();
        fixture.set(metadata_path, answer);
        let text = refused_text(client.oauth.discover(&client.config, true).await);
        assert!(text.contains(expected), "{field} = {value}: {text}");
    }
    // A redirect to the forbidden address: refused, even by a guard that follows redirects.
    fixture.set(
        metadata_path,
        Answer {
            status: 302,
            headers: vec![(
                "location",
                format!("https://127.0.0.2:{}/.well-known/oauth-authorization-server", fixture.port),
            )],
            body: String::new(),
        },
    );
    let text = refused_text(client.oauth.discover(&client.config, true).await);
    assert!(text.contains("redirect refused"), "{text}");
    let following = EgressGuard::new(EgressPolicy { max_redirects: 3, ..fixture.policy() }).unwrap();
    let error = discovery::authorization_server(&following, &issuer, false).await.unwrap_err().to_string();
    assert!(error.contains("loopback"), "{error}");
    assert_eq!(fixture.trapped.load(Ordering::SeqCst), 0, "nothing connected to the forbidden address");
}

#[tokio::test]
async fn a_name_that_rebinds_to_a_forbidden_address_is_not_followed() {
    let fixture = Fixture::start().await;
    let client = client(&fixture).await;
    // rebind.test resolves to the fixture for the metadata, then to the trap for the token request.
    let issuer = fixture.url("rebind.test", "");
    fixture.upstream_names(&issuer);
    fixture.server_metadata("/.well-known/oauth-authorization-server", &issuer, &issuer);
    let discovered = client.oauth.discover(&client.config, true).await.unwrap();
    assert_eq!(discovered.server.token_endpoint.as_str(), fixture.url("rebind.test", "/token"));
    let identity = client.oauth.client_identity(&discovered.server).await.unwrap();
    let grant = token::Grant::Code { code: "code", redirect_uri: "https://gateway.test/oauth/callback", verifier: "v" };
    let refused = token::request_tokens(
        &client.oauth.guard,
        &discovered.server.token_endpoint,
        &identity,
        grant,
        client.config.resource.as_str(),
        0,
    )
    .await;
    let Err(error) = refused else { panic!("the token request must be refused") };
    assert!(error.to_string().contains("loopback"), "{error}");
    assert!(fixture.rebind_lookups.load(Ordering::SeqCst) >= 2, "the name was resolved again for the second request");
    assert_eq!(fixture.hits("/token"), 0);
    assert_eq!(fixture.trapped.load(Ordering::SeqCst), 0, "nothing connected to the rebound address");
}

/// Two authorization servers on the fixture (`/a` and `/b`); the upstream names `/a`.
fn two_servers(fixture: &Fixture) -> (String, String) {
    let (a, b) = (fixture.url("as.test", "/a"), fixture.url("as.test", "/b"));
    fixture.upstream_names(&a);
    fixture.server_metadata("/.well-known/oauth-authorization-server/a", &a, &a);
    fixture.server_metadata("/.well-known/oauth-authorization-server/b", &b, &b);
    (a, b)
}

fn flow_for(client: &Client, issuer: &str) -> AuthorizeFlow {
    AuthorizeFlow {
        person: alice(),
        upstream: "files".into(),
        issuer: issuer.to_owned(),
        client_id: client.oauth.client_metadata_url(),
        redirect_uri: client.oauth.redirect_uri(),
        verifier: "verifier-of-this-flow".into(),
        scopes: vec!["files:read".into()],
    }
}

fn token_answer(access_token: &str, refresh_token: &str) -> Answer {
    json_answer(json!({
        "access_token": access_token,
        "refresh_token": refresh_token,
        "token_type": "Bearer",
        "expires_in": 3600,
        "scope": "files:read",
    }))
}

#[tokio::test]
async fn a_mix_up_and_a_token_for_another_resource_store_nothing() {
    let fixture = Fixture::start().await;
    let client = client(&fixture).await;
    let (a, b) = two_servers(&fixture);
    let flow = flow_for(&client, &a);
    // Mix-up: the response says it comes from server B; the request went to A (RFC 9207).
    let error = client.oauth.finish_authorize("code", Some(&b), &flow).await.unwrap_err();
    assert_eq!(error, OAuthError::IssuerMismatch);
    // A server that announces `iss` must send it.
    assert_eq!(client.oauth.finish_authorize("code", None, &flow).await.unwrap_err(), OAuthError::IssuerMismatch);
    assert_eq!(fixture.hits("/a/token") + fixture.hits("/b/token"), 0, "no code was redeemed");
    // A token whose audience is another resource is refused, and nothing is stored.
    let foreign = unsigned_jwt(&json!({ "sub": "alice", "aud": "https://other.test/mcp", "scope": "files:read" }));
    fixture.set("/a/token", token_answer(&foreign, "refresh-1"));
    let error = client.oauth.finish_authorize("code", Some(&a), &flow).await.unwrap_err().to_string();
    assert!(error.contains("another resource"), "{error}");
    assert_eq!(fixture.hits("/a/token"), 1);
    assert!(client.store.connection(client.oauth.person_key(&alice()), "files").await.unwrap().is_none());
}

#[tokio::test]
async fn tokens_at_rest_are_sealed_to_their_person_and_client_approval_is_per_client() {
    let fixture = Fixture::start().await;
    let client = client(&fixture).await;
    let (a, _) = two_servers(&fixture);
    let access =
        unsigned_jwt(&json!({ "sub": "alice", "aud": client.config.resource.as_str(), "scope": "files:read" }));
    let refresh = "refresh-token-of-alice-0123456789";
    fixture.set("/a/token", token_answer(&access, refresh));
    client.oauth.finish_authorize("code", Some(&a), &flow_for(&client, &a)).await.unwrap();

    let alice_key = client.oauth.person_key(&alice());
    let row = client.store.connection(alice_key, "files").await.unwrap().expect("stored");
    assert_eq!(row.scopes, "files:read");
    // No token in clear text anywhere in the database files (WAL included).
    for entry in std::fs::read_dir(client.dir.path()).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        for secret in [access.as_bytes(), refresh.as_bytes()] {
            assert!(!bytes.windows(secret.len()).any(|window| window == secret), "a token is stored in clear text");
        }
    }

    // The person's approval of the calling MCP client is needed as well as the connection.
    let caller = |person: Person, client_id: &str| UserCaller { person, client_id: client_id.to_owned() };
    let needed = |result: Result<Zeroizing<String>, CredentialError>| {
        matches!(result, Err(CredentialError::UserAuthorizationRequired { .. }))
    };
    assert!(needed(client.oauth.access_token(&caller(alice(), "cursor"), "files").await), "no approval yet");
    client.store.approve_client(alice_key, "files", "cursor", 1).await.unwrap();
    let token = client.oauth.access_token(&caller(alice(), "cursor"), "files").await.unwrap();
    assert_eq!(token.as_str(), access);
    assert!(needed(client.oauth.access_token(&caller(alice(), "claude"), "files").await), "another client");

    // The row copied to another person does not open for them.
    let bob = Person { subject: "bob".into(), ..alice() };
    let bob_key = client.oauth.person_key(&bob);
    client.store.approve_client(bob_key, "files", "cursor", 1).await.unwrap();
    client.store.put_connection(&ConnectionRow { principal_key: bob_key, ..row.clone() }).await.unwrap();
    assert!(needed(client.oauth.access_token(&caller(bob.clone(), "cursor"), "files").await), "a copied row opened");
    // …nor for the same person at another upstream's name.
    assert!(client.oauth.open_tokens(&ConnectionRow { upstream: "other".into(), ..row.clone() }).is_none());
    assert!(client.oauth.open_tokens(&row).is_some());
    assert!(client.store.delete_connection(bob_key, "files").await.unwrap());

    // A revoked client loses its approvals; the connection stays the person's.
    let revoked =
        client.oauth.on_principal_event(&PrincipalEvent::ClientRevoked { client: "cursor".into() }).await.unwrap();
    assert_eq!(revoked, 2);
    assert!(needed(client.oauth.access_token(&caller(alice(), "cursor"), "files").await));
    assert!(client.store.connection(alice_key, "files").await.unwrap().is_some());
    // The person's revocation removes the connection.
    let event = PrincipalEvent::TokensRevoked { issuer: "https://idp.test".into(), subject: "alice".into() };
    assert_eq!(client.oauth.on_principal_event(&event).await.unwrap(), 1);
    assert!(client.store.connection(alice_key, "files").await.unwrap().is_none());
}

#[tokio::test]
async fn a_registration_is_made_once_and_kept_sealed() {
    let fixture = Fixture::start().await;
    let client = client(&fixture).await;
    let issuer = fixture.url("as.test", "");
    fixture.upstream_names(&issuer);
    fixture.set(
        "/.well-known/oauth-authorization-server",
        json_answer(json!({
            "issuer": issuer,
            "authorization_endpoint": format!("{issuer}/authorize"),
            "token_endpoint": format!("{issuer}/token"),
            "registration_endpoint": format!("{issuer}/reg"),
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic"],
        })),
    );
    let secret = "registered-secret-0123456789";
    fixture.set(
        "/reg",
        Answer {
            status: 201,
            headers: vec![("content-type", "application/json".into())],
            body: json!({ "client_id": "palisade-17", "client_secret": secret, "token_endpoint_auth_method": "client_secret_basic" })
                .to_string(),
        },
    );
    let discovered = client.oauth.discover(&client.config, true).await.unwrap();
    let first = client.oauth.client_identity(&discovered.server).await.unwrap();
    assert_eq!(first.client_id, "palisade-17");
    let again = client.oauth.client_identity(&discovered.server).await.unwrap();
    assert_eq!(again.client_id, "palisade-17");
    assert_eq!(fixture.hits("/reg"), 1, "registered once, then read back from the store");
    let stored = client.store.oauth_client(&issuer, &client.oauth.redirect_uri()).await.unwrap().expect("kept");
    assert!(!stored.contains(secret), "the registration's secret is stored sealed");
}

#[test]
fn a_step_up_asks_only_for_scopes_within_the_maximum() {
    let config = UpstreamOAuth {
        id: "files".into(),
        resource: Url::parse("https://files.test/mcp").unwrap(),
        scopes: ["files:read".to_owned()].into(),
        max_scopes: ["files:read".to_owned(), "files:write".to_owned()].into(),
    };
    assert_eq!(config.scopes_to_ask(None), ["files:read"]);
    let asked = ["files:write".to_owned(), "admin".to_owned()];
    assert_eq!(config.scopes_to_ask(Some(&asked)), ["files:read", "files:write"], "admin is beyond the maximum");
}

/// Log lines written while a test runs (WARN and above).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        lock(&self.0).extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn start(&self) -> tracing::subscriber::DefaultGuard {
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&lock(&self.0)).into_owned()
    }
}

fn hex_sha256(text: &str) -> String {
    palisade_base::hex::hex(&id_digest(text))
}

#[tokio::test]
async fn a_refused_resource_metadata_hint_is_dropped_and_discovery_falls_back_to_the_well_known_location() {
    let logs = Captured::default();
    let _logging = logs.start();
    let fixture = Fixture::start().await;
    let client = client(&fixture).await;
    let issuer = fixture.url("as.test", "");
    fixture.upstream_names(&issuer);
    fixture.server_metadata("/.well-known/oauth-authorization-server", &issuer, &issuer);
    // A document at the hint that names another resource.
    fixture.set(
        "/wrong-resource",
        json_answer(json!({ "resource": fixture.url("files.test", "/other"), "authorization_servers": [issuer] })),
    );
    let hostile = [
        (format!("https://127.0.0.2:{}/.well-known/oauth-protected-resource", fixture.port), "loopback"),
        ("https://169.254.169.254/latest/meta-data/?token=hint-secret".to_owned(), "cloud metadata"),
        (fixture.url("files.test", "/wrong-resource"), "its resource is not this upstream's URI"),
        (fixture.url("files.test", "/missing"), "publishes no protected-resource metadata"),
    ];
    for (hint, reason) in &hostile {
        client.oauth.rejected(&alice(), "files", Some(hint)).await;
        let discovered = client.oauth.discover(&client.config, false).await;
        let discovered = discovered.unwrap_or_else(|error| panic!("{hint}: {error}"));
        assert_eq!(discovered.server.issuer, issuer, "{hint}");
        let hints = lock(&client.oauth.hints);
        let kept = hints.get("files").expect("an entry");
        assert!(kept.candidate.is_none() && kept.kept.is_none(), "{hint}: the refused hint is not kept");
        drop(hints);
        let text = logs.text();
        let line = text.lines().find(|line| line.contains(&hex_sha256(hint))).unwrap_or_else(|| panic!("{text}"));
        assert!(line.contains("was refused and dropped") && line.contains(reason), "{line}");
    }
    assert_eq!(fixture.hits("/.well-known/oauth-protected-resource/mcp"), hostile.len(), "fell back each time");
    assert_eq!(fixture.hits("/wrong-resource"), 1);
    let text = logs.text();
    assert!(!text.contains("127.0.0.2") && !text.contains("169.254") && !text.contains("hint-secret"), "{text}");

    // A hint that produces valid metadata is kept and used again.
    fixture.set(
        "/hinted",
        json_answer(json!({ "resource": fixture.url("files.test", "/mcp"), "authorization_servers": [issuer] })),
    );
    let good = fixture.url("files.test", "/hinted");
    client.oauth.rejected(&alice(), "files", Some(&good)).await;
    client.oauth.discover(&client.config, false).await.unwrap();
    client.oauth.discover(&client.config, true).await.unwrap();
    assert_eq!(fixture.hits("/hinted"), 2);
    assert_eq!(lock(&client.oauth.hints).get("files").and_then(|hints| hints.kept.clone()), Url::parse(&good).ok());
    // A later refused candidate is dropped; the kept hint still answers.
    client.oauth.rejected(&alice(), "files", Some(&hostile[0].0)).await;
    client.oauth.discover(&client.config, false).await.unwrap();
    assert_eq!(fixture.hits("/hinted"), 3);
    assert_eq!(fixture.hits("/.well-known/oauth-protected-resource/mcp"), hostile.len());
    assert_eq!(fixture.trapped.load(Ordering::SeqCst), 0, "nothing connected to the forbidden address");
}

#[tokio::test]
async fn a_refused_client_metadata_document_is_logged_by_digest_and_shown_as_not_stated() {
    let logs = Captured::default();
    let _logging = logs.start();
    let fixture = Fixture::start().await;
    let client = client(&fixture).await;
    let guard = &client.oauth.guard;
    let good = fixture.url("files.test", "/client.json");
    fixture.set("/client.json", json_answer(json!({ "client_id": good, "client_name": "Good client" })));
    assert_eq!(discovery::client_name(guard, &good).await.as_deref(), Some("Good client"));
    // Not a URL: nothing to fetch, nothing to say.
    assert_eq!(discovery::client_document_name(guard, "cursor").await, Ok(None));
    let other = fixture.url("files.test", "/other-client.json");
    fixture.set("/other-client.json", json_answer(json!({ "client_id": good, "client_name": "Impostor" })));
    let cases = [
        (
            format!("https://127.0.0.2:{}/client.json?secret=query", fixture.port),
            "refused by the egress guard (the host's address is not allowed: loopback)",
        ),
        (fixture.url("files.test", "/absent.json"), "answered HTTP 404"),
        (other, "the document's client_id is not the URL it was fetched from"),
    ];
    for (client_id, reason) in &cases {
        assert_eq!(discovery::client_document_name(guard, client_id).await, Err((*reason).to_owned()), "{client_id}");
        assert_eq!(discovery::client_name(guard, client_id).await, None, "{client_id}");
        let text = logs.text();
        let line = text.lines().find(|line| line.contains(&hex_sha256(client_id))).unwrap_or_else(|| panic!("{text}"));
        assert!(line.contains("metadata document was refused") && line.contains(reason), "{line}");
    }
    let text = logs.text();
    assert!(!text.contains("127.0.0.2") && !text.contains("secret=query") && !text.contains("other-client"), "{text}");
    assert_eq!(fixture.trapped.load(Ordering::SeqCst), 0);
}
