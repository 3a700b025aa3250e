//! The authority's mTLS HTTPS endpoint (`palisade authority serve`): hyper over tokio-rustls,
//! client certificates required and verified against the configured CA.
//!
//! `POST /v1/disable/current-head` answers a [`HeadQuery`] with one signed head per target;
//! `POST /v1/disable/current-heads-batch` answers a [`BatchQuery`] of many queries with the same
//! heads, unsigned one by one, under one signature over their Merkle root ([`crate::batch`]);
//! `POST /v1/disable/redeem` redeems a commit token (200, or 409 when rejected). Anything else is
//! 404/405; malformed bodies 400; storage failures 503.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use palisade_base::clock::Clock;
use palisade_base::time::format_rfc3339_ms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::{AuthorityDb, AuthorityServiceError, RedeemError};
use crate::batch::{
    BATCH_PATH, BATCH_QUERY_SCHEMA_VERSION, BATCH_SCHEMA_VERSION, BatchItem, BatchPayload, BatchQuery, BatchResponse,
    MAX_BATCH_QUERIES, all_paths, hash_hex, key_id, leaf_hash, sign_batch,
};
use crate::envelope::sign_envelope;
use crate::head::{
    CURRENT_HEAD_PATH, Canonical as _, HEAD_SCHEMA_VERSION, HeadPayload, HeadQuery, HeadResponse,
    MAX_TARGETS_PER_QUERY, Phase, QUERY_SCHEMA_VERSION, REDEEM_PATH, RedeemRequest, canonical,
};
use crate::keys::Ed25519SigningKey;
use crate::policy::MAX_SAFE_INTEGER;
use crate::target::{TargetDigest, is_lower_hex};

/// Largest request body accepted (single query, redeem).
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Largest batch request body accepted.
const MAX_BATCH_BODY_BYTES: usize = 4 * 1024 * 1024;
/// A TLS handshake must finish within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the authority server needs.
pub struct AuthorityServerConfig {
    /// The authority id (must equal the policy's `authority`).
    pub authority_id: String,
    /// The head signing key (its public key file is the one the policy pins).
    pub signing_key: Arc<Ed25519SigningKey>,
    /// TLS: server certificate and client-certificate verification ([`server_tls_config`]).
    pub tls: Arc<rustls::ServerConfig>,
    /// How long a head stays valid after issue (`expires_at - issued_at`).
    pub head_ttl: Duration,
    /// How long a commit token may wait for its redemption.
    pub commit_token_ttl: Duration,
    /// The clock.
    pub clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for AuthorityServerConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("AuthorityServerConfig")
            .field("authority_id", &self.authority_id)
            .field("head_ttl", &self.head_ttl)
            .field("commit_token_ttl", &self.commit_token_ttl)
            .finish_non_exhaustive()
    }
}

fn tls_error(reason: impl Into<String>) -> AuthorityServiceError {
    AuthorityServiceError::Tls { reason: reason.into() }
}

