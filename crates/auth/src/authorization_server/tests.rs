//! The authorization server's refusals, one control per test, driven through `handle` with an
//! injected clock.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::*;
use palisade_base::clock::ManualClock;

const ISSUER: &str = "http://127.0.0.1:8080/dev-issuer";
const RESOURCE: &str = "http://127.0.0.1:8080/mcp";
const REDIRECT: &str = "http://127.0.0.1:3000/callback";
const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk-long-enough";

fn challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(digest(&SHA256, verifier.as_bytes()))
}

struct Fixture {
    server: DevAuthorizationServer,
    clock: Arc<ManualClock>,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fixture(auto_approve: bool) -> Fixture {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("palisade-as-test-{}-{n}", std::process::id()));
    let issuer = DevIssuer::load_or_create(&dir, ISSUER).unwrap();
    let mut settings = DevAuthorizationSettings::new(RESOURCE, vec!["shop:read".into(), "shop:basket".into()]);
    settings.auto_approve = auto_approve;
    settings.client_metadata_egress.allow_loopback = true;
    settings.client_metadata_egress.max_redirects = 2;
    let clock = Arc::new(ManualClock::new(1_800_000_000_000));
    let server = DevAuthorizationServer::new(issuer, settings).unwrap().with_clock(clock.clone());
    Fixture { server, clock, _dir: TempDir(dir) }
}

fn get(path: &str, query: &str) -> HttpRequest<'static> {
    let query: &'static str = Box::leak(query.to_owned().into_boxed_str());
    let path: &'static str = Box::leak(path.to_owned().into_boxed_str());
    HttpRequest { method: "GET", path, query: Some(query), content_type: None, cookie: None, body: b"", peer: None }
}

fn post<'a>(path: &'a str, content_type: &'a str, body: &'a [u8]) -> HttpRequest<'a> {
    HttpRequest { method: "POST", path, query: None, content_type: Some(content_type), cookie: None, body, peer: None }
}

fn form(pairs: &[(&str, &str)]) -> Vec<u8> {
    url::form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish().into_bytes()
}

fn body(response: &HttpResponse) -> Value {
    serde_json::from_slice(&response.body).unwrap()
}

fn header<'a>(response: &'a HttpResponse, name: &str) -> Option<&'a str> {
    response.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
}

/// The query parameters of the redirect `response` sends the browser to.
fn redirect_params(response: &HttpResponse) -> HashMap<String, String> {
    assert!(matches!(response.status, 302 | 303), "{} {}", response.status, String::from_utf8_lossy(&response.body));
    let location = Url::parse(header(response, "location").unwrap()).unwrap();
    location.query_pairs().into_owned().collect()
}

async fn register(fx: &Fixture, redirect_uris: &[&str]) -> String {
    let doc = json!({ "redirect_uris": redirect_uris, "client_name": "test", "token_endpoint_auth_method": "none" });
    let bytes = doc.to_string().into_bytes();
    let response = fx.server.handle(post("/dev-issuer/register", "application/json", &bytes)).await;
    assert_eq!(response.status, 201, "{}", String::from_utf8_lossy(&response.body));
    body(&response)["client_id"].as_str().unwrap().to_owned()
}

fn authorize_query(client_id: &str, overrides: &[(&str, Option<&str>)]) -> String {
    let challenge = challenge(VERIFIER);
    let mut pairs: Vec<(String, String)> = vec![
        ("response_type".into(), "code".into()),
        ("client_id".into(), client_id.into()),
        ("redirect_uri".into(), REDIRECT.into()),
        ("code_challenge".into(), challenge),
        ("code_challenge_method".into(), "S256".into()),
        ("state".into(), "xyz-state".into()),
        ("resource".into(), RESOURCE.into()),
        ("scope".into(), "shop:read".into()),
    ];
    for (name, value) in overrides {
        pairs.retain(|(n, _)| n != name);
        if let Some(value) = value {
            pairs.push(((*name).into(), (*value).into()));
        }
    }
    url::form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish()
}

async fn code_for(fx: &Fixture, client_id: &str) -> String {
    let response = fx.server.handle(get("/dev-issuer/authorize", &authorize_query(client_id, &[]))).await;
    let params = redirect_params(&response);
    assert_eq!(params["state"], "xyz-state");
    assert_eq!(params["iss"], ISSUER);
    params["code"].clone()
}

