//! The one loop behind the server's periodic background jobs (handle retention, task recovery
//! and purge, session purge): run the job at once and then on every tick of a fixed period,
//! until the server's shutdown token fires.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

/// Spawns `job` to run now and then every `period`, until `shutdown` is cancelled. A run in
/// progress finishes; no run starts once `shutdown` is cancelled. The job logs its own outcome
/// (its log lines carry the span `periodic` with `job = name`); a failed run waits for the next
/// tick. `period` must not be zero.
pub fn spawn_periodic<Job, Run>(
    name: &'static str,
    period: Duration,
    shutdown: CancellationToken,
    mut job: Job,
) -> JoinHandle<()>
where
    Job: FnMut() -> Run + Send + 'static,
    Run: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(period);
        loop {
            tokio::select! {
                // Shutdown wins over a tick that is due at the same time.
                biased;
                () = shutdown.cancelled() => break,
                _ = ticker.tick() => {}
            }
            job().instrument(tracing::info_span!("periodic", job = name)).await;
        }
        tracing::debug!(job = name, "periodic job stopped");
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::sync::mpsc;
    use tokio::time::Instant;

    use super::*;

    const PERIOD: Duration = Duration::from_secs(300);

    /// Paused time: the runtime jumps to the next timer whenever every task waits.
    #[tokio::test(start_paused = true)]
    async fn runs_at_once_then_on_each_tick_and_stops_on_shutdown() {
        let (runs, mut ran) = mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let start = Instant::now();
        let job = spawn_periodic("test", PERIOD, shutdown.clone(), move || {
            let runs = runs.clone();
            async move {
                runs.send(Instant::now()).unwrap();
            }
        });
        for tick in 0..3 {
            assert_eq!(ran.recv().await.unwrap() - start, PERIOD * tick, "run {tick}");
        }
        // Waiting for the fourth tick: shutdown ends the loop without another run.
        shutdown.cancel();
        job.await.unwrap();
        tokio::time::sleep(PERIOD * 10).await;
        assert!(ran.recv().await.is_none(), "no run after shutdown (the job, and its sender, are gone)");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_token_runs_nothing() {
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        let (runs, mut ran) = mpsc::unbounded_channel::<()>();
        let job = spawn_periodic("test", PERIOD, shutdown, move || {
            let runs = runs.clone();
            async move {
                runs.send(()).unwrap();
            }
        });
        job.await.unwrap();
        assert!(ran.recv().await.is_none());
    }
}