/// Builds the server TLS configuration from PEM: the server's certificate chain and key, and the
/// CA bundle client certificates must chain to (a client without one is refused in the
/// handshake). aws-lc-rs, TLS 1.2+, HTTP/1.1.
pub fn server_tls_config(
    server_cert_chain_pem: &[u8],
    server_key_pem: &[u8],
    client_ca_pem: &[u8],
) -> Result<Arc<rustls::ServerConfig>, AuthorityServiceError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(client_ca_pem) {
        roots
            .add(certificate.map_err(|_| tls_error("client CA is not PEM"))?)
            .map_err(|_| tls_error("client CA unusable"))?;
    }
    if roots.is_empty() {
        return Err(tls_error("client CA bundle holds no certificate"));
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|_| tls_error("client verifier"))?;
    let chain = CertificateDer::pem_slice_iter(server_cert_chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| tls_error("server certificate is not PEM"))?;
    if chain.is_empty() {
        return Err(tls_error("server certificate file holds no certificate"));
    }
    let key = PrivateKeyDer::from_pem_slice(server_key_pem).map_err(|_| tls_error("server key is not PEM"))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|_| tls_error("TLS versions"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|_| tls_error("server certificate and key do not match"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

struct State {
    config: AuthorityServerConfig,
    db: AuthorityDb,
    key_id: String,
    random: aws_lc_rs::rand::SystemRandom,
}

/// Serves the authority on `listener` until `shutdown` completes. Connections already accepted
/// finish on their own. Expired commit tokens are purged once a minute.
pub async fn serve(
    listener: TcpListener,
    config: AuthorityServerConfig,
    db: AuthorityDb,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AuthorityServiceError> {
    let acceptor = TlsAcceptor::from(config.tls.clone());
    let key_id = key_id(&config.signing_key.verifying_key());
    let state = Arc::new(State { config, db, key_id, random: aws_lc_rs::rand::SystemRandom::new() });
    let purger = tokio::spawn({
        let state = state.clone();
        async move {
            let mut interval = tokio::time::interval(Duration::from_secs(60));
            loop {
                interval.tick().await;
                let cutoff = state.config.clock.now_ms().saturating_sub(60_000);
                if let Err(error) = state.db.purge_expired_tokens(cutoff).await {
                    tracing::warn!(%error, "authority could not purge expired commit tokens");
                }
            }
        }
    });
    tokio::pin!(shutdown);
    let result = loop {
        tokio::select! {
            () = &mut shutdown => break Ok(()),
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Per-connection errors (e.g. the peer reset before accept) are not fatal.
                        tracing::debug!(%error, "authority accept failed");
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let state = state.clone();
                tokio::spawn(async move {
                    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(error)) => {
                            tracing::info!(%peer, %error, "authority TLS handshake refused");
                            return;
                        }
                        Err(_) => return,
                    };
                    let service = hyper::service::service_fn(move |request| handle(state.clone(), request));
                    let connection = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(Duration::from_secs(5))
                        .serve_connection(TokioIo::new(tls), service);
                    if let Err(error) = connection.await {
                        tracing::debug!(%peer, %error, "authority connection ended with an error");
                    }
                });
            }
        }
    };
    purger.abort();
    result
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    headers.insert(hyper::header::CACHE_CONTROL, hyper::header::HeaderValue::from_static("no-store"));
    response
}

fn error_response(status: StatusCode, code: &str) -> Response<Full<Bytes>> {
    json_response(status, canonical(&serde_json::json!({ "error": code })))
}

