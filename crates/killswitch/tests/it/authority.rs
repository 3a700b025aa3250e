//! End to end over real mTLS on loopback: the kill switch against the reference authority.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use palisade_killswitch::authority::{RedeemError, RedeemRejection};
use palisade_killswitch::{
    AuthorityClient, AuthorityError, GenerationRecord, GenerationStore, GenerationSubject, KillSwitchError,
    MonotonicOutcome, SqliteGenerationStore, TargetKind, TargetState, TargetValues,
};

use crate::fixture::{self, CHECKOUT, MAX_AGE_MS, PRODUCT_GET, RELEASE, SkewClock, World, now_ms};

fn checkout_targets(tool: &str) -> TargetValues {
    TargetValues::new().with(TargetKind::ServerRelease, RELEASE).with(TargetKind::Tool, tool)
}

#[tokio::test]
async fn signed_enable_passes_both_phases_and_the_fence_redeems_once() {
    let world = World::new().await;
    let targets = checkout_targets("basket_checkout");
    let clearance = world.kill_switch.pre_dispatch(CHECKOUT, &targets).await.unwrap();
    assert_eq!(clearance.targets().len(), 2);
    assert_eq!(clearance.generations(), &[1, 1]);
    let fence = world.kill_switch.pre_side_effect(CHECKOUT, &targets, &clearance).await.unwrap();
    assert!(fence.is_required());
    assert_eq!(fence.tokens().len(), 2, "one token per target");
    assert!(!format!("{fence:?}").contains(fence.tokens()[0].token.expose()), "Debug hides tokens");

    let client = world.client();
    for request in fence.redeem_requests() {
        client.redeem(&request).await.unwrap();
    }
    for request in fence.redeem_requests() {
        assert!(matches!(client.redeem(&request).await, Err(AuthorityError::RedeemRejected)), "one use only");
        assert!(matches!(
            world.authority.db.redeem(&request, now_ms()).await,
            Err(RedeemError::Rejected(RedeemRejection::AlreadyUsed))
        ));
    }
}

#[tokio::test]
async fn signed_disable_refuses_and_is_broadcast_then_a_newer_enable_is_accepted() {
    let world = World::new().await;
    let mut disables = world.kill_switch.subscribe_disables();
    let targets = checkout_targets("basket_checkout");
    let tool = world.target_key().digest(TargetKind::Tool, "basket_checkout");
    let status = world.authority.db.disable(&tool, "incident-42", now_ms()).await.unwrap();
    assert_eq!((status.state, status.generation), (TargetState::Disable, 2));

    let refused = world.kill_switch.pre_dispatch(CHECKOUT, &targets).await.unwrap_err();
    match &refused {
        KillSwitchError::Disabled { kind, generation, reason_code } => {
            assert_eq!((*kind, *generation, reason_code.as_str()), (TargetKind::Tool, 2, "incident-42"));
        }
        other => panic!("expected DISABLE, got {other:?}"),
    }
    assert!(refused.is_disabled());
    let event = disables.try_recv().unwrap();
    assert_eq!(event.target, tool);
    assert_eq!(world.kill_switch.target_digest(TargetKind::Tool, "basket_checkout"), event.target);

    // Other tools are unaffected.
    world.kill_switch.pre_dispatch(CHECKOUT, &checkout_targets("other_tool")).await.unwrap();

    let enabled = world.authority.db.enable(&tool, "incident-42-resolved", now_ms()).await.unwrap();
    assert_eq!(enabled.generation, 3);
    let clearance = world.kill_switch.pre_dispatch(CHECKOUT, &targets).await.expect("newer re-enable accepted");
    assert_eq!(clearance.generations(), &[1, 3]);
    let statuses = world.authority.db.status().await.unwrap();
    assert_eq!(statuses.len(), 1);
    assert_eq!(statuses[0].reason_code, "incident-42-resolved");
}

