//! What a run shows while it goes: on a terminal, a live progress bar on stderr (checks done of
//! all, the last one's id) with every verdict other than PASS printed above it; otherwise one
//! plain line per check, so logs and CI output stay readable.

use std::io::IsTerminal as _;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::check::{Check, Outcome, Verdict};
use crate::report::progress_line;

/// The run's progress display.
#[derive(Debug)]
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar over `total` checks when stderr is a terminal, plain lines otherwise.
    pub fn new(total: usize) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self { bar: None };
        }
        let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
        // The template is a constant: a bad one is a programming error caught by the unit test.
        if let Ok(style) = ProgressStyle::with_template("{bar:32} {pos}/{len} checks  {elapsed}  {wide_msg}") {
            bar.set_style(style);
        }
        Self { bar: Some(bar) }
    }

    /// One check finished.
    pub fn finished(&self, check: &Check, outcome: &Outcome) {
        match &self.bar {
            Some(bar) => {
                if outcome.verdict != Verdict::Pass {
                    bar.println(progress_line(check, outcome));
                }
                bar.set_message(check.id);
                bar.inc(1);
            }
            None => eprintln!("{}", progress_line(check, outcome)),
        }
    }

    /// The run ended: the bar is removed (the summary table follows on stdout).
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_template_is_valid() {
        assert!(ProgressStyle::with_template("{bar:32} {pos}/{len} checks  {elapsed}  {wide_msg}").is_ok());
    }
}
