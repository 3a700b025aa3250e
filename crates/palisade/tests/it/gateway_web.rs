//! The gateway's web pages (`[web]`) through the real binary: the review page's sign-in limits
//! (parallel wrong guesses past the per-source limit refused unchecked, the operator at another
//! address still signing in) and the audit records of the pages' grants and refusals; the
//! operator console in headless Chromium (tests/interop/console_page.mjs).

use std::time::{Duration, Instant};

use crate::harness::{Palisade, TempDir};
use crate::upstream_fixture::{Upstream, tool};

const REVIEW_TOKEN: &str = "operator-review-token-it-0123";
const OPERATOR: &str = "olivia";
const OPERATOR_TOKEN: &str = "operator-console-token-it-0123";
/// A description an attacker would write: markup, and a hidden right-to-left override.
const HOSTILE: &str = "Echoes its arguments. <img src=x onerror=alert(1)><script>alert(2)</script>\u{202E}";

struct Pages {
    _server: Palisade,
    origin: String,
    ca: reqwest::Certificate,
    db: std::path::PathBuf,
    config: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    _upstream: Upstream,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

async fn boot() -> Pages {
    let upstream = Upstream::start(vec![tool("echo", HOSTILE)]).await;
    let dir = TempDir::new();
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let cert = dir.0.join("web.crt");
    let key = dir.0.join("web.key");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let token = dir.0.join("review-token");
    std::fs::write(&token, REVIEW_TOKEN).unwrap();
    let operators = dir.0.join("operators");
    std::fs::write(&operators, format!("# the console's operators\n{OPERATOR} {OPERATOR_TOKEN}\n")).unwrap();
    let port = free_port();
    let config = dir.0.join("gateway.toml");
    let db = dir.0.join("palisade.db");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{data}\"\n\n[auth]\ndev_issuer = true\n\n[killswitch]\nmode = \"dev\"\n\n\
             [web]\nlisten = \"127.0.0.1:{port}\"\n\
             public_url = \"https://127.0.0.1:{port}/\"\ntls_cert_file = \"{cert}\"\ntls_key_file = \"{key}\"\n\
             review_token_file = \"{token}\"\noperators_file = \"{operators}\"\nconsole_sample_secs = 1\n\n\
             [[upstreams]]\nid = \"docs\"\nurl = \"{url}\"\n",
            data = dir.path(),
            cert = cert.display(),
            key = key.display(),
            token = token.display(),
            operators = operators.display(),
            url = upstream.url,
        ),
    )
    .unwrap();
    let server = Palisade::spawn(
        &["gateway", "--config", config.to_str().unwrap()],
        &[("PALISADE_AUDIT_TRANSPORT_REFUSAL_INTERVAL_SECS", "1")],
        dir,
    );
    Pages {
        _server: server,
        origin: format!("https://127.0.0.1:{port}"),
        ca: reqwest::Certificate::from_pem(certified.cert.pem().as_bytes()).unwrap(),
        db,
        config,
        cert,
        key,
        _upstream: upstream,
    }
}

impl Pages {
    /// A browser at `address` (a loopback address of this machine).
    fn browser(&self, address: [u8; 4]) -> reqwest::Client {
        reqwest::Client::builder()
            .tls_certs_only([self.ca.clone()])
            .local_address(std::net::IpAddr::from(address))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
    }

    async fn sign_in(&self, browser: &reqwest::Client, token: &str) -> u16 {
        let body = url::form_urlencoded::Serializer::new(String::new()).append_pair("token", token).finish();
        let response = browser
            .post(format!("{}/review/login", self.origin))
            .header("origin", &self.origin)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .unwrap();
        response.status().as_u16()
    }

    /// The records of stage `web`: `(decision, operation, code, detail)`.
    fn records(&self) -> Vec<(String, String, Option<i64>, String)> {
        let Ok(database) = rusqlite::Connection::open(&self.db) else { return Vec::new() };
        let Ok(mut query) = database
            .prepare("SELECT decision, operation, code, coalesce(detail, '') FROM audit_log WHERE stage = 'web'")
        else {
            return Vec::new();
        };
        query
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))
            .map(|rows| rows.filter_map(Result::ok).collect())
            .unwrap_or_default()
    }
}

