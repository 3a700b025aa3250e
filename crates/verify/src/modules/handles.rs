//! The handles module (being written).

use crate::modules::Module;

/// The handles module.
pub fn module() -> Module {
    Module { name: "handles", cases: Vec::new() }
}
