//! The transport module: what a Streamable HTTP endpoint must refuse before any method runs
//! (DNS rebinding and cross-site requests, limits, JSON-RPC framing, header/body agreement,
//! versions, removed methods, authentication, HTTP methods and media types). Each case sends a
//! correct request first (its positive control) and then the same request with one thing
//! broken; for behaviour the spec leaves open the verdict is a WARNING, not a FAIL.

use serde_json::{Value, json};

use crate::check::{Check, Judgement, Outcome, Verdict, paired};
use crate::modules::{Context, Module, cases};
use crate::target::{Auth, Exchange, Probe};

/// The transport module.
pub fn module() -> Module {
    Module {
        name: "transport",
        exclusive: false,
        cases: cases! {
            host_foreign: "transport.host.foreign", "A Host the server does not serve is refused (DNS rebinding)",
                "streamable-http §Security: validate Host/Origin; conformance dns-rebinding-protection", High;
            host_suffix: "transport.host.lookalike", "A Host that merely starts with the server's name is refused",
                "streamable-http §Security (DNS rebinding)", High;
            origin_foreign: "transport.origin.foreign", "A foreign Origin is refused with 403",
                "streamable-http: servers MUST validate Origin; invalid → 403", High;
            origin_null: "transport.origin.null", "`Origin: null` (sandboxed or file pages) is refused",
                "streamable-http: servers MUST validate Origin", High;
            origin_repeated: "transport.origin.repeated", "Two Origin headers are refused",
                "streamable-http: servers MUST validate Origin", Medium;
            body_oversize: "transport.body.oversize", "A 4 MiB body is refused cleanly (413 or an error, never a result)",
                "seed: bounded resources per request", Medium;
            header_huge: "transport.header.huge", "A 64 KiB header is refused",
                "seed: bounded resources per request (RFC 9110 §15.5.22: 431)", Low;
            batch_array: "transport.batch.array", "A JSON-RPC batch (array) is refused",
                "basic/index: no batching", Medium;
            batch_empty: "transport.batch.empty", "An empty batch `[]` is refused",
                "basic/index: no batching", Low;
            id_null: "transport.id.null", "`id: null` is refused",
                "basic/index: request ids are strings or integers, never null", Medium;
            id_float: "transport.id.float", "A fractional id (`1.5`) is refused",
                "basic/index: request ids are strings or integers", Low;
            id_object: "transport.id.object", "An object id is refused",
                "basic/index: request ids are strings or integers", Low;
            meta_missing: "transport.meta.missing", "A request without `_meta` is refused with -32602 (400)",
                "basic/index: every request needs params._meta; missing → -32602, HTTP 400", Medium;
            method_header_mismatch: "transport.header.method_mismatch", "`Mcp-Method` differing from the body's method is refused with -32020",
                "streamable-http §Headers: mismatch → 400 + -32020", High;
            method_header_missing: "transport.header.method_missing", "A request without `Mcp-Method` is refused with -32020",
                "streamable-http §Headers: missing → 400 + -32020", Medium;
            name_header_mismatch: "transport.header.name_mismatch", "`Mcp-Name` differing from the params' name is refused with -32020",
                "streamable-http §Headers: Mcp-Name = params.name/uri; mismatch → 400 + -32020", High;
            name_header_missing: "transport.header.name_missing", "A routed request without `Mcp-Name` is refused with -32020",
                "streamable-http §Headers: missing → 400 + -32020", Medium;
            version_header_mismatch: "transport.header.version_mismatch", "`MCP-Protocol-Version` differing from `_meta` is refused with -32020",
                "streamable-http §Headers: MCP-Protocol-Version equal to _meta protocolVersion", High;
            version_header_missing: "transport.header.version_missing", "A request without `MCP-Protocol-Version` is refused with -32020",
                "streamable-http §Validation (MAY read as 2025-03-26; conformance expects -32020)", Low;
            version_unsupported: "transport.version.unsupported", "An unsupported version is answered -32022 naming the supported ones",
                "basic/versioning: -32022 with data.supported and data.requested, HTTP 400", Medium;
            removed_initialize: "transport.removed.initialize", "`initialize` on a 2026-07-28 request is not served",
                "server/discover: initialize does not exist in 2026-07-28 (dual-era servers MAY serve it)", Low;
            removed_ping: "transport.removed.ping", "`ping` on a 2026-07-28 request is not served",
                "changelog: ping removed → -32601 (404)", Low;
            removed_tasks_list: "transport.removed.tasks_list", "`tasks/list` is not served",
                "ext-tasks: tasks/list removed; conformance expects -32601", Medium;
            removed_tasks_result: "transport.removed.tasks_result", "`tasks/result` is not served",
                "ext-tasks: tasks/result removed; conformance expects -32601", Medium;
            auth_missing: "transport.auth.missing", "A request without a token is refused with 401 and a challenge naming resource_metadata",
                "authorization: RFC 9728 WWW-Authenticate resource_metadata; RFC 6750 §3", Critical;
            http_get: "transport.http.get", "GET on the endpoint without a session opens no stream",
                "streamable-http: GET → 405 in 2026-07-28", Medium;
            http_delete: "transport.http.delete", "DELETE on the endpoint without a session is refused",
                "streamable-http: DELETE → 405 in 2026-07-28", Low;
            content_type_wrong: "transport.content_type.wrong", "A `text/plain` body is refused",
                "streamable-http: POST bodies are application/json (415 expected)", Low;
            content_type_missing: "transport.content_type.missing", "A body without `Content-Type` is refused",
                "streamable-http: POST bodies are application/json (415 expected)", Low;
            accept_no_json: "transport.accept.no_json", "`Accept` allowing neither JSON nor SSE is refused",
                "streamable-http: clients MUST accept application/json and text/event-stream (406 expected)", Low;
        },
    }
}

