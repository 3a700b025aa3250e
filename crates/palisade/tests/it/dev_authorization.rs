//! The development issuer as an authorization server, through the real binary: discovery from
//! the resource's challenge, registration (a client metadata document, and dynamic
//! registration), authorization with auto-approve, the token endpoint, a tool call, then scope
//! step-up after a 403; and the refusals that need the running server (PKCE, resource, a
//! metadata document that lies about its id, auto-approve on a non-loopback listener).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use aws_lc_rs::digest::{SHA256, digest};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use crate::harness::{TempDir, with_meta};

const REDIRECT: &str = "http://127.0.0.1:1/callback";
const VERIFIER: &str = "it-verifier-0123456789-0123456789-0123456789-abcdef";

struct Demo {
    child: Child,
    origin: String,
    _data: TempDir,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn write_config(data: &TempDir, text: &str) -> String {
    let path = data.0.join("palisade.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// The demo on a fixed free port (its issuer and resource URIs must be reachable), auto-approving,
/// with loopback client metadata documents allowed.
fn start_demo() -> Demo {
    start_demo_with(&[])
}

/// [`start_demo`] with `envs` set.
fn start_demo_with(envs: &[(&str, &str)]) -> Demo {
    let data = TempDir::new();
    let port = free_port();
    let config = write_config(
        &data,
        "[auth.dev_issuer]\nauto_approve = true\nclient_metadata_allow_loopback = true\n[killswitch]\nmode = \"off\"\n",
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["serve", "--app", "demo", "--config", &config, "--listen", &format!("127.0.0.1:{port}")])
        .args(["--data-dir", data.path()])
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start palisade");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("listening on "), "{line:?}");
    Demo { child, origin: format!("http://127.0.0.1:{port}"), _data: data }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

fn tool_call(demo: &Demo, token: &str, tool: &str, arguments: Value) -> reqwest::RequestBuilder {
    let params = with_meta(json!({ "name": tool, "arguments": arguments }), json!({}));
    client()
        .post(format!("{}/mcp", demo.origin))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .header("authorization", format!("Bearer {token}"))
        .body(json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params }).to_string())
}

/// The location's query parameters after an authorization request with `extra` parameters.
async fn authorize(demo: &Demo, client_id: &str, extra: &[(&str, &str)]) -> (u16, Vec<(String, String)>) {
    let challenge = URL_SAFE_NO_PAD.encode(digest(&SHA256, VERIFIER.as_bytes()));
    let resource = format!("{}/mcp", demo.origin);
    let mut params: Vec<(&str, &str)> = vec![
        ("response_type", "code"),
        ("client_id", client_id),
        ("redirect_uri", REDIRECT),
        ("code_challenge", &challenge),
        ("code_challenge_method", "S256"),
        ("state", "s-1"),
        ("resource", &resource),
    ];
    for (name, value) in extra {
        params.retain(|(n, _)| n != name);
        if !value.is_empty() {
            params.push((name, value));
        }
    }
    let query = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(&params).finish();
    let response = client().get(format!("{}/dev-issuer/authorize?{query}", demo.origin)).send().await.unwrap();
    let status = response.status().as_u16();
    let pairs = match response.headers().get("location") {
        Some(location) => url::Url::parse(location.to_str().unwrap()).unwrap().query_pairs().into_owned().collect(),
        None => Vec::new(),
    };
    (status, pairs)
}

fn form_body(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish()
}

fn param<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

async fn token(demo: &Demo, client_id: &str, code: &str) -> Value {
    let resource = format!("{}/mcp", demo.origin);
    let form = [
        ("grant_type", "authorization_code"),
        ("code", code),
        ("client_id", client_id),
        ("redirect_uri", REDIRECT),
        ("code_verifier", VERIFIER),
        ("resource", &resource),
    ];
    let response = client()
        .post(format!("{}/dev-issuer/token", demo.origin))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&form))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// Discovery → authorize → token → a call; then a tool needing more scope → 403 naming it →
/// authorize again for the named scopes → the call succeeds.
async fn connect_and_step_up(demo: &Demo, client_id: &str) {
    let (status, pairs) = authorize(demo, client_id, &[("scope", "shop:read")]).await;
    assert_eq!(status, 302);
    assert_eq!(param(&pairs, "state"), Some("s-1"));
    assert_eq!(param(&pairs, "iss"), Some(format!("{}/dev-issuer", demo.origin).as_str()));
    let tokens = token(demo, client_id, param(&pairs, "code").unwrap()).await;
    let reader = tokens["access_token"].as_str().unwrap();
    let ok = tool_call(demo, reader, "product_get", json!({ "sku": "TEA-001" })).send().await.unwrap();
    assert_eq!(ok.status(), 200);

    let refused = tool_call(demo, reader, "basket_create", json!({})).send().await.unwrap();
    assert_eq!(refused.status(), 403);
    let challenge = refused.headers()["www-authenticate"].to_str().unwrap().to_owned();
    assert!(challenge.contains("error=\"insufficient_scope\""), "{challenge}");
    let scope = challenge.split("scope=\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    assert!(scope.contains("shop:basket"), "{scope}");
    let (_, pairs) = authorize(demo, client_id, &[("scope", &scope)]).await;
    let tokens = token(demo, client_id, param(&pairs, "code").unwrap()).await;
    let stepped_up = tokens["access_token"].as_str().unwrap();
    let ok = tool_call(demo, stepped_up, "basket_create", json!({})).send().await.unwrap();
    assert_eq!(ok.status(), 200);
}

#[tokio::test]
async fn a_client_discovers_registers_authorizes_and_steps_up() {
    let demo = start_demo();
    let http = client();
    // Discovery: the challenge names the resource metadata, which names the issuer, whose
    // metadata is where RFC 8414 derives it and has that issuer.
    let unauthenticated = tool_call(&demo, "x", "product_get", json!({})).header("authorization", "");
    let challenge = unauthenticated.send().await.unwrap();
    assert_eq!(challenge.status(), 401);
    let resource: Value = http
        .get(format!("{}/.well-known/oauth-protected-resource/mcp", demo.origin))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let issuer = resource["authorization_servers"][0].as_str().unwrap().to_owned();
    assert_eq!(issuer, format!("{}/dev-issuer", demo.origin));
    let metadata_url = format!("{}/.well-known/oauth-authorization-server/dev-issuer", demo.origin);
    let metadata: Value = http.get(metadata_url).send().await.unwrap().json().await.unwrap();
    assert_eq!(metadata["issuer"], issuer);

    // Dynamic registration.
    let registration =
        json!({ "redirect_uris": [REDIRECT], "client_name": "it", "token_endpoint_auth_method": "none" });
    let registered =
        http.post(metadata["registration_endpoint"].as_str().unwrap()).json(&registration).send().await.unwrap();
    assert_eq!(registered.status(), 201);
    let registered: Value = registered.json().await.unwrap();
    connect_and_step_up(&demo, registered["client_id"].as_str().unwrap()).await;

    // A client metadata document (served on loopback, allowed by the test configuration).
    let documents = DocumentHost::start().await;
    connect_and_step_up(&demo, &documents.url("/client.json")).await;
}

#[tokio::test]
async fn the_running_issuer_refuses_what_the_flow_forbids() {
    let demo = start_demo();
    let documents = DocumentHost::start().await;
    let good = documents.url("/client.json");
    for (extra, error) in [
        (vec![("code_challenge_method", "plain")], "invalid_request"),
        (vec![("code_challenge_method", ""), ("code_challenge", "")], "invalid_request"),
        (vec![("resource", "")], "invalid_target"),
        (vec![("resource", "https://other.example/mcp")], "invalid_target"),
    ] {
        let (status, pairs) = authorize(&demo, &good, &extra).await;
        assert_eq!((status, param(&pairs, "error")), (302, Some(error)), "{extra:?}");
        assert_eq!(param(&pairs, "code"), None);
    }
    // One character off the registered redirect URI: a page, never a redirect.
    let (status, pairs) = authorize(&demo, &good, &[("redirect_uri", "http://127.0.0.1:1/callbacK")]).await;
    assert_eq!((status, pairs.len()), (400, 0));
    // A document whose client_id is not its own URL.
    let (status, pairs) = authorize(&demo, &documents.url("/impostor.json"), &[]).await;
    assert_eq!((status, pairs.len()), (400, 0));
    // A document that redirects to a private address.
    let (status, pairs) = authorize(&demo, &documents.url("/moved.json"), &[]).await;
    assert_eq!((status, pairs.len()), (400, 0));
    // A replayed code.
    let (_, pairs) = authorize(&demo, &good, &[]).await;
    let code = param(&pairs, "code").unwrap().to_owned();
    token(&demo, &good, &code).await;
    let form = [
        ("grant_type", "authorization_code"),
        ("code", code.as_str()),
        ("client_id", good.as_str()),
        ("redirect_uri", REDIRECT),
        ("code_verifier", VERIFIER),
    ];
    let replay = client()
        .post(format!("{}/dev-issuer/token", demo.origin))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&form))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 400);
}

