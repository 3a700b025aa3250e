//! The report's unit tests: the Markdown head, root causes, and SARIF's shape against the
//! SARIF 2.1.0 schema's required fields.

use super::*;
use crate::check::Severity;

const PASSING: Check = Check { id: "demo.passing", title: "t", requirement: "r", severity: Severity::Low };
const FAILING: Check = Check { id: "demo.failing", title: "t", requirement: "r", severity: Severity::High };

fn report() -> Report {
    let results = vec![
        (PASSING, Outcome::new(&PASSING, Verdict::Pass, "fine")),
        (FAILING, Outcome::new(&FAILING, Verdict::Fail, "broken")),
    ];
    Report::new("http://127.0.0.1:9/mcp", results, &Baseline::default(), Redactor::default())
}

#[test]
fn the_markdown_report_opens_with_target_date_version_and_the_verdicts() {
    let report = report();
    let markdown = report.render(Format::Markdown);
    let head: Vec<&str> = markdown.lines().take_while(|line| !line.starts_with('|')).collect();
    let head = head.join("\n");
    assert!(head.starts_with("# palisade verify report"), "{markdown}");
    assert!(head.contains("- **Target:** http://127.0.0.1:9/mcp"), "{head}");
    assert!(head.contains(&format!("- **Date:** {}", report.date)), "{head}");
    assert!(report.date.starts_with("20") && report.date.ends_with('Z'), "{}", report.date);
    assert!(head.contains(&format!("- **Verifier:** palisade-verify {}", env!("CARGO_PKG_VERSION"))), "{head}");
    assert!(head.contains("- **Identities:** none given (tokens redacted)"), "{head}");
    assert!(
        head.contains(
            "- **Verdicts:** 2 checks: 1 pass, 1 fail (1 unbaselined), 0 warning, 0 not testable, 0 inconclusive"
        ),
        "{head}"
    );
    assert_eq!(report.to_json()["date"], report.date.as_str());
    // Which program each operator command ran, in the head and in JSON.
    let report = report.with_programs(vec!["--disable-command runs /usr/bin/palisade (palisade found on PATH)".into()]);
    let markdown = report.render(Format::Markdown);
    let (head, _) = markdown.split_once("\n| check |").unwrap();
    assert!(
        head.contains("- **Command:** --disable-command runs /usr/bin/palisade (palisade found on PATH)"),
        "{markdown}"
    );
    assert_eq!(report.to_json()["programs"][0], "--disable-command runs /usr/bin/palisade (palisade found on PATH)");
}

fn identity(name: &str, token: &str, tenant: Option<&str>) -> Identity {
    Identity {
        name: name.into(),
        token: crate::identity::Token::new(token),
        tenant: tenant.map(str::to_owned),
        client: Some("shop-web".into()),
        subject: Some(name.into()),
        expired_token: None,
        other_resource_token: Some(crate::identity::Token::new(format!("{token}-other"))),
    }
}

#[test]
fn the_markdown_head_names_the_identities_and_never_their_tokens() {
    let identities = [
        identity("alice", "eyJ.alice-secret-token-value-0123456789", Some("acme")),
        identity("carol", "eyJ.carol-secret-token-value-0123456789", None),
    ];
    let redactor = Redactor::new(&identities);
    let results = vec![(FAILING, Outcome::new(&FAILING, Verdict::Fail, "broken"))];
    let report =
        Report::new("http://127.0.0.1:9/mcp", results, &Baseline::default(), redactor).with_identities(&identities);
    let markdown = report.render(Format::Markdown);
    let (head, _) = markdown.split_once("\n| check |").unwrap();
    assert!(
        head.contains(
            "- **Identities:** alice (subject alice, tenant acme, client shop-web), with another resource's token; \
             carol (subject carol, client shop-web), with another resource's token (tokens redacted)"
        ),
        "{head}"
    );
    let verdicts = head.find("- **Verdicts:**").unwrap();
    assert!(head.find("- **Identities:**").unwrap() < verdicts, "{head}");
    for format in [Format::Json, Format::Junit, Format::Markdown, Format::Sarif] {
        let text = report.render(format);
        assert!(!text.contains("secret-token-value"), "{format:?}: {text}");
    }
    assert_eq!(
        report.to_json()["identities"][1],
        "carol (subject carol, client shop-web), with another resource's token"
    );
}

