//! The pin store's checks: observations, decisions bound to a digest, listing and races.

use super::*;

/// The SHA-256 of `definition`, as a pin digest (64 lowercase hex digits).
pub fn pin_digest(definition: &str) -> String {
    palisade_base::hex::hex(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, definition.as_bytes()).as_ref())
}

/// An observation of the definition `name` of `kind` on `upstream` (URL
/// `https://<upstream>.example/mcp`), in `version` of its text, seen at `seen_at_ms`.
pub fn sample_pin(
    pin_id: &str,
    upstream: &str,
    kind: &str,
    name: &str,
    version: u32,
    seen_at_ms: i64,
) -> PinObservation {
    let definition = if kind == "instructions" {
        serde_json::Value::String(format!("Instructions, version {version}."))
    } else {
        serde_json::json!({ "name": name, "description": format!("Version {version} — ünïcode."), "inputSchema": {} })
    };
    let definition = definition.to_string();
    PinObservation {
        pin_id: pin_id.into(),
        upstream_id: upstream.into(),
        upstream_url: format!("https://{upstream}.example/mcp"),
        kind: kind.into(),
        name: name.into(),
        digest: pin_digest(&definition),
        definition,
        seen_at_ms,
    }
}

/// A decision on `digest` of `pin_id`.
pub fn sample_decision(pin_id: &str, digest: &str, verdict: PinVerdict, at_ms: i64) -> PinDecision {
    PinDecision {
        pin_id: pin_id.into(),
        digest: digest.into(),
        verdict,
        reviewer: format!("reviewer at {at_ms}"),
        note: Some(format!("looked at it at {at_ms}\nall fine")),
        signature: Some("bm90IGEgcmVhbCBzaWduYXR1cmU+/w==".into()),
        decided_at_ms: at_ms,
    }
}

async fn expect_pin(store: &dyn Store, pin_id: &str) -> PinRow {
    store.pin(pin_id).await.expect("pin").unwrap_or_else(|| panic!("pin {pin_id} should exist"))
}

/// An observation reads back whole, from this instance and another; observing it again keeps
/// its first sighting and takes the new digest, definition and time; a pin id observed under
/// another identity is refused with the whole batch.
pub async fn pins_round_trip_and_reobservation_keeps_first_seen(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    assert!(store.pins(None).await.expect("pins").is_empty());
    assert_eq!(store.pin("weather-tool-forecast").await.expect("pin"), None);
    store.observe_pins(Vec::new()).await.expect("an empty batch is a no-op");
    let forecast = sample_pin("weather-tool-forecast", "weather", "tool", "forecast", 1, 100);
    let instructions = sample_pin("weather-instructions", "weather", "instructions", "", 1, 100);
    // A stdio upstream's launch is a pin too (nameless, like instructions; migration 0008).
    let launch = sample_pin("weather-launch", "weather", "launch", "", 1, 100);
    store.observe_pins(vec![forecast.clone(), instructions.clone(), launch.clone()]).await.expect("observe");
    assert_eq!(expect_pin(store.as_ref(), "weather-launch").await.observation, launch);
    let expected =
        PinRow { observation: forecast.clone(), first_seen_ms: 100, decision: None, decided_definition: None };
    assert_eq!(expect_pin(store.as_ref(), "weather-tool-forecast").await, expected);
    assert_eq!(expect_pin(other.as_ref(), "weather-tool-forecast").await, expected, "another instance");
    assert_eq!(expect_pin(store.as_ref(), "weather-instructions").await.observation, instructions);

    // Changed text: new digest and definition, same first sighting.
    let changed = sample_pin("weather-tool-forecast", "weather", "tool", "forecast", 2, 200);
    assert_ne!(changed.digest, forecast.digest);
    other.observe_pins(vec![changed.clone()]).await.expect("observe again");
    let row = expect_pin(store.as_ref(), "weather-tool-forecast").await;
    assert_eq!((row.observation, row.first_seen_ms, row.decision), (changed.clone(), 100, None));
    // The same text seen later: only the time moves.
    let again = sample_pin("weather-tool-forecast", "weather", "tool", "forecast", 2, 300);
    store.observe_pins(vec![again.clone()]).await.expect("observe unchanged");
    let row = expect_pin(store.as_ref(), "weather-tool-forecast").await;
    assert_eq!((row.observation, row.first_seen_ms), (again.clone(), 100));

    // One pin id is one identity: another URL, kind or name under it refuses the whole batch.
    let newcomer = sample_pin("weather-tool-radar", "weather", "tool", "radar", 1, 400);
    let mut moved = sample_pin("weather-tool-forecast", "weather", "tool", "forecast", 3, 400);
    moved.upstream_url = "https://elsewhere.example/mcp".into();
    let mut renamed = sample_pin("weather-tool-forecast", "weather", "tool", "forecast_v2", 3, 400);
    renamed.definition = moved.definition.clone();
    let mut rekinded = sample_pin("weather-tool-forecast", "weather", "prompt", "forecast", 3, 400);
    rekinded.definition = moved.definition.clone();
    let mut other_upstream = sample_pin("weather-tool-forecast", "climate", "tool", "forecast", 3, 400);
    other_upstream.upstream_url = again.upstream_url.clone();
    for conflicting in [moved, renamed, rekinded, other_upstream] {
        let result = store.observe_pins(vec![newcomer.clone(), conflicting.clone()]).await;
        expect_invalid(result, &format!("{conflicting:?}"));
    }
    assert_eq!(store.pin("weather-tool-radar").await.expect("pin"), None, "the batch was rolled back");
    let row = expect_pin(store.as_ref(), "weather-tool-forecast").await;
    assert_eq!((row.observation, row.first_seen_ms), (again, 100), "the conflicting pin is unchanged");
    assert_eq!(store.pins(None).await.expect("pins").len(), 3);
    other.close().await;
    fixture.cleanup().await;
}

