//! Tests of the console: the operators file, the sign-in and its separation from the review
//! page's, every section of the page with hostile values escaped, the exposition parser, the
//! bounded ring and the charts.

use palisade_base::clock::SystemClock;
use palisade_server::secret::ServerSecret;
use palisade_store::{ChainReport, ConnectionRow, SqliteStore};
use serde::Deserialize;

use super::samples::{ChainStatus, Kind, MAX_SERIES, RING, Sample, Series, parse};
use super::*;
use crate::config::{RawGateway, RawPins, RawUpstream, RawWeb};
use crate::review::tests::tool_observation;
use crate::web::testing::{get, post, send};
use crate::web::{WebSettings, surface};

const ALICE: &str = "operator-alice-token-0123";

struct Fixture {
    router: Router,
    console: Arc<Console>,
    store: Arc<dyn Store>,
    audit: Arc<palisade_server::surface_audit::SurfaceAudit>,
}

async fn fixture(review_page: bool) -> Fixture {
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        gateway: RawGateway,
        #[serde(default)]
        pins: RawPins,
        upstreams: Vec<RawUpstream>,
        web: Option<RawWeb>,
    }
    let text = "[[upstreams]]\nid = \"files\"\nurl = \"http://127.0.0.1:9/mcp\"\n\
                [web]\npublic_url = \"https://127.0.0.1:8443/\"\ntls_cert_file = \"/nonexistent/c\"\n\
                tls_key_file = \"/nonexistent/k\"\n";
    let file: File = toml::from_str(text).unwrap();
    let settings = crate::config::validate(file.gateway, file.pins, file.upstreams, file.web).unwrap();
    let web: WebSettings = settings.web.clone().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open("sqlite::memory:").await.unwrap());
    let gateway = Gateway::new(settings, store.clone(), Arc::new(SystemClock)).unwrap();
    let accounts = parse_operators(&format!("# operators\nalice {ALICE}\nbob operator-bob-token-000123\n")).unwrap();
    let key = ServerSecret::from_bytes([4; 32]).derive(KEY_LABEL);
    let console = Arc::new(Console::new(&gateway, accounts, key, None, review_page));
    let audit = crate::web::testing::recording(store.clone());
    Fixture { router: surface(&web, audit.clone(), routes(console.clone())), console, store, audit }
}

async fn sign_in(router: &Router) -> String {
    let (status, headers, _) =
        send(router, post("/console/login", None, &[("operator", "alice"), ("token", ALICE)])).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let set = headers["set-cookie"].to_str().unwrap();
    assert!(set.starts_with("__Host-palisade_console=") && set.contains("HttpOnly") && set.contains("Secure"));
    set.split(';').next().unwrap().to_owned()
}

#[test]
fn the_operators_file_is_checked_line_by_line_and_errors_never_show_a_token() {
    let accounts =
        parse_operators("\n# comment\nalice operator-alice-token-0123\n  bob   0123456789abcdef  \n").unwrap();
    assert_eq!(accounts.len(), 2);
    for (text, expected) in [
        ("", "names no operator"),
        ("alice", "line 1: write one operator a line"),
        ("alice tok en-0123456789abcdef", "line 1: write one operator a line"),
        ("<b> operator-token-0123456789", "line 1: an operator name is"),
        ("alice short-secret-1\n", "line 1: the token of operator alice is shorter than 16"),
        ("alice operator-token-0123456789\nalice operator-token-9876543210", "line 2: operator alice is named twice"),
    ] {
        let error = parse_operators(text).err().unwrap().to_string();
        assert!(error.starts_with("web.operators_file: ") && error.contains(expected), "{text:?}: {error}");
        assert!(!error.contains("secret-1") && !error.contains("0123456789"), "{error}");
    }
}

