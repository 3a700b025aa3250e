//! The connect pages' grants and refusals on the audit record, driven through the surface with
//! the discovery of the upstream's authorization server already cached (nothing is fetched).

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use palisade_base::clock::SystemClock;
use palisade_server::secret::ServerSecret;
use palisade_server::surface_audit::SurfaceAudit;
use palisade_store::{SqliteStore, Store};
use tower::ServiceExt as _;
use url::Url;

use super::super::{Discovered, UpstreamOAuth, UserOAuthSettings, lock};
use super::*;
use crate::user_oauth::SignInSettings;
use crate::web::{WebSettings, surface, testing};

const ORIGIN: &str = "https://gateway.test";
const PEER: [u8; 4] = [192, 0, 2, 30];

struct Pages {
    oauth: Arc<UserOAuth>,
    router: Router,
    store: Arc<dyn Store>,
    audit: Arc<SurfaceAudit>,
}

fn alice() -> Person {
    Person { issuer: "https://idp.test".into(), subject: "alice".into(), tenant: None }
}

async fn pages() -> Pages {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open("sqlite::memory:").await.unwrap());
    let config = UpstreamOAuth {
        id: "files".into(),
        resource: Url::parse("https://files.test/mcp").unwrap(),
        scopes: ["files:read".to_owned()].into(),
        max_scopes: ["files:read".to_owned()].into(),
    };
    let settings = UserOAuthSettings {
        public_url: Url::parse("https://gateway.test/").unwrap(),
        sign_in: SignInSettings {
            issuer: "https://idp.test".into(),
            client_id: "palisade".into(),
            client_secret: None,
        },
        egress: palisade_auth::egress::EgressPolicy::default(),
        flow_ttl_secs: 600,
        client_name: "Palisade gateway".into(),
    };
    let secret = ServerSecret::from_bytes([7; 32]);
    let oauth = UserOAuth::new(settings, vec![config], store.clone(), &secret, Arc::new(SystemClock)).unwrap();
    // The upstream's authorization server, as discovery would have found it (CIMD: no registration).
    let server = AuthorizationServer {
        issuer: "https://as.test".into(),
        authorization_endpoint: Url::parse("https://as.test/authorize").unwrap(),
        token_endpoint: Url::parse("https://as.test/token").unwrap(),
        registration_endpoint: None,
        client_id_metadata_documents: true,
        iss_parameter: true,
        token_auth_methods: vec!["none".into()],
    };
    lock(&oauth.discovered).insert("files".into(), Arc::new(Discovered { server, fetched_ms: oauth.now_ms() }));
    let web = WebSettings {
        listen: "127.0.0.1:0".parse().unwrap(),
        public_url: Url::parse("https://gateway.test/").unwrap(),
        tls_cert_file: "/nonexistent".into(),
        tls_key_file: "/nonexistent".into(),
        review_token: None,
        operators_file: None,
        console_sample_secs: 10,
        sign_in: None,
        flow_ttl_secs: 600,
    };
    let audit = testing::recording(store.clone());
    let router = surface(&web, audit.clone(), routes(oauth.clone()));
    Pages { oauth, router, store, audit }
}

impl Pages {
    /// A connect link of alice's MCP client for `files`.
    async fn link(&self) -> String {
        let id = random_id().unwrap();
        let flow = ConnectFlow {
            person: alice(),
            client_id: "https://client.test/app.json".into(),
            upstream: "files".into(),
            scopes: vec!["files:read".into()],
        };
        let body = serde_json::to_string(&flow).unwrap();
        self.store.put_flow(id_digest(&id), CONNECT, &body, self.oauth.now_ms() + 600_000).await.unwrap();
        id
    }

    /// The `Cookie` header of a browser signed in as `person`.
    fn signed_in(&self, person: &Person) -> String {
        let signed = SignedIn {
            issuer: person.issuer.clone(),
            subject: person.subject.clone(),
            expires: self.oauth.now_secs() + 600,
        };
        let value = self.oauth.keys.sign("session", &serde_json::to_vec(&signed).unwrap());
        format!("__Host-{SESSION_COOKIE}={value}")
    }

