//! The server's time is the workspace's one clock ([`palisade_base::clock`]): every part a
//! `ServerBuilder` wires together must keep time by the same one, so that moving a test
//! clock moves token, handle, request-state, stream and kill-switch time together.

use std::sync::Arc;

pub use palisade_base::clock::{Clock, ManualClock, SystemClock};

/// Whether two parts keep the same time: the same clock instance, or both the wall clock.
pub(crate) fn same_clock(a: &Arc<dyn Clock>, b: &Arc<dyn Clock>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b)) || (a.is_wall_clock() && b.is_wall_clock())
}