/// How a negative case's answer is judged.
fn judge_status(negative: &Exchange, expected: &[u16]) -> Judgement {
    if negative.accepted() {
        return Judgement::Accepted(format!("served ({})", negative.summary()));
    }
    match negative.status {
        Some(status) if expected.contains(&status) => Judgement::Refused,
        _ => Judgement::RefusedOddly(format!("refused, but with {} (expected HTTP {expected:?})", negative.summary())),
    }
}

fn judge_code(negative: &Exchange, code: i64, status: u16) -> Judgement {
    if negative.accepted() {
        return Judgement::Accepted(format!("served ({})", negative.summary()));
    }
    if negative.error_code() == Some(code) && negative.status == Some(status) {
        Judgement::Refused
    } else {
        Judgement::RefusedOddly(format!(
            "refused, but with {} (expected HTTP {status}, error {code})",
            negative.summary()
        ))
    }
}

/// Refused in any clean way: an HTTP 4xx or a JSON-RPC error, never a result.
fn judge_clean(negative: &Exchange) -> Judgement {
    if negative.accepted() {
        Judgement::Accepted(format!("served ({})", negative.summary()))
    } else if negative.client_error() || negative.error().is_some() {
        Judgement::Refused
    } else {
        Judgement::RefusedOddly(format!("not served, but not refused cleanly either ({})", negative.summary()))
    }
}

async fn pair(ctx: &Context, check: Check, control: Probe, negative: Probe) -> (Exchange, Exchange) {
    let _ = check;
    let control = ctx.target.send(control).await;
    let negative = ctx.target.send(negative).await;
    (control, negative)
}

async fn with_header(ctx: &Context, check: Check, name: &str, value: &str, expected: &[u16], odd: Verdict) -> Outcome {
    let (c, n) = pair(ctx, check, ctx.base(), ctx.base().header(name, value)).await;
    paired(&check, &c, &n, judge_status(&n, expected), odd)
}

async fn host_foreign(ctx: &Context, check: Check) -> Outcome {
    with_header(ctx, check, "host", "rebind.palisade-verify.invalid", &[403], Verdict::Warning).await
}

async fn host_suffix(ctx: &Context, check: Check) -> Outcome {
    let host = ctx.target.url().host_str().unwrap_or("localhost").to_owned();
    let value = format!("{host}.palisade-verify.invalid");
    with_header(ctx, check, "host", &value, &[403], Verdict::Warning).await
}

async fn origin_foreign(ctx: &Context, check: Check) -> Outcome {
    with_header(ctx, check, "origin", "https://attacker.palisade-verify.invalid", &[403], Verdict::Fail).await
}

