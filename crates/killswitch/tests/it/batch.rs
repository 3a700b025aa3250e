//! The batched envelope against a scripted authority (real mTLS on loopback) that builds honest
//! batch answers and then breaks them: a tampered path, a leaf for another query, a wrong tree
//! size, a root signed under the v2 context, one bad item, a replayed batch, a stale batch, a
//! rollback in one item. Two callers share each batch (one request); a defect fails exactly the
//! callers it concerns.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use palisade_base::time::format_rfc3339_ms;
use palisade_killswitch::batch::{
    BATCH_SCHEMA_VERSION, BatchItem, BatchPayload, BatchQuery, BatchResponse, all_paths, hash_hex, key_id, leaf_hash,
    sign_batch,
};
use palisade_killswitch::envelope::{EnvelopeError, sign_envelope};
use palisade_killswitch::head::HeadPayload;
use palisade_killswitch::{
    AuthorityClient, AuthorityError, DispatchClearance, Ed25519SigningKey, KillSwitch, KillSwitchError,
    SqliteGenerationStore, TargetKind, TargetValues,
};
use tokio::net::TcpListener;

use crate::fixture::{self, AUTHORITY_ID, PRODUCT_GET, Pki, PolicyKit, now_ms};

type HeadDefect = Box<dyn Fn(usize, &mut HeadPayload) + Send + Sync>;
type PayloadDefect = Box<dyn Fn(&mut BatchPayload) + Send + Sync>;
type ResponseDefect = Box<dyn Fn(&mut BatchResponse) + Send + Sync>;

/// What a test does to the honest answer.
#[derive(Default)]
struct Defects {
    /// Applied to the heads of query `index` before the tree is built (the authority signs them).
    heads: Option<HeadDefect>,
    /// Applied to the signed payload before signing.
    payload: Option<PayloadDefect>,
    /// Sign the payload the v2 way (no batch context).
    v2_context: bool,
    /// Applied to the finished response.
    response: Option<ResponseDefect>,
    /// Answer every request after the first with the first answer.
    replay: bool,
    /// Shift every time the authority writes, in ms.
    time_shift_ms: i64,
}

fn answer(batch: &BatchQuery, key: &Ed25519SigningKey, defects: &Defects) -> BatchResponse {
    let now = now_ms() + defects.time_shift_ms;
    let heads: Vec<Vec<HeadPayload>> = batch
        .queries
        .iter()
        .enumerate()
        .map(|(query_index, query)| {
            (0..query.targets.len())
                .map(|index| {
                    let mut head = fixture::honest_head(query, index, now);
                    if let Some(mutate) = &defects.heads {
                        mutate(query_index, &mut head);
                    }
                    head
                })
                .collect()
        })
        .collect();
    let leaves: Vec<_> = batch.queries.iter().zip(&heads).map(|(query, heads)| leaf_hash(query, heads)).collect();
    let (root, paths) = all_paths(&leaves);
    let mut payload = BatchPayload {
        authority: AUTHORITY_ID.to_owned(),
        batch_id: "0".repeat(32),
        issued_at: format_rfc3339_ms(now),
        key_id: key_id(&key.verifying_key()),
        root: hash_hex(&root.unwrap()),
        schema_version: BATCH_SCHEMA_VERSION.to_owned(),
        tree_size: leaves.len() as u64,
    };
    if let Some(mutate) = &defects.payload {
        mutate(&mut payload);
    }
    let signed = if defects.v2_context {
        sign_envelope(&palisade_base::canonical::canonical_bytes(&serde_json::to_value(&payload).unwrap()), key)
    } else {
        sign_batch(&payload, key)
    };
    let items = heads
        .into_iter()
        .zip(paths)
        .enumerate()
        .map(|(index, (heads, path))| BatchItem {
            heads,
            index: index as u64,
            path: path.iter().map(hash_hex).collect(),
        })
        .collect();
    let mut response = BatchResponse { batch: signed, items };
    if let Some(mutate) = &defects.response {
        mutate(&mut response);
    }
    response
}

struct Scripted {
    kill_switch: KillSwitch,
    requests: Arc<AtomicUsize>,
    _kit: PolicyKit,
}

