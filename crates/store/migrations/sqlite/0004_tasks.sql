-- Durable, partitioned Tasks (SQLite). The task id is never stored, only its SHA-256; the owner is
-- a keyed subject digest plus tenant and client. Every change is a compare-and-swap on `version`
-- that also requires a non-terminal status, so terminal rows are immutable in the store.

CREATE TABLE tasks (
    task_digest      BLOB    PRIMARY KEY CHECK (length(task_digest) = 32),
    subject_key      BLOB    NOT NULL CHECK (length(subject_key) = 32),
    tenant_id        TEXT    NOT NULL CHECK (tenant_id <> ''),
    client_id        TEXT    NOT NULL CHECK (client_id <> ''),
    request_id       TEXT    NOT NULL,
    method           TEXT    NOT NULL,
    tool             TEXT    NOT NULL CHECK (tool <> ''),
    arguments_digest BLOB    NOT NULL CHECK (length(arguments_digest) = 32),
    scopes           TEXT    NOT NULL,
    execution        TEXT    NOT NULL,
    status           TEXT    NOT NULL
                     CHECK (status IN ('working', 'input_required', 'completed', 'failed', 'cancelled')),
    status_message   TEXT,
    input_requests   TEXT,
    input_responses  TEXT    NOT NULL,
    answered_keys    TEXT    NOT NULL,
    result           TEXT,
    error            TEXT,
    cancel_requested BOOLEAN NOT NULL,
    created_ms       INTEGER NOT NULL,
    updated_ms       INTEGER NOT NULL,
    ttl_ms           INTEGER CHECK (ttl_ms IS NULL OR ttl_ms >= 0),
    poll_interval_ms INTEGER CHECK (poll_interval_ms IS NULL OR poll_interval_ms > 0),
    lease_owner      TEXT,
    lease_until_ms   INTEGER,
    attempts         INTEGER NOT NULL,
    version          INTEGER NOT NULL,
    CHECK (status <> 'completed' OR (result IS NOT NULL AND error IS NULL)),
    CHECK (status <> 'failed' OR (error IS NOT NULL AND result IS NULL))
) WITHOUT ROWID;

CREATE INDEX tasks_owner ON tasks (subject_key, tenant_id, client_id);
CREATE INDEX tasks_working ON tasks (status, lease_until_ms);
CREATE INDEX tasks_retention ON tasks (created_ms) WHERE ttl_ms IS NOT NULL;

-- Every status a task passed through, for audit.
CREATE TABLE task_history (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task_digest BLOB    NOT NULL,
    at_ms       INTEGER NOT NULL,
    status      TEXT    NOT NULL
);
CREATE INDEX task_history_task ON task_history (task_digest, at_ms);
