//! stdio transport: newline-delimited JSON on stdin/stdout. stdout carries MCP messages only
//! (logs go to stderr); `notifications/cancelled` cancels a request or ends a listen; EOF ends
//! the server after in-flight work is cancelled.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use palisade_wire::jsonrpc::{Message, error_frame, parse_message};
use palisade_wire::{ProtocolError, RequestId};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::context::NotificationSink;
use crate::server::Server;

/// Serves `input`/`output` (stdin/stdout in production) until EOF.
pub async fn serve<R, W>(server: Arc<Server>, input: R, output: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let max_line = server.config().max_body_bytes;
    let (out_tx, mut out_rx) = mpsc::channel::<Value>(1024);
    let writer = tokio::spawn(async move {
        let mut output = output;
        while let Some(frame) = out_rx.recv().await {
            let mut line = frame.to_string().into_bytes();
            line.push(b'\n');
            if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
                break;
            }
        }
    });
    let in_flight: Arc<Mutex<HashMap<RequestId, CancellationToken>>> = Arc::default();
    let mut running = tokio::task::JoinSet::new();
    let mut reader = BufReader::new(input);
    let mut line = Vec::new();
    loop {
        line.clear();
        // Read at most one byte past the limit so an oversized line is detected without
        // buffering all of it.
        let read =
            (&mut reader).take(u64::try_from(max_line).unwrap_or(u64::MAX) + 1).read_until(b'\n', &mut line).await?;
        if read == 0 {
            break;
        }
        if line.last() != Some(&b'\n') && line.len() > max_line {
            let _ = out_tx.send(error_frame(None, &ProtocolError::PayloadTooLarge)).await;
            discard_rest_of_line(&mut reader).await?;
            continue;
        }
        let frame = trim_line(&line);
        if frame.is_empty() {
            continue;
        }
        match parse_message(frame) {
            Err(frame_error) => {
                let _ = out_tx.send(error_frame(frame_error.id.as_ref(), &frame_error.error)).await;
            }
            Ok(Message::Notification(notification)) => {
                if notification.method == "notifications/cancelled"
                    && let Some(id) = notification.params.get("requestId").and_then(RequestId::from_value)
                    && let Some(token) = lock(&in_flight).remove(&id)
                {
                    token.cancel();
                }
            }
            Ok(Message::Request(request)) => {
                let id = request.id.clone();
                let cancel = CancellationToken::new();
                if lock(&in_flight).insert(id.clone(), cancel.clone()).is_some() {
                    // A duplicate of an outstanding id: refuse, keep the original running.
                    let _ = out_tx
                        .send(error_frame(Some(&id), &ProtocolError::InvalidRequest("duplicate request id")))
                        .await;
                    continue;
                }
                let server = server.clone();
                let out = out_tx.clone();
                let in_flight = in_flight.clone();
                running.spawn(async move {
                    let (sink, mut notifications) = NotificationSink::channel(server.config().listen_queue);
                    let forward = {
                        let out = out.clone();
                        tokio::spawn(async move {
                            while let Some(notification) = notifications.recv().await {
                                if out.send(notification).await.is_err() {
                                    break;
                                }
                            }
                        })
                    };
                    let reply = server.handle_request(request, None, sink, cancel.clone()).await;
                    let _ = forward.await;
                    lock(&in_flight).remove(&id);
                    // A cancelled request gets no response.
                    if !cancel.is_cancelled() {
                        let _ = out.send(reply.frame).await;
                    }
                });
            }
        }
    }
    // EOF: listens end with their complete result, in-flight requests get a grace period to
    // answer, whatever is left is cancelled; then flush and exit.
    server.shutdown_token().cancel();
    let grace =
        tokio::time::timeout(std::time::Duration::from_secs(5), async { while running.join_next().await.is_some() {} });
    if grace.await.is_err() {
        for (_, token) in lock(&in_flight).drain() {
            token.cancel();
        }
        while running.join_next().await.is_some() {}
    }
    drop(out_tx);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), writer).await;
    Ok(())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn trim_line(line: &[u8]) -> &[u8] {
    let mut end = line.len();
    while end > 0 && matches!(line[end - 1], b'\n' | b'\r') {
        end -= 1;
    }
    &line[..end]
}

async fn discard_rest_of_line<R: AsyncBufReadExt + Unpin>(reader: &mut R) -> std::io::Result<()> {
    loop {
        let buffer = reader.fill_buf().await?;
        if buffer.is_empty() {
            return Ok(());
        }
        if let Some(position) = buffer.iter().position(|b| *b == b'\n') {
            reader.consume(position + 1);
            return Ok(());
        }
        let length = buffer.len();
        reader.consume(length);
    }
}