#[tokio::test]
async fn the_console_has_its_own_sign_in_and_nothing_without_it() {
    let Fixture { router, store, audit, .. } = fixture(true).await;
    let (status, headers, html) = send(&router, get("/console", None)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("action=\"/console/login\"") && !html.contains("id=\"upstreams\""), "{html}");
    assert_eq!(headers["x-frame-options"], "DENY");
    assert!(headers["content-security-policy"].to_str().unwrap().starts_with("default-src 'none'"));
    // A right token under another operator's name, a wrong token: refused, no cookie.
    for (name, token) in [("bob", ALICE), ("alice", "operator-alice-token-9999")] {
        let (status, headers, _) =
            send(&router, post("/console/login", None, &[("operator", name), ("token", token)])).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(headers.get("set-cookie").is_none());
    }
    // A review session (another page's key and cookie) and a forged cookie are no console session.
    let review = "__Host-palisade_review=abc.def";
    assert!(send(&router, get("/console", Some(review))).await.2.contains("/console/login"));
    let forged = "__Host-palisade_console=YWJjLjk5OTk5OTk5OTkuYWxpY2U.AAAA";
    assert!(send(&router, get("/console", Some(forged))).await.2.contains("/console/login"));
    // A sign-in posted from another site is refused before the console sees it.
    let mut cross = post("/console/login", None, &[("operator", "alice"), ("token", ALICE)]);
    cross.headers_mut().insert("origin", "https://evil.example".parse().unwrap());
    assert_eq!(send(&router, cross).await.0, StatusCode::FORBIDDEN);

    let cookie = sign_in(&router).await;
    let (status, _, html) = send(&router, get("/console", Some(&cookie))).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("<strong id=\"operator\">alice</strong>"), "{html}");
    // Signing out needs the form's CSRF token.
    assert_eq!(
        send(&router, post("/console/logout", Some(&cookie), &[("csrf", "AAAA")])).await.0,
        StatusCode::FORBIDDEN
    );
    let start = html.find("name=\"csrf\" value=\"").unwrap() + "name=\"csrf\" value=\"".len();
    let csrf = &html[start..start + html[start..].find('"').unwrap()];
    let (status, headers, _) = send(&router, post("/console/logout", Some(&cookie), &[("csrf", csrf)])).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(headers["set-cookie"].to_str().unwrap().contains("Max-Age=0"));

    let records = crate::web::testing::records(&audit, store.as_ref()).await;
    let operations: Vec<(&str, &str)> = records.iter().map(|r| (r.0.as_str(), r.1.as_str())).collect();
    assert!(operations.contains(&("allow", "console/signed_in")), "{operations:?}");
    assert!(operations.contains(&("deny", "console/token_wrong")) && operations.contains(&("deny", "console/csrf")));
    let signed_in = records.iter().find(|r| r.1 == "console/signed_in").unwrap();
    assert!(signed_in.3.ends_with("operator=alice"), "{signed_in:?}");
    assert!(!format!("{records:?}").contains("alice-token"), "no token on the record");
}

