//! Head verification, field by field, against a scripted authority (real mTLS on loopback) that
//! signs whatever a test tells it to.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use palisade_base::time::format_rfc3339_ms;
use palisade_killswitch::envelope::{SignedEnvelope, sign_envelope};
use palisade_killswitch::head::{HeadPayload, HeadQuery, HeadResponse};
use palisade_killswitch::{
    AuthorityClient, AuthorityError, Ed25519SigningKey, KillSwitch, KillSwitchError, Phase, SqliteGenerationStore,
    TargetKind, TargetState, TargetValues,
};
use tokio::net::TcpListener;

use crate::fixture::{self, CHECKOUT, PRODUCT_GET, Pki, PolicyKit, now_ms};

type Script = Arc<dyn Fn(&HeadQuery, &[u8]) -> (u16, Vec<u8>) + Send + Sync>;

struct Scripted {
    kill_switch: KillSwitch,
    requests: Arc<AtomicUsize>,
    _kit: PolicyKit,
}

async fn scripted(
    script: impl Fn(&HeadQuery, &Ed25519SigningKey) -> (u16, Vec<u8>) + Send + Sync + 'static,
) -> Scripted {
    let pki = Pki::new();
    let kit = PolicyKit::new();
    let key = kit.authority_key.clone();
    let script: Script = Arc::new(move |query, _| script(query, &key));
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
            let acceptor = acceptor.clone();
            let script = script.clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else { return };
                let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let script = script.clone();
                    let counter = counter.clone();
                    async move {
                        counter.fetch_add(1, Ordering::SeqCst);
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        let query: HeadQuery = serde_json::from_slice(&body).unwrap();
                        let (status, answer) = script(&query, &body);
                        let mut response = Response::new(Full::new(Bytes::from(answer)));
                        *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                        if status == 302 {
                            response.headers_mut().insert("location", "https://example.com/".parse().unwrap());
                        }
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service).await;
            });
        }
    });
    // This scripted authority speaks the single-query v2 envelope (the batched one: `batch.rs`).
    let mut config = pki.client_config(&url, &pki.client, &pki.ca.cert_pem);
    config.envelope = palisade_killswitch::HeadEnvelope::Single;
    let client = AuthorityClient::new(config).unwrap();
    let store = Arc::new(SqliteGenerationStore::open("sqlite::memory:").await.unwrap());
    let kill_switch = fixture::kill_switch(kit.policy(1), client, store, &[3; 32]).await.unwrap();
    Scripted { kill_switch, requests, _kit: kit }
}

/// The honest head for one target of a query.
fn honest(query: &HeadQuery, index: usize) -> HeadPayload {
    fixture::honest_head(query, index, now_ms())
}

fn answer(envelopes: Vec<SignedEnvelope>) -> (u16, Vec<u8>) {
    (200, serde_json::to_vec(&HeadResponse { heads: envelopes }).unwrap())
}

/// An authority that signs the honest heads after `mutate`.
fn mutating(
    mutate: impl Fn(&mut HeadPayload) + Send + Sync + 'static,
) -> impl Fn(&HeadQuery, &Ed25519SigningKey) -> (u16, Vec<u8>) {
    move |query, key| {
        answer(
            (0..query.targets.len())
                .map(|index| {
                    let mut head = honest(query, index);
                    mutate(&mut head);
                    sign_envelope(&head.canonical_bytes(), key)
                })
                .collect(),
        )
    }
}

fn tool() -> TargetValues {
    TargetValues::new().with(TargetKind::Tool, "product_get")
}

async fn refusal(
    script: impl Fn(&HeadQuery, &Ed25519SigningKey) -> (u16, Vec<u8>) + Send + Sync + 'static,
) -> KillSwitchError {
    scripted(script).await.kill_switch.pre_dispatch(PRODUCT_GET, &tool()).await.unwrap_err()
}

fn mismatch(error: &KillSwitchError) -> &'static str {
    match error {
        KillSwitchError::Authority(AuthorityError::HeadMismatch { field }) => field,
        other => panic!("expected a head mismatch, got {other:?}"),
    }
}

#[tokio::test]
async fn honest_heads_pass_with_one_round_trip_per_phase() {
    let world = scripted(mutating(|_| {})).await;
    let targets = TargetValues::new().with(TargetKind::ServerRelease, "1").with(TargetKind::Tool, "basket_checkout");
    let clearance = world.kill_switch.pre_dispatch(CHECKOUT, &targets).await.unwrap();
    assert_eq!(world.requests.load(Ordering::SeqCst), 1, "two targets, one query");
    let fence = world.kill_switch.pre_side_effect(CHECKOUT, &targets, &clearance).await.unwrap();
    assert_eq!(world.requests.load(Ordering::SeqCst), 2);
    assert_eq!(fence.tokens().len(), 2);
}

#[tokio::test]
async fn a_head_for_another_policy_digest_is_refused() {
    let error = refusal(mutating(|head| head.policy_digest = "00".repeat(32))).await;
    assert_eq!(mismatch(&error), "policy_digest");
    let error = refusal(mutating(|head| head.policy_generation += 1)).await;
    assert_eq!(mismatch(&error), "policy_generation");
}