/// A decision is recorded only on the digest the pin has now: the matching digest is recorded
/// with the definition it was made on; a digest from before the definition changed, or an
/// unknown pin, records nothing; observations never touch a decision.
pub async fn pin_decision_needs_the_current_digest(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let shown = sample_pin("docs-tool-search", "docs", "tool", "search", 1, 100);
    store.observe_pins(vec![shown.clone()]).await.expect("observe");
    let approval = sample_decision("docs-tool-search", &shown.digest, PinVerdict::Approved, 150);
    assert!(store.decide_pin(approval.clone()).await.expect("decide"), "the current digest is decided");
    let row = expect_pin(store.as_ref(), "docs-tool-search").await;
    assert_eq!(row.decision.as_ref(), Some(&approval));
    assert_eq!(row.decided_definition.as_deref(), Some(shown.definition.as_str()));
    assert_eq!(row.observation, shown);

    // The definition changes (a rug pull); the decision stays as it was, on the old digest.
    let pulled = sample_pin("docs-tool-search", "docs", "tool", "search", 2, 200);
    store.observe_pins(vec![pulled.clone()]).await.expect("observe the change");
    let held = expect_pin(store.as_ref(), "docs-tool-search").await;
    assert_eq!(held.observation, pulled);
    assert_eq!(held.decision.as_ref(), Some(&approval), "observing does not touch the decision");
    assert_eq!(held.decided_definition.as_deref(), Some(shown.definition.as_str()));

    // A reviewer who was shown the old text cannot approve (or reject) the new one.
    for verdict in [PinVerdict::Approved, PinVerdict::Rejected] {
        let stale = sample_decision("docs-tool-search", &shown.digest, verdict, 250);
        assert!(!store.decide_pin(stale).await.expect("decide"), "a stale digest is not decided");
    }
    assert_eq!(expect_pin(store.as_ref(), "docs-tool-search").await, held, "nothing changed");

    // An unknown pin: nothing recorded, nothing created.
    let unknown = sample_decision("docs-tool-missing", &shown.digest, PinVerdict::Approved, 260);
    assert!(!store.decide_pin(unknown).await.expect("decide"));
    assert_eq!(store.pin("docs-tool-missing").await.expect("pin"), None);

    // Shown the new text, the reviewer decides it.
    let fresh = sample_decision("docs-tool-search", &pulled.digest, PinVerdict::Approved, 300);
    assert!(store.decide_pin(fresh.clone()).await.expect("decide"));
    let row = expect_pin(store.as_ref(), "docs-tool-search").await;
    assert_eq!(row.decision, Some(fresh));
    assert_eq!(row.decided_definition.as_deref(), Some(pulled.definition.as_str()));
    assert_eq!(row.first_seen_ms, 100);
    fixture.cleanup().await;
}