async fn origin_null(ctx: &Context, check: Check) -> Outcome {
    with_header(ctx, check, "origin", "null", &[403], Verdict::Fail).await
}

async fn origin_repeated(ctx: &Context, check: Check) -> Outcome {
    let negative = ctx.base().append("origin", "null").append("origin", "https://attacker.palisade-verify.invalid");
    let (c, n) = pair(ctx, check, ctx.base(), negative).await;
    paired(&check, &c, &n, judge_status(&n, &[403]), Verdict::Warning)
}

async fn body_oversize(ctx: &Context, check: Check) -> Outcome {
    let mut frame = ctx.base().frame();
    frame["id"] = ctx.target.next_id();
    frame["params"]["cursor"] = json!("x".repeat(4 * 1024 * 1024));
    let id = frame["id"].clone();
    let negative = ctx.base().id(id).body(frame.to_string().into_bytes());
    let control = ctx.target.send(ctx.base()).await;
    let n = ctx.target.send_early_answer(negative).await;
    let c = control;
    let judgement = if n.status.is_none() && !n.accepted() {
        Judgement::RefusedOddly(format!("the connection ended without an answer ({})", n.summary()))
    } else {
        judge_clean(&n)
    };
    paired(&check, &c, &n, judgement, Verdict::Warning)
}

async fn header_huge(ctx: &Context, check: Check) -> Outcome {
    let negative = ctx.base().header("x-palisade-verify-padding", "a".repeat(64 * 1024));
    let (c, n) = pair(ctx, check, ctx.base(), negative).await;
    // Nothing in the spec bounds headers: being served is a weakness, not a violation.
    let judgement = match judge_clean(&n) {
        Judgement::Accepted(why) => Judgement::RefusedOddly(format!("a 64 KiB header was accepted: {why}")),
        other => other,
    };
    paired(&check, &c, &n, judgement, Verdict::Warning)
}

/// The base request sent as `body` (built from its frame), with the frame's id.
fn raw(ctx: &Context, id: Value, body: Value) -> Probe {
    ctx.base().id(id).body(body.to_string().into_bytes())
}

async fn batch_array(ctx: &Context, check: Check) -> Outcome {
    let mut frame = ctx.base().frame();
    let id = ctx.target.next_id();
    frame["id"] = id.clone();
    let (c, n) = pair(ctx, check, ctx.base(), raw(ctx, id, json!([frame]))).await;
    paired(&check, &c, &n, judge_clean(&n), Verdict::Warning)
}

async fn batch_empty(ctx: &Context, check: Check) -> Outcome {
    let (c, n) = pair(ctx, check, ctx.base(), raw(ctx, Value::Null, json!([]))).await;
    paired(&check, &c, &n, judge_clean(&n), Verdict::Warning)
}

async fn with_id(ctx: &Context, check: Check, id: Value) -> Outcome {
    let mut frame = ctx.base().frame();
    frame["id"] = id.clone();
    let (c, n) = pair(ctx, check, ctx.base(), raw(ctx, id, frame)).await;
    paired(&check, &c, &n, judge_clean(&n), Verdict::Warning)
}

async fn id_null(ctx: &Context, check: Check) -> Outcome {
    with_id(ctx, check, Value::Null).await
}

async fn id_float(ctx: &Context, check: Check) -> Outcome {
    with_id(ctx, check, json!(1.5)).await
}

async fn id_object(ctx: &Context, check: Check) -> Outcome {
    with_id(ctx, check, json!({ "n": 1 })).await
}

async fn meta_missing(ctx: &Context, check: Check) -> Outcome {
    let mut negative = ctx.base();
    negative.params = json!({});
    let (c, n) = pair(ctx, check, ctx.base(), negative).await;
    paired(&check, &c, &n, judge_code(&n, -32602, 400), Verdict::Fail)
}

async fn method_header_mismatch(ctx: &Context, check: Check) -> Outcome {
    let (c, n) = pair(ctx, check, ctx.base(), ctx.base().header("mcp-method", "prompts/list")).await;
    paired(&check, &c, &n, judge_code(&n, -32020, 400), Verdict::Fail)
}