#[test]
fn auto_approve_is_refused_on_a_non_loopback_listener() {
    let data = TempDir::new();
    let config = write_config(&data, "listen = \"0.0.0.0:0\"\n[auth.dev_issuer]\nauto_approve = true\n");
    let output = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["serve", "--app", "demo", "--config", &config, "--data-dir", data.path()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("auth.dev_issuer.auto_approve"));
    // The same file with a loopback listener passes the check.
    let config = write_config(&data, "listen = \"127.0.0.1:0\"\n[auth.dev_issuer]\nauto_approve = true\n");
    let output = Command::new(env!("CARGO_BIN_EXE_palisade")).args(["config", "check", &config]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

/// Client metadata documents on a loopback port: a good one, an impostor, a redirect.
struct DocumentHost {
    origin: String,
    _task: tokio::task::JoinHandle<()>,
}

impl DocumentHost {
    async fn start() -> Self {
        use axum::routing::get;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let own = format!("{origin}/client.json");
        let router =
            axum::Router::new()
                .route(
                    "/client.json",
                    get(move || {
                        let own = own.clone();
                        async move {
                            axum::Json(json!({ "client_id": own, "client_name": "it", "redirect_uris": [REDIRECT] }))
                        }
                    }),
                )
                .route(
                    "/impostor.json",
                    get(|| async {
                        axum::Json(
                            json!({ "client_id": "https://trusted.example/client.json", "redirect_uris": [REDIRECT] }),
                        )
                    }),
                )
                .route(
                    "/moved.json",
                    get(|| async { (axum::http::StatusCode::FOUND, [("location", "https://10.0.0.1/client.json")]) }),
                );
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self { origin, _task: task }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.origin)
    }
}

/// The development issuer's records in the data directory's audit log (shipped from the
/// instance's segment): `(operation, decision, detail, principal digest)`.
fn issuer_records(demo: &Demo) -> Vec<(String, String, String, Option<String>)> {
    let Ok(database) = rusqlite::Connection::open(demo._data.0.join("palisade.db")) else { return Vec::new() };
    let Ok(mut query) = database.prepare(
        "SELECT operation, decision, coalesce(detail, ''), principal_digest FROM audit_log WHERE stage = 'authorization_server'",
    ) else {
        return Vec::new();
    };
    query
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))
        .map(|rows| rows.filter_map(Result::ok).collect())
        .unwrap_or_default()
}