fn counted(records: &[(String, String, Option<i64>, String)], operation: &str) -> u64 {
    records
        .iter()
        .filter(|(decision, op, _, _)| op == operation && decision == "deny")
        .filter_map(|(_, _, _, detail)| detail.rsplit("count=").next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn parallel_wrong_review_tokens_are_limited_per_source_and_every_sign_in_and_refusal_is_audited() {
    let pages = boot().await;
    let guesser = pages.browser([127, 0, 0, 1]);
    let guesses = (0..30).map(|n| {
        let (pages, guesser) = (&pages, &guesser);
        async move { pages.sign_in(guesser, &format!("operator-review-token-guess-{n:03}")).await }
    });
    let statuses = futures::future::join_all(guesses).await;
    let checked = statuses.iter().filter(|status| **status == 403).count();
    let limited = statuses.iter().filter(|status| **status == 429).count();
    assert_eq!((checked, limited), (5, 25), "{statuses:?}");
    // The operator at another address signs in.
    let operator = pages.browser([127, 0, 0, 2]);
    assert_eq!(pages.sign_in(&operator, REVIEW_TOKEN).await, 303);
    // A form posted without Origin is refused before any page runs.
    let bare = guesser
        .post(format!("{}/review/login", pages.origin))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("token=x")
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), 403);
    let deadline = Instant::now() + Duration::from_secs(30);
    let records = loop {
        let records = pages.records();
        let complete = counted(&records, "review/rate_limited") == 25
            && counted(&records, "review/token_wrong") == 5
            && counted(&records, "surface/origin_missing") == 1
            && records.iter().any(|(decision, op, _, _)| decision == "allow" && op == "review/signed_in");
        if complete || Instant::now() > deadline {
            break records;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(counted(&records, "review/rate_limited"), 25, "{records:?}");
    assert_eq!(counted(&records, "review/token_wrong"), 5, "{records:?}");
    assert_eq!(counted(&records, "surface/origin_missing"), 1, "{records:?}");
    let signed_in = records.iter().find(|(_, op, _, _)| op == "review/signed_in").expect("review/signed_in");
    // The two sources are told apart by digests; no address, token or guess is recorded.
    let guesser_source = records.iter().find(|(_, op, _, _)| op == "review/token_wrong").unwrap().3.clone();
    assert_ne!(signed_in.3.split(' ').next(), guesser_source.split(' ').next());
    let text = format!("{records:?}");
    assert!(!text.contains("127.0.0") && !text.contains("operator-review-token"), "{text}");
}

/// The operator console in headless Chromium: sign-in, every section with the upstream and its
/// pending definition, the upstream the operator switched off, the CSP, framing and forged-POST refusals, the layout at 390 px and the
/// landmarks' boxes against tests/interop/console-layout.json (tests/interop/console_page.mjs
/// says what each check is).
#[tokio::test]
async fn the_operator_console_in_headless_chromium() {
    let tools = crate::gateway_stdio_servers::test_tools();
    let pages = boot().await;
    // An operator switches the upstream off at the (development) authority (`--force`: with nothing
    // approved yet, the development policy has no rule that asks for upstream targets).
    let disabled = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["authority", "disable", "--target", "upstream:docs", "--reason", "incident-7", "--force", "--config"])
        .arg(&pages.config)
        .output()
        .unwrap();
    assert!(disabled.status.success(), "{}", String::from_utf8_lossy(&disabled.stderr));
    let browser = pages.browser([127, 0, 0, 1]);
    let body = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("operator", OPERATOR)
        .append_pair("token", OPERATOR_TOKEN)
        .finish();
    let signed_in = browser
        .post(format!("{}/console/login", pages.origin))
        .header("origin", &pages.origin)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), 303);
    let cookie = signed_in.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_owned();
    // The console has figures once it sampled twice and verified the chains once.
    let deadline = Instant::now() + Duration::from_secs(60);
    let html = loop {
        let page = browser.get(format!("{}/console", pages.origin)).header("cookie", &cookie).send().await.unwrap();
        let html = page.text().await.unwrap();
        let charted = html.split("id=\"chart-requests\"").nth(1).is_some_and(|chart| {
            let chart = &chart[..chart.find("</figure>").unwrap_or(chart.len())];
            chart.contains("<polyline") || chart.contains("<circle")
        });
        if (charted && html.contains("Chain status: intact")) || Instant::now() > deadline {
            break html;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(html.contains("Chain status: intact"), "{html}");
    assert!(!html.contains("<img src=x") && html.contains("&lt;img src=x"), "the hostile description is escaped");

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop");
    // The screenshots stay beside the build for a person (or CI) to look at.
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&out).unwrap();
    let run = std::process::Command::new(tools.join("bin/node"))
        .arg(root.join("console_page.mjs"))
        .arg(&out)
        .env("INTEROP_NODE_MODULES", tools.join("npm/node_modules"))
        .env("CHROMIUM", "/usr/bin/chromium")
        .env("CONSOLE_URL", format!("{}/console", pages.origin))
        .env("CONSOLE_OPERATOR", OPERATOR)
        .env("CONSOLE_TOKEN", OPERATOR_TOKEN)
        .env("WEB_CERT", &pages.cert)
        .env("WEB_KEY", &pages.key)
        .env("EXPECT_UPSTREAM", "docs")
        .env("EXPECT_DISABLED", "upstream:docs")
        .env("EXPECT_LAYOUT", root.join("console-layout.json"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(!stdout.contains("FAIL") && stdout.matches("ok - console:").count() >= 18, "{stdout}");
}
