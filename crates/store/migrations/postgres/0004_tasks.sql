-- Durable, partitioned Tasks (PostgreSQL). The task id is never stored, only its SHA-256; the owner
-- is a keyed subject digest plus tenant and client. Every change is a compare-and-swap on
-- `version` that also requires a non-terminal status, so terminal rows are immutable in the store.

CREATE TABLE tasks (
    task_digest      BYTEA   PRIMARY KEY CHECK (octet_length(task_digest) = 32),
    subject_key      BYTEA   NOT NULL CHECK (octet_length(subject_key) = 32),
    tenant_id        TEXT    NOT NULL CHECK (tenant_id <> ''),
    client_id        TEXT    NOT NULL CHECK (client_id <> ''),
    request_id       TEXT    NOT NULL,
    method           TEXT    NOT NULL,
    tool             TEXT    NOT NULL CHECK (tool <> ''),
    arguments_digest BYTEA   NOT NULL CHECK (octet_length(arguments_digest) = 32),
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
    created_ms       BIGINT  NOT NULL,
    updated_ms       BIGINT  NOT NULL,
    ttl_ms           BIGINT  CHECK (ttl_ms IS NULL OR ttl_ms >= 0),
    poll_interval_ms BIGINT  CHECK (poll_interval_ms IS NULL OR poll_interval_ms > 0),
    lease_owner      TEXT,
    lease_until_ms   BIGINT,
    attempts         BIGINT  NOT NULL,
    version          BIGINT  NOT NULL,
    CHECK (status <> 'completed' OR (result IS NOT NULL AND error IS NULL)),
    CHECK (status <> 'failed' OR (error IS NOT NULL AND result IS NULL))
);

CREATE INDEX tasks_owner ON tasks (subject_key, tenant_id, client_id);
CREATE INDEX tasks_working ON tasks (status, lease_until_ms);
CREATE INDEX tasks_retention ON tasks (created_ms) WHERE ttl_ms IS NOT NULL;

CREATE TABLE task_history (
    id          BIGSERIAL PRIMARY KEY,
    task_digest BYTEA     NOT NULL,
    at_ms       BIGINT    NOT NULL,
    status      TEXT      NOT NULL
);
CREATE INDEX task_history_task ON task_history (task_digest, at_ms);