async fn handle(state: Arc<State>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_owned();
    if path != CURRENT_HEAD_PATH && path != REDEEM_PATH && path != BATCH_PATH {
        return Ok(error_response(StatusCode::NOT_FOUND, "not_found"));
    }
    if request.method() != Method::POST {
        return Ok(error_response(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"));
    }
    let limit = if path == BATCH_PATH { MAX_BATCH_BODY_BYTES } else { MAX_BODY_BYTES };
    let body = match Limited::new(request.into_body(), limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(error_response(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large")),
    };
    Ok(match path.as_str() {
        CURRENT_HEAD_PATH => current_head(&state, &body).await,
        BATCH_PATH => current_heads_batch(&state, &body).await,
        _ => redeem(&state, &body).await,
    })
}

fn query_is_valid(query: &HeadQuery) -> bool {
    let mut seen = std::collections::HashSet::new();
    query.schema_version == QUERY_SCHEMA_VERSION
        && is_lower_hex(&query.policy_digest, 64)
        && (1..=MAX_SAFE_INTEGER).contains(&query.policy_generation)
        && query.query_nonce.len() >= 32
        && query.query_nonce.len() <= 128
        && is_lower_hex(&query.query_nonce, query.query_nonce.len())
        && !query.targets.is_empty()
        && query.targets.len() <= MAX_TARGETS_PER_QUERY
        && query.targets.iter().all(|target| target.is_well_formed() && seen.insert(target.clone()))
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The head bodies of one query (the same for both envelopes).
fn head_payloads(
    config: &AuthorityServerConfig,
    query: &HeadQuery,
    heads: Vec<(super::TargetStatus, Option<String>)>,
    now_ms: i64,
) -> Vec<HeadPayload> {
    let issued_at = format_rfc3339_ms(now_ms);
    let expires_at = format_rfc3339_ms(now_ms.saturating_add(millis(config.head_ttl)));
    heads
        .into_iter()
        .map(|(status, token)| HeadPayload {
            authority: config.authority_id.clone(),
            commit_token: token,
            expires_at: expires_at.clone(),
            generation: status.generation,
            issued_at: issued_at.clone(),
            phase: query.phase,
            policy_digest: query.policy_digest.clone(),
            policy_generation: query.policy_generation,
            query_nonce: query.query_nonce.clone(),
            reason_code: status.reason_code,
            schema_version: HEAD_SCHEMA_VERSION.to_owned(),
            state: status.state,
            target: status.target,
        })
        .collect()
}

async fn current_head(state: &State, body: &[u8]) -> Response<Full<Bytes>> {
    let Ok(query) = serde_json::from_slice::<HeadQuery>(body) else {
        return error_response(StatusCode::BAD_REQUEST, "malformed_query");
    };
    if !query_is_valid(&query) {
        return error_response(StatusCode::BAD_REQUEST, "invalid_query");
    }
    let config = &state.config;
    let now_ms = config.clock.now_ms();
    let issue = query.phase == Phase::PreSideEffect;
    let mut answers =
        match state.db.answer(&[(query.targets.as_slice(), issue)], now_ms, millis(config.commit_token_ttl)).await {
            Ok(answers) => answers,
            Err(error) => {
                tracing::warn!(%error, "authority could not read heads");
                return error_response(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
            }
        };
    let heads = answers.pop().unwrap_or_default();
    let envelopes = head_payloads(config, &query, heads, now_ms)
        .iter()
        .map(|payload| sign_envelope(&payload.canonical_bytes(), &config.signing_key))
        .collect();
    json_response(StatusCode::OK, canonical(&HeadResponse { heads: envelopes }))
}

/// The batched envelope: every query's heads, one leaf per query, one signature per batch.
async fn current_heads_batch(state: &State, body: &[u8]) -> Response<Full<Bytes>> {
    let Ok(batch) = serde_json::from_slice::<BatchQuery>(body) else {
        return error_response(StatusCode::BAD_REQUEST, "malformed_query");
    };
    if batch.schema_version != BATCH_QUERY_SCHEMA_VERSION
        || batch.queries.is_empty()
        || batch.queries.len() > MAX_BATCH_QUERIES
        || !batch.queries.iter().all(query_is_valid)
    {
        return error_response(StatusCode::BAD_REQUEST, "invalid_query");
    }
    let config = &state.config;
    let now_ms = config.clock.now_ms();
    let asks: Vec<(&[TargetDigest], bool)> =
        batch.queries.iter().map(|query| (query.targets.as_slice(), query.phase == Phase::PreSideEffect)).collect();
    let answers = match state.db.answer(&asks, now_ms, millis(config.commit_token_ttl)).await {
        Ok(answers) => answers,
        Err(error) => {
            tracing::warn!(%error, "authority could not read heads");
            return error_response(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
        }
    };
    let heads: Vec<Vec<HeadPayload>> =
        batch.queries.iter().zip(answers).map(|(query, answer)| head_payloads(config, query, answer, now_ms)).collect();
    let leaves: Vec<_> = batch.queries.iter().zip(&heads).map(|(query, heads)| leaf_hash(query, heads)).collect();
    let (Some(root), paths) = all_paths(&leaves) else {
        return error_response(StatusCode::BAD_REQUEST, "invalid_query");
    };
    let mut batch_id = [0_u8; 16];
    if aws_lc_rs::rand::SecureRandom::fill(&state.random, &mut batch_id).is_err() {
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    }
    let payload = BatchPayload {
        authority: config.authority_id.clone(),
        batch_id: crate::target::hex(&batch_id),
        issued_at: format_rfc3339_ms(now_ms),
        key_id: state.key_id.clone(),
        root: hash_hex(&root),
        schema_version: BATCH_SCHEMA_VERSION.to_owned(),
        tree_size: u64::try_from(leaves.len()).unwrap_or(u64::MAX),
    };
    let signed = sign_batch(&payload, &config.signing_key);
    let items = heads
        .into_iter()
        .zip(paths)
        .enumerate()
        .map(|(index, (heads, path))| BatchItem {
            heads,
            index: u64::try_from(index).unwrap_or(u64::MAX),
            path: path.iter().map(hash_hex).collect(),
        })
        .collect();
    json_response(StatusCode::OK, BatchResponse { batch: signed, items }.canonical_bytes())
}

async fn redeem(state: &State, body: &[u8]) -> Response<Full<Bytes>> {
    let Ok(request) = serde_json::from_slice::<RedeemRequest>(body) else {
        return error_response(StatusCode::BAD_REQUEST, "malformed_redeem");
    };
    match state.db.redeem(&request, state.config.clock.now_ms()).await {
        Ok(()) => json_response(StatusCode::OK, canonical(&serde_json::json!({ "result": "redeemed" }))),
        Err(RedeemError::Rejected(rejection)) => json_response(
            StatusCode::CONFLICT,
            canonical(&serde_json::json!({ "result": "rejected", "reason": rejection })),
        ),
        Err(RedeemError::Storage(error)) => {
            tracing::warn!(%error, "authority could not redeem");
            error_response(StatusCode::SERVICE_UNAVAILABLE, "unavailable")
        }
    }
}
