//! Applications built only on Palisade's public library API: the conformance fixture that the
//! official MCP conformance suite and the SDK clients exercise, and the demo application.
//!
//! Layers, low to high: `conformance`, `demo`.

pub mod conformance;
pub mod demo;

use palisade_server::App;

/// The applications `palisade serve --app` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppName {
    /// The demo shop.
    Demo,
    /// The conformance fixture.
    Conformance,
}

impl AppName {
    /// Builds the application.
    pub fn build(self) -> App {
        self.build_with_orders(None)
    }

    /// Builds the application; the demo records orders in `orders` (ignored by the others).
    pub fn build_with_orders(self, orders: Option<demo::Orders>) -> App {
        match self {
            Self::Demo => demo::app_with_orders(orders),
            Self::Conformance => conformance::app(),
        }
    }

    /// The scopes the application understands, for the protected-resource metadata.
    pub fn scopes_supported(self) -> &'static [&'static str] {
        match self {
            Self::Demo => demo::SCOPES,
            Self::Conformance => &[],
        }
    }
}