    async fn send(&self, mut request: Request<Body>) -> (StatusCode, String) {
        request.extensions_mut().insert(ConnectInfo(std::net::SocketAddr::from((PEER, 443))));
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    /// What the audit log holds of stage `web`: operation → (decision, detail).
    async fn records(&self) -> HashMap<String, (String, String)> {
        testing::records(&self.audit, self.store.as_ref())
            .await
            .into_iter()
            .map(|(decision, operation, _, detail)| (operation, (decision, detail)))
            .collect()
    }
}

fn consent_form(id: &str, cookie: &str, fields: &[(&str, &str)]) -> Request<Body> {
    let body = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(fields).finish();
    Request::post(format!("/connect/{id}"))
        .header("origin", ORIGIN)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("cookie", cookie)
        .body(Body::from(body))
        .unwrap()
}

#[tokio::test]
async fn a_consent_without_its_csrf_token_and_a_replayed_state_are_recorded_refusals() {
    let pages = pages().await;
    let id = pages.link().await;
    let cookie = pages.signed_in(&alice());
    let redirect = pages.oauth.redirect_uri();
    let missing = consent_form(&id, &cookie, &[("decision", "approve"), ("redirect_uri", &redirect)]);
    assert_eq!(pages.send(missing).await.0, StatusCode::FORBIDDEN);
    // An authorization `state` answered once (by another person's browser: refused, and spent),
    // then replayed.
    let flow = AuthorizeFlow {
        person: alice(),
        upstream: "files".into(),
        issuer: "https://as.test".into(),
        client_id: pages.oauth.client_metadata_url(),
        redirect_uri: redirect.clone(),
        verifier: random_id().unwrap(),
        scopes: vec!["files:read".into()],
    };
    let body = serde_json::to_string(&flow).unwrap();
    let expires = pages.oauth.now_ms() + 600_000;
    pages.store.put_flow(id_digest("replayed-state"), AUTHORIZE, &body, expires).await.unwrap();
    let mallory = Person { subject: "mallory".into(), ..alice() };
    let callback = |cookie: &str| {
        Request::get("/oauth/callback?code=c&state=replayed-state&iss=https%3A%2F%2Fas.test")
            .header("cookie", cookie)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(pages.send(callback(&pages.signed_in(&mallory))).await.0, StatusCode::FORBIDDEN);
    assert_eq!(pages.send(callback(&cookie)).await.0, StatusCode::BAD_REQUEST);
    // Another person opening alice's link.
    let opened = Request::get(format!("/connect/{id}")).header("cookie", pages.signed_in(&mallory)).body(Body::empty());
    assert_eq!(pages.send(opened.unwrap()).await.0, StatusCode::FORBIDDEN);
    let source = &pages.audit.digest("192.0.2.30")[..16];
    let records = pages.records().await;
    for operation in ["consent/csrf", "callback/another_person", "callback/state_unknown", "connect/another_person"] {
        assert_eq!(
            records.get(operation),
            Some(&("deny".to_owned(), format!("source={source} count=1"))),
            "{records:?}"
        );
    }
    assert_eq!(records.len(), 4, "{records:?}");
    assert!(!format!("{records:?}").contains("replayed-state"));
}

#[tokio::test]
async fn a_consent_is_recorded_before_it_is_acted_on_and_a_changed_redirect_uri_is_refused() {
    let pages = pages().await;
    let id = pages.link().await;
    let cookie = pages.signed_in(&alice());
    let (_, page) =
        pages.send(Request::get(format!("/connect/{id}")).header("cookie", &cookie).body(Body::empty()).unwrap()).await;
    let marker = "name=\"csrf\" value=\"";
    let start = page.find(marker).unwrap() + marker.len();
    let csrf = page[start..start + page[start..].find('"').unwrap()].to_owned();
    let redirect = pages.oauth.redirect_uri();
    let tampered = format!("{redirect}/");
    let changed = consent_form(&id, &cookie, &[("csrf", &csrf), ("decision", "approve"), ("redirect_uri", &tampered)]);
    assert_eq!(pages.send(changed).await.0, StatusCode::BAD_REQUEST);
    let approve = consent_form(&id, &cookie, &[("csrf", &csrf), ("decision", "approve"), ("redirect_uri", &redirect)]);
    let (status, _) = pages.send(approve).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let source = &pages.audit.digest("192.0.2.30")[..16];
    let records = pages.records().await;
    assert_eq!(records.get("consent/redirect_uri"), Some(&("deny".to_owned(), format!("source={source} count=1"))));
    assert_eq!(records.get("consent/approved"), Some(&("allow".to_owned(), format!("source={source} upstream=files"))));
    // The grant names the person and the MCP client by their keyed digests only.
    let stored = pages.store.recent(100).await.unwrap();
    let approved = stored.iter().find(|r| r.record.operation == "consent/approved").unwrap();
    assert_eq!(approved.record.principal_digest, Some(pages.audit.digest("https://idp.test#alice")));
    assert_eq!(approved.record.client_digest, Some(pages.audit.digest("https://client.test/app.json")));
    assert!(!format!("{stored:?}").contains("alice\"") && !format!("{stored:?}").contains("client.test"));
}
