//! The signed policy and the complete registry.

use std::sync::Arc;

use palisade_base::time::format_rfc3339_ms;
use palisade_killswitch::envelope::{EnvelopeError, SignedEnvelope, envelope_bytes, sign_envelope};
use palisade_killswitch::keys::generate_keypair_files;
use palisade_killswitch::{
    Coverage, Ed25519SigningKey, ExposedOperation, KillSwitchError, MonotonicOutcome, PolicyError, PolicyHeader,
    PolicyPayload, SqliteGenerationStore, TargetKind, TargetValues, sign_policy,
};
use serde_json::json;

use crate::fixture::{self, CHECKOUT, EXPOSED, PolicyKit, TOOLS_LIST, now_ms};

fn schema_error(result: Result<palisade_killswitch::Policy, PolicyError>) -> String {
    match result {
        Err(PolicyError::Schema { reason }) => reason,
        other => panic!("expected a schema refusal, got {other:?}"),
    }
}

#[test]
fn a_valid_policy_loads_and_classifies() {
    let kit = PolicyKit::new();
    let policy = kit.policy(3);
    assert_eq!(policy.generation(), 3);
    assert_eq!(policy.authority(), fixture::AUTHORITY_ID);
    assert!(policy.check_complete(EXPOSED).is_ok());
    assert_eq!(policy.lookup(CHECKOUT).unwrap().coverage, Coverage::Covered);
    assert_eq!(policy.lookup(TOOLS_LIST).unwrap().coverage, Coverage::NotApplicable);
    assert!(policy.lookup("tools/call:unknown").is_none(), "unlisted operations have no entry");
    assert_eq!(policy.digest().len(), 64);
}

#[test]
fn an_omitted_operation_is_reported() {
    let kit = PolicyKit::new();
    let policy = kit.policy(1);
    let error =
        policy.check_complete(EXPOSED.into_iter().chain(["tools/call:refund", "prompts/get:welcome"])).unwrap_err();
    assert_eq!(error.missing, vec!["prompts/get:welcome".to_owned(), "tools/call:refund".to_owned()]);
}

