//! The delegation ledger's checks: chains, mint refusals, budgets, revocation and approvals.

use super::*;

/// A delegation digest numbered `n` (distinct from every other test digest).
pub fn delegation_digest(n: u8) -> [u8; 32] {
    let mut digest = [0xd0; 32];
    digest[0] = n;
    digest[31] = n.wrapping_mul(13).wrapping_add(1);
    digest
}

/// The keyed digest of principal number `n`.
fn principal(n: u8) -> [u8; 32] {
    [0x50_u8.wrapping_add(n); 32]
}

/// A delegation numbered `n` under the parent numbered `parent` (a root for `None`), acting for
/// principal 1 with a budget of `calls`, created at 1_000 + n and expiring at 10_000.
pub fn sample_delegation(n: u8, parent: Option<u8>, calls: i64) -> NewDelegation {
    NewDelegation {
        digest: delegation_digest(n),
        parent: parent.map(delegation_digest),
        principal_key: principal(1),
        agent: format!("agent-{n}"),
        body: format!(r#"{{"tools":["tool_{n}"],"note":"ünïcode"}}"#),
        expires_ms: 10_000,
        calls,
        created_ms: 1_000 + i64::from(n),
    }
}

async fn mint_ok(store: &dyn Store, new: NewDelegation, max_depth: u32) -> DelegationRow {
    let what = format!("{new:?}");
    match store.mint_delegation(new, max_depth).await.expect("mint_delegation") {
        Ok(row) => row,
        Err(refusal) => panic!("{what}: refused: {}", refusal.reason()),
    }
}

/// Every row in the store, newest first.
async fn all_delegations(store: &dyn Store) -> Vec<DelegationRow> {
    store.delegations(None, MAX_DELEGATION_LIST).await.expect("delegations")
}

/// The stored row of `n` (the last of its chain).
async fn delegation_row(store: &dyn Store, n: u8) -> DelegationRow {
    let chain = store.delegation_chain(delegation_digest(n)).await.expect("delegation_chain");
    chain.last().cloned().unwrap_or_else(|| panic!("delegation {n} should exist"))
}

/// A root and two generations below it: each mint returns the row as stored (root, depth,
/// parent, budget), each child's budget comes out of its parent's `remaining`, and a chain reads
/// back root first from either instance. A chain whose root is gone starts below it.
pub async fn delegation_chain_links_root_to_grandchild(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    assert!(store.delegation_chain(delegation_digest(1)).await.expect("chain").is_empty(), "unknown digest");
    let root = mint_ok(store.as_ref(), sample_delegation(1, None, 10), 0).await;
    let expected_root = DelegationRow {
        digest: delegation_digest(1),
        parent: None,
        root: delegation_digest(1),
        depth: 0,
        principal_key: principal(1),
        agent: "agent-1".into(),
        body: sample_delegation(1, None, 10).body,
        expires_ms: 10_000,
        calls: 10,
        remaining: 10,
        created_ms: 1_001,
        revoked_ms: None,
    };
    assert_eq!(root, expected_root);
    let child = mint_ok(other.as_ref(), sample_delegation(2, Some(1), 4), 4).await;
    assert_eq!((child.parent, child.root, child.depth), (Some(delegation_digest(1)), delegation_digest(1), 1));
    assert_eq!((child.calls, child.remaining), (4, 4));
    let grandchild = mint_ok(store.as_ref(), sample_delegation(3, Some(2), 1), 4).await;
    assert_eq!((grandchild.parent, grandchild.root, grandchild.depth), (Some(delegation_digest(2)), root.root, 2));
    assert_eq!((grandchild.calls, grandchild.remaining), (1, 1));

    for instance in [&store, &other] {
        let chain = instance.delegation_chain(delegation_digest(3)).await.expect("chain");
        let digests: Vec<[u8; 32]> = chain.iter().map(|row| row.digest).collect();
        assert_eq!(digests, vec![delegation_digest(1), delegation_digest(2), delegation_digest(3)], "root first");
        assert_eq!(chain.iter().map(|row| row.depth).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert!(chain.iter().all(|row| row.root == delegation_digest(1)), "{chain:?}");
        assert_eq!(chain.iter().map(|row| row.remaining).collect::<Vec<_>>(), vec![6, 3, 1], "budgets moved down");
        assert_eq!(chain[0], DelegationRow { remaining: 6, ..expected_root.clone() });
        assert_eq!(chain[2], grandchild);
    }
    let chain = store.delegation_chain(delegation_digest(2)).await.expect("chain");
    assert_eq!(
        chain.iter().map(|row| row.digest).collect::<Vec<_>>(),
        vec![delegation_digest(1), delegation_digest(2)]
    );
    // A second child may take exactly what the root has left.
    let second = mint_ok(store.as_ref(), sample_delegation(4, Some(1), 6), 4).await;
    assert_eq!((second.depth, second.remaining), (1, 6));
    assert_eq!(delegation_row(store.as_ref(), 1).await.remaining, 0);
    assert_eq!(all_delegations(store.as_ref()).await.len(), 4);

    fixture.tamper("DELETE FROM delegations WHERE depth = 0").await;
    let chain = store.delegation_chain(delegation_digest(3)).await.expect("chain");
    assert_eq!(
        chain.iter().map(|row| (row.digest, row.depth)).collect::<Vec<_>>(),
        vec![(delegation_digest(2), 1), (delegation_digest(3), 2)]
    );
    other.close().await;
    fixture.cleanup().await;
}

/// Mints `new` expecting `refusal`, and checks that no row changed (not the parent's budget, not
/// the number of rows).
async fn expect_refusal(store: &dyn Store, new: NewDelegation, max_depth: u32, refusal: MintRefusal, what: &str) {
    let before = all_delegations(store).await;
    let result = store.mint_delegation(new, max_depth).await.expect("mint_delegation");
    assert_eq!(result.err(), Some(refusal), "{what}");
    assert_eq!(all_delegations(store).await, before, "{what}: a refused mint changed the rows");
}

/// Each refusal, in its own case and at its exact edge, with every row unchanged after it; the
/// mint just inside each edge is accepted.
pub async fn every_mint_refusal_leaves_every_row_unchanged(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let store = store.as_ref();
    mint_ok(store, sample_delegation(1, None, 10), 0).await;
    mint_ok(store, sample_delegation(2, Some(1), 4), 8).await;
    mint_ok(store, sample_delegation(3, None, 10), 0).await;
    assert!(store.revoke_delegation(delegation_digest(3), 1_500).await.expect("revoke"));
    mint_ok(store, NewDelegation { expires_ms: 2_000, ..sample_delegation(4, None, 10) }, 0).await;

    let unknown = sample_delegation(10, Some(99), 1);
    expect_refusal(store, unknown, 8, MintRefusal::ParentUnknown, "unknown parent").await;
    let revoked = sample_delegation(10, Some(3), 1);
    expect_refusal(store, revoked, 8, MintRefusal::ParentRevoked, "revoked parent").await;
    let at_expiry = NewDelegation { created_ms: 2_000, expires_ms: 2_001, ..sample_delegation(10, Some(4), 1) };
    expect_refusal(store, at_expiry, 8, MintRefusal::ParentExpired, "parent expires at the child's creation").await;
    let after_expiry = NewDelegation { created_ms: 5_000, expires_ms: 6_000, ..sample_delegation(10, Some(4), 1) };
    expect_refusal(store, after_expiry, 8, MintRefusal::ParentExpired, "parent expired before").await;
    let before_expiry = NewDelegation { created_ms: 1_999, expires_ms: 2_000, ..sample_delegation(10, Some(4), 1) };
    assert_eq!(mint_ok(store, before_expiry, 8).await.depth, 1, "a parent live at creation");
    let stranger = NewDelegation { principal_key: principal(2), ..sample_delegation(11, Some(1), 1) };
    expect_refusal(store, stranger, 8, MintRefusal::OtherPrincipal, "another principal").await;
    // Depth: the caller's maximum (2 is at depth 1: its child would be depth 2).
    expect_refusal(store, sample_delegation(11, Some(2), 1), 1, MintRefusal::TooDeep, "max_depth 1").await;
    expect_refusal(store, sample_delegation(11, Some(1), 1), 0, MintRefusal::TooDeep, "max_depth 0").await;
    let outlives = NewDelegation { expires_ms: 10_001, ..sample_delegation(11, Some(1), 1) };
    expect_refusal(store, outlives, 8, MintRefusal::OutlivesParent, "outlives its parent").await;
    let greedy = sample_delegation(11, Some(1), 7);
    expect_refusal(store, greedy, 8, MintRefusal::BudgetExceeded, "more than the parent has left").await;
    let greedy_child = sample_delegation(11, Some(2), 5);
    expect_refusal(store, greedy_child, 8, MintRefusal::BudgetExceeded, "more than the child has").await;
    expect_refusal(store, sample_delegation(1, None, 1), 8, MintRefusal::Exists, "an existing root digest").await;
    let twice = sample_delegation(2, Some(1), 1);
    expect_refusal(store, twice, 8, MintRefusal::Exists, "an existing child digest").await;
    let own_parent = NewDelegation { parent: Some(delegation_digest(1)), ..sample_delegation(1, None, 1) };
    expect_refusal(store, own_parent, 8, MintRefusal::Exists, "a delegation as its own child").await;

    // Just inside each edge: expiring with the parent, exactly the budget left, the deepest max_depth allows.
    let exact = NewDelegation { expires_ms: 10_000, ..sample_delegation(11, Some(1), 6) };
    let exact = mint_ok(store, exact, 2).await;
    assert_eq!((exact.depth, exact.remaining), (1, 6));
    assert_eq!(delegation_row(store, 1).await.remaining, 0, "the exact budget left is granted");
    expect_refusal(store, sample_delegation(12, Some(1), 1), 8, MintRefusal::BudgetExceeded, "nothing left").await;
    assert_eq!(mint_ok(store, sample_delegation(12, Some(1), 0), 8).await.calls, 0, "a budget of 0 fits");
    assert_eq!(mint_ok(store, sample_delegation(13, Some(2), 1), 2).await.depth, 2, "depth 2 at max_depth 2");

    // The hard cap: a chain to depth MAX_DELEGATION_DEPTH, whatever maximum the caller gives.
    mint_ok(store, sample_delegation(100, None, 0), 0).await;
    for n in 101..=100 + MAX_DELEGATION_DEPTH as u8 {
        mint_ok(store, sample_delegation(n, Some(n - 1), 0), u32::MAX).await;
    }
    let deepest = 100 + MAX_DELEGATION_DEPTH as u8;
    let chain = store.delegation_chain(delegation_digest(deepest)).await.expect("chain");
    assert_eq!(chain.len(), MAX_DELEGATION_DEPTH as usize + 1, "the longest chain reads back whole");
    assert_eq!((chain[0].depth, chain[chain.len() - 1].depth), (0, MAX_DELEGATION_DEPTH));
    let too_deep = sample_delegation(deepest + 1, Some(deepest), 0);
    expect_refusal(store, too_deep, u32::MAX, MintRefusal::TooDeep, "beyond MAX_DELEGATION_DEPTH").await;
    fixture.cleanup().await;
}

/// Breaks one field of a delegation.
type BreakDelegation = fn(&mut NewDelegation);

/// Invalid fields are `InvalidRecord` with a reason that quotes no value, for a root and for a
/// child, and nothing is written (not the row, not the parent's budget).
pub async fn invalid_delegations_are_refused_and_nothing_is_written(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    mint_ok(store.as_ref(), sample_delegation(1, None, 10), 0).await;
    let before = all_delegations(store.as_ref()).await;
    let broken: Vec<(&str, BreakDelegation)> = vec![
        ("empty agent", |new| new.agent.clear()),
        ("too-long agent", |new| new.agent = "a".repeat(crate::MAX_DELEGATION_AGENT_BYTES + 1)),
        ("control character in agent", |new| new.agent = "hunter2\u{1b}[2J".into()),
        ("body an array", |new| new.body = r#"["hunter2"]"#.into()),
        ("body a string", |new| new.body = r#""hunter2""#.into()),
        ("body not JSON", |new| new.body = "{hunter2".into()),
        ("empty body", |new| new.body.clear()),
        ("too-large body", |new| new.body = format!(r#"{{"x":"{}"}}"#, "b".repeat(crate::MAX_DELEGATION_BODY_BYTES))),
        ("negative calls", |new| new.calls = -1),
        ("expires at creation", |new| new.expires_ms = new.created_ms),
        ("expires before creation", |new| new.expires_ms = new.created_ms - 1),
        ("negative creation", |new| new.created_ms = -10),
    ];
    for (what, break_it) in broken {
        for parent in [None, Some(1)] {
            let mut new = sample_delegation(2, parent, 1);
            break_it(&mut new);
            let result = store.mint_delegation(new, 8).await;
            if let Err(error) = &result {
                let text = format!("{error} {error:?}");
                assert!(!text.contains("hunter2"), "{what}: the reason quotes a value: {text}");
            }
            expect_invalid(result, what);
            assert_eq!(all_delegations(store.as_ref()).await, before, "{what}: something was written");
        }
    }
    let largest = NewDelegation {
        body: format!(r#"{{"x":"{}"}}"#, "b".repeat(crate::MAX_DELEGATION_BODY_BYTES - 8)),
        ..sample_delegation(2, Some(1), 1)
    };
    assert_eq!(mint_ok(store.as_ref(), largest.clone(), 8).await.body, largest.body, "the largest body fits");
    assert_eq!(delegation_row(store.as_ref(), 2).await.body.len(), crate::MAX_DELEGATION_BODY_BYTES);
    fixture.cleanup().await;
}

/// 50 concurrent spends of a budget of 10 over two instances: exactly 10 succeed and the budget
/// ends at 0. A child spends its own budget, not its parent's; a revoked or expired row (at the
/// exact instant) spends nothing.
pub async fn concurrent_spends_never_exceed_the_budget(harness: &dyn Harness) {
    const SPENDERS: usize = 50;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    mint_ok(instances[0].as_ref(), sample_delegation(1, None, 10), 0).await;
    let mut tasks = tokio::task::JoinSet::new();
    for spender in 0..SPENDERS {
        let instance = instances[spender % instances.len()].clone();
        tasks.spawn(async move { instance.spend_delegation_call(delegation_digest(1), 5_000).await });
    }
    let mut spent = 0;
    while let Some(joined) = tasks.join_next().await {
        if joined.expect("spender task").expect("spend_delegation_call") {
            spent += 1;
        }
    }
    assert_eq!(spent, 10, "{spent} of {SPENDERS} racing spends of a budget of 10 succeeded");
    for instance in &instances {
        assert_eq!(delegation_row(instance.as_ref(), 1).await.remaining, 0);
        assert!(!instance.spend_delegation_call(delegation_digest(1), 5_000).await.expect("spend"), "spent out");
    }
    assert_eq!(delegation_row(instances[0].as_ref(), 1).await.remaining, 0, "never negative");

    let store = instances[0].as_ref();
    mint_ok(store, sample_delegation(2, None, 3), 0).await;
    mint_ok(store, sample_delegation(3, Some(2), 2), 4).await;
    assert!(store.spend_delegation_call(delegation_digest(3), 5_000).await.expect("spend"), "the child's own");
    assert_eq!(delegation_row(store, 2).await.remaining, 1, "the parent keeps what it did not grant");
    assert_eq!(delegation_row(store, 3).await.remaining, 1);
    assert!(!store.spend_delegation_call(delegation_digest(3), 10_000).await.expect("spend"), "at expiry");
    assert!(!store.spend_delegation_call(delegation_digest(3), 20_000).await.expect("spend"), "after expiry");
    assert!(store.spend_delegation_call(delegation_digest(3), 9_999).await.expect("spend"), "just before");
    assert!(store.revoke_delegation(delegation_digest(2), 6_000).await.expect("revoke"));
    assert!(!store.spend_delegation_call(delegation_digest(2), 6_001).await.expect("spend"), "revoked");
    assert_eq!(delegation_row(store, 2).await.remaining, 1, "a refused spend takes nothing");
    assert!(!store.spend_delegation_call(delegation_digest(99), 5_000).await.expect("spend"), "unknown");
    instances[1].close().await;
    fixture.cleanup().await;
}

/// Per-tool counters: a call spends the tool's counter and the overall budget together (exactly
/// the counter's worth under racing spends on two instances, the overall budget untouched by a
/// refused one); a child's counter for a tool the parent counts is reserved from the parent's
/// (more than it has left: refused, nothing written); a tool the parent does not count is not
/// reserved; invalid counters are refused.
pub async fn per_tool_budgets_are_reserved_and_spent_with_the_overall_one(harness: &dyn Harness) {
    use std::collections::BTreeMap;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    let store = instances[0].as_ref();
    let counters = |pairs: &[(&str, i64)]| -> BTreeMap<String, i64> {
        pairs.iter().map(|(tool, count)| ((*tool).to_owned(), *count)).collect()
    };
    let minted = store
        .mint_delegation_with_tools(sample_delegation(1, None, 10), 0, counters(&[("export", 3)]))
        .await
        .expect("mint");
    assert!(minted.is_ok());
    assert_eq!(
        store.delegation_tool_budgets(delegation_digest(1)).await.expect("budgets"),
        [("export".to_owned(), (3, 3))].into()
    );
    let mut tasks = tokio::task::JoinSet::new();
    for spender in 0..20 {
        let instance = instances[spender % 2].clone();
        tasks.spawn(async move { instance.spend_delegation_tool_call(delegation_digest(1), "export", 5_000).await });
    }
    let mut spent = 0;
    while let Some(joined) = tasks.join_next().await {
        spent += usize::from(joined.expect("spender").expect("spend"));
    }
    assert_eq!(spent, 3, "exactly the tool's counter");
    assert_eq!(delegation_row(store, 1).await.remaining, 7, "the overall budget spent with it, no more");
    assert!(
        !store.spend_delegation_tool_call(delegation_digest(1), "other", 5_000).await.expect("spend"),
        "no counter"
    );
    assert_eq!(delegation_row(store, 1).await.remaining, 7, "a refused spend takes nothing");
    assert!(store.spend_delegation_call(delegation_digest(1), 5_000).await.expect("spend"), "uncounted calls go on");

    // A child: its counter for `export` is reserved from the parent's (0 left: refused) ...
    let refused = store
        .mint_delegation_with_tools(sample_delegation(2, Some(1), 2), 4, counters(&[("export", 1)]))
        .await
        .expect("mint");
    assert_eq!(refused.err(), Some(MintRefusal::BudgetExceeded));
    assert_eq!(delegation_row(store, 1).await.remaining, 6, "nothing reserved by a refused mint");
    assert!(store.delegation_chain(delegation_digest(2)).await.expect("chain").is_empty());
    // ... a counter the parent does not keep is not reserved from anything but the overall budget.
    let minted = store
        .mint_delegation_with_tools(sample_delegation(3, Some(1), 2), 4, counters(&[("read", 2)]))
        .await
        .expect("mint");
    assert!(minted.is_ok());
    assert_eq!(store.delegation_tool_budgets(delegation_digest(1)).await.expect("budgets")["export"], (3, 0));
    assert_eq!(store.delegation_tool_budgets(delegation_digest(3)).await.expect("budgets")["read"], (2, 2));
    // A grandchild's counter for `read` comes out of the child's.
    let minted = store
        .mint_delegation_with_tools(sample_delegation(4, Some(3), 1), 4, counters(&[("read", 1)]))
        .await
        .expect("mint");
    assert!(minted.is_ok());
    assert_eq!(store.delegation_tool_budgets(delegation_digest(3)).await.expect("budgets")["read"], (2, 1));
    // Invalid counters: more than the overall budget, negative, an empty tool name.
    for bad in [counters(&[("x", 3)]), counters(&[("x", -1)]), counters(&[("", 1)])] {
        let result = store.mint_delegation_with_tools(sample_delegation(5, None, 2), 0, bad).await;
        assert!(matches!(result, Err(StoreError::InvalidRecord { .. })), "{result:?}");
    }
    assert!(store.delegation_chain(delegation_digest(5)).await.expect("chain").is_empty());
    instances[1].close().await;
    fixture.cleanup().await;
}

/// Mints of children and spends race on one parent over two instances: whatever the interleaving,
/// the calls spent and the budgets granted add up to exactly the parent's budget.
pub async fn racing_mints_and_spends_share_the_parent_budget_exactly(harness: &dyn Harness) {
    const RACERS: u8 = 30;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    mint_ok(instances[0].as_ref(), sample_delegation(1, None, 12), 0).await;
    let mut tasks = tokio::task::JoinSet::new();
    for racer in 0..RACERS {
        let instance = instances[usize::from(racer) % instances.len()].clone();
        tasks.spawn(async move {
            if racer % 2 == 0 {
                let child = sample_delegation(10 + racer, Some(1), 1);
                instance.mint_delegation(child, 4).await.expect("mint_delegation").is_ok()
            } else {
                instance.spend_delegation_call(delegation_digest(1), 5_000).await.expect("spend_delegation_call")
            }
        });
    }
    let mut granted = 0;
    while let Some(joined) = tasks.join_next().await {
        if joined.expect("racer task") {
            granted += 1;
        }
    }
    assert_eq!(granted, 12, "{granted} calls spent or granted from a budget of 12");
    let rows = all_delegations(instances[1].as_ref()).await;
    let children = rows.iter().filter(|row| row.parent == Some(delegation_digest(1))).count();
    assert_eq!(delegation_row(instances[1].as_ref(), 1).await.remaining, 0);
    assert!(children <= usize::from(RACERS / 2) && rows.len() == children + 1, "{children} children");
    instances[1].close().await;
    fixture.cleanup().await;
}

/// A revocation succeeds once (from either instance), an unknown digest is not revoked, and the
/// revoked row stays in its chain with its revocation time, its descendants unchanged.
pub async fn delegation_revocation_is_once_and_stays_in_the_chain(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    mint_ok(store.as_ref(), sample_delegation(1, None, 10), 0).await;
    mint_ok(store.as_ref(), sample_delegation(2, Some(1), 5), 4).await;
    mint_ok(store.as_ref(), sample_delegation(3, Some(2), 5), 4).await;
    assert!(store.revoke_delegation(delegation_digest(2), 2_500).await.expect("revoke"), "first revocation");
    assert!(!other.revoke_delegation(delegation_digest(2), 2_600).await.expect("revoke"), "already revoked");
    assert!(!store.revoke_delegation(delegation_digest(2), 2_700).await.expect("revoke"), "already revoked");
    assert!(!store.revoke_delegation(delegation_digest(99), 2_500).await.expect("revoke"), "unknown");
    let chain = other.delegation_chain(delegation_digest(3)).await.expect("chain");
    assert_eq!(chain.len(), 3);
    assert_eq!(chain.iter().map(|row| row.revoked_ms).collect::<Vec<_>>(), vec![None, Some(2_500), None]);
    assert_eq!(chain[1].remaining, 0, "revocation moves no budget");
    other.close().await;
    fixture.cleanup().await;
}

/// Listing by principal returns only that principal's rows, newest first (then by digest), at
/// most the limit; without a principal, every row.
pub async fn delegations_are_listed_by_principal_newest_first(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    assert!(all_delegations(store.as_ref()).await.is_empty());
    // (n, principal, created_ms): 3 and 4 share a creation time.
    for (n, who, created_ms) in [(1, 1, 1_000), (2, 2, 1_500), (3, 1, 3_000), (4, 1, 3_000), (5, 1, 2_000), (6, 2, 50)]
    {
        let new = NewDelegation { principal_key: principal(who), created_ms, ..sample_delegation(n, None, 1) };
        mint_ok(store.as_ref(), new, 0).await;
    }
    let numbers = |rows: Vec<DelegationRow>| -> Vec<u8> { rows.iter().map(|row| row.digest[0]).collect() };
    let first = store.delegations(Some(principal(1)), 100).await.expect("delegations");
    assert!(first.iter().all(|row| row.principal_key == principal(1)), "{first:?}");
    // Same instant: by digest ascending (3's first byte sorts before 4's).
    assert_eq!(numbers(first), vec![3, 4, 5, 1]);
    assert_eq!(numbers(store.delegations(Some(principal(1)), 2).await.expect("delegations")), vec![3, 4]);
    assert_eq!(numbers(store.delegations(Some(principal(2)), 100).await.expect("delegations")), vec![2, 6]);
    assert!(store.delegations(Some(principal(3)), 100).await.expect("delegations").is_empty());
    assert!(store.delegations(Some(principal(1)), 0).await.expect("delegations").is_empty());
    assert_eq!(numbers(store.delegations(None, 100).await.expect("delegations")), vec![3, 4, 5, 2, 1, 6]);
    assert_eq!(numbers(store.delegations(None, 3).await.expect("delegations")), vec![3, 4, 5]);
    assert_eq!(store.delegations(None, u32::MAX).await.expect("delegations").len(), 6);
    fixture.cleanup().await;
}

/// An approval is recorded once (a duplicate is `false`, from either instance) and taken at most
/// once: 20 concurrent takers over two instances, exactly one succeeds, per key. An expired
/// approval (at the exact instant) is never taken.
pub async fn approvals_are_taken_at_most_once(harness: &dyn Harness) {
    const TAKERS: usize = 20;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    let key = |n: u8| {
        let mut key = delegation_digest(n);
        key[15] = 0xaa;
        key
    };
    assert!(instances[0].put_approval(key(1), 10_000).await.expect("put"), "new");
    assert!(!instances[0].put_approval(key(1), 10_000).await.expect("put"), "duplicate");
    assert!(!instances[1].put_approval(key(1), 20_000).await.expect("put"), "duplicate, another instance");
    assert!(!instances[0].take_approval(key(2), 5_000).await.expect("take"), "unknown");
    for round in 1..=3u8 {
        let key = key(round);
        if round > 1 {
            assert!(instances[1].put_approval(key, 10_000).await.expect("put"));
        }
        let mut tasks = tokio::task::JoinSet::new();
        for taker in 0..TAKERS {
            let instance = instances[taker % instances.len()].clone();
            tasks.spawn(async move { instance.take_approval(key, 5_000).await });
        }
        let mut taken = 0;
        while let Some(joined) = tasks.join_next().await {
            if joined.expect("taker task").expect("take_approval") {
                taken += 1;
            }
        }
        assert_eq!(taken, 1, "round {round}: {taken} of {TAKERS} racing takers took the approval");
        assert!(!instances[0].take_approval(key, 5_000).await.expect("take"), "round {round}: taken already");
    }
    assert!(instances[0].put_approval(key(9), 1_000).await.expect("put"));
    assert!(!instances[0].take_approval(key(9), 1_000).await.expect("take"), "at expiry");
    assert!(!instances[1].take_approval(key(9), 2_000).await.expect("take"), "after expiry");
    assert!(!instances[0].put_approval(key(9), 9_000).await.expect("put"), "the expired approval is still stored");
    assert!(instances[0].take_approval(key(9), 999).await.expect("take"), "a caller whose clock is before expiry");
    instances[1].close().await;
    fixture.cleanup().await;
}

/// Retention deletes approvals and delegation rows whose expiry is at or before `now_ms`, at most
/// `limit` of each per call, and counts both; live ones stay usable.
pub async fn delegation_purge_takes_only_expired_rows_and_is_bounded(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let store = store.as_ref();
    for (n, expires_ms) in [(1, 2_000), (2, 3_000), (3, 3_000), (4, 3_001)] {
        mint_ok(store, NewDelegation { expires_ms, ..sample_delegation(n, None, 5) }, 0).await;
        assert!(store.put_approval([n; 32], expires_ms).await.expect("put"));
    }
    assert_eq!(store.purge_delegations(1_999, 10).await.expect("purge"), 0, "nothing expired yet");
    assert_eq!(store.purge_delegations(3_000, 0).await.expect("purge"), 0, "limit 0");
    assert_eq!(store.purge_delegations(2_000, 10).await.expect("purge"), 2, "one row and one approval");
    assert!(store.delegation_chain(delegation_digest(1)).await.expect("chain").is_empty(), "row 1 purged");
    assert!(store.put_approval([1; 32], 9_000).await.expect("put"), "approval 1 purged");
    assert_eq!(store.purge_delegations(3_000, 1).await.expect("purge"), 2, "at most one of each");
    assert_eq!(store.purge_delegations(3_000, 1).await.expect("purge"), 2, "and the other two");
    assert_eq!(store.purge_delegations(3_000, 10).await.expect("purge"), 0);
    let left: Vec<u8> = all_delegations(store).await.iter().map(|row| row.digest[0]).collect();
    assert_eq!(left, vec![4], "the live row stays");
    assert!(store.spend_delegation_call(delegation_digest(4), 3_000).await.expect("spend"), "and is usable");
    assert!(store.take_approval([4; 32], 3_000).await.expect("take"), "the live approval stays");
    for n in 2..=3 {
        assert!(!store.take_approval([n; 32], 0).await.expect("take"), "approval {n} was purged");
        assert!(store.put_approval([n; 32], 9_000).await.expect("put"), "approval {n} was purged");
    }
    fixture.cleanup().await;
}

/// A store that is down refuses every delegation operation with `Unavailable` (fail closed), and
/// the refused calls wrote nothing.
pub async fn closed_store_refuses_delegation_operations(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    mint_ok(store.as_ref(), sample_delegation(1, None, 10), 0).await;
    assert!(store.put_approval([7; 32], 10_000).await.expect("put"));
    let before = all_delegations(other.as_ref()).await;
    store.close().await;
    expect_unavailable(store.mint_delegation(sample_delegation(2, None, 1), 4).await, "mint_delegation (root)");
    expect_unavailable(store.mint_delegation(sample_delegation(2, Some(1), 1), 4).await, "mint_delegation (child)");
    expect_unavailable(store.delegation_chain(delegation_digest(1)).await, "delegation_chain");
    expect_unavailable(store.spend_delegation_call(delegation_digest(1), 5_000).await, "spend_delegation_call");
    expect_unavailable(store.revoke_delegation(delegation_digest(1), 5_000).await, "revoke_delegation");
    expect_unavailable(store.delegations(None, 10).await, "delegations");
    expect_unavailable(store.delegations(Some(principal(1)), 10).await, "delegations of a principal");
    expect_unavailable(store.put_approval([8; 32], 10_000).await, "put_approval");
    expect_unavailable(store.take_approval([7; 32], 5_000).await, "take_approval");
    expect_unavailable(store.purge_delegations(20_000, 10).await, "purge_delegations");
    assert_eq!(all_delegations(other.as_ref()).await, before, "a refused call wrote something");
    assert!(other.take_approval([7; 32], 5_000).await.expect("take"), "the approval was not taken");
    assert!(other.put_approval([8; 32], 10_000).await.expect("put"), "no approval was recorded");
    other.close().await;
    fixture.cleanup().await;
}
