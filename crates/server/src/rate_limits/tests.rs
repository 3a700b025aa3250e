//! The rate-limit set: which rules apply to a request and under which key, all-or-nothing over
//! several rules, state carried over a rebuild for unchanged rules only, and the shared store's
//! failure handled both ways.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

fn principal(subject: &str, tenant: Option<&str>) -> VerifiedPrincipal {
    let stored = serde_json::json!({
        "issuer": "https://issuer", "subject": subject, "tenant": tenant, "client": "app", "scopes": [],
    });
    VerifiedPrincipal::from_stored(&stored).unwrap()
}

fn rule(name: &str, key: &[Dimension], per_second: u32, burst: u32) -> RateRule {
    RateRule {
        name: name.into(),
        key: key.to_vec(),
        methods: Vec::new(),
        tools: Vec::new(),
        upstreams: Vec::new(),
        rate: Rate::new(per_second, 1, burst),
        quota: None,
    }
}

fn call(tool: &str) -> OperationKey {
    OperationKey::tool_call(tool)
}

const NOW: u64 = 1_700_000_000_000_000;

async fn allowed(limits: &RateLimits, operation: &OperationKey, who: &VerifiedPrincipal) -> bool {
    matches!(limits.check(operation, who, || NOW).await.decision, Decision::Allowed(_))
}

#[tokio::test]
async fn a_rule_keys_on_its_dimensions_and_applies_only_where_they_exist() {
    let limits = RateLimits::build(
        vec![
            rule("per-subject", &[Dimension::Subject], 1, 2),
            rule("per-tenant-tool", &[Dimension::Tenant, Dimension::Tool], 1, 3),
        ],
        None,
        None,
    )
    .unwrap();
    let alice = principal("alice", Some("t1"));
    let bob = principal("bob", Some("t1"));
    // Alice: two (her own burst).
    assert!(allowed(&limits, &call("echo"), &alice).await);
    assert!(allowed(&limits, &call("echo"), &alice).await);
    let refused = limits.check(&call("echo"), &alice, || NOW).await.decision;
    assert_eq!(refused, Decision::Refused { rule: 0, retry_after_ms: 1000 });
    // Bob has his own subject bucket, but shares tenant t1's bucket for `echo` (3, two spent).
    assert!(allowed(&limits, &call("echo"), &bob).await);
    assert_eq!(
        limits.check(&call("echo"), &bob, || NOW).await.decision,
        Decision::Refused { rule: 1, retry_after_ms: 1000 }
    );
    // Another tool is another tenant-tool bucket; a list has no tool, so only per-subject applies.
    assert!(allowed(&limits, &call("add"), &bob).await);
    let list = OperationKey::new(Method::ToolsList, None);
    assert_eq!(limits.check(&list, &principal("carol", None), || NOW).await.decision, Decision::Allowed(vec![0]));
}

#[tokio::test]
async fn filters_choose_the_requests_a_rule_counts() {
    let mut only_echo = rule("echo", &[], 1, 1);
    only_echo.tools = vec!["echo".into()];
    let mut only_lists = rule("lists", &[], 1, 1);
    only_lists.methods = vec![Method::ToolsList];
    let limits = RateLimits::build(vec![only_echo, only_lists], None, None).unwrap();
    let who = principal("alice", None);
    assert!(allowed(&limits, &call("echo"), &who).await);
    assert!(!allowed(&limits, &call("echo"), &who).await);
    assert_eq!(limits.check(&call("add"), &who, || NOW).await.decision, Decision::Allowed(vec![]));
    let list = OperationKey::new(Method::ToolsList, None);
    assert!(allowed(&limits, &list, &who).await);
    assert!(!allowed(&limits, &list, &who).await);
}