async fn redeem(fx: &Fixture, code: &str, client_id: &str, redirect_uri: &str) -> HttpResponse {
    let body = form(&[
        ("grant_type", "authorization_code"),
        ("code", code),
        ("client_id", client_id),
        ("redirect_uri", redirect_uri),
        ("code_verifier", VERIFIER),
        ("resource", RESOURCE),
    ]);
    fx.server.handle(post("/dev-issuer/token", "application/x-www-form-urlencoded", &body)).await
}

#[tokio::test]
async fn metadata_is_served_where_clients_look() {
    let fx = fixture(true);
    for path in [
        "/.well-known/oauth-authorization-server/dev-issuer",
        "/.well-known/openid-configuration/dev-issuer",
        "/dev-issuer/.well-known/openid-configuration",
    ] {
        let response = fx.server.handle(get(path, "")).await;
        assert_eq!(response.status, 200, "{path}");
        let doc = body(&response);
        assert_eq!(doc["issuer"], ISSUER);
        assert_eq!(doc["token_endpoint"], "http://127.0.0.1:8080/dev-issuer/token");
        assert_eq!(doc["code_challenge_methods_supported"], json!(["S256"]));
        assert_eq!(doc["client_id_metadata_document_supported"], true);
        assert_eq!(doc["authorization_response_iss_parameter_supported"], true);
    }
    let jwks = body(&fx.server.handle(get("/dev-issuer/jwks", "")).await);
    assert_eq!(jwks["keys"][0]["kty"], "EC");
}

#[tokio::test]
async fn the_whole_flow_issues_a_token_for_the_resource_and_rotates_refresh_tokens() {
    let fx = fixture(true);
    let client = register(&fx, &[REDIRECT]).await;
    let code = code_for(&fx, &client).await;
    let tokens = body(&redeem(&fx, &code, &client, REDIRECT).await);
    assert_eq!(tokens["token_type"], "Bearer");
    assert_eq!(tokens["scope"], "shop:read");
    let claims = tokens["access_token"].as_str().unwrap().split('.').nth(1).unwrap().to_owned();
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).unwrap()).unwrap();
    assert_eq!(claims["aud"], RESOURCE);
    assert_eq!(claims["iss"], ISSUER);
    assert_eq!(claims["client_id"], client.as_str());
    assert_eq!(claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(), 300);

    let first = tokens["refresh_token"].as_str().unwrap().to_owned();
    let refresh = |token: String| {
        let client = client.clone();
        let fx = &fx;
        async move {
            let body = form(&[("grant_type", "refresh_token"), ("refresh_token", &token), ("client_id", &client)]);
            fx.server.handle(post("/dev-issuer/token", "application/x-www-form-urlencoded", &body)).await
        }
    };
    let rotated = refresh(first.clone()).await;
    assert_eq!(rotated.status, 200);
    let second = body(&rotated)["refresh_token"].as_str().unwrap().to_owned();
    assert_ne!(first, second);
    // The old one is refused, and its reuse revokes the family: the new one dies too.
    let reused = refresh(first).await;
    assert_eq!((reused.status, body(&reused)["error"].clone()), (400, json!("invalid_grant")));
    let after_reuse = refresh(second).await;
    assert_eq!(after_reuse.status, 400);
}

#[tokio::test]
async fn pkce_is_required_and_must_be_s256() {
    let fx = fixture(true);
    let client = register(&fx, &[REDIRECT]).await;
    for overrides in [
        vec![("code_challenge_method", None), ("code_challenge", None)],
        vec![("code_challenge_method", None)],
        vec![("code_challenge_method", Some("plain")), ("code_challenge", Some(VERIFIER))],
        vec![("code_challenge", None)],
    ] {
        let response = fx.server.handle(get("/dev-issuer/authorize", &authorize_query(&client, &overrides))).await;
        let params = redirect_params(&response);
        assert_eq!(params["error"], "invalid_request", "{overrides:?}");
        assert_eq!(params["state"], "xyz-state");
        assert_eq!(params["iss"], ISSUER);
        assert!(!params.contains_key("code"));
    }
    // And the verifier must match the challenge.
    let code = code_for(&fx, &client).await;
    let body_bytes = form(&[
        ("grant_type", "authorization_code"),
        ("code", &code),
        ("client_id", &client),
        ("redirect_uri", REDIRECT),
        ("code_verifier", &format!("{VERIFIER}x")),
    ]);
    let response = fx.server.handle(post("/dev-issuer/token", "application/x-www-form-urlencoded", &body_bytes)).await;
    assert_eq!(body(&response)["error"], "invalid_grant");
}