/// A later decision replaces the earlier one whole (verdict, reviewer, note, signature, time),
/// on every instance.
pub async fn pin_rejection_replaces_an_approval(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let pin = sample_pin("mail-prompt-draft", "mail", "prompt", "draft", 1, 100);
    store.observe_pins(vec![pin.clone()]).await.expect("observe");
    let approval = sample_decision("mail-prompt-draft", &pin.digest, PinVerdict::Approved, 110);
    assert!(store.decide_pin(approval).await.expect("approve"));
    let rejection = PinDecision {
        pin_id: "mail-prompt-draft".into(),
        digest: pin.digest.clone(),
        verdict: PinVerdict::Rejected,
        reviewer: "second reviewer".into(),
        note: None,
        signature: None,
        decided_at_ms: 120,
    };
    assert!(other.decide_pin(rejection.clone()).await.expect("reject"));
    let row = expect_pin(store.as_ref(), "mail-prompt-draft").await;
    assert_eq!(row.decision, Some(rejection), "the rejection replaced the approval, note and signature included");
    assert_eq!(row.decided_definition.as_deref(), Some(pin.definition.as_str()));
    let again = sample_decision("mail-prompt-draft", &pin.digest, PinVerdict::Approved, 130);
    assert!(store.decide_pin(again.clone()).await.expect("approve again"));
    assert_eq!(expect_pin(other.as_ref(), "mail-prompt-draft").await.decision, Some(again.clone()));
    // The decisions alone (what a running gateway polls): only decided pins, the latest each.
    let undecided = sample_pin("mail-tool-send", "mail", "tool", "send", 2, 140);
    store.observe_pins(vec![undecided]).await.expect("observe another");
    assert_eq!(other.pin_decisions().await.expect("decisions"), vec![again]);
    other.close().await;
    fixture.cleanup().await;
}

/// The listing is ordered by (upstream id, kind, name) comparing bytes, the same on every
/// backend, and filters by upstream exactly.
pub async fn pins_are_listed_by_upstream_in_order(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    // Given out of order, with names whose byte order differs from a natural-language order.
    let pins = vec![
        sample_pin("beta-tool-b", "beta", "tool", "b", 1, 100),
        sample_pin("alpha-tool-zeta", "alpha", "tool", "zeta", 1, 100),
        sample_pin("alpha-prompt-ab", "alpha", "prompt", "ab", 1, 100),
        sample_pin("alpha-tool-upper", "alpha", "tool", "Zeta", 1, 100),
        sample_pin("alpha-instructions", "alpha", "instructions", "", 1, 100),
        sample_pin("alpha-prompt-a-b", "alpha", "prompt", "a_b", 1, 100),
        sample_pin("alpha-resource", "alpha", "resource", "file:///a", 1, 100),
        sample_pin("alpha-template", "alpha", "resource_template", "file:///{path}", 1, 100),
        sample_pin("alpha-beta-tool-a", "alpha-beta", "tool", "a", 1, 100),
        sample_pin("beta-prompt-b", "beta", "prompt", "b", 1, 100),
    ];
    store.observe_pins(pins.clone()).await.expect("observe");
    let mut expected = pins.clone();
    expected.sort_by(|a, b| (&a.upstream_id, &a.kind, &a.name).cmp(&(&b.upstream_id, &b.kind, &b.name)));
    let ids = |rows: Vec<PinRow>| rows.into_iter().map(|row| row.observation.pin_id).collect::<Vec<_>>();
    let all = ids(store.pins(None).await.expect("pins"));
    assert_eq!(all, expected.iter().map(|pin| pin.pin_id.clone()).collect::<Vec<_>>());
    assert_eq!(
        all[..7],
        [
            "alpha-instructions",
            "alpha-prompt-a-b",
            "alpha-prompt-ab",
            "alpha-resource",
            "alpha-template",
            "alpha-tool-upper",
            "alpha-tool-zeta"
        ]
    );
    let alpha = store.pins(Some("alpha")).await.expect("pins of alpha");
    assert!(alpha.iter().all(|row| row.observation.upstream_id == "alpha" && row.decision.is_none()));
    assert_eq!(ids(alpha), all[..7]);
    assert_eq!(ids(store.pins(Some("beta")).await.expect("pins of beta")), ["beta-prompt-b", "beta-tool-b"]);
    assert_eq!(ids(store.pins(Some("alpha-beta")).await.expect("pins")), ["alpha-beta-tool-a"]);
    assert!(store.pins(Some("gamma")).await.expect("pins of gamma").is_empty());
    assert!(store.pins(Some("ALPHA")).await.expect("pins").is_empty(), "upstream ids compare exactly");
    expect_invalid(store.pins(Some("alpha/../beta")).await, "an impossible upstream id");
    expect_invalid(store.pins(Some("")).await, "an empty upstream id");
    fixture.cleanup().await;
}