/// The authority answers from memory and notices changes by SQLite's `data_version`: a DISABLE
/// or ENABLE committed by another connection on the file (another `AuthorityDb`, as
/// `palisade authority disable` in another process) is in the very next answer, however many
/// answers came from memory before it — and, the generation being higher, the kill switch's
/// replay window never hides it.
#[tokio::test]
async fn a_change_committed_by_another_process_is_in_the_next_answer() {
    let world = World::new().await;
    let other_process =
        palisade_killswitch::authority::AuthorityDb::open(world.authority.db_path.to_str().unwrap()).await.unwrap();
    let targets = TargetValues::new().with(TargetKind::Tool, "product_get");
    let tool = world.target_key().digest(TargetKind::Tool, "product_get");
    for _ in 0..3 {
        assert_eq!(world.kill_switch.pre_dispatch(PRODUCT_GET, &targets).await.unwrap().generations(), &[1]);
    }
    other_process.disable(&tool, "incident-7", now_ms()).await.unwrap();
    let refused = world.kill_switch.pre_dispatch(PRODUCT_GET, &targets).await.unwrap_err();
    assert!(matches!(refused, KillSwitchError::Disabled { generation: 2, .. }), "{refused:?}");
    other_process.enable(&tool, "incident-7-resolved", now_ms()).await.unwrap();
    assert_eq!(world.kill_switch.pre_dispatch(PRODUCT_GET, &targets).await.unwrap().generations(), &[3]);
    // And the authority's own writes (its pool, not the probe) likewise.
    world.authority.db.disable(&tool, "incident-8", now_ms()).await.unwrap();
    let refused = world.kill_switch.pre_dispatch(PRODUCT_GET, &targets).await.unwrap_err();
    assert!(matches!(refused, KillSwitchError::Disabled { generation: 4, .. }), "{refused:?}");
}

#[tokio::test]
async fn disable_between_the_phases_refuses_the_side_effect() {
    let world = World::new().await;
    let targets = checkout_targets("basket_checkout");
    let clearance = world.kill_switch.pre_dispatch(CHECKOUT, &targets).await.unwrap();
    let release = world.target_key().digest(TargetKind::ServerRelease, RELEASE);
    world.authority.db.disable(&release, "bad-release", now_ms()).await.unwrap();
    let refused = world.kill_switch.pre_side_effect(CHECKOUT, &targets, &clearance).await.unwrap_err();
    assert!(refused.is_disabled(), "{refused:?}");
}

#[tokio::test]
async fn a_clearance_is_bound_to_its_operation_and_targets() {
    let world = World::new().await;
    let targets = checkout_targets("basket_checkout");
    let clearance = world.kill_switch.pre_dispatch(CHECKOUT, &targets).await.unwrap();
    let other_op = world.kill_switch.pre_side_effect(PRODUCT_GET, &targets, &clearance).await.unwrap_err();
    assert!(matches!(other_op, KillSwitchError::ClearanceMismatch), "{other_op:?}");
    let other_targets =
        world.kill_switch.pre_side_effect(CHECKOUT, &checkout_targets("x"), &clearance).await.unwrap_err();
    assert!(matches!(other_targets, KillSwitchError::ClearanceMismatch), "{other_targets:?}");
}

#[tokio::test]
async fn a_stale_but_signed_enable_is_refused() {
    let world = World::new().await;
    let targets = TargetValues::new().with(TargetKind::Tool, "product_get");
    // The authority's clock lags: every head it signs is already older than the freshness bound.
    world.authority.clock.offset_ms.store(-(i64::try_from(MAX_AGE_MS).unwrap() + 1000), Ordering::SeqCst);
    let refused = world.kill_switch.pre_dispatch(PRODUCT_GET, &targets).await.unwrap_err();
    assert!(matches!(refused, KillSwitchError::Authority(AuthorityError::Stale)), "{refused:?}");
    // A clock ahead: issued in the future.
    world.authority.clock.offset_ms.store(60_000, Ordering::SeqCst);
    let refused = world.kill_switch.pre_dispatch(PRODUCT_GET, &targets).await.unwrap_err();
    assert!(matches!(refused, KillSwitchError::Authority(AuthorityError::Stale)), "{refused:?}");
    world.authority.clock.offset_ms.store(0, Ordering::SeqCst);
    world.kill_switch.pre_dispatch(PRODUCT_GET, &targets).await.unwrap();
}