#[tokio::test]
async fn every_section_is_shown_and_every_hostile_value_escaped() {
    let Fixture { router, console, store, .. } = fixture(true).await;
    let hostile =
        tool_observation("files", "read<script>alert(1)</script>", "Reads <img src=x onerror=alert(2)>\u{202E}");
    store.observe_pins(vec![hostile.clone()]).await.unwrap();
    store
        .put_connection(&ConnectionRow {
            principal_key: [7; 32],
            principal: "alice <svg onload=alert(3)>".into(),
            upstream: "files".into(),
            issuer: "https://as.example".into(),
            client_id: "palisade".into(),
            scopes: "files:read".into(),
            sealed: vec![1, 2, 3],
            version: 1,
            created_ms: 1_700_000_000_000,
            updated_ms: 1_700_000_000_000,
            expires_ms: None,
        })
        .await
        .unwrap();
    let exposition = "# TYPE palisade_requests_total counter\npalisade_requests_total{outcome=\"ok\"} 10\n\
                      palisade_requests_total{outcome=\"error\"} 1\n\
                      # TYPE palisade_tool_calls_total counter\n\
                      palisade_tool_calls_total{tool=\"<img src=y>\",upstream=\"files\"} 4\n";
    console.samples().push(parse(exposition, 1_000));
    console.samples().push(parse(&exposition.replace(" 10\n", " 30\n").replace(" 4\n", " 14\n"), 11_000));
    console.samples().set_chain(ChainStatus {
        at_ms: 1_700_000_000_000,
        outcome: Ok(ChainReport { records: 3, chains: 1, checkpointed: 0, first_break: None }),
    });
    let cookie = sign_in(&router).await;
    let (_, _, html) = send(&router, get("/console", Some(&cookie))).await;
    for id in ["upstreams", "definitions", "killswitch", "connections", "delegations", "audit", "metrics"] {
        assert!(html.contains(&format!("<section id=\"{id}\">")), "{id}");
    }
    // The upstream with its counts, the pending definition linking its review form.
    assert!(html.contains("<td data-label=\"Upstream\"><b>files</b>"), "{html}");
    assert!(html.contains(&format!("href=\"/review#pin-{}\"", hostile.pin_id)), "{html}");
    assert!(html.contains("data-finding=\"hidden-characters\""), "the review findings are shown");
    assert!(html.contains("<td data-label=\"Pending\">0</td>"), "before a build the report counts nothing");
    // Nothing hostile is markup; the hidden character is a marker.
    for raw in ["<script>", "<img src=x", "<svg onload", "<img src=y>"] {
        assert!(!html.contains(raw), "{raw} is sent raw");
    }
    assert!(html.contains("read&lt;script&gt;alert(1)&lt;/script&gt;") && html.contains("\u{27E8}U+202E\u{27E9}"));
    assert!(html.contains("alice &lt;svg onload=alert(3)&gt;") && !html.contains("AQID"), "no sealed bytes");
    // The audit tail holds the sign-in; the chain status is the last verification.
    assert!(html.contains("<code>console/signed_in</code>"), "{html}");
    assert!(html.contains("Chain status: intact — 3 records in 1 chains"), "{html}");
    // The charts: request rate 2/s over the interval, the tool's counter by its labels.
    assert!(html.contains("id=\"chart-requests\"") && html.contains("all <b>2</b>"), "{html}");
    assert!(
        html.contains("id=\"chart-palisade_tool_calls_total\"")
            && html.contains("tool=&lt;img src=y&gt;, upstream=files <b>1</b>"),
        "{html}"
    );
    assert!(html.contains("<polyline") || html.contains("<circle"), "{html}");
    assert!(html.contains("No kill switch runs"));
    // Read-only: the only form is the sign-out.
    assert_eq!(html.matches("<form").count(), 1, "{html}");
}

#[tokio::test]
async fn without_the_review_page_the_console_says_how_to_decide() {
    let Fixture { router, store, .. } = fixture(false).await;
    store.observe_pins(vec![tool_observation("files", "read", "Reads.")]).await.unwrap();
    let cookie = sign_in(&router).await;
    let (_, _, html) = send(&router, get("/console", Some(&cookie))).await;
    assert!(html.contains("The review page is off") && !html.contains("href=\"/review"), "{html}");
}