#[tokio::test]
async fn a_server_exposing_an_unlisted_operation_does_not_start() {
    let kit = PolicyKit::new();
    let pki = fixture::Pki::new();
    let client = palisade_killswitch::AuthorityClient::new(pki.client_config(
        "https://127.0.0.1:9",
        &pki.client,
        &pki.ca.cert_pem,
    ))
    .unwrap();
    let store = Arc::new(SqliteGenerationStore::open("sqlite::memory:").await.unwrap());
    let result = palisade_killswitch::KillSwitch::start(palisade_killswitch::KillSwitchConfig {
        policy: kit.policy(1),
        exposed_operations: vec![CHECKOUT.to_owned(), "tools/call:refund".to_owned()],
        authority: client,
        store,
        target_key: palisade_killswitch::TargetKey::from_bytes(&[1; 32]),
        clock: Arc::new(palisade_base::clock::SystemClock),
    })
    .await;
    match result {
        Err(KillSwitchError::Registry(error)) => assert_eq!(error.missing, vec!["tools/call:refund".to_owned()]),
        other => panic!("expected a registry refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_justified_not_applicable_operation_passes_without_the_authority_and_unlisted_ones_are_refused() {
    let kit = PolicyKit::new();
    let pki = fixture::Pki::new();
    // Nothing listens on port 9: a covered operation would fail; NOT_APPLICABLE never asks.
    let client = palisade_killswitch::AuthorityClient::new(pki.client_config(
        "https://127.0.0.1:9",
        &pki.client,
        &pki.ca.cert_pem,
    ))
    .unwrap();
    let store = Arc::new(SqliteGenerationStore::open("sqlite::memory:").await.unwrap());
    let kill_switch = fixture::kill_switch(kit.policy(1), client, store, &[1; 32]).await.unwrap();
    let clearance = kill_switch.pre_dispatch(TOOLS_LIST, &TargetValues::new()).await.unwrap();
    assert!(clearance.not_applicable_reason().unwrap().contains("no effect"));
    let fence = kill_switch.pre_side_effect(TOOLS_LIST, &TargetValues::new(), &clearance).await.unwrap();
    assert!(fence.tokens().is_empty() && !fence.is_required());
    assert!(fence.not_applicable_reason().is_some());

    let unlisted = kill_switch.pre_dispatch("tools/call:refund", &TargetValues::new()).await.unwrap_err();
    assert!(matches!(unlisted, KillSwitchError::UnlistedOperation { .. }), "{unlisted:?}");
    let covered = kill_switch
        .pre_dispatch(
            fixture::PRODUCT_GET,
            &TargetValues::new().with(palisade_killswitch::TargetKind::Tool, "product_get"),
        )
        .await
        .unwrap_err();
    assert!(matches!(covered, KillSwitchError::Authority(_)), "{covered:?}");
    let missing = kill_switch.pre_dispatch(fixture::PRODUCT_GET, &TargetValues::new()).await.unwrap_err();
    assert!(matches!(missing, KillSwitchError::MissingTarget { .. }), "{missing:?}");
}

#[test]
fn not_applicable_needs_a_reason_and_no_targets_or_fence() {
    let kit = PolicyKit::new();
    for (label, rule) in [
        (
            "empty reason",
            json!({"coverage": "NOT_APPLICABLE", "require_commit_fence": false, "required_target_kinds": [], "technical_reason": ""}),
        ),
        (
            "blank reason",
            json!({"coverage": "NOT_APPLICABLE", "require_commit_fence": false, "required_target_kinds": [], "technical_reason": "  "}),
        ),
        (
            "null reason",
            json!({"coverage": "NOT_APPLICABLE", "require_commit_fence": false, "required_target_kinds": [], "technical_reason": null}),
        ),
        (
            "with targets",
            json!({"coverage": "NOT_APPLICABLE", "require_commit_fence": false, "required_target_kinds": ["tool"], "technical_reason": "x"}),
        ),
        (
            "with fence",
            json!({"coverage": "NOT_APPLICABLE", "require_commit_fence": true, "required_target_kinds": [], "technical_reason": "x"}),
        ),
        (
            "covered without targets",
            json!({"coverage": "COVERED", "require_commit_fence": false, "required_target_kinds": [], "technical_reason": null}),
        ),
        (
            "covered with reason",
            json!({"coverage": "COVERED", "require_commit_fence": false, "required_target_kinds": ["tool"], "technical_reason": "x"}),
        ),
        (
            "duplicate kinds",
            json!({"coverage": "COVERED", "require_commit_fence": false, "required_target_kinds": ["tool", "tool"], "technical_reason": null}),
        ),
        (
            "unknown kind",
            json!({"coverage": "COVERED", "require_commit_fence": false, "required_target_kinds": ["planet"], "technical_reason": null}),
        ),
        (
            "unknown coverage",
            json!({"coverage": "MAYBE", "require_commit_fence": false, "required_target_kinds": ["tool"], "technical_reason": null}),
        ),
        (
            "missing reason key",
            json!({"coverage": "COVERED", "require_commit_fence": false, "required_target_kinds": ["tool"]}),
        ),
        (
            "extra rule key",
            json!({"coverage": "COVERED", "require_commit_fence": false, "required_target_kinds": ["tool"], "technical_reason": null, "allow": true}),
        ),
    ] {
        let mut payload = kit.payload(1);
        payload["operations"][TOOLS_LIST] = rule;
        let reason = schema_error(kit.load(&kit.sign(&payload)));
        assert!(!reason.is_empty(), "{label}");
    }
}

#[test]
fn envelope_defects_are_refused() {
    let kit = PolicyKit::new();
    let payload = palisade_base::canonical::canonical_bytes(&kit.payload(1));
    let good = sign_envelope(&payload, &kit.root_key);

    let extra = json!({"payload_b64": good.payload_b64, "signature_b64": good.signature_b64, "alg": "none"});
    assert!(matches!(kit.load(extra.to_string().as_bytes()), Err(PolicyError::Envelope(EnvelopeError::Schema))));
    let missing = json!({"payload_b64": good.payload_b64});
    assert!(matches!(kit.load(missing.to_string().as_bytes()), Err(PolicyError::Envelope(EnvelopeError::Schema))));

    // Non-canonical base64: padding dropped, or a trailing newline, or URL-safe alphabet.
    let stripped = good.signature_b64.trim_end_matches('=').to_owned();
    assert_ne!(stripped, good.signature_b64, "a 64-byte signature is padded");
    for (payload_b64, signature_b64) in [
        (good.payload_b64.clone(), stripped),
        (good.payload_b64.clone(), format!("{}\n", good.signature_b64)),
        (format!("{}===", good.payload_b64.trim_end_matches('=')), good.signature_b64.clone()),
    ] {
        let envelope = envelope_bytes(&SignedEnvelope { payload_b64, signature_b64 });
        let result = kit.load(&envelope);
        assert!(
            matches!(result, Err(PolicyError::Envelope(EnvelopeError::Base64 { .. } | EnvelopeError::Signature))),
            "{result:?}"
        );
    }

    // Bad signature: payload changed after signing.
    let mut tampered = kit.payload(1);
    tampered["policy_generation"] = json!(99);
    let tampered_b64 = sign_envelope(&palisade_base::canonical::canonical_bytes(&tampered), &kit.root_key).payload_b64;
    let forged =
        envelope_bytes(&SignedEnvelope { payload_b64: tampered_b64, signature_b64: good.signature_b64.clone() });
    assert!(matches!(kit.load(&forged), Err(PolicyError::Envelope(EnvelopeError::Signature))));

    // Wrong root key: signed by another key.
    let other = Ed25519SigningKey::generate().unwrap();
    let other_signed = envelope_bytes(&sign_envelope(&payload, &other));
    assert!(matches!(kit.load(&other_signed), Err(PolicyError::Envelope(EnvelopeError::Signature))));

    assert!(kit.load(&envelope_bytes(&good)).is_ok(), "the untouched envelope still loads");
}

#[test]
fn payload_defects_are_refused() {
    let kit = PolicyKit::new();
    let mut unknown = kit.payload(1);
    unknown["allow_all"] = json!(true);
    assert!(schema_error(kit.load(&kit.sign(&unknown))).contains("allow_all"));

    let mut missing = kit.payload(1);
    missing.as_object_mut().unwrap().remove("not_after");
    schema_error(kit.load(&kit.sign(&missing)));

    let mut version = kit.payload(1);
    version["schema_version"] = json!("aidefend.mcp-disable-policy.v1");
    schema_error(kit.load(&kit.sign(&version)));

    let mut zero = kit.payload(1);
    zero["policy_generation"] = json!(0);
    schema_error(kit.load(&kit.sign(&zero)));

    let mut negative = kit.payload(1);
    negative["policy_generation"] = json!(-1);
    schema_error(kit.load(&kit.sign(&negative)));

    let mut fractional = kit.payload(1);
    fractional["max_authority_response_age_ms"] = json!(1.5);
    schema_error(kit.load(&kit.sign(&fractional)));

    let mut zero_age = kit.payload(1);
    zero_age["max_authority_response_age_ms"] = json!(0);
    schema_error(kit.load(&kit.sign(&zero_age)));

    let mut bad_authority = kit.payload(1);
    bad_authority["authority"] = json!("authority with spaces");
    schema_error(kit.load(&kit.sign(&bad_authority)));

    let mut no_operations = kit.payload(1);
    no_operations["operations"] = json!({});
    schema_error(kit.load(&kit.sign(&no_operations)));

    let mut expired = kit.payload(1);
    expired["not_after"] = json!(format_rfc3339_ms(now_ms() - 1000));
    assert!(matches!(kit.load(&kit.sign(&expired)), Err(PolicyError::Expired)));

    let mut local_time = kit.payload(1);
    local_time["not_after"] = json!("2999-01-01T00:00:00+01:00");
    schema_error(kit.load(&kit.sign(&local_time)));

    // Duplicate operation keys in the signed bytes.
    let canonical = String::from_utf8(palisade_base::canonical::canonical_bytes(&kit.payload(1))).unwrap();
    let rule = r#"{"coverage":"COVERED","require_commit_fence":false,"required_target_kinds":["tool"],"technical_reason":null}"#;
    let duplicated = canonical.replacen("\"operations\":{", &format!("\"operations\":{{\"tools/list\":{rule},"), 1);
    schema_error(kit.load(&kit.sign_bytes(duplicated.as_bytes())));
}

#[test]
fn authority_key_must_stay_inside_the_trust_root_and_match_its_digest() {
    let kit = PolicyKit::new();
    // A key outside the trust root, with its correct digest pinned.
    let (_, outside) = generate_keypair_files(kit.dir.path(), "outside").unwrap();
    let outside_digest = palisade_killswitch::file_sha256_hex(&outside).unwrap();
    let with_path = |path: &str, digest: &str| {
        let mut payload = kit.payload(1);
        payload["authority_key_path"] = json!(path);
        payload["authority_key_sha256"] = json!(digest);
        kit.load(&kit.sign(&payload))
    };
    assert!(matches!(with_path("../outside.pub", &outside_digest), Err(PolicyError::KeyPathEscape)));
    assert!(matches!(with_path("keys/../../outside.pub", &outside_digest), Err(PolicyError::KeyPathEscape)));
    assert!(matches!(with_path(outside.to_str().unwrap(), &outside_digest), Err(PolicyError::KeyPathEscape)));
    assert!(matches!(with_path("./keys/authority.pub", &kit.authority_key_sha256), Err(PolicyError::KeyPathEscape)));
    assert!(matches!(with_path("", &kit.authority_key_sha256), Err(PolicyError::KeyPathEscape)));
    assert!(matches!(with_path("keys", &kit.authority_key_sha256), Err(PolicyError::KeyPathEscape)), "a directory");
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&outside, kit.trust_root.join("keys/link.pub")).unwrap();
        assert!(matches!(with_path("keys/link.pub", &outside_digest), Err(PolicyError::KeyPathEscape)), "symlink out");
        std::os::unix::fs::symlink(kit.trust_root.join("keys/authority.pub"), kit.trust_root.join("inside.pub"))
            .unwrap();
        assert!(with_path("inside.pub", &kit.authority_key_sha256).is_ok(), "a symlink inside the root is fine");
    }
    // Digest mismatch: the right file, another digest.
    assert!(matches!(with_path("keys/authority.pub", &outside_digest), Err(PolicyError::KeyDigestMismatch)));
    assert!(with_path("keys/authority.pub", &kit.authority_key_sha256).is_ok());
}

