//! Tests of the web surface: security headers, same-origin POSTs, CSRF tokens, `__Host-` cookies,
//! the form extractor, TLS configuration and the accept loop.

use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use axum::http::Request as HttpRequest;
use axum::routing::{get, post};
use tower::ServiceExt as _;

use super::*;

fn settings() -> WebSettings {
    WebSettings {
        listen: "127.0.0.1:0".parse().unwrap(),
        public_url: Url::parse("https://127.0.0.1:8443/").unwrap(),
        tls_cert_file: PathBuf::from("/nonexistent/web.crt"),
        tls_key_file: PathBuf::from("/nonexistent/web.key"),
        review_token: None,
        operators_file: None,
        console_sample_secs: 10,
        sign_in: None,
        flow_ttl_secs: 600,
    }
}

async fn body_text(response: Response) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn assert_guarded(headers: &HeaderMap) {
    assert_eq!(headers[X_FRAME_OPTIONS], "DENY");
    assert_eq!(headers[X_CONTENT_TYPE_OPTIONS], "nosniff");
    assert_eq!(headers[CACHE_CONTROL], "no-store");
    assert_eq!(headers[REFERRER_POLICY], "same-origin");
    let csp = headers[CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(csp.contains("frame-ancestors 'none'") && csp.starts_with("default-src 'none'"), "{csp}");
}

#[tokio::test]
async fn a_page_is_a_complete_document_with_every_guard() {
    let response = page(StatusCode::OK, "Pins <review>", "<p>hello</p>");
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_guarded(&headers);
    assert_eq!(
        headers[CONTENT_SECURITY_POLICY],
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    );
    assert_eq!(headers[CONTENT_TYPE], "text/html; charset=utf-8");
    let html = body_text(response).await;
    assert!(html.starts_with("<!doctype html><html lang=\"en\">"), "{html}");
    assert!(html.contains("<title>Pins &lt;review&gt;</title>") && html.ends_with("<p>hello</p></body></html>"));
}

#[tokio::test]
async fn a_page_may_name_more_form_targets_and_set_cookies() {
    let target = Url::parse("https://as.example.com:9443/authorize?x=1").unwrap();
    let opaque = Url::parse("data:text/html,hi").unwrap();
    let cookie = host_cookie("session", "abc", 60).unwrap();
    let response = Page::new(StatusCode::OK, "t", "")
        .form_action(&target)
        .form_action(&opaque)
        .cookie(cookie.clone())
        .cookie(clear_host_cookie("old").unwrap())
        .into_response();
    let headers = response.headers();
    assert_eq!(
        headers[CONTENT_SECURITY_POLICY],
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self' https://as.example.com:9443; frame-ancestors 'none'; base-uri 'none'"
    );
    let cookies: Vec<_> = headers.get_all(SET_COOKIE).iter().collect();
    assert_eq!(cookies.len(), 2);
    assert_eq!(cookies[0], cookie);
    assert_guarded(headers);
}

#[test]
fn redirects_are_303_no_store_and_refuse_a_bad_location() {
    let response = SeeOther::to("/review").cookie(host_cookie("s", "v", 1).unwrap()).into_response();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()[LOCATION], "/review");
    assert_eq!(response.headers()[CACHE_CONTROL], "no-store");
    assert!(response.headers().contains_key(SET_COOKIE));
    assert_eq!(redirect("/x").status(), StatusCode::SEE_OTHER);
    let bad = redirect("/x\r\nSet-Cookie: a=b");
    assert_eq!(bad.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!bad.headers().contains_key(LOCATION));
}

#[tokio::test]
async fn error_pages_escape_the_message() {
    let response = error_page(StatusCode::FORBIDDEN, "<script>alert(1)</script>");
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let html = body_text(response).await;
    assert!(html.contains("<h1>Forbidden</h1><p id=\"error\">&lt;script&gt;alert(1)&lt;/script&gt;</p>"), "{html}");
}