#[test]
fn the_exposition_parser_keeps_only_charted_series_and_reads_labels_exactly() {
    let text = "# HELP palisade_tool_calls_total Calls.\n# TYPE palisade_tool_calls_total counter\n\
                palisade_tool_calls_total{tool=\"a \\\"b\\\" c\",upstream=\"x,y}\"} 3\n\
                # TYPE palisade_upstream_latency_seconds histogram\n\
                palisade_upstream_latency_seconds_bucket{upstream=\"u\",le=\"0.1\"} 1\n\
                palisade_upstream_latency_seconds_sum{upstream=\"u\"} 0.25\n\
                palisade_upstream_latency_seconds_count{upstream=\"u\"} 2\n\
                palisade_decisions_total{stage=\"x\"} 9\nnot a line\npalisade_tool_x{broken 1\n";
    let sample = parse(text, 5);
    let tool = Series {
        name: "palisade_tool_calls_total".into(),
        labels: vec![("tool".into(), "a \"b\" c".into()), ("upstream".into(), "x,y}".into())],
    };
    assert_eq!(sample.values.get(&tool), Some(&3.0));
    assert_eq!(sample.values.len(), 3, "{:?}", sample.values);
    assert_eq!(sample.kinds.get("palisade_upstream_latency_seconds"), Some(&Kind::Histogram));
    assert!(sample.values.keys().all(|series| !series.name.ends_with("_bucket")));

    let many: String = (0..MAX_SERIES + 5).map(|n| format!("palisade_tool_calls_total{{tool=\"t{n}\"}} 1\n")).collect();
    let sample = parse(&many, 0);
    assert_eq!((sample.values.len(), sample.dropped), (MAX_SERIES, 5));
}

#[test]
fn the_ring_is_bounded_and_histograms_chart_as_interval_means() {
    let samples = Samples::default();
    for n in 0..RING + 10 {
        samples.push(Sample { at_ms: n as i64, ..Sample::default() });
    }
    let all = samples.all();
    assert_eq!((all.len(), all[0].at_ms), (RING, 10));

    let text = |sum: f64, count: f64| {
        format!(
            "# TYPE palisade_upstream_latency_seconds histogram\n\
             palisade_upstream_latency_seconds_sum{{upstream=\"u\"}} {sum}\n\
             palisade_upstream_latency_seconds_count{{upstream=\"u\"}} {count}\n"
        )
    };
    let series = [parse(&text(1.0, 10.0), 0), parse(&text(1.5, 20.0), 10_000), parse(&text(1.5, 20.0), 20_000)];
    let charts = charts::charts(&series);
    let latency = charts.iter().find(|chart| chart.id == "chart-palisade_upstream_latency_seconds").unwrap();
    assert_eq!(latency.unit, "ms (mean)");
    // 0.5 s over 10 calls: 50 ms; an interval without calls has no point.
    assert_eq!(latency.lines[0].points, vec![(10_000, 50.0)]);
    assert_eq!(latency.lines[0].label, "upstream=u");
    let html = charts::chart_html(latency, 0, 20_000);
    assert!(html.starts_with("<figure class=\"chart\" id=\"chart-palisade_upstream_latency_seconds\">"), "{html}");
    assert!(html.contains("<circle") && html.contains("upstream=u <b>50</b>"), "{html}");
}

#[tokio::test]
async fn kill_switch_states_are_shown_by_name_where_the_deployment_can_name_them() {
    use palisade_killswitch::authority::TargetStatus;
    use palisade_killswitch::{TargetDigest, TargetKind, TargetState};

    let Fixture { console, .. } = fixture(true).await;
    let mut view = render::gather(&console).await;
    let status = |kind, digest: &str, state, reason: &str| TargetStatus {
        target: TargetDigest { kind, digest: digest.into() },
        state,
        generation: 3,
        reason_code: reason.into(),
        updated_at_ms: 1_700_000_000_000,
    };
    view.kill_switch = render::KillView::States(vec![
        (Some("upstream:files".into()), status(TargetKind::Upstream, "ab", TargetState::Disable, "incident <42>")),
        (None, status(TargetKind::Tenant, "0123456789abcdef0123", TargetState::Enable, "restored")),
    ]);
    let html = render::kill_switch_html(&view);
    assert!(
        html.contains("<code>upstream:files</code></td><td data-label=\"State\"><span class=\"bad\">DISABLE</span>"),
        "{html}"
    );
    assert!(html.contains("incident &lt;42&gt;") && html.contains("2023-11-14T22:13:20.000Z"), "{html}");
    assert!(html.contains("<code>tenant:?</code> <span class=\"muted\">0123456789abcdef</span>"), "{html}");
    view.kill_switch = render::KillView::External;
    assert!(render::kill_switch_html(&view).contains("external authority"));
}
