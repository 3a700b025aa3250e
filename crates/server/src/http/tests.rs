//! The HTTP transport's tests: the accept loop's endpoint against the router, and the
//! transport checks.

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};

use super::*;
use crate::http_response::transport_headers;

/// `serve`'s [`Endpoint`] and the router it wraps give the same answer to every kind of
/// request (the router's own `/mcp` route is what embedders of [`router`] use).
#[tokio::test]
async fn the_endpoint_answers_as_the_router_does() {
    use tower::ServiceExt as _;
    let app = crate::App::builder("t", "0").build().unwrap();
    let server = Arc::new(
        Server::builder(
            app,
            crate::ServerConfig::default(),
            crate::auth::Authenticator::UnauthenticatedLoopback,
            crate::secret::ServerSecret::random(),
        )
        .without_audit()
        .build()
        .unwrap(),
    );
    let local: SocketAddr = "127.0.0.1:4000".parse().unwrap();
    let (router, state) = router_with_state(server, local, Routes::Public { metrics: false });
    let endpoint = Endpoint { state, router: router.clone(), mcp: true };
    let request = |method: &str, uri: &str, host: &str| {
        axum::extract::Request::builder()
            .method(method)
            .uri(uri)
            .header(header::HOST, host)
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#))
            .unwrap()
    };
    let cases = [
        (("GET", "/mcp", "127.0.0.1:4000"), StatusCode::METHOD_NOT_ALLOWED),
        (("POST", "/mcp", "evil.example:4000"), StatusCode::FORBIDDEN),
        (("POST", "/mcp?access_token=x", "127.0.0.1:4000"), StatusCode::BAD_REQUEST),
        // Reaches the pipeline: an app with no tools has no tools/list (-32601, 404).
        (("POST", "/mcp", "127.0.0.1:4000"), StatusCode::NOT_FOUND),
        (("GET", "/healthz", "127.0.0.1:4000"), StatusCode::OK),
        (("GET", "/healthz", "evil.example:4000"), StatusCode::OK),
        // Not on the public listener unless asked for.
        (("GET", "/metrics", "127.0.0.1:4000"), StatusCode::NOT_FOUND),
        (("POST", "/other", "127.0.0.1:4000"), StatusCode::NOT_FOUND),
    ];
    for ((method, uri, host), expected) in cases {
        let mut answers = Vec::new();
        for response in [
            router.clone().oneshot(request(method, uri, host)).await.unwrap(),
            endpoint.serve(request(method, uri, host)).await,
        ] {
            let status = response.status();
            let allow = response.headers().get(header::ALLOW).cloned();
            let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
            answers.push((status, allow, body));
        }
        assert_eq!(answers[0].0, expected, "{method} {uri} (host {host})");
        if expected == StatusCode::NOT_FOUND && uri == "/mcp" {
            assert!(String::from_utf8_lossy(&answers[0].2).contains("-32601"), "the pipeline's answer");
        }
        assert_eq!(answers[0], answers[1], "{method} {uri} (host {host})");
    }
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(value).unwrap());
    }
    map
}

#[test]
fn transport_headers_are_read_in_one_pass() {
    let found = transport_headers(&headers(&[
        ("host", "127.0.0.1:1"),
        ("MCP-Protocol-Version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("Mcp-Name", "product_get"),
        ("mcp-param-sku", "TEA-001"),
        ("Mcp-Param-Region", "eu"),
        ("mcp-session-id", "not a routing header"),
        ("authorization", "Bearer abc"),
    ]));
    assert_eq!(found.protocol_version.as_deref(), Some(&b"2026-07-28"[..]));
    assert_eq!(found.method.as_deref(), Some(&b"tools/call"[..]));
    assert_eq!(found.name.as_deref(), Some(&b"product_get"[..]));
    assert_eq!(found.authorization.as_deref(), Some(&b"Bearer abc"[..]));
    let mut params = found.params.clone();
    params.sort();
    assert_eq!(params, vec![("region".to_owned(), b"eu".to_vec()), ("sku".to_owned(), b"TEA-001".to_vec())]);
    assert_eq!(found.duplicate, None);

    let none = transport_headers(&headers(&[("host", "127.0.0.1:1"), ("x-mcp-method", "tools/call")]));
    assert!(none.protocol_version.is_none() && none.method.is_none() && none.name.is_none());
    assert!(none.authorization.is_none() && none.params.is_empty() && none.duplicate.is_none());
}

#[test]
fn a_repeated_routing_or_authorization_header_is_flagged() {
    for (name, display) in
        [("mcp-protocol-version", "MCP-Protocol-Version"), ("mcp-method", "Mcp-Method"), ("mcp-name", "Mcp-Name")]
    {
        let found = transport_headers(&headers(&[(name, "first"), ("mcp-param-x", "1"), (name, "second")]));
        assert_eq!(found.duplicate.as_deref(), Some(display), "{name}");
        let kept = [&found.protocol_version, &found.method, &found.name];
        assert_eq!(kept.iter().filter(|v| v.as_deref() == Some(&b"first"[..])).count(), 1, "{name}: first value kept");
        assert!(kept.iter().all(|v| v.as_deref() != Some(&b"second"[..])), "{name}");
    }
    // The first repeated header in the check's order is the one named.
    let both =
        transport_headers(&headers(&[("mcp-name", "a"), ("mcp-name", "b"), ("mcp-method", "c"), ("mcp-method", "d")]));
    assert_eq!(both.duplicate.as_deref(), Some("Mcp-Method"));
    // A repeated parameter header, in either order of its values.
    for (first, second) in [("1", "2"), ("2", "1")] {
        let found = transport_headers(&headers(&[("mcp-param-qty", first), ("Mcp-Param-Qty", second)]));
        assert_eq!(found.duplicate.as_deref(), Some("Mcp-Param-qty"));
    }
    // Two Authorization headers: an empty credential, which authentication refuses.
    let twice = transport_headers(&headers(&[("authorization", "Bearer a"), ("authorization", "Bearer b")]));
    assert_eq!(twice.authorization.as_deref(), Some(&b""[..]));
}