const HOST: Check = Check { id: "transport.host.foreign", title: "host", requirement: "r1", severity: Severity::High };
const ORIGIN: Check =
    Check { id: "transport.origin.foreign", title: "origin", requirement: "r2", severity: Severity::High };
const SESSION: Check =
    Check { id: "sessions.other_identity", title: "s", requirement: "r3", severity: Severity::Critical };
const AUTH: Check = Check { id: "auth.jwt.alg_none", title: "a", requirement: "r4", severity: Severity::Critical };

#[test]
fn failures_of_one_shared_cause_are_grouped_and_a_lone_one_is_not() {
    let results = vec![
        (HOST, Outcome::new(&HOST, Verdict::Fail, "served")),
        (ORIGIN, Outcome::new(&ORIGIN, Verdict::Fail, "served")),
        (SESSION, Outcome::new(&SESSION, Verdict::Fail, "served")),
        (AUTH, Outcome::new(&AUTH, Verdict::Fail, "served")),
    ];
    let report = Report::new("http://127.0.0.1:9/mcp", results.clone(), &Baseline::default(), Redactor::default())
        .with_no_authentication(Some("tools/list without a token: HTTP 200".into()))
        .with_shared_causes();
    let causes: Vec<(&str, Vec<&str>)> = report.root_causes.iter().map(|c| (c.id, c.checks.clone())).collect();
    // The session FAIL follows from no authentication (claimed first); Host and Origin share
    // one cause; each keeps its own verdict.
    assert_eq!(
        causes,
        [
            ("auth.none", vec!["sessions.other_identity", "auth.jwt.alg_none"]),
            ("transport.no_rebinding_protection", vec!["transport.host.foreign", "transport.origin.foreign"]),
        ]
    );
    assert_eq!(report.count(Verdict::Fail), 4);
    let markdown = report.render(Format::Markdown);
    assert!(markdown.contains("## Root cause `transport.no_rebinding_protection`: Host and Origin are not validated"));
    assert!(markdown.contains("**What to fix:** Accept only the Host and Origin values"), "{markdown}");
    let summary = report.summary_table();
    assert!(summary.contains("ROOT CAUSE transport.no_rebinding_protection (high)"), "{summary}");
    // A target that does need a token: the session FAIL is not grouped alone.
    let report = Report::new("http://127.0.0.1:9/mcp", results, &Baseline::default(), Redactor::default())
        .with_no_authentication(None)
        .with_shared_causes();
    let causes: Vec<&str> = report.root_causes.iter().map(|c| c.id).collect();
    assert_eq!(causes, ["transport.no_rebinding_protection"]);
    assert!(report.entries[2].root_cause.is_none(), "one session FAIL alone is not grouped");
}

/// A member's name and the test of its type.
type Field<'a> = (&'a str, fn(&Value) -> bool);

