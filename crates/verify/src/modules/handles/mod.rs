//! The explicit application-handle module (seed 000, DESIGN C2): cross-call state is an opaque
//! handle passed back as an ordinary tool argument, and the server must authorize its owner
//! (subject, tenant, client, scope) on every use. The module finds the handle tools from
//! `tools/list` (a tool named like create/new/open/start without required arguments whose
//! result holds a string under a property that other tools take as an argument), has the first
//! identity create a handle, and checks that its owner is served while another subject, another
//! tenant, another client, no token, a token without the scope, guessed and near-miss handles,
//! a revoked or replaced handle are refused; that the refusal for another identity's handle is
//! the refusal for a handle that does not exist (no existence oracle) and echoes nothing of the
//! object; and that handles are distinct, long enough and never listed.
//!
//! Creating a handle is a side effect: without `--allow-mutations` every case is NOT TESTABLE
//! and nothing is sent. Only tools the one rule of [`crate::callable`] permits are considered at
//! all (never one annotated destructive or named like delete, revoke or checkout), so a revoke
//! case needs a tool named like close, discard, release or invalidate. Handles are credentials:
//! each one (real, guessed, near-miss) is added to the run's redactor before a transcript that
//! could show it is kept.

mod common;
mod forged;
mod lifecycle;
mod owner;

#[cfg(test)]
mod tests;

use crate::modules::{Module, cases};
use forged::*;
use lifecycle::*;
use owner::*;

/// The handles module.
pub fn module() -> Module {
    Module {
        name: "handles",
        exclusive: false,
        cases: cases! {
            create: "handles.discover.create", "A create tool issues a handle its owner can use in another tool",
                "seed 000 G001: cross-call state is an explicit handle passed as an ordinary argument", Low;
            read_other_subject: "handles.read.other_subject", "Another subject of the same tenant cannot read through the owner's handle",
                "seed 000 G001: authorize the referenced object on every use; Verify safely: substitution across subject", Critical;
            read_other_tenant: "handles.read.other_tenant", "Another tenant cannot read through the owner's handle",
                "seed 000: handles bound to tenant; Verify safely: substitution across tenant", Critical;
            read_other_client: "handles.read.other_client", "The same subject through another client cannot read through the handle",
                "seed 000: handles bound to client; Verify safely: substitution across client", Critical;
            read_no_token: "handles.read.no_token", "The owner's handle without a token is refused by a reading tool",
                "seed 000 G001: a handle is an untrusted argument, not authentication", Critical;
            write_other_subject: "handles.write.other_subject", "Another subject of the same tenant cannot change the object through the handle",
                "seed 000 G001: authorize the referenced object on every use; Verify safely: substitution across subject", Critical;
            write_other_tenant: "handles.write.other_tenant", "Another tenant cannot change the object through the owner's handle",
                "seed 000: handles bound to tenant; Verify safely: substitution across tenant", Critical;
            write_other_client: "handles.write.other_client", "The same subject through another client cannot change the object",
                "seed 000: handles bound to client; Verify safely: substitution across client", Critical;
            write_no_token: "handles.write.no_token", "The owner's handle without a token is refused by a changing tool",
                "seed 000 G001: a handle is an untrusted argument, not authentication", Critical;
            forge_random: "handles.forge.random", "A random handle of the same length and alphabet is refused",
                "seed 000 Verify safely: guessing", High;
            forge_last_char: "handles.forge.last_char", "The owner's handle with its last character changed is refused",
                "seed 000 Verify safely: guessing (near misses)", High;
            forge_first_char: "handles.forge.first_char", "The owner's handle with its first character changed is refused",
                "seed 000 Verify safely: guessing (near misses)", High;
            forge_truncated: "handles.forge.truncated", "The owner's handle shortened by one character is refused",
                "seed 000 Verify safely: guessing (near misses)", High;
            forge_appended: "handles.forge.appended", "The owner's handle with one character appended is refused",
                "seed 000 Verify safely: guessing (near misses)", High;
            forge_case_flipped: "handles.forge.case_flipped", "The owner's handle with its letters' case flipped is refused",
                "seed 000 Verify safely: guessing (near misses); handles compared exactly (by digest)", High;
            foreign_handle: "handles.substitution.foreign_handle", "An identity presenting another subject's handle is refused",
                "seed 000 Verify safely: substitution across subject", Critical;
            other_position: "handles.substitution.other_position", "Another identity's handle in a second handle argument is refused",
                "seed 000 G001: every handle argument authorized on every use", Critical;
            oracle_other_subject: "handles.oracle.other_subject", "Another subject's handle is refused exactly like one that does not exist",
                "seed 000 (no oracle: one refusal for every reason); existence oracle", High;
            oracle_other_tenant: "handles.oracle.other_tenant", "Another tenant's handle is refused exactly like one that does not exist",
                "seed 000 (no oracle: one refusal for every reason); existence oracle", High;
            no_echo: "handles.oracle.no_echo", "The refusal of another identity's handle shows nothing of the object",
                "seed 000 G001: the referenced object is authorized before any of it is returned", High;
            distinct: "handles.issue.distinct", "Two creates issue two different handles",
                "seed 000 G001: one high-entropy handle per object; Verify safely: database uniqueness", High;
            entropy: "handles.issue.entropy", "A handle carries at least 128 bits (length × alphabet)",
                "seed 000 G001: store only a high-entropy handle at the client (256-bit in the seed)", Medium;
            not_listed: "handles.issue.not_listed", "A handle appears in no listing (tools, resources, templates, prompts)",
                "seed 000 G001: the handle is given to its owner only; DESIGN C2", High;
            revoked: "handles.lifecycle.revoked", "After its owner revokes a handle it is refused",
                "seed 000 G001: independently revocable handles; Verify safely: revocation", High;
            revoke_other: "handles.lifecycle.revoke_other", "Another identity cannot revoke the owner's handle",
                "seed 000 revokeHandle: revocation bound to the owner", High;
            replaced: "handles.lifecycle.replaced", "After the object is replaced the old handle is refused",
                "seed 000: handles bound to the object's version; Verify safely: object/version change", Medium;
            expired: "handles.lifecycle.expired", "After its announced expiry a handle is refused",
                "seed 000 G001: expiring handles; Verify safely: expiry boundaries", High;
            scope_escalation: "handles.scope.escalation", "The owner's handle with a token of the owner lacking a scope is refused",
                "seed 000 resolveHandle: required scope checked on every use; Verify safely: scope escalation", High;
        },
    }
}