#[tokio::test]
async fn the_redirect_uri_must_match_exactly() {
    let fx = fixture(true);
    let client = register(&fx, &[REDIRECT]).await;
    let one_off = "http://127.0.0.1:3000/callbacK";
    let response = fx
        .server
        .handle(get("/dev-issuer/authorize", &authorize_query(&client, &[("redirect_uri", Some(one_off))])))
        .await;
    // Never redirected to an unregistered URI: a page instead.
    assert_eq!(response.status, 400);
    assert!(header(&response, "location").is_none());
    // At the token endpoint, too.
    let code = code_for(&fx, &client).await;
    let response = redeem(&fx, &code, &client, "http://127.0.0.1:3000/callback/").await;
    assert_eq!(body(&response)["error"], "invalid_grant");
}

#[tokio::test]
async fn a_code_works_once_for_its_client_and_not_after_it_expires() {
    let fx = fixture(true);
    let client = register(&fx, &[REDIRECT]).await;
    let other = register(&fx, &[REDIRECT]).await;

    let code = code_for(&fx, &client).await;
    let first = redeem(&fx, &code, &client, REDIRECT).await;
    assert_eq!(first.status, 200);
    let refresh = body(&first)["refresh_token"].as_str().unwrap().to_owned();
    let replay = redeem(&fx, &code, &client, REDIRECT).await;
    assert_eq!((replay.status, body(&replay)["error"].clone()), (400, json!("invalid_grant")));
    // The replay revoked the refresh token the code produced.
    let body_bytes = form(&[("grant_type", "refresh_token"), ("refresh_token", &refresh), ("client_id", &client)]);
    let response = fx.server.handle(post("/dev-issuer/token", "application/x-www-form-urlencoded", &body_bytes)).await;
    assert_eq!(response.status, 400);

    let stolen = code_for(&fx, &client).await;
    let response = redeem(&fx, &stolen, &other, REDIRECT).await;
    assert_eq!(body(&response)["error_description"], "code was issued to another client");

    let late = code_for(&fx, &client).await;
    fx.clock.advance(Duration::from_secs(61));
    let response = redeem(&fx, &late, &client, REDIRECT).await;
    assert_eq!(body(&response)["error_description"], "code expired");
}

#[tokio::test]
async fn resource_is_required_and_must_be_this_server() {
    let fx = fixture(true);
    let client = register(&fx, &[REDIRECT]).await;
    for resource in [None, Some("http://127.0.0.1:8080/other"), Some("https://elsewhere.example/mcp")] {
        let response =
            fx.server.handle(get("/dev-issuer/authorize", &authorize_query(&client, &[("resource", resource)]))).await;
        assert_eq!(redirect_params(&response)["error"], "invalid_target", "{resource:?}");
    }
    let code = code_for(&fx, &client).await;
    let body_bytes = form(&[
        ("grant_type", "authorization_code"),
        ("code", &code),
        ("client_id", &client),
        ("redirect_uri", REDIRECT),
        ("code_verifier", VERIFIER),
        ("resource", "https://elsewhere.example/mcp"),
    ]);
    let response = fx.server.handle(post("/dev-issuer/token", "application/x-www-form-urlencoded", &body_bytes)).await;
    assert_eq!(body(&response)["error"], "invalid_target");
}

#[tokio::test]
async fn registration_refuses_unsafe_redirect_uris_and_confidential_clients() {
    let fx = fixture(true);
    for doc in [
        json!({ "redirect_uris": [] }),
        json!({ "redirect_uris": ["http://evil.example/cb"] }),
        json!({ "redirect_uris": ["javascript:alert(1)"] }),
        json!({ "redirect_uris": ["https://app.example/cb#frag"] }),
        json!({ "redirect_uris": ["https://app.example/cb"], "token_endpoint_auth_method": "client_secret_basic" }),
    ] {
        let bytes = doc.to_string().into_bytes();
        let response = fx.server.handle(post("/dev-issuer/register", "application/json", &bytes)).await;
        assert_eq!(response.status, 400, "{doc}");
    }
}