#[test]
fn csrf_tokens_are_bound_to_their_binding() {
    let key = CsrfKey::generate().unwrap();
    let token = key.token(&["session-1", "review-decide"]);
    assert!(key.check(&["session-1", "review-decide"], &token));
    assert!(!key.check(&["session-2", "review-decide"], &token), "another session");
    assert!(!key.check(&["session-1", "review-sign-out"], &token), "another form");
    assert!(!key.check(&["session-1"], &token));
    // Parts are length-prefixed: moving a boundary is another binding.
    assert_ne!(key.token(&["ab", "c"]), key.token(&["a", "bc"]));
    assert!(!CsrfKey::generate().unwrap().check(&["session-1", "review-decide"], &token), "another key");
    let mut flipped = URL_SAFE_NO_PAD.decode(&token).unwrap();
    flipped[0] ^= 1;
    for forged in [String::new(), "AAAA".to_owned(), URL_SAFE_NO_PAD.encode(&flipped), format!("{token}A"), "%%".into()]
    {
        assert!(!key.check(&["session-1", "review-decide"], &forged), "{forged:?}");
    }
    // Derived keys agree with themselves, and a token is HMAC-SHA256 (32 bytes).
    let derived = CsrfKey::from_bytes(&[7; 32]);
    assert_eq!(derived.token(&["a"]), CsrfKey::from_bytes(&[7; 32]).token(&["a"]));
    assert_eq!(URL_SAFE_NO_PAD.decode(derived.token(&["a"])).unwrap().len(), 32);
    assert_eq!(format!("{derived:?}"), "CsrfKey(<redacted>)");
}

#[test]
fn cookies_are_host_prefixed_secure_http_only_lax() {
    let cookie = host_cookie("palisade_review", "abc-_123", 28_800).unwrap();
    assert_eq!(cookie, "__Host-palisade_review=abc-_123; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age=28800");
    assert_eq!(
        clear_host_cookie("palisade_review").unwrap(),
        "__Host-palisade_review=; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age=0"
    );
    for (name, value) in [("", "v"), ("a b", "v"), ("a;b", "v"), ("n", "a;b"), ("n", "a b"), ("n", "\"q\""), ("n", "é")]
    {
        assert!(matches!(host_cookie(name, value, 1), Err(WebError::Cookie { .. })), "{name:?}={value:?}");
    }
}

#[test]
fn read_cookie_reads_only_the_host_prefixed_cookie_once() {
    let headers = |values: &[&str]| {
        let mut map = HeaderMap::new();
        for value in values {
            map.append(COOKIE, HeaderValue::from_str(value).unwrap());
        }
        map
    };
    assert_eq!(read_cookie(&headers(&["a=1; __Host-s=xyz; b=2"]), "s").as_deref(), Some("xyz"));
    assert_eq!(read_cookie(&headers(&["a=1", "__Host-s=xyz"]), "s").as_deref(), Some("xyz"));
    assert_eq!(read_cookie(&headers(&["s=xyz"]), "s"), None, "without the prefix");
    assert_eq!(read_cookie(&headers(&["__Host-s=1; __Host-s=2"]), "s"), None, "ambiguous");
    assert_eq!(read_cookie(&headers(&["__Host-s=1", "__Host-s=1"]), "s"), None, "ambiguous");
    assert_eq!(read_cookie(&headers(&["__Host-s=a\\b"]), "s"), None, "not cookie-octets");
    assert_eq!(read_cookie(&headers(&["__Host-session=1"]), "s"), None);
    assert_eq!(read_cookie(&HeaderMap::new(), "s"), None);
}

#[test]
fn same_origin_wants_exactly_the_origin() {
    let with = |values: &[&str]| {
        let mut map = HeaderMap::new();
        for value in values {
            map.append(ORIGIN, HeaderValue::from_str(value).unwrap());
        }
        map
    };
    let origin = settings().origin();
    assert!(same_origin(&with(&["https://127.0.0.1:8443"]), &origin));
    for other in [
        &[][..],
        &["null"],
        &["https://127.0.0.1:8444"],
        &["http://127.0.0.1:8443"],
        &["https://127.0.0.1:8443/"],
        &["https://127.0.0.1:8443", "https://127.0.0.1:8443"],
    ] {
        assert!(!same_origin(&with(other), &origin), "{other:?}");
    }
}

