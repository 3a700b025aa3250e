//! The pinning module (being written).

use crate::modules::Module;

/// The pinning module.
pub fn module() -> Module {
    Module { name: "pinning", cases: Vec::new() }
}
