//! The task store's checks: owner visibility, compare-and-swap changes, orphans and purge.

use super::*;

/// A `working` task numbered `n`, owned by `owner`, created at 1_000 with a 10 s retention.
pub fn sample_task(n: u8, owner: &HandleOwner) -> TaskRow {
    TaskRow {
        digest: [n; 32],
        owner: owner.clone(),
        request_id: format!("{n}"),
        method: "tools/call".into(),
        tool: "slow_compute".into(),
        arguments_digest: [0xaa; 32],
        scopes: "jobs:run".into(),
        execution: "{}".into(),
        status: TaskStatus::Working,
        status_message: None,
        input_requests: None,
        input_responses: "{}".into(),
        answered_keys: "[]".into(),
        result: None,
        error: None,
        cancel_requested: false,
        created_ms: 1_000,
        updated_ms: 1_000,
        ttl_ms: Some(10_000),
        poll_interval_ms: Some(500),
        lease_owner: Some("instance-a".into()),
        lease_until_ms: Some(5_000),
        attempts: 1,
        version: 1,
    }
}

/// Owners see their task until its retention ends; nobody else ever does.
pub async fn task_is_visible_to_its_owner_until_it_expires(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    store.insert_task(sample_task(1, &alice)).await.expect("insert_task");
    let found = store.load_owned_task([1; 32], &alice, 2_000).await.expect("load").expect("visible");
    assert_eq!(found, sample_task(1, &alice));
    for other in [owner(2, "shop", "cli"), owner(1, "other", "cli"), owner(1, "shop", "web")] {
        assert!(store.load_owned_task([1; 32], &other, 2_000).await.expect("load").is_none(), "{other:?}");
    }
    assert!(store.load_owned_task([1; 32], &alice, 10_999).await.expect("load").is_some());
    assert!(store.load_owned_task([1; 32], &alice, 11_000).await.expect("load").is_none(), "expired");
    let active = |tenant: Option<&'static str>| store.active_tasks_of([1; 32], tenant, 10);
    assert_eq!(active(None).await.expect("active").len(), 1);
    assert_eq!(active(Some("shop")).await.expect("active").len(), 1);
    assert!(active(Some("other")).await.expect("active").is_empty());
    let duplicate = store.insert_task(sample_task(1, &owner(9, "evil", "x"))).await;
    assert!(matches!(duplicate, Err(StoreError::Conflict { .. })), "{duplicate:?}");
    fixture.cleanup().await;
}

/// A change applies only at the expected version; once terminal, no change applies; every
/// status passed through is in the history, once.
pub async fn task_changes_are_compare_and_swap_and_terminal_rows_never_change(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let alice = owner(1, "shop", "cli");
    store.insert_task(sample_task(1, &alice)).await.expect("insert_task");
    let mut next = sample_task(1, &alice);
    next.status = TaskStatus::InputRequired;
    next.input_requests = Some(r#"{"confirm":{}}"#.into());
    next.updated_ms = 1_100;
    assert!(store.swap_task(next.clone(), 1).await.expect("swap"));
    assert!(!other.swap_task(next.clone(), 1).await.expect("swap"), "a stale version must lose");
    // Two instances racing from the same version: exactly one wins.
    let mut done = next.clone();
    done.status = TaskStatus::Completed;
    done.input_requests = None;
    done.result = Some(r#"{"content":[]}"#.into());
    done.updated_ms = 1_200;
    let mut cancelled = next.clone();
    cancelled.status = TaskStatus::Cancelled;
    cancelled.updated_ms = 1_200;
    let (a, b) = tokio::join!(store.swap_task(done.clone(), 2), other.swap_task(cancelled.clone(), 2));
    assert!(a.expect("swap") ^ b.expect("swap"), "exactly one of two racing writers wins");
    let terminal = store.load_task([1; 32]).await.expect("load").expect("present");
    assert!(terminal.is_terminal());
    assert_eq!(terminal.version, 3);
    // Terminal: even a writer holding the current version changes nothing.
    let mut reopen = terminal.clone();
    reopen.status = TaskStatus::Working;
    reopen.result = None;
    assert!(!store.swap_task(reopen, 3).await.expect("swap"));
    assert_eq!(store.load_task([1; 32]).await.expect("load").expect("present"), terminal);
    let history: Vec<String> =
        store.task_history([1; 32]).await.expect("history").into_iter().map(|(_, s)| s).collect();
    assert_eq!(history, ["working", "input_required", terminal.status.as_str()]);
    // A row breaking the schema's rules is refused before the database (an unknown status
    // cannot be written at all: it is a `TaskStatus`; one read back is an invalid record).
    let mut broken = sample_task(2, &alice);
    broken.tool = String::new();
    assert!(matches!(store.insert_task(broken).await, Err(StoreError::InvalidRecord { .. })));
    fixture.cleanup().await;
}

/// Working tasks whose lease ended are orphans; terminal or leased ones are not. Purging takes
/// only tasks past retention, at most `limit` per call.
pub async fn orphaned_tasks_are_found_and_expired_tasks_purged(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    for n in 1..=4u8 {
        let mut task = sample_task(n, &alice);
        task.created_ms = 1_000 + i64::from(n);
        task.lease_until_ms = Some(if n == 2 { 9_000 } else { 5_000 });
        if n == 3 {
            task.status = TaskStatus::Completed;
            task.result = Some("{}".into());
        }
        if n == 4 {
            task.ttl_ms = None;
        }
        store.insert_task(task).await.expect("insert_task");
    }
    let orphans: Vec<u8> =
        store.orphaned_tasks(6_000, 10).await.expect("orphans").iter().map(|t| t.digest[0]).collect();
    assert_eq!(orphans, [1, 4]);
    assert_eq!(store.orphaned_tasks(6_000, 1).await.expect("orphans").len(), 1);
    // Retention 10 s from ~1 s: 1..=3 expire by 20 s; 4 never does.
    assert_eq!(store.purge_tasks(20_000, 2).await.expect("purge"), 2);
    assert_eq!(store.purge_tasks(20_000, 10).await.expect("purge"), 1);
    assert!(store.load_task([4; 32]).await.expect("load").is_some());
    assert!(store.task_history([1; 32]).await.expect("history").is_empty(), "history purged with its task");
    fixture.cleanup().await;
}

/// A store that is down refuses every task operation with `Unavailable`.
pub async fn closed_store_refuses_task_operations(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    store.insert_task(sample_task(1, &alice)).await.expect("insert_task");
    store.close().await;
    expect_unavailable(store.insert_task(sample_task(2, &alice)).await, "insert_task");
    expect_unavailable(store.load_owned_task([1; 32], &alice, 2_000).await, "load_owned_task");
    expect_unavailable(store.swap_task(sample_task(1, &alice), 1).await, "swap_task");
    expect_unavailable(store.orphaned_tasks(6_000, 5).await, "orphaned_tasks");
    fixture.cleanup().await;
}
