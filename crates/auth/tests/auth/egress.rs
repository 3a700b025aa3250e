//! The egress guard against malicious URLs: each refused with its reason, and a fixture listener
//! on the forbidden address accepting zero connections. Names resolve through a test resolver;
//! nothing leaves the machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use palisade_auth::egress::{AddressRefusal, EgressError, EgressGuard, EgressPolicy, Resolver};
use url::Url;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::common::*;

const OK_REPLY: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";

fn guard(policy: EgressPolicy) -> EgressGuard {
    EgressGuard::new(policy).expect("guard")
}

fn url(text: &str) -> Url {
    Url::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn refused(reason: &'static str) -> EgressError {
    EgressError::AddressNotAllowed(AddressRefusal { reason, embedded_in: None })
}

fn refused_inside(form: &'static str, reason: &'static str) -> EgressError {
    EgressError::AddressNotAllowed(AddressRefusal { reason, embedded_in: Some(form) })
}

const PLAIN_HTTP: EgressError = EgressError::UrlNotAllowed("plain http");
const SCHEME: EgressError = EgressError::UrlNotAllowed("scheme");

#[tokio::test]
async fn malicious_urls_are_refused_and_nothing_connects() {
    // The "admin port": a listener on 127.0.0.1 that must never see a connection.
    let admin = Listener::start("127.0.0.1", 0, Some(OK_REPLY)).await;
    let p = admin.port;
    let strict = guard(EgressPolicy::default());
    let cases: Vec<(String, EgressError)> = vec![
        (format!("http://127.0.0.1:{p}/admin"), PLAIN_HTTP),
        (format!("https://127.0.0.1:{p}/admin"), refused("loopback")),
        (format!("http://localhost:{p}/admin"), PLAIN_HTTP),
        (format!("https://localhost:{p}/admin"), refused("loopback")),
        // Numeric spellings the URL parser turns into 127.0.0.1.
        (format!("http://2130706433:{p}/"), PLAIN_HTTP),
        (format!("https://2130706433:{p}/"), refused("loopback")),
        (format!("https://0x7f000001:{p}/"), refused("loopback")),
        (format!("https://0x7f.1:{p}/"), refused("loopback")),
        (format!("https://0177.0.0.1:{p}/"), refused("loopback")),
        (format!("https://017700000001:{p}/"), refused("loopback")),
        (format!("https://127.1:{p}/"), refused("loopback")),
        (format!("https://127.0.0.1.:{p}/"), refused("loopback")),
        // IPv6 forms of the loopback.
        (format!("https://[::ffff:127.0.0.1]:{p}/"), refused_inside("IPv4-mapped", "loopback")),
        (format!("https://[::1]:{p}/"), refused("loopback")),
        (format!("https://[::127.0.0.1]:{p}/"), refused("IPv4-compatible (deprecated)")),
        (format!("https://[64:ff9b::7f00:1]:{p}/"), refused_inside("NAT64", "loopback")),
        (format!("https://[2002:7f00:1::1]:{p}/"), refused("6to4 (embeds an IPv4 address)")),
        (format!("https://[2001:0:7f00:1::1]:{p}/"), refused("Teredo (embeds IPv4 addresses)")),
        (format!("https://0.0.0.0:{p}/"), refused("\"this network\" (unspecified)")),
        (format!("https://[::]:{p}/"), refused("unspecified")),
        // Cloud metadata services.
        ("http://169.254.169.254/latest/meta-data/".into(), PLAIN_HTTP),
        ("https://169.254.169.254/latest/meta-data/".into(), refused("link-local (cloud metadata service)")),
        ("https://2852039166/latest/meta-data/".into(), refused("link-local (cloud metadata service)")),
        (
            "https://[::ffff:169.254.169.254]/latest/".into(),
            refused_inside("IPv4-mapped", "link-local (cloud metadata service)"),
        ),
        ("https://[fd00:ec2::254]/latest/".into(), refused("unique local (cloud metadata service)")),
        ("https://10.0.0.7/".into(), refused("private-use")),
        ("https://100.64.0.1/".into(), refused("shared address space (CGNAT)")),
        ("https://[fe80::1]/".into(), refused("link-local")),
        // Not http at all.
        ("file:///etc/passwd".into(), SCHEME),
        (format!("javascript:fetch('http://127.0.0.1:{p}/')"), SCHEME),
        (format!("gopher://127.0.0.1:{p}/"), SCHEME),
        (format!("https://user:secret@127.0.0.1:{p}/"), EgressError::UrlNotAllowed("credentials in the URL")),
    ];
    for (text, expected) in cases {
        let result = strict.get(&url(&text), "*/*").await;
        assert_eq!(result.map(|f| f.status), Err(expected), "{text}");
    }
    assert_eq!(admin.connections(), 0);
}

#[tokio::test]
async fn a_name_resolving_to_a_forbidden_address_is_refused_before_connecting() {
    let admin = Listener::start("127.0.0.1", 0, Some(OK_REPLY)).await;
    let (resolver, lookups) = table_resolver(&[
        ("internal.test", &["127.0.0.1"]),
        ("metadata.test", &["169.254.169.254"]),
        ("private.test", &["10.0.0.7"]),
        ("ula.test", &["fd00:ec2::254"]),
        ("mapped.test", &["::ffff:127.0.0.1"]),
        // One public and one loopback address: any refused address refuses the name.
        ("mixed.test", &["93.184.216.34", "127.0.0.1"]),
    ]);
    let strict = guard(EgressPolicy { resolver: Some(resolver), ..EgressPolicy::default() });
    let p = admin.port;
    for (name, expected) in [
        ("internal.test", refused("loopback")),
        ("metadata.test", refused("link-local (cloud metadata service)")),
        ("private.test", refused("private-use")),
        ("ula.test", refused("unique local (cloud metadata service)")),
        ("mapped.test", refused_inside("IPv4-mapped", "loopback")),
        ("mixed.test", refused("loopback")),
        ("unknown.test", EgressError::Resolve),
    ] {
        let result = strict.get(&url(&format!("https://{name}:{p}/doc")), "*/*").await;
        assert_eq!(result.map(|f| f.status), Err(expected), "{name}");
    }
    assert_eq!(lookups.lock().expect("lock").len(), 7, "one lookup per fetch");
    assert_eq!(admin.connections(), 0);
}

#[tokio::test]
async fn rebinding_cannot_switch_the_checked_address() {
    // The name first resolves to an allowed address, then to the metadata service: each fetch
    // resolves once and connects to exactly what it checked.
    let server = Listener::start("127.0.0.1", 0, Some(OK_REPLY)).await;
    let lookups = Arc::new(AtomicUsize::new(0));
    let counter = lookups.clone();
    let rebinding = Resolver::new(move |_| match counter.fetch_add(1, Ordering::SeqCst) {
        0 => vec!["127.0.0.1".parse().expect("ip")],
        _ => vec!["169.254.169.254".parse().expect("ip")],
    });
    let dev = guard(EgressPolicy { allow_loopback: true, resolver: Some(rebinding), ..EgressPolicy::default() });
    let target = url(&format!("http://localhost:{}/doc", server.port));
    let first = dev.get(&target, "*/*").await.expect("the first answer is allowed");
    assert_eq!((first.status, first.body.as_slice()), (200, b"ok".as_slice()));
    assert_eq!((lookups.load(Ordering::SeqCst), server.connections()), (1, 1));
    let second = dev.get(&target, "*/*").await;
    assert_eq!(second.map(|f| f.status), Err(refused("link-local (cloud metadata service)")));
    assert_eq!((lookups.load(Ordering::SeqCst), server.connections()), (2, 1));
}

#[tokio::test]
async fn rebinding_under_the_strict_policy_never_reaches_the_second_address() {
    // 127.0.0.1 is allow-listed (it stands for a public address), 127.0.0.2 is not; both listen
    // on the same port, so only the checked address decides where a connection goes.
    let forbidden = Listener::start("127.0.0.2", 0, None).await;
    let allowed = Listener::start("127.0.0.1", forbidden.port, None).await;
    let lookups = Arc::new(AtomicUsize::new(0));
    let counter = lookups.clone();
    let rebinding = Resolver::new(move |_| match counter.fetch_add(1, Ordering::SeqCst) {
        0 => vec!["127.0.0.1".parse().expect("ip")],
        _ => vec!["127.0.0.2".parse().expect("ip")],
    });
    let strict = guard(EgressPolicy {
        allowed_networks: vec!["127.0.0.1/32".parse().expect("cidr")],
        resolver: Some(rebinding),
        ..EgressPolicy::default()
    });
    let target = url(&format!("https://rebind.test:{}/doc", allowed.port));
    // The allowed address gets the connection (a plain TCP listener: TLS then fails).
    assert_eq!(strict.get(&target, "*/*").await.map(|f| f.status), Err(EgressError::Transport));
    assert_eq!(strict.get(&target, "*/*").await.map(|f| f.status), Err(refused("loopback")));
    assert_eq!(lookups.load(Ordering::SeqCst), 2);
    assert_eq!((allowed.connections(), forbidden.connections()), (1, 0));
}

#[tokio::test]
async fn a_redirect_to_a_forbidden_address_is_refused_before_connecting() {
    let fixture = Listener::start("127.0.0.1", 0, Some(OK_REPLY)).await;
    let server = MockServer::start().await;
    let p = fixture.port;
    let hops = [
        ("/to-metadata", "http://169.254.169.254/latest/meta-data/".to_owned(), PLAIN_HTTP),
        (
            "/to-metadata-https",
            "https://169.254.169.254/latest/".to_owned(),
            refused("link-local (cloud metadata service)"),
        ),
        ("/to-mapped", "https://[::ffff:10.0.0.1]/".to_owned(), refused_inside("IPv4-mapped", "private-use")),
        ("/to-private-name", "https://private.test/x".to_owned(), refused("private-use")),
        // A name with a private address beside the fixture's: the fixture sees nothing.
        ("/to-mixed-name", format!("https://mixed.test:{p}/x"), refused("private-use")),
        ("/to-file", "file:///etc/passwd".to_owned(), SCHEME),
    ];
    for (from, to, _) in &hops {
        let redirect = ResponseTemplate::new(302).insert_header("location", to.as_str());
        Mock::given(method("GET")).and(path(*from)).respond_with(redirect).mount(&server).await;
    }
    let (resolver, _) = table_resolver(&[
        ("private.test", &["10.0.0.7"]),
        ("mixed.test", &["127.0.0.1", "10.0.0.7"]),
        // The mock server itself is reached by its IP literal, so no lookup is needed for it.
    ]);
    let dev = guard(EgressPolicy {
        allow_loopback: true,
        max_redirects: 3,
        resolver: Some(resolver),
        ..EgressPolicy::default()
    });
    for (from, _, expected) in hops {
        let result = dev.get(&url(&format!("{}{from}", server.uri())), "*/*").await;
        assert_eq!(result.map(|f| f.status), Err(expected), "{from}");
    }
    assert_eq!(fixture.connections(), 0);
    // Redirects refused by default (the JWKS fetch's policy).
    let strict_redirects = guard(EgressPolicy { allow_loopback: true, ..EgressPolicy::default() });
    let refused_hop = strict_redirects.get(&url(&format!("{}/to-metadata", server.uri())), "*/*").await;
    assert_eq!(refused_hop.map(|f| f.status), Err(EgressError::RedirectRefused));
}

#[tokio::test]
async fn the_allow_list_admits_listed_networks_only() {
    let listed = Listener::start("127.0.0.1", 0, None).await;
    let unlisted = Listener::start("127.0.0.2", listed.port, None).await;
    let p = listed.port;
    let (resolver, _) = table_resolver(&[
        ("internal.test", &["127.0.0.1"]),
        ("other.test", &["127.0.0.2"]),
        ("db.test", &["10.0.0.1"]),
    ]);
    let operator = guard(EgressPolicy {
        allowed_networks: vec!["127.0.0.1/32".parse().expect("cidr")],
        resolver: Some(resolver),
        ..EgressPolicy::default()
    });
    // Listed: the connection is made (the fixture speaks no TLS, hence the transport error).
    for text in [format!("https://internal.test:{p}/"), format!("https://127.0.0.1:{p}/")] {
        assert_eq!(operator.get(&url(&text), "*/*").await.map(|f| f.status), Err(EgressError::Transport), "{text}");
    }
    for (text, expected) in [
        (format!("https://other.test:{p}/"), refused("loopback")),
        (format!("https://127.0.0.2:{p}/"), refused("loopback")),
        ("https://db.test/".to_owned(), refused("private-use")),
        ("https://169.254.169.254/".to_owned(), refused("link-local (cloud metadata service)")),
        // The allow-list admits addresses, not plain http.
        (format!("http://127.0.0.1:{p}/"), PLAIN_HTTP),
    ] {
        assert_eq!(operator.get(&url(&text), "*/*").await.map(|f| f.status), Err(expected), "{text}");
    }
    assert_eq!((listed.connections(), unlisted.connections()), (2, 0));
}

#[tokio::test]
async fn an_egress_proxy_carries_https_and_literals_are_still_checked() {
    let proxy = ConnectProxy::start().await;
    let (resolver, lookups) = table_resolver(&[("idp.example.test", &["10.0.0.7"])]);
    let proxied = guard(EgressPolicy {
        proxy: Some(url(&format!("http://127.0.0.1:{}", proxy.port))),
        resolver: Some(resolver),
        ..EgressPolicy::default()
    });
    // The proxy resolves the name (our test resolver would have answered a private address).
    let result = proxied.get(&url("https://idp.example.test/jwks"), "*/*").await;
    assert_eq!(result.map(|f| f.status), Err(EgressError::Transport));
    assert_eq!(proxy.requests().len(), 1);
    assert!(proxy.requests()[0].starts_with("CONNECT idp.example.test:443 "), "{:?}", proxy.requests());
    assert!(lookups.lock().expect("lock").is_empty(), "the target name is not resolved locally");
    // Refused before anything is sent to the proxy.
    for (text, expected) in [
        ("http://idp.example.test/jwks", PLAIN_HTTP),
        ("https://169.254.169.254/latest/", refused("link-local (cloud metadata service)")),
        ("https://[::ffff:127.0.0.1]/", refused_inside("IPv4-mapped", "loopback")),
        ("https://10.0.0.7/", refused("private-use")),
        ("file:///etc/passwd", SCHEME),
    ] {
        assert_eq!(proxied.get(&url(text), "*/*").await.map(|f| f.status), Err(expected), "{text}");
    }
    assert_eq!(proxy.requests().len(), 1);

    // A proxy named by host: its own (loopback) address is the operator's choice, not checked.
    let (resolver, _) = table_resolver(&[("proxy.internal.test", &["127.0.0.1"])]);
    let by_name = guard(EgressPolicy {
        proxy: Some(url(&format!("http://proxy.internal.test:{}", proxy.port))),
        resolver: Some(resolver),
        ..EgressPolicy::default()
    });
    let result = by_name.get(&url("https://idp.example.test/jwks"), "*/*").await;
    assert_eq!(result.map(|f| f.status), Err(EgressError::Transport));
    assert_eq!(proxy.requests().len(), 2);
}

#[test]
fn a_proxy_must_be_http() {
    let socks = EgressPolicy { proxy: Some(url("socks5://127.0.0.1:1080")), ..EgressPolicy::default() };
    assert_eq!(EgressGuard::new(socks).err(), Some(EgressError::Config("the proxy URL must be http or https")));
    let with_secret =
        EgressPolicy { proxy: Some(url("http://user:hunter2@127.0.0.1:3128")), ..EgressPolicy::default() };
    let shown = format!("{with_secret:?}");
    assert!(!shown.contains("hunter2") && shown.contains("127.0.0.1:3128"), "{shown}");
}
