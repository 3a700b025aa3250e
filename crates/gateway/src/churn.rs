//! Coalescing of an upstream's definition churn in the audit log.
//!
//! Every change of a definition's standing (new, changed, held, served again) is an audit record
//! (`pins/<kind>:<name>`). An upstream that changes its definitions on every listing and
//! announces each change (`list_changed`) would write records as fast as it is re-listed, without
//! bound. [`Churn`] bounds that per upstream: the first change is recorded at once and in full
//! (a real rug pull is on the record immediately); changes in the [`WINDOW_MS`] after it are
//! counted instead, and written as one `pins/churn:<upstream>` record carrying their count when
//! the window ends. An upstream that keeps changing gets one such record per window, never more;
//! one that falls quiet for a whole window has its next change recorded in full again.
//!
//! What is coalesced is the upstream's own doing: a definition that is new or whose digest
//! changed, and a served flag that changed under the same state (a collision, the kill-switch
//! registry). A state change under the same digest is a reviewer's decision and is always
//! recorded; it also closes the upstream's window (its count written first), so a change right
//! after a review is recorded in full again. The first listing of an upstream (the gateway's
//! start) opens no window.

use std::collections::{HashMap, HashSet};

/// The coalescing window: one minute, the default re-listing interval (`[pins] relist_secs`), so
/// an upstream that changes on every listing at the default interval loses nothing.
pub const WINDOW_MS: u64 = 60_000;

/// What to do with one upstream's coalescible changes of one build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Record each change (one record per definition, as always).
    Record,
    /// Write nothing now: the changes are counted. `started` on the first change counted in the
    /// window (worth one warning in the log).
    Coalesce {
        /// Whether this is the window's first coalesced change.
        started: bool,
    },
    /// Write this summary (which counts these changes too) instead of the changes.
    Summarize(Summary),
}

/// One upstream's coalesced changes: the `pins/churn:<upstream>` record's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The upstream's id.
    pub upstream: String,
    /// How many standing changes were not recorded one by one.
    pub coalesced: u64,
    /// When the window they fell in opened (ms since the epoch).
    pub since_ms: u64,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    opened_ms: u64,
    coalesced: u64,
}

/// The coalescing state of every upstream.
#[derive(Debug, Default)]
pub struct Churn {
    windows: HashMap<String, Window>,
    /// (upstream, definitions or launch) seen once already.
    listed: HashSet<(String, bool)>,
}

impl Churn {
    /// `changes` coalescible standing changes of `upstream` in one build at `now_ms`;
    /// `definitions` when some of them are listed definitions (not only the launch). The first
    /// of each (the upstream's first listing, its launch first seen) opens no window.
    pub fn observe(&mut self, upstream: &str, changes: u64, definitions: bool, now_ms: u64) -> Verdict {
        if changes == 0 {
            return Verdict::Record;
        }
        if self.listed.insert((upstream.to_owned(), definitions)) {
            // The upstream's first listing (or its launch first seen): everything is new, nothing
            // has churned yet.
            return Verdict::Record;
        }
        let fresh = Window { opened_ms: now_ms, coalesced: 0 };
        let Some(window) = self.windows.get_mut(upstream) else {
            self.windows.insert(upstream.to_owned(), fresh);
            return Verdict::Record;
        };
        if now_ms.saturating_sub(window.opened_ms) < WINDOW_MS {
            window.coalesced += changes;
            return Verdict::Coalesce { started: window.coalesced == changes };
        }
        let previous = std::mem::replace(window, fresh);
        if previous.coalesced == 0 {
            // Quiet for a whole window: this change starts a new one, recorded in full.
            return Verdict::Record;
        }
        // Still changing: one summary for the elapsed window and this change; a new window opens.
        Verdict::Summarize(Summary {
            upstream: upstream.to_owned(),
            coalesced: previous.coalesced + changes,
            since_ms: previous.opened_ms,
        })
    }

    /// A reviewer's decision on `upstream` took effect: its window closes, and what it counted
    /// is the summary to write now.
    pub fn reset(&mut self, upstream: &str) -> Option<Summary> {
        let window = self.windows.remove(upstream)?;
        (window.coalesced > 0).then(|| Summary {
            upstream: upstream.to_owned(),
            coalesced: window.coalesced,
            since_ms: window.opened_ms,
        })
    }

