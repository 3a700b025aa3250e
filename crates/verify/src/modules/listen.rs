//! The listen module (being written).

use crate::modules::Module;

/// The listen module.
pub fn module() -> Module {
    Module { name: "listen", cases: Vec::new() }
}