#[tokio::test]
async fn policy_generations_are_accepted_only_monotonically() {
    let kit = PolicyKit::new();
    let pki = fixture::Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let store_path = dir.path().join("generations.db");
    let store = Arc::new(SqliteGenerationStore::open(store_path.to_str().unwrap()).await.unwrap());
    let client = || {
        palisade_killswitch::AuthorityClient::new(pki.client_config(
            "https://127.0.0.1:9",
            &pki.client,
            &pki.ca.cert_pem,
        ))
        .unwrap()
    };
    fixture::kill_switch(kit.policy(5), client(), store.clone(), &[1; 32]).await.unwrap();
    fixture::kill_switch(kit.policy(5), client(), store.clone(), &[1; 32]).await.expect("the same policy again");
    let lower = fixture::kill_switch(kit.policy(4), client(), store.clone(), &[1; 32]).await.unwrap_err();
    assert!(
        matches!(lower, KillSwitchError::PolicyGenerationRefused { outcome: MonotonicOutcome::Stale }),
        "{lower:?}"
    );
    let mut changed = kit.payload(5);
    changed["policy_version"] = json!("other");
    let conflicting = kit.load(&kit.sign(&changed)).unwrap();
    let conflict = fixture::kill_switch(conflicting, client(), store.clone(), &[1; 32]).await.unwrap_err();
    assert!(matches!(conflict, KillSwitchError::PolicyGenerationRefused { outcome: MonotonicOutcome::Conflict }));
    // Restart: a reopened store still refuses the lower generation.
    store.close().await;
    let reopened = Arc::new(SqliteGenerationStore::open(store_path.to_str().unwrap()).await.unwrap());
    assert!(fixture::kill_switch(kit.policy(4), client(), reopened.clone(), &[1; 32]).await.is_err());
    fixture::kill_switch(kit.policy(6), client(), reopened, &[1; 32]).await.expect("a newer policy");
}