    /// The summaries due at `now_ms`: of every window that has elapsed with changes counted
    /// (a new window opens after each), or of every window when `all` (the gateway stops). An
    /// elapsed window without counted changes closes.
    pub fn due(&mut self, now_ms: u64, all: bool) -> Vec<Summary> {
        let mut out = Vec::new();
        self.windows.retain(|upstream, window| {
            if !all && now_ms.saturating_sub(window.opened_ms) < WINDOW_MS {
                return true;
            }
            if window.coalesced == 0 {
                return false;
            }
            out.push(Summary { upstream: upstream.clone(), coalesced: window.coalesced, since_ms: window.opened_ms });
            *window = Window { opened_ms: now_ms, coalesced: 0 };
            !all
        });
        out.sort_by(|a, b| a.upstream.cmp(&b.upstream));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: u64 = 1_800_000_000_000;

    #[test]
    fn the_first_listing_opens_no_window_and_the_first_change_is_recorded_at_once() {
        let mut churn = Churn::default();
        assert_eq!(churn.observe("evil", 8, true, START), Verdict::Record, "the first listing");
        assert_eq!(churn.observe("evil", 1, true, START + 1), Verdict::Record, "the first change");
        assert_eq!(churn.observe("evil", 1, true, START + 2), Verdict::Coalesce { started: true });
        assert_eq!(churn.observe("evil", 2, true, START + 3), Verdict::Coalesce { started: false });
        // Another upstream has windows of its own.
        assert_eq!(churn.observe("docs", 3, true, START + 3), Verdict::Record);
        assert_eq!(churn.observe("docs", 1, true, START + 4), Verdict::Record);
        assert!(churn.due(START + WINDOW_MS - 1, false).is_empty(), "no window has elapsed");
    }

    #[test]
    fn an_upstream_changing_on_every_listing_writes_one_record_per_window_with_the_count() {
        let mut churn = Churn::default();
        churn.observe("evil", 1, true, START);
        // Six changes a second for ten minutes: the first in full, then one summary a window.
        let (mut recorded, mut summaries, mut counted) = (0, Vec::new(), 0);
        let changes = 6 * 600;
        for n in 0..changes {
            let now = START + 1 + n * 1000 / 6;
            match churn.observe("evil", 1, true, now) {
                Verdict::Record => recorded += 1,
                Verdict::Coalesce { .. } => {}
                Verdict::Summarize(summary) => summaries.push((now, summary)),
            }
            // The periodic flush runs too, every fifteen seconds.
            if n % 90 == 0 {
                summaries.extend(churn.due(now, false).into_iter().map(|summary| (now, summary)));
            }
        }
        let end = START + 1 + changes * 1000 / 6;
        summaries.extend(churn.due(end, true).into_iter().map(|summary| (end, summary)));
        assert_eq!(recorded, 1, "only the first change is recorded in full");
        counted += summaries.iter().map(|(_, summary)| summary.coalesced).sum::<u64>();
        assert_eq!(counted + recorded, changes, "every change is counted once");
        assert!(summaries.len() as u64 <= 600 / 60 + 1, "{} summaries", summaries.len());
        for pair in summaries.windows(2) {
            assert!(pair[1].0 - pair[0].0 >= WINDOW_MS || pair[1].0 == end, "one summary per window");
            assert!(pair[1].1.since_ms >= pair[0].1.since_ms + WINDOW_MS || pair[1].0 == end);
        }
        assert!(summaries.iter().all(|(_, summary)| summary.upstream == "evil" && summary.coalesced > 0));
        assert!(churn.due(end + 10 * WINDOW_MS, false).is_empty(), "nothing is left to write");
    }

    #[test]
    fn an_upstream_quiet_for_a_window_is_recorded_in_full_again() {
        let mut churn = Churn::default();
        churn.observe("docs", 2, true, START);
        assert_eq!(churn.observe("docs", 1, true, START + 10), Verdict::Record);
        assert_eq!(churn.observe("docs", 1, true, START + WINDOW_MS + 10), Verdict::Record, "one change a window");
        assert_eq!(churn.observe("docs", 1, true, START + WINDOW_MS + 20), Verdict::Coalesce { started: true });
        let due = churn.due(START + 2 * WINDOW_MS + 10, false);
        assert_eq!(due, [Summary { upstream: "docs".into(), coalesced: 1, since_ms: START + WINDOW_MS + 10 }]);
        // The window after the summary saw nothing: it closes, and the next change is recorded.
        assert!(churn.due(START + 3 * WINDOW_MS + 10, false).is_empty());
        assert_eq!(churn.observe("docs", 1, true, START + 3 * WINDOW_MS + 20), Verdict::Record);
    }

    #[test]
    fn a_change_after_an_elapsed_window_with_counted_changes_is_summarized_with_them() {
        let mut churn = Churn::default();
        churn.observe("evil", 1, true, START);
        churn.observe("evil", 1, true, START + 1);
        churn.observe("evil", 4, true, START + 2);
        let verdict = churn.observe("evil", 1, true, START + WINDOW_MS + 5);
        assert_eq!(verdict, Verdict::Summarize(Summary { upstream: "evil".into(), coalesced: 5, since_ms: START + 1 }));
        assert_eq!(churn.observe("evil", 1, true, START + WINDOW_MS + 6), Verdict::Coalesce { started: true });
        assert_eq!(
            churn.due(START + WINDOW_MS + 7, true),
            [Summary { upstream: "evil".into(), coalesced: 1, since_ms: START + WINDOW_MS + 5 }],
            "the gateway stopping writes what is counted"
        );
        assert!(churn.due(START + WINDOW_MS + 8, true).is_empty());
    }

    #[test]
    fn a_decision_closes_the_window_so_the_next_change_is_recorded_in_full() {
        let mut churn = Churn::default();
        churn.observe("docs", 2, true, START);
        assert_eq!(churn.observe("docs", 1, true, START + 1), Verdict::Record);
        assert_eq!(churn.reset("docs"), None, "nothing was counted");
        assert_eq!(churn.observe("docs", 1, true, START + 2), Verdict::Record, "after a review");
        assert_eq!(churn.observe("docs", 3, true, START + 3), Verdict::Coalesce { started: true });
        assert_eq!(churn.reset("docs"), Some(Summary { upstream: "docs".into(), coalesced: 3, since_ms: START + 2 }));
        assert_eq!(churn.observe("docs", 1, true, START + 4), Verdict::Record, "after another review");
        assert_eq!(churn.reset("other"), None);
    }

    #[test]
    fn the_first_launch_and_the_first_listing_open_no_window() {
        let mut churn = Churn::default();
        assert_eq!(churn.observe("tool", 1, false, START), Verdict::Record, "the launch, new");
        assert_eq!(churn.observe("tool", 5, true, START + 1), Verdict::Record, "its first listing");
        assert_eq!(churn.observe("tool", 1, true, START + 2), Verdict::Record, "the first change");
        assert_eq!(churn.observe("tool", 1, false, START + 3), Verdict::Coalesce { started: true });
        assert_eq!(churn.observe("other", 0, true, START), Verdict::Record, "no change: nothing to coalesce");
    }
}