/// A surface with one form handler that counts its runs.
fn counting_surface() -> (Router, Arc<AtomicUsize>) {
    counting_surface_on(testing::none())
}

/// [`counting_surface`], recording on `audit`.
fn counting_surface_on(audit: Arc<SurfaceAudit>) -> (Router, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let routes = Router::new().route("/hello", get(|| async { page(StatusCode::OK, "hello", "<p>hi</p>") })).route(
        "/submit",
        post(move |form: Form| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                page(StatusCode::OK, "done", &escape(form.one("field").unwrap_or("(none)")))
            }
        }),
    );
    (surface(&settings(), audit, routes), runs)
}

fn form_post(origin: Option<&str>, content_type: &str, body: impl Into<Body>) -> HttpRequest<Body> {
    let mut request = HttpRequest::post("/submit").header(CONTENT_TYPE, content_type);
    if let Some(origin) = origin {
        request = request.header(ORIGIN, origin);
    }
    request.body(body.into()).unwrap()
}

#[tokio::test]
async fn the_surface_refuses_a_post_from_another_origin_before_the_handler_runs() {
    let (router, runs) = counting_surface();
    let form = "application/x-www-form-urlencoded";
    for origin in [None, Some("https://evil.example"), Some("null")] {
        let response = router.clone().oneshot(form_post(origin, form, "field=x")).await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{origin:?}");
        assert_guarded(response.headers());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no refused request reached the handler");
    let response =
        router.clone().oneshot(form_post(Some("https://127.0.0.1:8443"), form, "field=a%3Cb")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_guarded(response.headers());
    assert!(body_text(response).await.contains("a&lt;b"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_missing_or_foreign_origin_is_on_the_audit_record_per_source() {
    let store: Arc<dyn palisade_store::AuditStore> =
        Arc::new(palisade_store::SqliteStore::open("sqlite::memory:").await.unwrap());
    let audit = testing::recording(store.clone());
    let (router, runs) = counting_surface_on(audit.clone());
    let form = "application/x-www-form-urlencoded";
    let from = |origin: Option<&str>, peer: [u8; 4]| {
        let mut request = form_post(origin, form, "field=x");
        request.extensions_mut().insert(ConnectInfo(SocketAddr::from((peer, 40000))));
        request
    };
    for request in [
        from(None, [192, 0, 2, 1]),
        from(None, [192, 0, 2, 1]),
        from(Some("https://evil.example"), [192, 0, 2, 1]),
        from(Some("null"), [192, 0, 2, 2]),
    ] {
        assert_eq!(router.clone().oneshot(request).await.unwrap().status(), StatusCode::FORBIDDEN);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let one = &audit.digest("192.0.2.1")[..16];
    let two = &audit.digest("192.0.2.2")[..16];
    let mut expected = vec![
        ("deny".to_owned(), "surface/origin_foreign".to_owned(), Some(403), format!("source={one} count=1")),
        ("deny".to_owned(), "surface/origin_foreign".to_owned(), Some(403), format!("source={two} count=1")),
        ("deny".to_owned(), "surface/origin_missing".to_owned(), Some(403), format!("source={one} count=2")),
    ];
    expected.sort();
    assert_eq!(testing::records(&audit, store.as_ref()).await, expected);
}

#[tokio::test]
async fn forms_must_be_urlencoded_and_small() {
    let (router, runs) = counting_surface();
    let origin = Some("https://127.0.0.1:8443");
    let json = router.clone().oneshot(form_post(origin, "application/json", "{}")).await.unwrap();
    assert_eq!(json.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let big = format!("field={}", "a".repeat(MAX_FORM_BYTES));
    let large =
        router.clone().oneshot(form_post(origin, "application/x-www-form-urlencoded", big.clone())).await.unwrap();
    assert_eq!(large.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // Without a Content-Length (a stream), the limit holds while reading.
    let stream = Body::from_stream(futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from(big))]));
    let streamed =
        router.clone().oneshot(form_post(origin, "application/x-www-form-urlencoded", stream)).await.unwrap();
    assert_eq!(streamed.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_guarded(streamed.headers());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let charset = router
        .clone()
        .oneshot(form_post(origin, "application/x-www-form-urlencoded; charset=UTF-8", "field=ok"))
        .await
        .unwrap();
    assert_eq!(charset.status(), StatusCode::OK);
}

#[test]
fn a_repeated_field_is_no_value() {
    let form = Form::from_fields(vec![("a".into(), "1".into()), ("a".into(), "2".into()), ("b".into(), "3".into())]);
    assert_eq!(form.one("a"), None);
    assert_eq!(form.one("b"), Some("3"));
    assert_eq!(form.one("c"), None);
}

#[tokio::test]
async fn unknown_paths_and_wrong_methods_are_guarded_too() {
    let (router, _) = counting_surface();
    let missing = router.clone().oneshot(HttpRequest::get("/nothing").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert_guarded(missing.headers());
    let wrong = router.clone().oneshot(HttpRequest::get("/submit").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(wrong.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_guarded(wrong.headers());
}

#[test]
fn tls_config_refuses_what_it_cannot_use() {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = certified.cert.pem();
    let key = certified.signing_key.serialize_pem();
    let config = tls_config(cert.as_bytes(), key.as_bytes()).unwrap();
    assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    for (cert, key) in [
        ("", key.as_str()),
        ("not pem", key.as_str()),
        (cert.as_str(), ""),
        (cert.as_str(), &other.signing_key.serialize_pem()),
    ] {
        assert!(matches!(tls_config(cert.as_bytes(), key.as_bytes()), Err(WebError::Tls { .. })));
    }
    let missing = settings().load_tls().unwrap_err().to_string();
    assert!(missing.contains("/nonexistent/web.crt") && missing.contains("cannot be read"), "{missing}");
}

#[tokio::test]
async fn serve_web_answers_over_tls_and_stops_on_shutdown() {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let tls = tls_config(certified.cert.pem().as_bytes(), certified.signing_key.serialize_pem().as_bytes()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (router, _) = counting_surface();
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(serve_web(listener, tls, router, shutdown.clone()));
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(certified.cert.pem().as_bytes()).unwrap()])
        .resolve("localhost", SocketAddr::from(([127, 0, 0, 1], port)))
        .build()
        .unwrap();
    let response = client.get(format!("https://localhost:{port}/hello")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-frame-options"], "DENY");
    assert!(response.text().await.unwrap().contains("<p>hi</p>"));
    // Plain HTTP on the TLS port gets no page.
    let plain = reqwest::Client::new().get(format!("http://127.0.0.1:{port}/hello")).send().await;
    assert!(plain.is_err() || plain.is_ok_and(|response| response.status() != 200));
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(15), served).await.unwrap().unwrap();
    assert!(client.get(format!("https://localhost:{port}/hello")).send().await.is_err(), "stopped listening");
}

#[test]
fn signed_values_open_only_for_their_purpose_and_keys() {
    let keys = PageKeys::new(hmac::Key::new(hmac::HMAC_SHA256, &[1; 32]));
    let other = PageKeys::new(hmac::Key::new(hmac::HMAC_SHA256, &[2; 32]));
    let value = keys.sign("session", b"alice.1700000000");
    assert_eq!(keys.verify("session", &value).as_deref(), Some(&b"alice.1700000000"[..]));
    assert!(keys.verify("consent", &value).is_none(), "another purpose");
    assert!(other.verify("session", &value).is_none(), "another key");
    let (payload, mac) = value.split_once('.').unwrap();
    let forged = format!("{}.{mac}", URL_SAFE_NO_PAD.encode(b"mallory.1700000000"));
    assert!(keys.verify("session", &forged).is_none(), "a changed payload");
    assert!(keys.verify("session", payload).is_none(), "no MAC");
    assert!(keys.same_secret("operator-token-0123", "operator-token-0123"));
    assert!(!keys.same_secret("operator-token-0124", "operator-token-0123"));
    assert!(!keys.same_secret("", "operator-token-0123"));
    // The CSRF key is derived, not the signing key itself: a token is not a signed value.
    let token = keys.csrf().token(&["s", "decide"]);
    assert!(keys.csrf().check(&["s", "decide"], &token) && !other.csrf().check(&["s", "decide"], &token));
}
