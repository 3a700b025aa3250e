//! [`Switch`]: how the operator flips a target, and the results of the run's one flip sequence.

use std::collections::HashMap;

use tokio::sync::OnceCell;

use crate::check::Outcome;

/// How the operator flips a target, and the results of the one flip sequence of a run.
pub struct Switch {
    pub(super) disable: Option<String>,
    pub(super) enable: Option<String>,
    pub(super) results: OnceCell<HashMap<&'static str, Outcome>>,
}

impl std::fmt::Debug for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The command lines may carry credentials: only whether they were given.
        f.debug_struct("Switch")
            .field("disable", &self.disable.is_some())
            .field("enable", &self.enable.is_some())
            .finish_non_exhaustive()
    }
}

impl Switch {
    /// The operator's disable and enable command lines (`{target}` stands for `kind:name`).
    pub fn new(disable: Option<String>, enable: Option<String>) -> Self {
        let given = |command: Option<String>| command.filter(|line| !line.trim().is_empty());
        Self { disable: given(disable), enable: given(enable), results: OnceCell::new() }
    }

    /// No way to flip a target was given.
    pub fn none() -> Self {
        Self::new(None, None)
    }
}
