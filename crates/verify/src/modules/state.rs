//! The state module (being written).

use crate::modules::Module;

/// The state module.
pub fn module() -> Module {
    Module { name: "state", cases: Vec::new() }
}
