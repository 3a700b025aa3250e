//! Applications built only on Palisade's public library API: the conformance fixture that the
//! official MCP conformance suite and the SDK clients exercise, and the demo application.

pub mod conformance;

use palisade_server::App;

/// The applications `palisade serve --app` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppName {
    /// The demo. Until the demo shop lands it serves the conformance fixture.
    Demo,
    /// The conformance fixture.
    Conformance,
}

impl AppName {
    /// Builds the application.
    pub fn build(self) -> App {
        match self {
            Self::Demo | Self::Conformance => conformance::app(),
        }
    }
}
