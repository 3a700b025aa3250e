//! Recall on planted defects: the real demo (`palisade serve --app demo`) behind a relay on its
//! public URL is the correct server; each [`Defect`] breaks exactly one thing of it — through a
//! `palisade serve` flag (an allowed foreign Host or Origin, no authentication) or in the relay
//! (`planted/wrapper.rs`) — and the verifier must FAIL a named check for each, while the correct
//! server PASSes every one of those checks. The recall per module is computed here and must
//! equal the table in VERIFY.md ("Recall on planted defects"). With the 2025-era session wire
//! switched off, the sessions checks are NOT TESTABLE under one line saying so.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

#[path = "planted/wrapper.rs"]
mod wrapper;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use palisade_verify::check::Verdict;
use palisade_verify::report::Report;
use palisade_verify::{VerifyArgs, verify};
use support::{Demo, Scratch, identity, identity_of, palisade_binary};
use wrapper::{Defect, Wrapper};

/// One planted defect: the module meant to see it, the checks that must FAIL for it, and the
/// `palisade serve` flags that plant it (none: the relay plants it).
struct Planted {
    defect: Defect,
    module: &'static str,
    caught_by: &'static [&'static str],
    flags: &'static [&'static str],
}

const fn planted(
    defect: Defect,
    module: &'static str,
    caught_by: &'static [&'static str],
    flags: &'static [&'static str],
) -> Planted {
    Planted { defect, module, caught_by, flags }
}

/// Every planted defect, in module order.
const PLANTED: &[Planted] = &[
    planted(
        Defect::ForeignHostAllowed,
        "transport",
        &["transport.host.foreign"],
        &["--allow-host", "rebind.palisade-verify.invalid"],
    ),
    planted(
        Defect::ForeignOriginAllowed,
        "transport",
        &["transport.origin.foreign"],
        &["--allow-origin", "https://attacker.palisade-verify.invalid"],
    ),
    planted(Defect::NullOriginAllowed, "transport", &["transport.origin.null"], &["--allow-origin", "null"]),
    planted(Defect::BatchesAnswered, "transport", &["transport.batch.array"], &[]),
    planted(
        Defect::NoAuthentication,
        "auth",
        &["auth.challenge.resource_metadata", "auth.token.not_jwt", "auth.jwt.alg_none"],
        &["--auth", "none"],
    ),
    planted(Defect::SiblingAudienceAccepted, "auth", &["auth.token.other_resource"], &[]),
    planted(Defect::QueryStringToken, "auth", &["auth.token.query_string"], &[]),
    planted(Defect::AnySchemeTaken, "auth", &["auth.scheme.basic", "auth.scheme.token"], &[]),
    planted(
        Defect::MetadataOnInternalAddress,
        "auth",
        &["auth.challenge.resource_metadata", "auth.metadata.resource"],
        &[],
    ),
    planted(
        Defect::SessionIsTheCaller,
        "sessions",
        &[
            "sessions.other_identity",
            "sessions.other_tenant",
            "sessions.other_client",
            "sessions.no_token",
            "sessions.delete.other_identity",
        ],
        &[],
    ),
    planted(Defect::SessionDeleteIgnored, "sessions", &["sessions.after_delete"], &[]),
    planted(Defect::SessionPrefixMatched, "sessions", &["sessions.near_miss"], &[]),
    planted(
        Defect::HandleNotBound,
        "handles",
        &[
            "handles.read.other_subject",
            "handles.read.other_tenant",
            "handles.read.other_client",
            "handles.write.other_subject",
            "handles.write.other_tenant",
        ],
        &[],
    ),
    planted(Defect::HandleOracle, "handles", &["handles.oracle.other_subject", "handles.oracle.other_tenant"], &[]),
    planted(Defect::HandleGuessable, "handles", &["handles.issue.entropy"], &[]),
    planted(
        Defect::TaskNotBound,
        "tasks",
        &["tasks.get.other_subject", "tasks.get.other_tenant", "tasks.cancel.other_subject"],
        &[],
    ),
    planted(Defect::TaskOracle, "tasks", &["tasks.oracle.get", "tasks.oracle.cancel"], &[]),
    planted(Defect::TaskIdGuessable, "tasks", &["tasks.create.id_entropy"], &[]),
    planted(Defect::ListenTaskNotBound, "listen", &["listen.task.other_identity"], &[]),
    planted(Defect::GetStreamOpen, "listen", &["listen.get.stream"], &[]),
    planted(Defect::ListenNotReauthorized, "listen", &["listen.auth.no_token", "listen.auth.other_resource"], &[]),
    planted(Defect::InstructionsInDescription, "definitions", &["definitions.model-directed-instructions"], &[]),
    planted(Defect::HiddenCharacters, "definitions", &["definitions.hidden-characters"], &[]),
    planted(Defect::SecretField, "definitions", &["definitions.invites-secrets"], &[]),
    planted(Defect::DefinitionChanged, "definitions", &["definitions.meaning-changed"], &[]),
    planted(
        Defect::CachedPastKillSwitch,
        "killswitch",
        &["killswitch.tool.disabled", "killswitch.prompt.disabled", "killswitch.resource.disabled"],
        &[],
    ),
    planted(Defect::UnknownMethodAnswered, "killswitch", &["killswitch.unlisted.method"], &[]),
    planted(Defect::UnknownToolAnswered, "killswitch", &["killswitch.unlisted.tool"], &[]),
];

