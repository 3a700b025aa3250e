//! The killswitch module (being written).

use crate::modules::Module;

/// The killswitch module.
pub fn module() -> Module {
    Module { name: "killswitch", cases: Vec::new() }
}