#[tokio::test]
async fn lower_and_conflicting_generations_are_refused() {
    let world = World::new().await;
    let tool = world.target_key().digest(TargetKind::Tool, "product_get");
    let targets = TargetValues::new().with(TargetKind::Tool, "product_get");
    // Every answer to the store: within the replay window this instance would answer its own
    // generation 1 from memory (the bounded split view, tested in generation::remembered).
    world.kill_switch.set_replay_window(std::time::Duration::ZERO);
    world.kill_switch.pre_dispatch(PRODUCT_GET, &targets).await.unwrap();
    // Another instance accepted generation 5 for this target (the authority later lost state and
    // went back to generation 1): the head is now a rollback.
    let record = |generation, digest: &str| GenerationRecord {
        authority: fixture::AUTHORITY_ID.to_owned(),
        subject: GenerationSubject::Target(tool.clone()),
        generation,
        digest: digest.to_owned(),
        state: "ENABLE".to_owned(),
    };
    assert_eq!(world.store.accept_all(&[record(5, &"ee".repeat(32))]).await.unwrap(), vec![MonotonicOutcome::Accepted]);
    let stale = world.kill_switch.pre_dispatch(PRODUCT_GET, &targets).await.unwrap_err();
    assert!(matches!(stale, KillSwitchError::StaleGeneration { kind: TargetKind::Tool }), "{stale:?}");

    // A second target whose generation 1 was accepted with a different state digest.
    let other = world.target_key().digest(TargetKind::Tool, "conflicted");
    let conflicting = GenerationRecord { subject: GenerationSubject::Target(other), ..record(1, &"ff".repeat(32)) };
    world.store.accept_all(&[conflicting]).await.unwrap();
    let conflict = world
        .kill_switch
        .pre_dispatch(PRODUCT_GET, &TargetValues::new().with(TargetKind::Tool, "conflicted"))
        .await
        .unwrap_err();
    assert!(matches!(conflict, KillSwitchError::GenerationConflict { .. }), "{conflict:?}");
}

#[tokio::test]
async fn a_restarted_server_keeps_refusing_rolled_back_heads() {
    let world = World::new().await;
    let tool = world.target_key().digest(TargetKind::Tool, "product_get");
    world.authority.db.disable(&tool, "halt", now_ms()).await.unwrap();
    world.authority.db.enable(&tool, "resume", now_ms()).await.unwrap();
    let targets = TargetValues::new().with(TargetKind::Tool, "product_get");
    assert_eq!(world.kill_switch.pre_dispatch(PRODUCT_GET, &targets).await.unwrap().generations(), &[3]);

    // Restart the server side: new store handle on the same file, new kill switch.
    world.store.close().await;
    let store = Arc::new(
        SqliteGenerationStore::open(world.kit.dir.path().join("generations.db").to_str().unwrap()).await.unwrap(),
    );
    // The authority loses its state (a restore from an old backup): it answers generation 1 again.
    // (A backup holds the older state version too, so the authority's memory reloads.)
    sqlx::query("DELETE FROM killswitch_authority_targets").execute(world.authority.db.pool()).await.unwrap();
    sqlx::query("UPDATE killswitch_authority_meta SET state_version = 0")
        .execute(world.authority.db.pool())
        .await
        .unwrap();
    let restarted =
        fixture::kill_switch(world.kit.policy(1), world.client(), store, &world.target_key_bytes).await.unwrap();
    let refused = restarted.pre_dispatch(PRODUCT_GET, &targets).await.unwrap_err();
    assert!(matches!(refused, KillSwitchError::StaleGeneration { .. }), "{refused:?}");
}

