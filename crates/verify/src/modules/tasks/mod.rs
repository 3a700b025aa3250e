//! The tasks module (seed 002; the `io.modelcontextprotocol/tasks` extension, protocol.md §13):
//! negotiation (`-32021` without the extension, no task returned to a client that did not ask),
//! invalid task ids, another identity's `tasks/get | update | cancel` (another subject of the
//! same tenant, another tenant, another client of the same user, no token), the existence
//! oracle (a foreign task must be refused exactly like an unknown one), `Mcp-Name` ≠ `taskId`,
//! the removed `tasks/list` and `tasks/result`, terminal immutability, duplicate and unknown
//! `inputResponses` keys, the shape of a `CreateTaskResult` and the entropy of task ids.
//!
//! Cases that need no task (negotiation, invalid ids, removed methods) are read-only: their
//! positive control is the target's `server/discover` advertising the extension. Every case that
//! needs a task creates its own as the first identity (a `tools/call` of a task-capable tool,
//! found from `tools/list`), which is a side effect: without `--allow-mutations` those cases
//! are NOT TESTABLE and nothing is called. Their control is the owner's own `tasks/get`; the
//! owner cancels what it created when the case is done. Task ids are handles: each one issued
//! (and each one made up) is added to the run's redactor before any transcript is kept.

mod common;
mod cross;
mod lifecycle;
mod negotiation;

use crate::modules::{Module, cases};
pub use common::TASKS_EXTENSION;
use cross::*;
use lifecycle::*;
use negotiation::*;