async fn scripted(defects: Defects) -> Scripted {
    let pki = Pki::new();
    let kit = PolicyKit::new();
    let key = kit.authority_key.clone();
    let defects = Arc::new(defects);
    let first: Arc<Mutex<Option<Vec<u8>>>> = Arc::default();
    let tls = palisade_killswitch::authority::server_tls_config(
        pki.server.cert_pem.as_bytes(),
        pki.server.key_pem.as_bytes(),
        pki.ca.cert_pem.as_bytes(),
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://localhost:{}", listener.local_addr().unwrap().port());
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    tokio::spawn(async move {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, key, defects, first, counter) =
                (acceptor.clone(), key.clone(), defects.clone(), first.clone(), counter.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else { return };
                let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let (key, defects, first, counter) = (key.clone(), defects.clone(), first.clone(), counter.clone());
                    async move {
                        assert_eq!(request.uri().path(), "/v1/disable/current-heads-batch");
                        counter.fetch_add(1, Ordering::SeqCst);
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        let batch: BatchQuery = serde_json::from_slice(&body).unwrap();
                        let fresh = serde_json::to_vec(&answer(&batch, &key, &defects)).unwrap();
                        let bytes =
                            if defects.replay { first.lock().unwrap().get_or_insert(fresh).clone() } else { fresh };
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(bytes))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service).await;
            });
        }
    });
    let client = AuthorityClient::new(pki.client_config(&url, &pki.client, &pki.ca.cert_pem)).unwrap();
    let store = Arc::new(SqliteGenerationStore::open("sqlite::memory:").await.unwrap());
    let kill_switch = fixture::kill_switch(kit.policy(1), client, store, &[3; 32]).await.unwrap();
    Scripted { kill_switch, requests, _kit: kit }
}

fn tool() -> TargetValues {
    TargetValues::new().with(TargetKind::Tool, "product_get")
}

type Outcome = Result<DispatchClearance, KillSwitchError>;

/// Two callers at once: one batch (the single-threaded test runtime queues both before the
/// driver runs).
async fn two_callers(scripted: &Scripted) -> (Outcome, Outcome) {
    let targets = tool();
    let (first, second) = tokio::join!(
        scripted.kill_switch.pre_dispatch(PRODUCT_GET, &targets),
        scripted.kill_switch.pre_dispatch(PRODUCT_GET, &targets)
    );
    assert_eq!(scripted.requests.load(Ordering::SeqCst), 1, "both callers travel in one request");
    assert_eq!(scripted.kill_switch.batch_stats(), Some((1, 2)));
    (first, second)
}

fn inclusion(outcome: &Outcome) -> bool {
    matches!(outcome, Err(KillSwitchError::Authority(AuthorityError::Inclusion)))
}

#[tokio::test]
async fn two_honest_callers_share_one_signed_batch() {
    let scripted = scripted(Defects::default()).await;
    let (first, second) = two_callers(&scripted).await;
    assert_eq!(first.unwrap().generations(), &[1]);
    assert_eq!(second.unwrap().generations(), &[1]);
    // A caller alone is not held back: it goes out at once, in a batch of one.
    scripted.kill_switch.pre_dispatch(PRODUCT_GET, &tool()).await.unwrap();
    assert_eq!(scripted.kill_switch.batch_stats(), Some((2, 3)));
}

#[tokio::test]
async fn a_tampered_path_fails_only_its_caller() {
    let scripted = scripted(Defects {
        response: Some(Box::new(|response| {
            let node = &mut response.items[0].path[0];
            let flipped = if node.starts_with('0') { "1" } else { "0" };
            node.replace_range(0..1, flipped);
        })),
        ..Defects::default()
    })
    .await;
    let (first, second) = two_callers(&scripted).await;
    assert!(inclusion(&first), "{first:?}");
    assert!(second.is_ok(), "{second:?}");
}

#[tokio::test]
async fn a_path_of_the_wrong_length_or_index_fails_only_its_caller() {
    let scripted = scripted(Defects {
        response: Some(Box::new(|response| {
            let extra = response.items[0].path[0].clone();
            response.items[0].path.push(extra);
            response.items[1].index = 2;
        })),
        ..Defects::default()
    })
    .await;
    let (first, second) = two_callers(&scripted).await;
    assert!(inclusion(&first), "{first:?}");
    assert!(inclusion(&second), "{second:?}");
}