async fn method_header_missing(ctx: &Context, check: Check) -> Outcome {
    let (c, n) = pair(ctx, check, ctx.base(), ctx.base().without("mcp-method")).await;
    paired(&check, &c, &n, judge_code(&n, -32020, 400), Verdict::Fail)
}

async fn name_header_mismatch(ctx: &Context, check: Check) -> Outcome {
    let Some(named) = ctx.named().await else {
        return Outcome::new(
            &check,
            Verdict::NotTestable,
            "the target lists no readable resource or argument-free prompt",
        );
    };
    let (c, n) = pair(ctx, check, named.clone(), named.header("mcp-name", "palisade-verify-other-name")).await;
    paired(&check, &c, &n, judge_code(&n, -32020, 400), Verdict::Fail)
}

async fn name_header_missing(ctx: &Context, check: Check) -> Outcome {
    let Some(named) = ctx.named().await else {
        return Outcome::new(
            &check,
            Verdict::NotTestable,
            "the target lists no readable resource or argument-free prompt",
        );
    };
    let (c, n) = pair(ctx, check, named.clone(), named.without("mcp-name")).await;
    paired(&check, &c, &n, judge_code(&n, -32020, 400), Verdict::Fail)
}

async fn version_header_mismatch(ctx: &Context, check: Check) -> Outcome {
    let (c, n) = pair(ctx, check, ctx.base(), ctx.base().header("mcp-protocol-version", "2025-11-25")).await;
    paired(&check, &c, &n, judge_code(&n, -32020, 400), Verdict::Fail)
}

async fn version_header_missing(ctx: &Context, check: Check) -> Outcome {
    let (c, n) = pair(ctx, check, ctx.base(), ctx.base().without("mcp-protocol-version")).await;
    // The spec lets a server read a missing header as an old version: served is a WARNING.
    let judgement = match judge_code(&n, -32020, 400) {
        Judgement::Accepted(why) => Judgement::RefusedOddly(format!("served without the header: {why}")),
        other => other,
    };
    paired(&check, &c, &n, judgement, Verdict::Warning)
}