/// Breaks one field of an observation.
type BreakObservation = fn(&mut PinObservation);
/// Breaks one field of a decision.
type BreakDecision = fn(&mut PinDecision);

/// Bad observations and decisions are refused with `InvalidRecord` and write nothing: not the
/// bad row, not the valid rows of its batch, not a decision.
pub async fn invalid_pins_are_refused_and_nothing_is_written(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let valid = sample_pin("shop-tool-buy", "shop", "tool", "buy", 1, 100);
    let broken: Vec<(&str, BreakObservation)> = vec![
        ("uppercase digest", |pin| pin.digest = pin.digest.to_uppercase()),
        ("short digest", |pin| pin.digest.truncate(63)),
        ("too-long name", |pin| pin.name = "n".repeat(crate::MAX_PIN_TEXT_BYTES + 1)),
        ("unknown kind", |pin| pin.kind = "widget".into()),
        ("bad pin id", |pin| pin.pin_id = "Shop Tool".into()),
        ("too-long upstream id", |pin| pin.upstream_id = "u".repeat(64)),
        ("too-long URL", |pin| pin.upstream_url = format!("https://x/{}", "a".repeat(2048))),
        ("definition not JSON", |pin| pin.definition = "{".into()),
        ("named instructions", |pin| pin.kind = "instructions".into()),
        ("named launch", |pin| pin.kind = "launch".into()),
        ("negative time", |pin| pin.seen_at_ms = -1),
    ];
    for (what, break_it) in broken {
        let mut bad = sample_pin("shop-tool-sell", "shop", "tool", "sell", 1, 100);
        break_it(&mut bad);
        expect_invalid(store.observe_pins(vec![valid.clone(), bad]).await, what);
        assert!(store.pins(None).await.expect("pins").is_empty(), "{what}: the batch wrote something");
    }
    expect_invalid(store.observe_pins(vec![valid.clone(), valid.clone()]).await, "a pin id twice in a batch");
    assert!(store.pins(None).await.expect("pins").is_empty(), "duplicate ids: the batch wrote something");

    store.observe_pins(vec![valid.clone()]).await.expect("observe");
    let before = expect_pin(store.as_ref(), "shop-tool-buy").await;
    let broken: Vec<(&str, BreakDecision)> = vec![
        ("bad digest", |decision| decision.digest = "x".repeat(64)),
        ("too-long reviewer", |decision| decision.reviewer = "r".repeat(201)),
        ("empty reviewer", |decision| decision.reviewer.clear()),
        ("too-long note", |decision| decision.note = Some("n".repeat(4097))),
        ("signature not base64", |decision| decision.signature = Some("not base64!".into())),
        ("bad pin id", |decision| decision.pin_id = "shop tool buy".into()),
    ];
    for (what, break_it) in broken {
        let mut decision = sample_decision("shop-tool-buy", &valid.digest, PinVerdict::Approved, 200);
        break_it(&mut decision);
        expect_invalid(store.decide_pin(decision).await, what);
        assert_eq!(expect_pin(store.as_ref(), "shop-tool-buy").await, before, "{what}: the pin changed");
    }
    expect_invalid(store.pin("Shop-Tool-Buy").await, "an impossible pin id");
    expect_invalid(store.pin("").await, "an empty pin id");
    fixture.cleanup().await;
}