/// The tasks module.
pub fn module() -> Module {
    Module {
        name: "tasks",
        exclusive: false,
        cases: cases! {
            advertised: "tasks.negotiation.advertised", "The extension is advertised under capabilities.extensions and tasks/get is served",
                "protocol.md §13 Negotiation: the server advertises io.modelcontextprotocol/tasks; a v1 capabilities.tasks is forbidden", Low;
            negotiation_get: "tasks.negotiation.get", "tasks/get without the extension declared is refused with -32021",
                "protocol.md §13 Errors: any tasks/* call without the capability gets -32021; seed 002 Verify safely", Medium;
            negotiation_update: "tasks.negotiation.update", "tasks/update without the extension declared is refused with -32021",
                "protocol.md §13 Errors: any tasks/* call without the capability gets -32021; seed 002 Verify safely", Medium;
            negotiation_cancel: "tasks.negotiation.cancel", "tasks/cancel without the extension declared is refused with -32021",
                "protocol.md §13 Errors: any tasks/* call without the capability gets -32021; seed 002 Verify safely", Medium;
            negotiation_tool: "tasks.negotiation.tool_call", "A task-capable tool called without the extension gets no task",
                "protocol.md §13 Creating a task: never return a task to a request without the capability (-32021 instead)", Medium;
            id_empty: "tasks.id.empty", "tasks/get with an empty taskId is refused with a JSON-RPC error, not a 5xx",
                "protocol.md §13 Errors: unknown taskId gets -32602; seed 002 Verify safely (invalid ID)", Medium;
            id_unknown: "tasks.id.unknown", "tasks/get of a random well-formed taskId is refused with -32602",
                "protocol.md §13 Errors: unknown or expired taskId gets -32602 (MUST for get)", Medium;
            id_long: "tasks.id.long", "tasks/get with a 4096-character taskId is refused with a JSON-RPC error, not a 5xx",
                "protocol.md §13 Errors; seed 002 Verify safely (invalid ID)", Medium;
            id_non_string: "tasks.id.non_string", "tasks/get with a numeric taskId is refused with a JSON-RPC error, not a 5xx",
                "ext-tasks schema GetTaskRequest: taskId is a string; seed 002 Verify safely (invalid ID)", Medium;
            id_missing: "tasks.id.missing", "tasks/get without a taskId is refused with a JSON-RPC error, not a 5xx",
                "ext-tasks schema GetTaskRequest: taskId is required; seed 002 Verify safely (invalid ID)", Medium;
            get_other_subject: "tasks.get.other_subject", "Another subject of the same tenant cannot read the task",
                "seed 002 G001: authorize each Task request independently, partitioned by principal", Critical;
            get_other_tenant: "tasks.get.other_tenant", "Another tenant cannot read the task",
                "seed 002 G001: partition durable Tasks by tenant", Critical;
            get_other_client: "tasks.get.other_client", "Another client of the same user cannot read the task",
                "seed 002 G001: partition durable Tasks by client", Critical;
            get_no_token: "tasks.get.no_token", "tasks/get of the task without a token is refused with 401",
                "authorization §Token Requirements; seed 002 G001", Critical;
            update_other_subject: "tasks.update.other_subject", "Another subject of the same tenant cannot answer the task's input requests",
                "seed 002 G001: authorize each Task request independently (update)", Critical;
            update_other_tenant: "tasks.update.other_tenant", "Another tenant cannot answer the task's input requests",
                "seed 002 G001: partition durable Tasks by tenant (update)", Critical;
            update_other_client: "tasks.update.other_client", "Another client of the same user cannot answer the task's input requests",
                "seed 002 G001: partition durable Tasks by client (update)", Critical;
            update_no_token: "tasks.update.no_token", "tasks/update of the task without a token is refused and changes nothing",
                "authorization §Token Requirements; seed 002 G001", Critical;
            cancel_other_subject: "tasks.cancel.other_subject", "Another subject of the same tenant cannot cancel the task",
                "seed 002 G001: authorize each Task request independently (cancel)", Critical;
            cancel_other_tenant: "tasks.cancel.other_tenant", "Another tenant cannot cancel the task",
                "seed 002 G001: partition durable Tasks by tenant (cancel)", Critical;
            cancel_other_client: "tasks.cancel.other_client", "Another client of the same user cannot cancel the task",
                "seed 002 G001: partition durable Tasks by client (cancel)", Critical;
            cancel_no_token: "tasks.cancel.no_token", "tasks/cancel of the task without a token is refused and cancels nothing",
                "authorization §Token Requirements; seed 002 G001", Critical;
            oracle_get: "tasks.oracle.get", "Another identity's task id is refused for tasks/get exactly like an unknown id",
                "protocol.md §13: unknown, expired or foreign taskId are the same -32602; seed 000 (no existence oracle)", High;
            oracle_update: "tasks.oracle.update", "Another identity's task id is refused for tasks/update exactly like an unknown id",
                "protocol.md §13: unknown, expired or foreign taskId are the same -32602; seed 000 (no existence oracle)", High;
            oracle_cancel: "tasks.oracle.cancel", "Another identity's task id is refused for tasks/cancel exactly like an unknown id",
                "protocol.md §13: unknown, expired or foreign taskId are the same -32602; seed 000 (no existence oracle)", High;
            mcp_name_mismatch: "tasks.mcp_name.mismatch", "tasks/get whose Mcp-Name differs from params.taskId is refused with 400 / -32020",
                "protocol.md §6 Headers: Mcp-Name equals params.taskId (tasks extension); a mismatch gets 400 + -32020", Medium;
            mcp_name_missing: "tasks.mcp_name.missing", "tasks/get without an Mcp-Name header is refused with 400 / -32020",
                "protocol.md §6 Validation: a missing header gets 400 + -32020; seed 002 (routing names)", Medium;
            removed_list: "tasks.removed.list", "The removed tasks/list is refused with -32601",
                "protocol.md §13 Errors: tasks/list is removed; conformance expects -32601 (HTTP 404)", Medium;
            removed_result: "tasks.removed.result", "The removed tasks/result is refused with -32601",
                "protocol.md §13 Errors: tasks/result is removed; conformance expects -32601 (HTTP 404)", Medium;
            terminal_cancel_completed: "tasks.terminal.cancel_completed", "tasks/cancel of a completed (or failed) task changes neither its status nor its result",
                "seed 002 G001: keep terminal states immutable; protocol.md §13 tasks/cancel", High;
            terminal_update_completed: "tasks.terminal.update_completed", "tasks/update of a completed (or failed) task changes neither its status nor its result",
                "seed 002 G001: keep terminal states immutable", High;
            terminal_cancel_cancelled: "tasks.terminal.cancel_cancelled", "tasks/cancel of a task its owner cancelled changes nothing",
                "seed 002 G001: keep terminal states immutable", High;
            terminal_update_cancelled: "tasks.terminal.update_cancelled", "tasks/update of a task its owner cancelled does not revive it",
                "seed 002 G001: keep terminal states immutable", High;
            input_duplicate: "tasks.input.duplicate_keys", "inputResponses naming a key twice (two answers) is refused or ignored",
                "seed 002 Verify safely (duplicate updates); wire strict JSON: one document, one meaning", Medium;
            input_unknown: "tasks.input.unknown_keys", "inputResponses with only unknown keys is ignored or refused without changing the task",
                "protocol.md §13 tasks/update: unknown or answered keys are ignored", Medium;
            create_flat: "tasks.create.flat", "A CreateTaskResult is flat (no result, inputRequests, error) and tasks/get resolves at once",
                "ext-tasks schema CreateTaskResult; protocol.md §13: send it only once tasks/get would resolve", Medium;
            create_entropy: "tasks.create.id_entropy", "Task ids are long and unguessable (at least 128 bits estimated)",
                "protocol.md §13: task ids must be unguessable; seed 002 G001 (high-entropy IDs)", High;
        },
    }
}