/// Defects the verifier does not catch, with why (none: every planted defect is caught).
const MISSED: &[(Defect, &str)] = &[];

/// The demo behind the relay, the identity files, and what a run needs.
struct Stage {
    demo: Demo,
    wrapper: Wrapper,
    url: String,
    scratch: Scratch,
    files: Vec<PathBuf>,
}

impl Stage {
    /// The demo started with `flags`, behind a relay on its public URL, and five identities
    /// (alice, bob and carol of two tenants, alice through another client, alice read-only).
    async fn start(flags: &[&str]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}/mcp");
        let mut args: Vec<String> = vec![
            "--public-url".into(),
            url.clone(),
            "--allow-host".into(),
            format!("127.0.0.1:{port}"),
            "--allow-origin".into(),
            format!("http://127.0.0.1:{port}"),
        ];
        args.extend(flags.iter().map(|flag| (*flag).to_owned()));
        let demo = tokio::task::spawn_blocking(move || Demo::start_with(&args)).await.unwrap();
        let upstream = demo.url.trim_end_matches("/mcp").to_owned();
        let scope = "shop:read shop:basket";
        // A server without authentication has no issuer: its callers' tokens are well-formed
        // JWTs it never checks.
        let unauthenticated = flags.windows(2).any(|pair| pair == ["--auth", "none"]);
        let token = |subject: &str, tenant: &str, client: &str, scope: &str| {
            if unauthenticated {
                unchecked_token(&url, subject, tenant, client, scope)
            } else {
                demo.token_for(&url, subject, tenant, client, scope)
            }
        };
        let tokens = [
            token("alice", "acme", "shop-web", scope),
            token("bob", "acme", "shop-web", scope),
            token("carol", "globex", "shop-cli", scope),
            token("alice", "acme", "shop-cli", scope),
            token("alice", "acme", "shop-web", "shop:read"),
        ];
        // Alice's token of a sibling resource (same issuer and key, another audience).
        let sibling_audience = format!("{url}-other-resource");
        let sibling = if unauthenticated {
            unchecked_token(&sibling_audience, "alice", "acme", "shop-web", scope)
        } else {
            demo.token_for(&sibling_audience, "alice", "acme", "shop-web", scope)
        };
        let scratch = Scratch::new("planted");
        let files = vec![
            identity(&scratch, "alice", &tokens[0], "acme", "shop-web"),
            identity(&scratch, "bob", &tokens[1], "acme", "shop-web"),
            identity(&scratch, "carol", &tokens[2], "globex", "shop-cli"),
            identity_of(&scratch, "alice-cli", "alice", &tokens[3], "acme", "shop-cli"),
            identity_of(&scratch, "alice-read", "alice", &tokens[4], "acme", "shop-web"),
        ];
        let alice = std::fs::read_to_string(&files[0]).unwrap();
        std::fs::write(&files[0], format!("{alice}other_resource_token = \"{sibling}\"\n")).unwrap();
        let exchange = HashMap::from([(sibling, tokens[0].clone())]);
        let wrapper = wrapper::start(listener, upstream, exchange);
        Self { demo, wrapper, url, scratch, files }
    }

    /// `palisade authority <action> --target {target} … --data-dir <the demo's data directory>`.
    fn authority(&self, action: &str) -> String {
        let binary = palisade_binary();
        let dir = self.demo.data.0.to_str().unwrap();
        assert!(!dir.contains(char::is_whitespace) && !binary.to_str().unwrap().contains(char::is_whitespace));
        format!("{} authority {action} --target {{target}} --reason palisade-verify --data-dir {dir}", binary.display())
    }

    /// Runs `modules` with `--allow-mutations` (and the kill-switch flips when `killswitch` is
    /// among them), with `extra` arguments.
    async fn run(&self, modules: &[&str], extra: &[String]) -> Report {
        let mut argv = vec![self.url.clone(), "--i-am-authorized".into(), "--allow-mutations".into()];
        for module in modules {
            argv.extend(["--module".into(), (*module).to_owned()]);
        }
        if modules.contains(&"killswitch") {
            argv.extend(["--disable-command".into(), self.authority("disable")]);
            argv.extend(["--enable-command".into(), self.authority("enable")]);
        }
        for file in &self.files {
            argv.extend(["--identity".into(), file.to_str().unwrap().to_owned()]);
        }
        argv.extend(extra.iter().cloned());
        verify(&VerifyArgs::parse_from(&argv).unwrap(), &mut |_, _| {}).await.unwrap()
    }

    fn saved(&self) -> PathBuf {
        self.scratch.0.join("definitions.json")
    }
}