async fn version_unsupported(ctx: &Context, check: Check) -> Outcome {
    let requested = "2099-01-01";
    let mut negative = ctx.base().header("mcp-protocol-version", requested);
    negative.params["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!(requested);
    let (c, n) = pair(ctx, check, ctx.base(), negative).await;
    let judgement = match judge_code(&n, -32022, 400) {
        Judgement::Refused => {
            let data = n.error().and_then(|error| error.get("data"));
            let supported = data.and_then(|d| d.get("supported")).and_then(Value::as_array);
            let names_versions = supported.is_some_and(|s| !s.is_empty() && s.iter().all(Value::is_string));
            let echoes = data.and_then(|d| d.get("requested")) == Some(&json!(requested));
            if names_versions && echoes {
                Judgement::Refused
            } else {
                Judgement::RefusedOddly("-32022 without data.supported (non-empty) and data.requested".into())
            }
        }
        other => other,
    };
    paired(&check, &c, &n, judgement, Verdict::Fail)
}

async fn removed(ctx: &Context, check: Check, method: &str, params: Value, served: Verdict) -> Outcome {
    let negative = Probe::request(method, params, ctx.auth());
    let (c, n) = pair(ctx, check, ctx.base(), negative).await;
    let judgement = match judge_code(&n, -32601, 404) {
        Judgement::Accepted(why) if served == Verdict::Warning => {
            Judgement::RefusedOddly(format!("served (a dual-era server may): {why}"))
        }
        other => other,
    };
    paired(&check, &c, &n, judgement, Verdict::Warning)
}

async fn removed_initialize(ctx: &Context, check: Check) -> Outcome {
    let params = json!({
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": { "name": "palisade-verify", "version": env!("CARGO_PKG_VERSION") }
    });
    removed(ctx, check, "initialize", params, Verdict::Warning).await
}

async fn removed_ping(ctx: &Context, check: Check) -> Outcome {
    removed(ctx, check, "ping", json!({}), Verdict::Fail).await
}

async fn removed_tasks_list(ctx: &Context, check: Check) -> Outcome {
    removed(ctx, check, "tasks/list", json!({}), Verdict::Fail).await
}

async fn removed_tasks_result(ctx: &Context, check: Check) -> Outcome {
    removed(ctx, check, "tasks/result", json!({ "taskId": "palisade-verify-none" }), Verdict::Fail).await
}

async fn auth_missing(ctx: &Context, check: Check) -> Outcome {
    let mut negative = ctx.base();
    negative.auth = Auth::None;
    let (c, n) = pair(ctx, check, ctx.base(), negative).await;
    let judgement = match judge_status(&n, &[401]) {
        Judgement::Refused => {
            let challenge = n.header("www-authenticate").unwrap_or_default().to_ascii_lowercase();
            if challenge.starts_with("bearer") && challenge.contains("resource_metadata=") {
                Judgement::Refused
            } else {
                Judgement::RefusedOddly("401 without a Bearer challenge naming resource_metadata".into())
            }
        }
        other => other,
    };
    paired(&check, &c, &n, judgement, Verdict::Fail)
}

/// A 2xx answer to a GET or DELETE whose body is a JSON-RPC error and no event stream (a 2025-era
/// server saying "session id required" with HTTP 200): nothing was opened or ended, so it is a
/// refusal in the wrong shape, not the method served.
fn refused_in_body(n: &Exchange) -> Option<Judgement> {
    let stream = n.header("content-type").is_some_and(|t| t.to_ascii_lowercase().starts_with("text/event-stream"));
    (n.error().is_some() && !stream)
        .then(|| Judgement::RefusedOddly(format!("refused in the body: {} (405 expected)", n.summary())))
}

async fn http_get(ctx: &Context, check: Check) -> Outcome {
    let negative = ctx.base().http_method(reqwest::Method::GET).header("accept", "text/event-stream");
    let (c, n) = pair(ctx, check, ctx.base(), negative).await;
    let judgement = match n.status {
        Some(405) => Judgement::Refused,
        Some(status) if (200..300).contains(&status) => refused_in_body(&n)
            .unwrap_or_else(|| Judgement::Accepted(format!("a GET without a session was answered {status}"))),
        _ if n.client_error() => Judgement::RefusedOddly(format!("refused with {} (405 expected)", n.summary())),
        _ => Judgement::RefusedOddly(format!("no clean refusal ({})", n.summary())),
    };
    paired(&check, &c, &n, judgement, Verdict::Warning)
}

async fn http_delete(ctx: &Context, check: Check) -> Outcome {
    let negative = ctx.base().http_method(reqwest::Method::DELETE);
    let (c, n) = pair(ctx, check, ctx.base(), negative).await;
    let judgement = match n.status {
        Some(405) => Judgement::Refused,
        Some(status) if (200..300).contains(&status) => {
            refused_in_body(&n).unwrap_or_else(|| Judgement::Accepted(format!("DELETE answered {status}")))
        }
        _ => Judgement::RefusedOddly(format!("refused with {} (405 expected)", n.summary())),
    };
    paired(&check, &c, &n, judgement, Verdict::Warning)
}

async fn content_type_wrong(ctx: &Context, check: Check) -> Outcome {
    with_header(ctx, check, "content-type", "text/plain", &[415], Verdict::Warning).await
}

async fn content_type_missing(ctx: &Context, check: Check) -> Outcome {
    let (c, n) = pair(ctx, check, ctx.base(), ctx.base().without("content-type")).await;
    paired(&check, &c, &n, judge_status(&n, &[415]), Verdict::Warning)
}

async fn accept_no_json(ctx: &Context, check: Check) -> Outcome {
    let (c, n) = pair(ctx, check, ctx.base(), ctx.base().header("accept", "text/html")).await;
    let judgement = match judge_status(&n, &[406]) {
        Judgement::Accepted(why) => Judgement::RefusedOddly(format!("served to a client accepting only HTML: {why}")),
        other => other,
    };
    paired(&check, &c, &n, judgement, Verdict::Warning)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_unique_and_in_the_module_namespace() {
        let module = super::module();
        assert!(module.cases.len() >= 20, "{}", module.cases.len());
        let mut ids: Vec<&str> = module.cases.iter().map(|case| case.check.id).collect();
        assert!(ids.iter().all(|id| id.starts_with("transport.")));
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), module.cases.len());
    }
}