#[tokio::test]
async fn an_expired_policy_refuses_everything() {
    const LIFETIME_MS: i64 = 60_000;
    let world = World::new().await;
    let mut payload = world.kit.payload(2);
    payload["not_after"] = serde_json::json!(palisade_base::time::format_rfc3339_ms(now_ms() + LIFETIME_MS));
    let policy = world.kit.load(&world.kit.sign(&payload)).unwrap();
    // The kill switch's clock is the system clock until the test moves it (no sleeping).
    let clock = Arc::new(SkewClock::default());
    let kill_switch = fixture::kill_switch_with_clock(
        policy,
        world.client(),
        world.store.clone(),
        &world.target_key_bytes,
        clock.clone(),
    )
    .await
    .unwrap();
    let targets = TargetValues::new().with(TargetKind::Tool, "product_get");
    kill_switch.pre_dispatch(PRODUCT_GET, &targets).await.unwrap();
    // Now is at least `not_after`: the policy has expired (`not_after` itself is expired).
    clock.offset_ms.store(LIFETIME_MS, Ordering::SeqCst);
    let refused = kill_switch.pre_dispatch(PRODUCT_GET, &targets).await.unwrap_err();
    assert!(matches!(refused, KillSwitchError::PolicyExpired), "{refused:?}");
    let refused = kill_switch.pre_dispatch(fixture::TOOLS_LIST, &TargetValues::new()).await.unwrap_err();
    assert!(matches!(refused, KillSwitchError::PolicyExpired), "NOT_APPLICABLE too: {refused:?}");
}

#[tokio::test]
async fn a_broken_generation_store_fails_closed() {
    struct DownStore;
    impl GenerationStore for DownStore {
        fn accept_all<'a>(
            &'a self,
            _records: &'a [GenerationRecord],
        ) -> palisade_killswitch::generation::StoreFuture<'a, Vec<MonotonicOutcome>> {
            Box::pin(async {
                Err(palisade_killswitch::GenerationStoreError::Unavailable { during: "accept", source: None })
            })
        }
    }
    let world = World::new().await;
    let started = fixture::kill_switch(world.kit.policy(1), world.client(), Arc::new(DownStore), &[1; 32]).await;
    assert!(matches!(started, Err(KillSwitchError::Store(_))), "cannot start without the store");

    // Valkey stops answering while running: a Redis store pointed at a port nobody serves.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let redis = palisade_killswitch::RedisGenerationStore::connect(
        &format!("redis://127.0.0.1:{port}/"),
        palisade_killswitch::RedisOptions {
            connect_timeout: Duration::from_millis(200),
            response_timeout: Duration::from_millis(200),
            retries: 0,
        },
    )
    .await;
    assert!(redis.is_err(), "unreachable Valkey is an error, never an empty store");
}