/// A well-formed ES256 JWT for `audience` whose signature is random: what a caller of a server
/// without authentication holds (nothing ever checks it).
fn unchecked_token(audience: &str, subject: &str, tenant: &str, client: &str, scope: &str) -> String {
    use base64::Engine as _;
    let encode = |value: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string());
    let header = encode(serde_json::json!({ "alg": "ES256", "typ": "at+jwt", "kid": "unchecked" }));
    let payload = encode(serde_json::json!({
        "iss": "http://127.0.0.1/unchecked", "sub": subject, "aud": audience, "tenant": tenant,
        "client_id": client, "scope": scope, "exp": 4_102_444_800_u64, "iat": 1_700_000_000_u64,
    }));
    let mut signature = [0u8; 64];
    aws_lc_rs::rand::fill(&mut signature).unwrap();
    format!("{header}.{payload}.{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signature))
}

fn verdict_of(report: &Report, id: &str) -> Option<Verdict> {
    report.entries.iter().find(|entry| entry.check.id == id).map(|entry| entry.outcome.verdict)
}

fn explain(report: &Report) -> String {
    report
        .entries
        .iter()
        .filter(|entry| entry.outcome.verdict != Verdict::Pass)
        .map(|entry| format!("{} {:?}: {}", entry.check.id, entry.outcome.verdict, entry.outcome.detail))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules the planted defects are meant for, in report order.
fn planted_modules() -> Vec<&'static str> {
    let mut modules: Vec<&str> = PLANTED.iter().map(|p| p.module).collect();
    modules.dedup();
    modules
}

/// Runs one planted defect on a fresh demo; `Ok` names the checks that FAILed for it, `Err`
/// says which named check did not.
async fn catch(planted: &Planted) -> Result<Vec<&'static str>, String> {
    let stage = Stage::start(planted.flags).await;
    let mut extra = Vec::new();
    if planted.defect == Defect::DefinitionChanged {
        // The definitions as approved: saved by a run against the correct server first.
        let saved = stage.saved().to_str().unwrap().to_owned();
        stage.run(&["definitions"], &["--save-definitions".into(), saved.clone()]).await;
        extra = vec!["--compare-definitions".into(), saved];
    }
    stage.wrapper.plant(planted.defect);
    let report = stage.run(&[planted.module], &extra).await;
    let missed: Vec<&str> =
        planted.caught_by.iter().copied().filter(|id| verdict_of(&report, id) != Some(Verdict::Fail)).collect();
    if missed.is_empty() {
        Ok(planted.caught_by.to_vec())
    } else {
        Err(format!("{:?}: {missed:?} did not FAIL\n{}", planted.defect, explain(&report)))
    }
}