/// Two instances race: one keeps changing a definition between two texts, the other keeps
/// deciding on the first text's digest. Whatever the interleaving, a recorded decision is always
/// paired with the definition whose digest it names, and it succeeds only while that text is
/// current.
pub async fn racing_observations_never_pair_a_decision_with_another_definition(harness: &dyn Harness) {
    const ROUNDS: i64 = 60;
    let fixture = harness.fresh().await;
    let observer = fixture.store();
    let decider = fixture.another_instance().await;
    let first = sample_pin("race-tool-t", "race", "tool", "t", 1, 0);
    let second = sample_pin("race-tool-t", "race", "tool", "t", 2, 0);
    observer.observe_pins(vec![first.clone()]).await.expect("observe");
    let observing = {
        let (observer, first, second) = (observer.clone(), first.clone(), second.clone());
        tokio::spawn(async move {
            for round in 1..=ROUNDS {
                let mut next = if round % 2 == 1 { second.clone() } else { first.clone() };
                next.seen_at_ms = round;
                observer.observe_pins(vec![next]).await.expect("observe");
            }
        })
    };
    let deciding = {
        let (decider, digest) = (decider.clone(), first.digest.clone());
        tokio::spawn(async move {
            let mut recorded = 0;
            for round in 1..=ROUNDS {
                let verdict = if round % 2 == 0 { PinVerdict::Approved } else { PinVerdict::Rejected };
                if decider.decide_pin(sample_decision("race-tool-t", &digest, verdict, round)).await.expect("decide") {
                    recorded += 1;
                }
                let row = expect_pin(decider.as_ref(), "race-tool-t").await;
                if let (Some(decision), Some(text)) = (&row.decision, &row.decided_definition) {
                    assert_eq!(pin_digest(text), decision.digest, "round {round}: decision paired with another text");
                }
            }
            recorded
        })
    };
    observing.await.expect("observer task");
    let recorded = deciding.await.expect("decider task");
    // The observer's last write (an even round) restored the first text: one more decision
    // must be recorded, with that text.
    let last = sample_decision("race-tool-t", &first.digest, PinVerdict::Approved, ROUNDS + 1);
    assert!(decider.decide_pin(last.clone()).await.expect("decide"));
    let row = expect_pin(observer.as_ref(), "race-tool-t").await;
    assert_eq!(row.decision, Some(last));
    assert_eq!(row.decided_definition.as_deref(), Some(first.definition.as_str()));
    assert!(recorded <= ROUNDS);
    decider.close().await;
    fixture.cleanup().await;
}

/// A store that is down refuses every pin operation with `Unavailable` (fail closed), and the
/// refused calls wrote nothing.
pub async fn closed_store_refuses_pin_operations(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let pin = sample_pin("ops-tool-restart", "ops", "tool", "restart", 1, 100);
    store.observe_pins(vec![pin.clone()]).await.expect("observe");
    store.close().await;
    let changed = sample_pin("ops-tool-restart", "ops", "tool", "restart", 2, 200);
    expect_unavailable(store.observe_pins(vec![changed]).await, "observe_pins");
    let approval = sample_decision("ops-tool-restart", &pin.digest, PinVerdict::Approved, 300);
    expect_unavailable(store.decide_pin(approval).await, "decide_pin");
    expect_unavailable(store.pin("ops-tool-restart").await, "pin");
    expect_unavailable(store.pins(None).await, "pins");
    expect_unavailable(store.pins(Some("ops")).await, "pins of one upstream");
    let row = expect_pin(other.as_ref(), "ops-tool-restart").await;
    assert_eq!((row.observation, row.decision), (pin, None));
    other.close().await;
    fixture.cleanup().await;
}
