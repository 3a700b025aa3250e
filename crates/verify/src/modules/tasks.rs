//! The tasks module (being written).

use crate::modules::Module;

/// The tasks module.
pub fn module() -> Module {
    Module { name: "tasks", cases: Vec::new() }
}