async fn serve_document(server: &MockServer, at: &str, response: ResponseTemplate) -> String {
    Mock::given(method("GET")).and(path(at)).respond_with(response).mount(server).await;
    format!("{}{at}", server.uri())
}

#[tokio::test]
async fn client_metadata_documents_are_checked() {
    let fx = fixture(true);
    let host = MockServer::start().await;
    let good_url = format!("{}/good.json", host.uri());
    let good = json!({ "client_id": good_url, "client_name": "CIMD", "redirect_uris": [REDIRECT] });
    serve_document(&host, "/good.json", ResponseTemplate::new(200).set_body_json(&good)).await;
    let code = code_for(&fx, &good_url).await;
    assert_eq!(redeem(&fx, &code, &good_url, REDIRECT).await.status, 200);

    let wrong = json!({ "client_id": "https://other.example/client.json", "redirect_uris": [REDIRECT] });
    let wrong_url = serve_document(&host, "/wrong.json", ResponseTemplate::new(200).set_body_json(&wrong)).await;
    let big_url = format!("{}/big.json", host.uri());
    let big = json!({ "client_id": big_url, "redirect_uris": [REDIRECT], "client_name": "x".repeat(6000) });
    serve_document(&host, "/big.json", ResponseTemplate::new(200).set_body_json(&big)).await;
    let private_redirect = ResponseTemplate::new(302).insert_header("location", "https://10.1.2.3/client.json");
    let redirect_url = serve_document(&host, "/moved.json", private_redirect).await;
    let metadata_service =
        ResponseTemplate::new(302).insert_header("location", "https://169.254.169.254/latest/meta-data");
    let metadata_url = serve_document(&host, "/imds.json", metadata_service).await;
    for (url, expected) in [
        (wrong_url.as_str(), "client metadata document's client_id differs from its URL"),
        (big_url.as_str(), "client metadata document too large"),
        (redirect_url.as_str(), "client metadata host address not allowed"),
        (metadata_url.as_str(), "client metadata host address not allowed"),
    ] {
        let response = fx.server.handle(get("/dev-issuer/authorize", &authorize_query(url, &[]))).await;
        assert_eq!(response.status, 400, "{url}");
        assert!(header(&response, "location").is_none());
        assert!(
            String::from_utf8_lossy(&response.body).contains(&escape(expected)),
            "{url}: {}",
            String::from_utf8_lossy(&response.body)
        );
    }
}

