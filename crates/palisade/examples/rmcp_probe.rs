//! An independent Rust client for the interop legs: the official SDK `rmcp`, pinned to
//! 2026-07-28, lists the tools of a server (a Palisade gateway, in scripts/interop) and calls
//! each named one, checking the text it answers.
//!
//! Usage: `rmcp_probe URL [NAME ARGS_JSON EXPECTED_TEXT]...` — for each triple, NAME must be
//! listed and `tools/call NAME ARGS_JSON` must answer a first text block equal to
//! EXPECTED_TEXT. Prints one `ok - rmcp: …` or `FAIL - rmcp: …` line per check and exits 1 if
//! any check failed (2 on bad usage).

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, ClientConfig, JsonObject, ProtocolVersion};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt};

/// Every request of the probe answers within this, or the check fails.
const CHECK_TIMEOUT: Duration = Duration::from_secs(20);

struct Report {
    failures: usize,
}

impl Report {
    fn line(&mut self, ok: bool, name: &str, detail: &str) {
        if !ok {
            self.failures += 1;
        }
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{} - rmcp: {name}: {detail}", if ok { "ok" } else { "FAIL" });
    }
}

struct Call {
    name: String,
    arguments: JsonObject,
    expected: String,
}

fn parse(args: &[String]) -> Result<(String, Vec<Call>), String> {
    let (url, rest) = args.split_first().ok_or("no URL")?;
    if !rest.len().is_multiple_of(3) {
        return Err("the checks come in triples: NAME ARGS_JSON EXPECTED_TEXT".into());
    }
    let mut calls = Vec::new();
    for triple in rest.chunks(3) {
        let arguments = serde_json::from_str::<JsonObject>(&triple[1])
            .map_err(|e| format!("{}: ARGS_JSON is not a JSON object: {e}", triple[0]))?;
        calls.push(Call { name: triple[0].clone(), arguments, expected: triple[2].clone() });
    }
    Ok((url.clone(), calls))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, calls) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(reason) => {
            eprintln!("rmcp_probe: {reason}\nusage: rmcp_probe URL [NAME ARGS_JSON EXPECTED_TEXT]...");
            return ExitCode::from(2);
        }
    };
    let mut report = Report { failures: 0 };
    run(&url, &calls, &mut report).await;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "rmcp client: {} ({} failed check(s))",
        if report.failures == 0 { "passed" } else { "FAILED" },
        report.failures
    );
    if report.failures == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

async fn run(url: &str, calls: &[Call], report: &mut Report) {
    let transport = StreamableHttpClientTransport::from_config(StreamableHttpClientTransportConfig::with_uri(url));
    let connect = ClientConfig::default().serve_with_lifecycle(
        transport,
        ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
    );
    let client = match tokio::time::timeout(CHECK_TIMEOUT, connect).await {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => return report.line(false, "connect (pinned 2026-07-28)", &e.to_string()),
        Err(_) => return report.line(false, "connect (pinned 2026-07-28)", "no answer in time"),
    };
    let negotiated = client.peer_info().map(|info| info.protocol_version.to_string());
    report.line(
        negotiated.as_deref() == Some("2026-07-28"),
        "connect (pinned 2026-07-28)",
        &format!("negotiated {}", negotiated.as_deref().unwrap_or("nothing")),
    );

    let listed = match tokio::time::timeout(CHECK_TIMEOUT, client.list_all_tools()).await {
        Ok(Ok(tools)) => tools.into_iter().map(|tool| tool.name.to_string()).collect::<Vec<_>>(),
        Ok(Err(e)) => {
            report.line(false, "tools/list", &e.to_string());
            Vec::new()
        }
        Err(_) => {
            report.line(false, "tools/list", "no answer in time");
            Vec::new()
        }
    };
    let missing: Vec<&str> =
        calls.iter().map(|call| call.name.as_str()).filter(|name| !listed.iter().any(|l| l == name)).collect();
    report.line(
        missing.is_empty() && !listed.is_empty(),
        "tools/list",
        &if missing.is_empty() {
            format!(
                "{} tools, including {}",
                listed.len(),
                calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
            )
        } else {
            format!("{} not listed in {listed:?}", missing.join(", "))
        },
    );

    for call in calls {
        let name = format!("tools/call {}", call.name);
        let request = CallToolRequestParams::new(call.name.clone()).with_arguments(call.arguments.clone());
        match tokio::time::timeout(CHECK_TIMEOUT, client.call_tool(request)).await {
            Ok(Ok(result)) => {
                let content = serde_json::to_value(&result.content).unwrap_or_default();
                let text = content.get(0).and_then(|block| block.get("text")).and_then(|t| t.as_str());
                let ok = result.is_error != Some(true) && text == Some(call.expected.as_str());
                let detail = match text {
                    Some(text) if ok => format!("{text:?}"),
                    _ => format!("content {content}, isError {:?}, expected {:?}", result.is_error, call.expected),
                };
                report.line(ok, &name, &detail);
            }
            Ok(Err(e)) => report.line(false, &name, &e.to_string()),
            Err(_) => report.line(false, &name, "no answer in time"),
        }
    }
    if let Err(e) = client.cancel().await {
        report.line(false, "close", &e.to_string());
    }
}