#[tokio::test]
async fn a_leaf_for_another_query_fails_only_the_caller_it_was_given_to() {
    let scripted = scripted(Defects {
        response: Some(Box::new(|response| response.items[0] = response.items[1].clone())),
        ..Defects::default()
    })
    .await;
    let (first, second) = two_callers(&scripted).await;
    assert!(inclusion(&first), "{first:?}");
    assert!(second.is_ok(), "{second:?}");
}

#[tokio::test]
async fn a_wrong_signed_tree_size_fails_the_batch() {
    let scripted =
        scripted(Defects { payload: Some(Box::new(|payload| payload.tree_size = 3)), ..Defects::default() }).await;
    let (first, second) = two_callers(&scripted).await;
    assert!(inclusion(&first), "{first:?}");
    assert!(inclusion(&second), "{second:?}");
}

#[tokio::test]
async fn a_root_signed_under_the_v2_context_is_refused() {
    let scripted = scripted(Defects { v2_context: true, ..Defects::default() }).await;
    let (first, second) = two_callers(&scripted).await;
    for outcome in [first, second] {
        assert!(
            matches!(outcome, Err(KillSwitchError::Authority(AuthorityError::Envelope(EnvelopeError::Signature)))),
            "{outcome:?}"
        );
    }
}

#[tokio::test]
async fn other_payload_defects_are_refused() {
    for (label, mutate) in [
        (
            "authority",
            Box::new(|payload: &mut BatchPayload| payload.authority = "other".into())
                as Box<dyn Fn(&mut BatchPayload) + Send + Sync>,
        ),
        ("key id", Box::new(|payload: &mut BatchPayload| payload.key_id = "0".repeat(64))),
        (
            "schema",
            Box::new(|payload: &mut BatchPayload| payload.schema_version = "palisade.mcp-disable-batch.v0".into()),
        ),
    ] {
        let scripted = scripted(Defects { payload: Some(mutate), ..Defects::default() }).await;
        let refused = scripted.kill_switch.pre_dispatch(PRODUCT_GET, &tool()).await.unwrap_err();
        assert!(
            matches!(refused, KillSwitchError::Authority(AuthorityError::HeadMismatch { .. })),
            "{label}: {refused:?}"
        );
    }
}

#[tokio::test]
async fn one_bad_head_in_the_tree_fails_only_its_caller() {
    let scripted = scripted(Defects {
        heads: Some(Box::new(|query, head| {
            if query == 1 {
                head.target.digest = "e".repeat(64);
            }
        })),
        ..Defects::default()
    })
    .await;
    let (first, second) = two_callers(&scripted).await;
    assert!(first.is_ok(), "{first:?}");
    assert!(
        matches!(second, Err(KillSwitchError::Authority(AuthorityError::HeadMismatch { field: "target" }))),
        "{second:?}"
    );
}

#[tokio::test]
async fn a_rollback_in_one_item_fails_only_its_caller() {
    let scripted = scripted(Defects {
        heads: Some(Box::new(|query, head| head.generation = if query == 0 { 5 } else { 4 })),
        ..Defects::default()
    })
    .await;
    let (first, second) = two_callers(&scripted).await;
    assert_eq!(first.unwrap().generations(), &[5]);
    assert!(matches!(second, Err(KillSwitchError::StaleGeneration { kind: TargetKind::Tool })), "{second:?}");
}

#[tokio::test]
async fn a_replayed_batch_does_not_verify_for_a_new_nonce() {
    let scripted = scripted(Defects { replay: true, ..Defects::default() }).await;
    scripted.kill_switch.pre_dispatch(PRODUCT_GET, &tool()).await.expect("the first answer is fresh");
    let refused = scripted.kill_switch.pre_dispatch(PRODUCT_GET, &tool()).await.unwrap_err();
    assert!(matches!(refused, KillSwitchError::Authority(AuthorityError::Inclusion)), "{refused:?}");
}

#[tokio::test]
async fn a_stale_or_future_batch_is_refused() {
    for shift in [-6_000, 2_000] {
        let scripted = scripted(Defects { time_shift_ms: shift, ..Defects::default() }).await;
        let refused = scripted.kill_switch.pre_dispatch(PRODUCT_GET, &tool()).await.unwrap_err();
        assert!(matches!(refused, KillSwitchError::Authority(AuthorityError::Stale)), "{shift}: {refused:?}");
    }
}