#[tokio::test]
async fn without_the_loopback_exception_a_loopback_document_is_refused() {
    let dir = std::env::temp_dir().join(format!("palisade-as-strict-{}", std::process::id()));
    let issuer = DevIssuer::load_or_create(&dir, ISSUER).unwrap();
    let settings = DevAuthorizationSettings {
        auto_approve: true,
        ..DevAuthorizationSettings::new(RESOURCE, vec!["shop:read".into()])
    };
    let server = DevAuthorizationServer::new(issuer, settings).unwrap();
    let host = MockServer::start().await;
    let url = format!("{}/c.json", host.uri());
    let response = server.handle(get("/dev-issuer/authorize", &authorize_query(&url, &[]))).await;
    assert!(String::from_utf8_lossy(&response.body).contains("https only"));
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn the_consent_page_is_unframeable_and_needs_its_csrf_token() {
    let fx = fixture(false);
    let client = register(&fx, &[REDIRECT]).await;
    let page = fx.server.handle(get("/dev-issuer/authorize", &authorize_query(&client, &[]))).await;
    assert_eq!(page.status, 200);
    assert_eq!(header(&page, "x-frame-options"), Some("DENY"));
    assert!(header(&page, "content-security-policy").unwrap().contains("frame-ancestors 'none'"));
    // `no-referrer` would make a browser send `Origin: null` with the form, which the listener's
    // DNS-rebinding check refuses: nobody could approve.
    assert_eq!(header(&page, "referrer-policy"), Some("same-origin"));
    let html = String::from_utf8(page.body.clone()).unwrap();
    let field = |name: &str| {
        let marker = format!("name=\"{name}\" value=\"");
        let start = html.find(&marker).unwrap() + marker.len();
        html[start..start + html[start..].find('"').unwrap()].to_owned()
    };
    let (request_id, csrf) = (field("request"), field("csrf"));
    let cookie = header(&page, "set-cookie").unwrap().split(';').next().unwrap().to_owned();
    assert_eq!(cookie, format!("{CSRF_COOKIE}={csrf}"));

    let answer = |fields: Vec<(&str, &str)>, cookie: Option<&str>| {
        let bytes = form(&fields);
        let cookie = cookie.map(str::to_owned);
        let fx = &fx;
        async move {
            let request = HttpRequest {
                method: "POST",
                path: "/dev-issuer/authorize",
                query: None,
                content_type: Some("application/x-www-form-urlencoded"),
                cookie: cookie.as_deref(),
                body: &bytes,
                peer: None,
            };
            fx.server.handle(request).await
        }
    };
    let base = vec![
        ("request", request_id.as_str()),
        ("subject", "bob"),
        ("tenant", "globex"),
        ("scope", "shop:basket"),
        ("decision", "approve"),
    ];
    // No CSRF field; a wrong one; the right field without the cookie.
    assert_eq!(answer(base.clone(), Some(&cookie)).await.status, 403);
    let mut wrong = base.clone();
    wrong.push(("csrf", "A".repeat(43).leak()));
    assert_eq!(answer(wrong, Some(&cookie)).await.status, 403);
    let mut right = base.clone();
    right.push(("csrf", csrf.as_str()));
    assert_eq!(answer(right.clone(), None).await.status, 403);
    // Field and cookie: the choices on the page become the grant.
    let approved = answer(right.clone(), Some(&cookie)).await;
    let params = redirect_params(&approved);
    assert_eq!(params["state"], "xyz-state");
    let tokens = body(&redeem(&fx, &params["code"], &client, REDIRECT).await);
    assert_eq!(tokens["scope"], "shop:basket");
    let claims = tokens["access_token"].as_str().unwrap().split('.').nth(1).unwrap().to_owned();
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).unwrap()).unwrap();
    assert_eq!((claims["sub"].as_str(), claims["tenant"].as_str()), (Some("bob"), Some("globex")));
    // The pending request is spent.
    assert_eq!(answer(right, Some(&cookie)).await.status, 400);
}

fn register_from<'a>(peer: &str, doc: &'a [u8]) -> HttpRequest<'a> {
    let mut request = post("/dev-issuer/register", "application/json", doc);
    request.peer = Some(peer.parse().unwrap());
    request
}

#[tokio::test]
async fn grants_and_refusals_carry_their_audit_event() {
    let fx = fixture(true);
    let client_id = register(&fx, &[REDIRECT]).await;
    let response = fx.server.handle(get("/dev-issuer/authorize", &authorize_query(&client_id, &[]))).await;
    let event = response.audit.clone().unwrap();
    assert_eq!((event.endpoint, event.granted, event.reason), ("authorize", true, "code_issued"));
    assert_eq!((event.subject.as_deref(), event.tenant.as_deref()), (Some("alice"), Some("acme")));
    let code = redirect_params(&response)["code"].clone();
    let issued = redeem(&fx, &code, &client_id, REDIRECT).await;
    assert_eq!(issued.status, 200);
    let event = issued.audit.clone().unwrap();
    assert_eq!((event.endpoint, event.granted, event.reason), ("token", true, "issued"));
    assert_eq!(
        (event.client_id.as_deref(), event.detail),
        (Some(client_id.as_str()), Some("grant=authorization_code"))
    );
    assert_eq!(event.scopes, ["shop:read"]);
    // The replayed code is a refusal with the OAuth error as its reason.
    let replayed = redeem(&fx, &code, &client_id, REDIRECT).await;
    let event = replayed.audit.clone().unwrap();
    assert_eq!((event.endpoint, event.granted, event.reason), ("token", false, "invalid_grant"));
    let unregistered = fx
        .server
        .handle(get(
            "/dev-issuer/authorize",
            &authorize_query(&client_id, &[("redirect_uri", Some("https://evil.example/cb"))]),
        ))
        .await;
    let event = unregistered.audit.clone().unwrap();
    assert_eq!((event.endpoint, event.granted, event.reason), ("authorize", false, "redirect_uri_unregistered"));
    // Metadata and keys are not decisions.
    let metadata = fx.server.handle(get("/.well-known/oauth-authorization-server/dev-issuer", "")).await;
    assert!(metadata.audit.is_none());
}