/// The members of `object` the SARIF 2.1.0 schema requires, present and of the right type.
fn required(object: &Value, path: &str, fields: &[Field<'_>]) {
    assert!(object.is_object(), "{path} is not an object: {object}");
    for (name, ok) in fields {
        assert!(ok(&object[*name]), "{path}.{name} is missing or of the wrong type: {object}");
    }
}

/// A message or multiformatMessageString needs `text`.
fn message(value: &Value, path: &str) {
    required(value, path, &[("text", Value::is_string)]);
}

fn is_2_1_0(value: &Value) -> bool {
    value == "2.1.0"
}

#[test]
fn sarif_has_the_shape_the_2_1_0_schema_requires_with_rules_from_the_registry() {
    let checks: Vec<Check> =
        crate::modules::all().into_iter().flat_map(|module| module.cases).map(|case| case.check).take(40).collect();
    let results: Vec<(Check, Outcome)> = checks
        .iter()
        .enumerate()
        .map(|(i, check)| {
            let verdict = [Verdict::Pass, Verdict::Fail, Verdict::Warning, Verdict::NotTestable][i % 4];
            (*check, Outcome::new(check, verdict, format!("detail {i}")))
        })
        .collect();
    let accepted = format!("[[accepted]]\nid = \"{}\"\nreason = \"known\"\n", checks[1].id);
    let baseline: Baseline = toml::from_str(&accepted).unwrap();
    let report = Report::new("http://127.0.0.1:9/mcp", results, &baseline, Redactor::default())
        .with_no_authentication(Some("served".into()))
        .with_shared_causes();
    assert!(!report.root_causes.is_empty(), "the sample has a root cause");
    let sarif: Value = serde_json::from_str(&report.render(Format::Sarif)).unwrap();
    // sarifLog: `version` "2.1.0" and `runs`; run: `tool`; tool: `driver`; driver: `name`.
    required(&sarif, "log", &[("version", is_2_1_0), ("runs", Value::is_array)]);
    let run = &sarif["runs"][0];
    required(run, "run", &[("tool", Value::is_object), ("results", Value::is_array)]);
    let driver = &run["tool"]["driver"];
    required(driver, "driver", &[("name", Value::is_string), ("rules", Value::is_array)]);
    let rules = driver["rules"].as_array().unwrap();
    let levels = ["none", "note", "warning", "error"];
    for rule in rules {
        let id = rule["id"].as_str().unwrap();
        required(rule, id, &[("shortDescription", Value::is_object), ("help", Value::is_object)]);
        message(&rule["shortDescription"], id);
        message(&rule["fullDescription"], id);
        message(&rule["help"], id);
        assert!(rule["help"]["markdown"].is_string(), "{rule}");
        assert!(levels.contains(&rule["defaultConfiguration"]["level"].as_str().unwrap()), "{rule}");
        let severity: f64 = rule["properties"]["security-severity"].as_str().unwrap().parse().unwrap();
        assert!((0.0..=10.0).contains(&severity), "{rule}");
        assert!(rule["properties"]["tags"].as_array().is_some_and(|tags| tags.iter().all(Value::is_string)));
    }
    // Each check's rule is the registry's: its title, help and reference.
    for check in &checks {
        let rule = rules.iter().find(|rule| rule["id"] == check.id).unwrap();
        let registry = crate::rules::Rule::of(check);
        assert_eq!(rule["shortDescription"]["text"], registry.title);
        assert_eq!(rule["help"]["text"], registry.help_text());
        assert_eq!(rule["help"]["markdown"], registry.help_markdown());
        assert_eq!(rule["properties"]["reference"], registry.reference);
    }
    let ids: std::collections::BTreeSet<&str> = rules.iter().filter_map(|rule| rule["id"].as_str()).collect();
    assert_eq!(ids.len(), rules.len(), "rule ids are unique");
    let results = run["results"].as_array().unwrap();
    assert!(!results.is_empty());
    for result in results {
        required(result, "result", &[("message", Value::is_object), ("ruleId", Value::is_string)]);
        message(&result["message"], "result");
        assert!(levels.contains(&result["level"].as_str().unwrap()), "{result}");
        // ruleIndex points at the rule of ruleId.
        let index = usize::try_from(result["ruleIndex"].as_u64().unwrap()).unwrap();
        assert_eq!(rules[index]["id"], result["ruleId"], "{result}");
        for location in result["locations"].as_array().unwrap() {
            assert!(location["physicalLocation"]["artifactLocation"]["uri"].is_string(), "{result}");
        }
        for suppression in result["suppressions"].as_array().into_iter().flatten() {
            assert!(["inSource", "external"].contains(&suppression["kind"].as_str().unwrap()), "{result}");
        }
    }
    // The baselined FAIL is suppressed with its reason.
    let baselined = results.iter().find(|r| r["ruleId"] == checks[1].id).unwrap();
    assert_eq!(baselined["suppressions"][0]["justification"], "known");
    let invocation = &run["invocations"][0];
    required(invocation, "invocation", &[("executionSuccessful", Value::is_boolean)]);
}