#[test]
fn skeleton_sign_and_load_round_trip() {
    let kit = PolicyKit::new();
    let header = PolicyHeader {
        policy_version: "init".to_owned(),
        policy_generation: 1,
        authority: fixture::AUTHORITY_ID.to_owned(),
        authority_key_path: "keys/authority.pub".to_owned(),
        authority_key_sha256: kit.authority_key_sha256.clone(),
        max_authority_response_age_ms: 2000,
        not_after: format_rfc3339_ms(now_ms() + 86_400_000),
    };
    let skeleton = PolicyPayload::skeleton(
        header,
        [
            ExposedOperation { key: CHECKOUT.to_owned(), has_side_effect: true, target_kinds: vec![TargetKind::Tool] },
            ExposedOperation { key: TOOLS_LIST.to_owned(), has_side_effect: false, target_kinds: vec![] },
            ExposedOperation {
                key: "resources/read:shop://policy".to_owned(),
                has_side_effect: false,
                target_kinds: vec![TargetKind::Resource],
            },
        ],
    );
    assert!(skeleton.operations.values().all(|rule| rule.coverage == Coverage::Covered), "fail-safe default");
    assert!(skeleton.operations[CHECKOUT].require_commit_fence);
    // Every rule asks for the targets an operator can name for any request: the release, the
    // caller's tenant and client, the delegated agents it acts through; plus the operation's
    // own entry.
    use TargetKind::{Agent, Client, Resource, ServerRelease, Tenant, Tool};
    assert_eq!(skeleton.operations[CHECKOUT].required_target_kinds, vec![ServerRelease, Tenant, Client, Tool, Agent]);
    assert_eq!(skeleton.operations[TOOLS_LIST].required_target_kinds, vec![ServerRelease, Tenant, Client, Agent]);
    assert_eq!(
        skeleton.operations["resources/read:shop://policy"].required_target_kinds,
        vec![ServerRelease, Tenant, Client, Resource, Agent]
    );
    let json = serde_json::to_vec_pretty(&skeleton).unwrap();
    let envelope = sign_policy(&json, &kit.root_key, now_ms()).unwrap();
    let policy = kit.load(&envelope).unwrap();
    assert_eq!(policy.payload(), &skeleton);
    assert!(policy.check_complete([CHECKOUT, TOOLS_LIST, "resources/read:shop://policy"]).is_ok());

    let mut expired = skeleton.clone();
    expired.not_after = format_rfc3339_ms(now_ms() - 1);
    assert!(matches!(
        sign_policy(&serde_json::to_vec(&expired).unwrap(), &kit.root_key, now_ms()),
        Err(PolicyError::Expired)
    ));
    assert!(sign_policy(b"{\"schema_version\":1}", &kit.root_key, now_ms()).is_err());
}