/// The recall table: per module, planted, caught, recall.
fn recall_table(caught: &[(Defect, bool)]) -> String {
    let mut text = "| module | planted | caught | recall |\n| --- | ---: | ---: | ---: |\n".to_owned();
    for module in planted_modules() {
        let of: Vec<&Planted> = PLANTED.iter().filter(|p| p.module == module).collect();
        let found = of.iter().filter(|p| caught.iter().any(|(d, ok)| *d == p.defect && *ok)).count();
        text.push_str(&format!("| `{module}` | {} | {found} | {} % |\n", of.len(), found * 100 / of.len()));
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_planted_defect_fails_a_named_check_and_recall_is_as_recorded() {
    let mut caught = Vec::new();
    let mut failures = Vec::new();
    for planted in PLANTED {
        let result = catch(planted).await;
        let expected_miss = MISSED.iter().any(|(defect, _)| *defect == planted.defect);
        match (&result, expected_miss) {
            (Ok(_), false) | (Err(_), true) => {}
            (Ok(ids), true) => failures.push(format!("{:?} is recorded as missed but {ids:?} FAIL", planted.defect)),
            (Err(why), false) => failures.push(why.clone()),
        }
        caught.push((planted.defect, result.is_ok()));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    let table = recall_table(&caught);
    let verify_md = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../VERIFY.md")).unwrap();
    assert!(verify_md.contains(&table), "VERIFY.md's recall table is not the measured one:\n{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_correct_server_passes_every_check_a_planted_defect_is_caught_by() {
    let stage = Stage::start(&[]).await;
    let report = stage.run(&planted_modules(), &[]).await;
    // The definitions read by the correct server, compared with themselves: nothing changed.
    let saved = stage.saved().to_str().unwrap().to_owned();
    stage.run(&["definitions"], &["--save-definitions".into(), saved.clone()]).await;
    let compared = stage.run(&["definitions"], &["--compare-definitions".into(), saved]).await;
    for planted in PLANTED {
        for id in planted.caught_by {
            let report = if *id == "definitions.meaning-changed" { &compared } else { &report };
            assert_eq!(verdict_of(report, id), Some(Verdict::Pass), "{id} on the correct server\n{}", explain(report));
        }
    }
    // The relay itself changes nothing: no check of these modules FAILs on the correct server.
    let failed: Vec<&str> =
        report.entries.iter().filter(|e| e.outcome.verdict == Verdict::Fail).map(|e| e.check.id).collect();
    assert!(failed.is_empty(), "{failed:?}\n{}", explain(&report));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_without_the_session_wire_gets_one_line_and_its_sessions_checks_are_not_testable() {
    // The demo with the 2025-era session wire switched off.
    let config = Scratch::new("planted-config");
    let file = config.file("palisade.toml", "[legacy]\nenabled = false\n");
    let stage = Stage::start(&["--config", file.to_str().unwrap()]).await;
    let report = stage.run(&["sessions"], &[]).await;
    let line = report.session_wire.clone().unwrap_or_else(|| panic!("no session wire line\n{}", explain(&report)));
    assert!(line.starts_with("the target does not speak the 2025-era session wire: initialize refused"), "{line}");
    assert!(!report.entries.is_empty());
    for entry in &report.entries {
        assert_eq!(entry.outcome.verdict, Verdict::NotTestable, "{}", entry.check.id);
        assert_eq!(
            entry.outcome.detail,
            "needs the 2025-era session wire, not spoken by the target (see the protocol line)"
        );
    }
    // One line in every format.
    let summary = report.summary_table();
    assert_eq!(summary.matches("the target does not speak the 2025-era session wire").count(), 1, "{summary}");
    let markdown = report.render(palisade_verify::report::Format::Markdown);
    assert_eq!(markdown.matches("- **Protocol:** the target does not speak the 2025-era session wire").count(), 1);
    let json: serde_json::Value = serde_json::from_str(&report.render(palisade_verify::report::Format::Json)).unwrap();
    assert_eq!(json["session_wire"]["spoken"], false);
    let junit = report.render(palisade_verify::report::Format::Junit);
    assert!(junit.contains("<property name=\"session_wire\" value=\"the target does not speak"), "{junit}");
    let sarif = report.render(palisade_verify::report::Format::Sarif);
    assert!(sarif.contains("the sessions checks are NOT TESTABLE"), "{sarif}");
}