#[tokio::test]
async fn a_head_for_another_target_is_refused() {
    let error = refusal(mutating(|head| head.target.digest = "11".repeat(32))).await;
    assert_eq!(mismatch(&error), "target");
    let error = refusal(mutating(|head| head.target.kind = TargetKind::Tenant)).await;
    assert_eq!(mismatch(&error), "target");
}

#[tokio::test]
async fn a_replayed_answer_fails_on_its_nonce() {
    type Recorded = Arc<Mutex<Option<(u16, Vec<u8>)>>>;
    let recorded: Recorded = Arc::default();
    let world = scripted(move |query, key| {
        let mut recorded = recorded.lock().unwrap();
        recorded.get_or_insert_with(|| mutating(|_| {})(query, key)).clone()
    })
    .await;
    world.kill_switch.pre_dispatch(PRODUCT_GET, &tool()).await.expect("the first answer is fresh");
    let error = world.kill_switch.pre_dispatch(PRODUCT_GET, &tool()).await.unwrap_err();
    assert_eq!(mismatch(&error), "query_nonce");
}

#[tokio::test]
async fn other_field_defects_are_refused() {
    assert_eq!(mismatch(&refusal(mutating(|head| head.authority = "impostor".to_owned())).await), "authority");
    assert_eq!(mismatch(&refusal(mutating(|head| head.phase = Phase::PreSideEffect)).await), "phase");
    assert_eq!(mismatch(&refusal(mutating(|head| head.generation = 0)).await), "generation");
    assert_eq!(mismatch(&refusal(mutating(|head| head.reason_code.clear())).await), "reason_code");
    assert_eq!(mismatch(&refusal(mutating(|head| head.schema_version = "v1".to_owned())).await), "schema_version");
    assert_eq!(mismatch(&refusal(mutating(|head| head.commit_token = Some("t".to_owned()))).await), "commit_token");
    assert_eq!(mismatch(&refusal(mutating(|head| head.issued_at = "yesterday".to_owned())).await), "issued_at");
    let expired = refusal(mutating(|head| head.expires_at = format_rfc3339_ms(now_ms() - 1))).await;
    assert!(matches!(expired, KillSwitchError::Authority(AuthorityError::Expired)), "{expired:?}");
    let stale = refusal(mutating(|head| head.issued_at = format_rfc3339_ms(now_ms() - 60_000))).await;
    assert!(matches!(stale, KillSwitchError::Authority(AuthorityError::Stale)), "{stale:?}");
}

#[tokio::test]
async fn malformed_or_foreign_answers_are_refused() {
    let other_key = Arc::new(Ed25519SigningKey::generate().unwrap());
    let error =
        refusal(move |query, _| answer(vec![sign_envelope(&honest(query, 0).canonical_bytes(), &other_key)])).await;
    assert!(
        matches!(
            error,
            KillSwitchError::Authority(AuthorityError::Envelope(
                palisade_killswitch::envelope::EnvelopeError::Signature
            ))
        ),
        "{error:?}"
    );

    let error = refusal(|query, key| {
        let mut value = serde_json::to_value(honest(query, 0)).unwrap();
        value["allow"] = serde_json::json!(true);
        answer(vec![sign_envelope(&palisade_base::canonical::canonical_bytes(&value), key)])
    })
    .await;
    assert!(
        matches!(error, KillSwitchError::Authority(AuthorityError::Malformed { what: "head schema" })),
        "{error:?}"
    );

    let error = refusal(|_, _| answer(Vec::new())).await;
    assert!(matches!(error, KillSwitchError::Authority(AuthorityError::Malformed { what: "head count" })), "{error:?}");
    let error = refusal(|_, _| (200, b"{\"heads\":[],\"extra\":1}".to_vec())).await;
    assert!(matches!(error, KillSwitchError::Authority(AuthorityError::Malformed { .. })), "{error:?}");
    let error = refusal(|_, _| (200, vec![b' '; 200 * 1024])).await;
    assert!(matches!(error, KillSwitchError::Authority(AuthorityError::TooLarge)), "{error:?}");
    let error = refusal(|_, _| (500, Vec::new())).await;
    assert!(matches!(error, KillSwitchError::Authority(AuthorityError::HttpStatus { status: 500 })), "{error:?}");
    let error = refusal(|_, _| (302, Vec::new())).await;
    assert!(
        matches!(error, KillSwitchError::Authority(AuthorityError::HttpStatus { status: 302 })),
        "redirects are not followed: {error:?}"
    );
}

#[tokio::test]
async fn a_fenced_operation_without_tokens_is_refused_before_the_side_effect() {
    let world = scripted(mutating(|head| head.commit_token = None)).await;
    let targets = TargetValues::new().with(TargetKind::ServerRelease, "1").with(TargetKind::Tool, "basket_checkout");
    let clearance = world.kill_switch.pre_dispatch(CHECKOUT, &targets).await.unwrap();
    let error = world.kill_switch.pre_side_effect(CHECKOUT, &targets, &clearance).await.unwrap_err();
    assert!(matches!(error, KillSwitchError::FenceMissing { .. }), "{error:?}");
}

#[tokio::test]
async fn a_disable_head_refuses() {
    let error = refusal(mutating(|head| {
        head.state = TargetState::Disable;
        head.generation = 4;
        head.reason_code = "halt".to_owned();
    }))
    .await;
    assert!(matches!(error, KillSwitchError::Disabled { generation: 4, .. }), "{error:?}");
}