#[tokio::test]
async fn a_rebuild_keeps_the_state_of_unchanged_rules_only() {
    let first = RateLimits::build(vec![rule("a", &[], 1, 1), rule("b", &[], 1, 1)], None, None).unwrap();
    let who = principal("alice", None);
    assert!(allowed(&first, &call("echo"), &who).await);
    // `a` unchanged, `b` with a new burst: `a` is still spent, `b` starts afresh.
    let second = RateLimits::build(vec![rule("a", &[], 1, 1), rule("b", &[], 1, 2)], None, Some(&first)).unwrap();
    assert!(second.shares_state_with(&first, "a"));
    assert!(!second.shares_state_with(&first, "b"));
    assert_eq!(
        second.check(&call("echo"), &who, || NOW).await.decision,
        Decision::Refused { rule: 0, retry_after_ms: 1000 }
    );
    let only_b = RateLimits::build(vec![rule("b", &[], 1, 2)], None, Some(&second)).unwrap();
    assert!(allowed(&only_b, &call("echo"), &who).await);
}

#[test]
fn a_set_refuses_duplicate_names_and_empty_rules() {
    let twice = RateLimits::build(vec![rule("a", &[], 1, 1), rule("a", &[], 2, 1)], None, None);
    assert_eq!(twice.unwrap_err(), RuleError::DuplicateName("a".into()));
    let mut empty = rule("e", &[], 1, 1);
    empty.rate = None;
    assert_eq!(RateLimits::build(vec![empty], None, None).unwrap_err(), RuleError::NothingToLimit("e".into()));
}

/// A shared store that fails, or records what it was asked and allows.
struct FakeStore {
    fail: bool,
    calls: AtomicU32,
    seen: Mutex<Vec<SharedCell>>,
}

impl SharedStore for FakeStore {
    fn check<'a>(&'a self, cells: &'a [SharedCell]) -> StoreFuture<'a> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().unwrap().extend(cells.iter().cloned());
        let fail = self.fail;
        Box::pin(async move { if fail { Err(StoreUnavailable("down".into())) } else { Ok(Verdict::Allowed) } })
    }
}

fn shared(fail: bool, on_failure: OnStoreFailure) -> (Arc<FakeStore>, Shared) {
    let store = Arc::new(FakeStore { fail, calls: AtomicU32::new(0), seen: Mutex::new(Vec::new()) });
    (store.clone(), Shared { store, namespace: "ns".into(), on_failure })
}

#[tokio::test]
async fn a_shared_check_is_one_call_with_digested_keys() {
    let (store, shared) = shared(false, OnStoreFailure::Refuse);
    let mut both = rule("both", &[Dimension::Subject], 1, 1);
    both.quota = Some(Quota { limit: 10, window_secs: 60 });
    let limits = RateLimits::build(vec![both, rule("all", &[], 1, 1)], Some(shared), None).unwrap();
    let who = principal("alice@example.com", None);
    assert_eq!(limits.check(&call("echo"), &who, || NOW).await.decision, Decision::Allowed(vec![0, 1]));
    assert_eq!(store.calls.load(Ordering::SeqCst), 1, "one round trip for every rule");
    let seen = store.seen.lock().unwrap();
    assert_eq!(seen.len(), 3, "a rate and a quota, then a rate");
    assert!(seen.iter().all(|cell| cell.key.starts_with("palisade:rl:{ns}:")));
    assert!(seen.iter().all(|cell| !cell.key.contains("alice")), "no subject in clear: {seen:?}");
    assert!(matches!(seen[1].limit, Limit::Quota(_)));
}

#[tokio::test]
async fn a_failed_store_refuses_by_default() {
    let (_, shared) = shared(true, OnStoreFailure::Refuse);
    let limits = RateLimits::build(vec![rule("a", &[], 1, 5)], Some(shared), None).unwrap();
    let checked = limits.check(&call("echo"), &principal("alice", None), || NOW).await;
    assert_eq!(checked, Checked { decision: Decision::StoreUnavailable, fell_back: false });
}

#[tokio::test]
async fn a_failed_store_falls_back_to_the_local_allowance_when_configured() {
    let (_, shared) = shared(true, OnStoreFailure::Local);
    let limits = RateLimits::build(vec![rule("a", &[], 1, 2)], Some(shared), None).unwrap();
    let who = principal("alice", None);
    for _ in 0..2 {
        let checked = limits.check(&call("echo"), &who, || NOW).await;
        assert_eq!(checked, Checked { decision: Decision::Allowed(vec![0]), fell_back: true });
    }
    let checked = limits.check(&call("echo"), &who, || NOW).await;
    assert_eq!(checked.decision, Decision::Refused { rule: 0, retry_after_ms: 1000 });
}
