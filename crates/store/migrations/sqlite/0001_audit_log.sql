-- The hash-chained audit log (SQLite). Columns are the source of truth: verify_chain rebuilds each
-- record from them and recomputes hash = SHA-256(prev_hash || canonical JSON of the record).

CREATE TABLE audit_log (
    seq              INTEGER PRIMARY KEY CHECK (seq > 0),
    at_ms            INTEGER NOT NULL CHECK (at_ms >= 0),
    trace_id         TEXT    NOT NULL,
    stage            TEXT    NOT NULL,
    decision         TEXT    NOT NULL CHECK (decision IN ('allow', 'deny')),
    operation        TEXT    NOT NULL,
    principal_digest TEXT,
    tenant_digest    TEXT,
    client_digest    TEXT,
    scopes           TEXT    NOT NULL, -- JSON array of strings
    policy_version   TEXT,
    code             INTEGER,
    detail           TEXT,
    prev_hash        BLOB    NOT NULL CHECK (length(prev_hash) = 32),
    hash             BLOB    NOT NULL CHECK (length(hash) = 32)
) STRICT;

CREATE INDEX audit_log_trace_id ON audit_log (trace_id);

-- One row: the sequence number and hash of the newest record. Appenders take the write lock
-- (BEGIN IMMEDIATE) before reading it, so two appenders can never extend the same head; it also
-- lets verify_chain notice records deleted from the tail.
CREATE TABLE audit_chain_head (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    last_seq  INTEGER NOT NULL CHECK (last_seq >= 0),
    last_hash BLOB    NOT NULL CHECK (length(last_hash) = 32)
) STRICT;

INSERT INTO audit_chain_head (id, last_seq, last_hash) VALUES (1, 0, zeroblob(32));