/// The sum of the `count=` of `records` of `operation`.
fn counted(records: &[(String, String, String, Option<String>)], operation: &str) -> u64 {
    records
        .iter()
        .filter(|(op, decision, _, _)| op == operation && decision == "deny")
        .filter_map(|(_, _, detail, _)| detail.rsplit("count=").next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn a_registration_flood_is_refused_past_the_rate_keeps_the_clients_in_use_and_is_on_the_audit_record() {
    let demo = start_demo_with(&[("PALISADE_AUDIT_TRANSPORT_REFUSAL_INTERVAL_SECS", "1")]);
    let http = client();
    let registration =
        json!({ "redirect_uris": [REDIRECT], "client_name": "it", "token_endpoint_auth_method": "none" });
    let endpoint = format!("{}/dev-issuer/register", demo.origin);
    let register = || http.post(&endpoint).json(&registration).send();
    let used: Value = register().await.unwrap().json().await.unwrap();
    let used = used["client_id"].as_str().unwrap().to_owned();
    let (status, pairs) = authorize(&demo, &used, &[]).await;
    assert_eq!(status, 302);
    let tokens = token(&demo, &used, param(&pairs, "code").unwrap()).await;
    let access = tokens["access_token"].as_str().unwrap().to_owned();
    // 1,000 registrations from this one address, 50 at a time.
    let mut statuses = Vec::new();
    for _ in 0..20 {
        for answer in futures::future::join_all((0..50).map(|_| register())).await {
            statuses.push(answer.unwrap().status().as_u16());
        }
    }
    let created = statuses.iter().filter(|status| **status == 201).count();
    let limited = statuses.iter().filter(|status| **status == 429).count();
    assert_eq!(created + limited, 1000, "{statuses:?}");
    assert!(created < 25, "at most the source's burst is registered: {created}");
    // The client that holds a token was not evicted: it authorizes again.
    let (status, pairs) = authorize(&demo, &used, &[]).await;
    assert_eq!(status, 302, "{pairs:?}");
    assert!(param(&pairs, "code").is_some(), "{pairs:?}");
    // On the record: the registrations, the codes and the token issued (at once), and the
    // refused registrations (counted per interval), by digests only.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let records = loop {
        let records = issuer_records(&demo);
        let complete = counted(&records, "register/rate_limited") == limited as u64
            && records.iter().any(|(op, decision, _, _)| op == "token/issued" && decision == "allow");
        if complete || std::time::Instant::now() > deadline {
            break records;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(counted(&records, "register/rate_limited"), limited as u64, "{records:?}");
    let issued = records.iter().find(|(op, _, _, _)| op == "token/issued").expect("token/issued");
    assert!(issued.2.starts_with("source=") && issued.2.ends_with("grant=authorization_code"), "{issued:?}");
    assert!(issued.3.as_deref().is_some_and(|digest| digest.len() == 32), "{issued:?}");
    let registered = records.iter().filter(|(op, _, _, _)| op == "register/registered").count();
    assert_eq!(registered, created + 1, "{records:?}");
    assert!(records.iter().any(|(op, _, _, _)| op == "authorize/code_issued"));
    let text = format!("{records:?}");
    assert!(!text.contains(&used) && !text.contains(&access) && !text.contains("127.0.0.1"), "{text}");
}
