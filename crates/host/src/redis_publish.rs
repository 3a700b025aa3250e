//! Publishing one message on a Redis channel, reconnecting with backoff: shared by the event
//! bridge and the answer relay, which publish on the same connections.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Longest wait between two reconnection attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The kind of a Redis error, without its detail (which may quote a URL with a password).
pub trait KindText {
    /// The error's kind, as text.
    fn kind_text(&self) -> String;
}

impl KindText for redis::RedisError {
    fn kind_text(&self) -> String {
        format!("{:?}", self.kind())
    }
}

/// Publishes `payload` on `channel`, reconnecting with backoff until it is sent (`true`) or the
/// bridge shuts down (`false`). `what` names the message in the log.
pub async fn publish(
    client: &redis::Client,
    connection: &mut redis::aio::MultiplexedConnection,
    channel: &str,
    payload: &str,
    shutdown: &CancellationToken,
    what: &str,
) -> bool {
    let mut backoff = Duration::from_millis(200);
    loop {
        let sent: redis::RedisResult<i64> =
            redis::cmd("PUBLISH").arg(channel).arg(payload).query_async(connection).await;
        let Err(error) = sent else { return true };
        tracing::warn!(error = %error.kind_text(), "publishing {what} failed; reconnecting");
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
        if let Ok(fresh) = client.get_multiplexed_async_connection().await {
            *connection = fresh;
        }
    }
}