#[tokio::test]
async fn a_slow_authority_times_out_and_an_absent_one_is_unreachable() {
    let pki = fixture::Pki::new();
    let kit = fixture::PolicyKit::new();
    let store = Arc::new(SqliteGenerationStore::open("sqlite::memory:").await.unwrap());
    // Accepts TCP connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://localhost:{}", silent.local_addr().unwrap().port());
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let mut config = pki.client_config(&url, &pki.client, &pki.ca.cert_pem);
    config.timeout = Duration::from_millis(300);
    let kill_switch =
        fixture::kill_switch(kit.policy(1), AuthorityClient::new(config).unwrap(), store.clone(), &[1; 32])
            .await
            .unwrap();
    let started = std::time::Instant::now();
    let refused = kill_switch
        .pre_dispatch(PRODUCT_GET, &TargetValues::new().with(TargetKind::Tool, "product_get"))
        .await
        .unwrap_err();
    assert!(matches!(refused, KillSwitchError::Authority(AuthorityError::Timeout)), "{refused:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    hold.abort();

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = pki.client_config(&format!("https://localhost:{closed}"), &pki.client, &pki.ca.cert_pem);
    let kill_switch =
        fixture::kill_switch(kit.policy(1), AuthorityClient::new(config).unwrap(), store, &[1; 32]).await.unwrap();
    let refused = kill_switch
        .pre_dispatch(PRODUCT_GET, &TargetValues::new().with(TargetKind::Tool, "product_get"))
        .await
        .unwrap_err();
    assert!(matches!(refused, KillSwitchError::Authority(AuthorityError::Unreachable { .. })), "{refused:?}");
}

#[tokio::test]
async fn mutual_tls_is_required_both_ways() {
    let world = World::new().await;
    let targets = TargetValues::new().with(TargetKind::Tool, "product_get");
    let with_client = |identity: &fixture::Identity, ca_pem: &str| {
        AuthorityClient::new(world.pki.client_config(&world.authority.url, identity, ca_pem)).unwrap()
    };

    // A client certificate from another CA.
    let foreign = world.pki.foreign_ca.issue(&["intruder"], true);
    let intruder = fixture::kill_switch(
        world.kit.policy(1),
        with_client(&foreign, &world.pki.ca.cert_pem),
        world.store.clone(),
        &[1; 32],
    )
    .await
    .unwrap();
    let refused = intruder.pre_dispatch(PRODUCT_GET, &targets).await.unwrap_err();
    assert!(matches!(refused, KillSwitchError::Authority(AuthorityError::Unreachable { .. })), "{refused:?}");

    // The authority's certificate does not chain to the CA the client trusts.
    let wary = fixture::kill_switch(
        world.kit.policy(1),
        with_client(&world.pki.client, &world.pki.foreign_ca.cert_pem),
        world.store.clone(),
        &[1; 32],
    )
    .await
    .unwrap();
    let refused = wary.pre_dispatch(PRODUCT_GET, &targets).await.unwrap_err();
    assert!(matches!(refused, KillSwitchError::Authority(AuthorityError::Unreachable { .. })), "{refused:?}");

    // No client certificate at all (a plain TLS client trusting the right CA).
    let mut roots = rustls::RootCertStore::empty();
    for certificate in rustls::pki_types::CertificateDer::pem_slice_iter(world.pki.ca.cert_pem.as_bytes()) {
        roots.add(certificate.unwrap()).unwrap();
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let anonymous = reqwest::Client::builder().use_preconfigured_tls(tls).no_proxy().build().unwrap();
    let result = anonymous
        .post(format!("{}/v1/disable/current-head", world.authority.url))
        .body("{}")
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(result.is_err(), "a client without a certificate gets no answer: {result:?}");

    // The legitimate client still works.
    world.kill_switch.pre_dispatch(PRODUCT_GET, &targets).await.unwrap();
}

use rustls::pki_types::pem::PemObject;

#[tokio::test]
async fn the_single_query_envelope_still_answers_fences_and_refuses() {
    let world = World::new().await;
    let mut config = world.pki.client_config(&world.authority.url, &world.pki.client, &world.pki.ca.cert_pem);
    config.envelope = palisade_killswitch::HeadEnvelope::Single;
    let switch = fixture::kill_switch(
        world.kit.policy(1),
        AuthorityClient::new(config).unwrap(),
        world.store.clone(),
        &world.target_key_bytes,
    )
    .await
    .unwrap();
    assert_eq!(switch.batch_stats(), None, "v2: no batches");
    let targets = checkout_targets("basket_checkout");
    let clearance = switch.pre_dispatch(CHECKOUT, &targets).await.unwrap();
    let fence = switch.pre_side_effect(CHECKOUT, &targets, &clearance).await.unwrap();
    assert_eq!(fence.tokens().len(), 2);
    for request in fence.redeem_requests() {
        world.client().redeem(&request).await.unwrap();
    }
    let tool = world.target_key().digest(TargetKind::Tool, "basket_checkout");
    world.authority.db.disable(&tool, "halt", now_ms()).await.unwrap();
    assert!(switch.pre_dispatch(CHECKOUT, &targets).await.unwrap_err().is_disabled());
    // The batched kill switch of the same world agrees.
    assert!(world.kill_switch.pre_dispatch(CHECKOUT, &targets).await.unwrap_err().is_disabled());
}
