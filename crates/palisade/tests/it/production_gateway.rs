//! The README's deployment example of `palisade gateway`, run as written (only the port, the
//! data directory and the upstream's address replaced): the development authorization server
//! must not be reachable on it, so the attack "register a client → approve your own consent →
//! get a token for any subject → call upstream tools" gets nothing. And `config check` refuses
//! the development issuer wherever anyone but this machine can reach it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use crate::harness::{Palisade, TempDir, with_meta};

/// The TOML block of README.md that starts with the deployment example's first line.
fn readme_deployment_example() -> String {
    let readme = include_str!("../../../../README.md");
    let start = readme.find("# gateway.toml — a deployment").expect("README has the deployment example");
    let end = readme[start..].find("```").expect("the example's code block ends");
    readme[start..start + end].to_owned()
}

/// The example with its port, data directory and upstream URL replaced, and nothing else.
fn deployment_config(port: u16, data: &str, upstream: &str) -> String {
    let example = readme_deployment_example();
    let mut replaced = 0;
    let text: Vec<String> = example
        .lines()
        .map(|line| {
            let key = line.split('=').next().unwrap_or("").trim();
            let value = match key {
                "listen" => format!("listen = \"0.0.0.0:{port}\""),
                "data_dir" => format!("data_dir = \"{data}\""),
                "url" => format!("url = \"{upstream}\""),
                _ => return line.to_owned(),
            };
            replaced += 1;
            value
        })
        .collect();
    assert_eq!(replaced, 3, "the example names listen, data_dir and one upstream url:\n{example}");
    text.join("\n") + "\n"
}

/// A port free at the moment (for a configuration that must name its port).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn palisade(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_palisade")).args(args).output().expect("run palisade")
}

/// A child process, killed on drop.
pub(crate) struct Running(pub(crate) Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_readme_deployment_gateway_hands_out_no_development_tokens() {
    let upstream = Palisade::start(&[]);
    let dir = TempDir::new();
    let port = free_port();
    let config = dir.0.join("gateway.toml").to_str().unwrap().to_owned();
    std::fs::write(&config, deployment_config(port, &format!("{}/data", dir.path()), &upstream.url)).unwrap();

    // `config check` accepts it and says the development issuer is off, and why.
    let checked = palisade(&["config", "check", &config]);
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
    let stdout = String::from_utf8_lossy(&checked.stdout);
    assert!(stdout.contains("development issuer: off (never on by default for the gateway"), "{stdout}");

    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["gateway", "--config", &config])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the gateway");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let _gateway = Running(child);
    assert_eq!(line.trim(), format!("listening on http://0.0.0.0:{port}/mcp"));

    // The attacker reaches the listener with the public Host.
    let origin = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let host = "mcp.example.com";
    for path in [
        "/.well-known/oauth-authorization-server/dev-issuer",
        "/dev-issuer/.well-known/oauth-authorization-server",
        "/.well-known/openid-configuration/dev-issuer",
        "/dev-issuer/jwks",
    ] {
        let answer = http.get(format!("{origin}{path}")).header("host", host).send().await.unwrap();
        assert_eq!(answer.status(), 404, "{path}");
    }
    // Register a client…
    let registration = json!({ "redirect_uris": ["http://127.0.0.1:1/cb"], "token_endpoint_auth_method": "none" });
    let registered = http
        .post(format!("{origin}/dev-issuer/register"))
        .header("host", host)
        .json(&registration)
        .send()
        .await
        .unwrap();
    assert_eq!(registered.status(), 404, "no client registration");
    // … approve its own consent page …
    let query = "response_type=code&client_id=x&redirect_uri=http%3A%2F%2F127.0.0.1%3A1%2Fcb&code_challenge=\
                 E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM&code_challenge_method=S256&state=s";
    let page = http.get(format!("{origin}/dev-issuer/authorize?{query}")).header("host", host).send().await.unwrap();
    assert_eq!(page.status(), 404, "no consent page");
    let consent = http
        .post(format!("{origin}/dev-issuer/authorize"))
        .header("host", host)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("subject=root&tenant=any&scope=everything&decision=approve")
        .send()
        .await
        .unwrap();
    assert_eq!(consent.status(), 404, "no consent answer");
    // … and take a token.
    let token = http
        .post(format!("{origin}/dev-issuer/token"))
        .header("host", host)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("grant_type=authorization_code&code=x&client_id=x&code_verifier=x")
        .send()
        .await
        .unwrap();
    assert_eq!(token.status(), 404, "no token endpoint");

    // The resource names only the real issuer, and a call without its token is refused.
    let metadata: Value = http
        .get(format!("{origin}/.well-known/oauth-protected-resource/mcp"))
        .header("host", host)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(metadata["authorization_servers"], json!(["https://idp.example.com"]));
    let params = with_meta(json!({ "name": "fx_test_simple_text", "arguments": {} }), json!({}));
    let call = http
        .post(format!("{origin}/mcp"))
        .header("host", host)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "fx_test_simple_text")
        .body(json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(call.status(), 401);

    // `palisade dev token` has no issuer to mint for in this configuration.
    let minted = palisade(&["dev", "token", "--config", &config, "--subject", "root", "--tenant", "any"]);
    assert!(!minted.status.success());
    assert!(minted.stdout.is_empty(), "no token printed");
}

#[test]
fn config_check_refuses_the_development_issuer_where_others_reach_it() {
    let dir = TempDir::new();
    let file = dir.0.join("gateway.toml").to_str().unwrap().to_owned();
    let data = format!("{}/data", dir.path());
    let deployment = deployment_config(8090, &data, "http://127.0.0.1:9/mcp");
    let loopback = format!(
        "listen = \"127.0.0.1:8090\"\ndata_dir = \"{data}\"\n\n[[upstreams]]\nid = \"fx\"\nurl = \"http://127.0.0.1:9/mcp\"\n"
    );
    let issuer = "[[auth.issuers]]\nissuer = \"https://idp.example.com\"\n\
                  jwks_url = \"https://idp.example.com/jwks\"\nalgorithms = [\"ES256\"]\n";
    let check = |text: &str| {
        std::fs::write(&file, text).unwrap();
        let output = palisade(&["config", "check", &file]);
        (
            output.status.code(),
            format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr)),
        )
    };

    // Named deliberately on a listener others reach: refused, naming the key.
    let (code, text) = check(&deployment.replace("mode = \"bearer\"", "mode = \"bearer\"\ndev_issuer = true"));
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("auth.dev_issuer") && text.contains("loopback"), "{text}");
    // A loopback listener behind a public URL is reached by others too.
    let public = loopback.replace("data_dir", "public_url = \"https://mcp.example.com/mcp\"\ndata_dir");
    let (code, text) = check(&format!("{public}[auth]\ndev_issuer = true\n"));
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("auth.dev_issuer"), "{text}");
    // A gateway on loopback does not get it by default: it needs real issuers or the flag.
    let (code, text) = check(&loopback);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("auth.issuers"), "{text}");
    let (code, text) = check(&format!("{loopback}[auth]\ndev_issuer = true\n"));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("development issuer: on (auth.dev_issuer = true)"), "{text}");
    // Beside real issuers only when both are named.
    let (code, text) = check(&format!("{loopback}{issuer}"));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("development issuer: off"), "{text}");
    let (code, text) = check(&format!("{loopback}[auth]\ndev_issuer = true\n{issuer}"));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("development issuer: on beside the configured issuers"), "{text}");
}