#[tokio::test]
async fn registrations_are_limited_per_source_and_a_flood_evicts_no_client_in_use() {
    let fx = fixture(true);
    let doc = json!({ "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none" }).to_string().into_bytes();
    // A client in use: it holds an unexpired access token.
    let used = register(&fx, &[REDIRECT]).await;
    let code = code_for(&fx, &used).await;
    assert_eq!(redeem(&fx, &code, &used, REDIRECT).await.status, 200);
    // One source: its burst, then 429 before the request is looked at.
    let statuses: Vec<u16> = futures_statuses(&fx, (0..100).map(|_| "198.51.100.1"), &doc).await;
    let accepted = statuses.iter().filter(|s| **s == 201).count();
    assert_eq!(accepted, REGISTRATION_LIMITS.burst as usize, "{statuses:?}");
    assert!(statuses.iter().all(|s| matches!(s, 201 | 429)));
    let limited = fx.server.handle(register_from("198.51.100.1", &doc)).await;
    assert_eq!(limited.audit.map(|e| (e.endpoint, e.reason)), Some(("register", "rate_limited")));
    // Many sources, over time: the table fills and the oldest idle clients make room; the client
    // in use is kept.
    for n in 0..MAX_CLIENTS as u32 + 50 {
        fx.clock.advance(Duration::from_millis(REGISTRATION_LIMITS.total_refill_ms));
        let peer = std::net::Ipv4Addr::from(0x0a00_0000 + n).to_string();
        assert_eq!(fx.server.handle(register_from(&peer, &doc)).await.status, 201, "registration {n}");
    }
    assert!(fx.server.lock().clients.len() <= MAX_CLIENTS);
    let again = fx.server.handle(get("/dev-issuer/authorize", &authorize_query(&used, &[]))).await;
    assert_eq!(again.status, 302, "{}", String::from_utf8_lossy(&again.body));
}

#[tokio::test]
async fn a_table_full_of_clients_in_use_refuses_a_registration_instead_of_evicting() {
    let fx = fixture(false);
    let doc = json!({ "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none" }).to_string().into_bytes();
    let pending = |client_id: String| {
        let fx = &fx;
        async move {
            let page = fx.server.handle(get("/dev-issuer/authorize", &authorize_query(&client_id, &[]))).await;
            assert_eq!(page.status, 200);
        }
    };
    let first = register(&fx, &[REDIRECT]).await;
    pending(first.clone()).await;
    // Every client in the table has a pending consent.
    for n in 0..MAX_CLIENTS as u32 {
        fx.clock.advance(Duration::from_millis(REGISTRATION_LIMITS.total_refill_ms));
        let peer = std::net::Ipv4Addr::from(0x0b00_0000 + n).to_string();
        let answer = fx.server.handle(register_from(&peer, &doc)).await;
        if answer.status != 201 {
            assert_eq!(answer.status, 503);
            assert_eq!(answer.audit.map(|e| e.reason), Some("clients_full"));
            break;
        }
        pending(body(&answer)["client_id"].as_str().unwrap().to_owned()).await;
    }
    let full = fx.server.handle(register_from("192.0.2.99", &doc)).await;
    assert_eq!(full.status, 503, "{}", String::from_utf8_lossy(&full.body));
    assert_eq!(fx.server.lock().clients.len(), MAX_CLIENTS);
    assert!(fx.server.lock().clients.contains_key(&first));
}

/// The statuses of registrations of `doc` from each of `peers`, one after another.
async fn futures_statuses<'a>(fx: &Fixture, peers: impl Iterator<Item = &'a str>, doc: &[u8]) -> Vec<u16> {
    let mut statuses = Vec::new();
    for peer in peers {
        statuses.push(fx.server.handle(register_from(peer, doc)).await.status);
    }
    statuses
}
