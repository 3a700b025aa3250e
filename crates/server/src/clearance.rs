//! The kill switch's clearance of one operation (control C5): what phase one (`pre_dispatch`)
//! hands on, the second phase (`pre_side_effect` and its [`CommitFence`]) a handler calls before
//! committing, the fence check after a fenced tool completes, and the watch that ends an open
//! stream when one of its targets is disabled.
//!
//! Knows only the kill-switch library: not the pipeline, the registry or the request context
//! (which carries a clearance and exposes phase two to handlers).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use palisade_killswitch::{CommitFence, DisableEvent, DispatchClearance, KillSwitch, KillSwitchError, TargetValues};
use palisade_wire::ProtocolError;
use tokio::sync::broadcast::{self, error::RecvError};

/// Maps a kill-switch refusal onto the client's error, logging the cause for the operator.
pub(crate) fn refusal(operation: &str, error: &KillSwitchError) -> ProtocolError {
    if error.is_disabled() {
        tracing::info!(stage = "killswitch", operation, %error, "operation disabled by the authority");
        return ProtocolError::OperationDisabled;
    }
    match error {
        KillSwitchError::UnlistedOperation { .. } => {
            tracing::error!(stage = "killswitch", operation, "operation absent from the signed registry: refused");
        }
        _ => {
            tracing::warn!(stage = "killswitch", operation, error = %error, source = std::error::Error::source(error).map(tracing::field::display), "kill switch in doubt: refused (fail closed)")
        }
    }
    ProtocolError::Unavailable
}

/// One request's passed `pre_dispatch`: what its second phase needs.
pub(crate) struct Cleared {
    switch: Arc<KillSwitch>,
    operation: String,
    targets: TargetValues,
    clearance: DispatchClearance,
    fence_required: bool,
    fence_obtained: AtomicBool,
    /// Set when [`Cleared::check_fence_obtained`] refused a result (for the audit record).
    fence_skipped: AtomicBool,
}

/// What a listen stream watches: DISABLE observations for one of its request's targets.
/// What ends an open stream: a DISABLE of one of its targets observed by any check, or its own
/// re-check of its targets (every `[killswitch] stream_recheck_secs`, through the same batched
/// path) refusing — on DISABLE or on any doubt.
pub(crate) struct DisableWatch(Option<Watch>);

struct Watch {
    receiver: broadcast::Receiver<DisableEvent>,
    cleared: Arc<Cleared>,
    next_recheck_ms: i64,
}

fn recheck_interval_ms(switch: &KillSwitch) -> i64 {
    i64::try_from(switch.stream_recheck().as_millis()).unwrap_or(i64::MAX)
}

impl DisableWatch {
    pub(crate) fn new(cleared: Option<&Arc<Cleared>>) -> Self {
        Self(cleared.map(|cleared| Watch {
            receiver: cleared.switch.subscribe_disables(),
            next_recheck_ms: cleared.switch.clock().now_ms().saturating_add(recheck_interval_ms(&cleared.switch)),
            cleared: cleared.clone(),
        }))
    }

    /// Completes when the stream must end. Cancel-safe: a re-check interrupted by the caller's
    /// `select!` runs again on the next call.
    pub(crate) async fn disabled(&mut self) {
        let Some(watch) = &mut self.0 else { return std::future::pending().await };
        let clock = watch.cleared.switch.clock().clone();
        loop {
            tokio::select! {
                received = watch.receiver.recv() => match received {
                    Ok(event) if watch.cleared.clearance.targets().contains(&event.target) => return,
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => return,
                    Err(RecvError::Closed) => return std::future::pending().await,
                },
                () = clock.sleep_until_ms(watch.next_recheck_ms) => {
                    let cleared = &watch.cleared;
                    if let Err(error) = cleared.switch.pre_dispatch(&cleared.operation, &cleared.targets).await {
                        let _ = refusal(&cleared.operation, &error);
                        return;
                    }
                    watch.next_recheck_ms = clock.now_ms().saturating_add(recheck_interval_ms(&cleared.switch));
                }
            }
        }
    }
}

impl Cleared {
    /// The clearance phase one granted for `operation` with `targets`.
    pub(crate) fn new(
        switch: Arc<KillSwitch>,
        operation: String,
        targets: TargetValues,
        clearance: DispatchClearance,
        fence_required: bool,
    ) -> Self {
        Self {
            switch,
            operation,
            targets,
            clearance,
            fence_required,
            fence_obtained: AtomicBool::new(false),
            fence_skipped: AtomicBool::new(false),
        }
    }

    /// Phase two.
    pub(crate) async fn pre_side_effect(&self) -> Result<CommitFence, ProtocolError> {
        let fence = self
            .switch
            .pre_side_effect(&self.operation, &self.targets, &self.clearance)
            .await
            .map_err(|error| refusal(&self.operation, &error))?;
        self.fence_obtained.store(true, Ordering::SeqCst);
        Ok(fence)
    }

    /// After a handler completed successfully: a tool whose rule requires a commit fence must
    /// have asked for one. A handler that did not skipped the second check before whatever it
    /// committed (a defect in the handler): its result is refused with
    /// [`ProtocolError::Internal`] (no detail reaches the client), the cause is logged for the
    /// operator, and a request's refusal is audited as a deny at stage `killswitch`
    /// ([`Cleared::fence_skipped`]). What the handler did is not undone: only the fence can stop
    /// an effect before it happens.
    pub(crate) fn check_fence_obtained(&self) -> Result<(), ProtocolError> {
        if !self.fence_required || self.fence_obtained.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.fence_skipped.store(true, Ordering::SeqCst);
        tracing::error!(
            stage = "killswitch",
            operation = %self.operation,
            "a tool whose registry rule requires a commit fence completed without calling pre_side_effect: result refused"
        );
        Err(ProtocolError::Internal)
    }

    /// Whether [`Cleared::check_fence_obtained`] refused this request's result.
    pub(crate) fn fence_skipped(&self) -> bool {
        self.fence_skipped.load(Ordering::SeqCst)
    }
}
