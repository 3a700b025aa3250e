-- The hash-chained audit log (PostgreSQL). Columns are the source of truth: verify_chain rebuilds
-- each record from them and recomputes hash = SHA-256(prev_hash || canonical JSON of the record).

CREATE TABLE audit_log (
    seq              BIGINT PRIMARY KEY CHECK (seq > 0),
    at_ms            BIGINT NOT NULL CHECK (at_ms >= 0),
    trace_id         TEXT   NOT NULL,
    stage            TEXT   NOT NULL,
    decision         TEXT   NOT NULL CHECK (decision IN ('allow', 'deny')),
    operation        TEXT   NOT NULL,
    principal_digest TEXT,
    tenant_digest    TEXT,
    client_digest    TEXT,
    scopes           TEXT   NOT NULL, -- JSON array of strings
    policy_version   TEXT,
    code             BIGINT,
    detail           TEXT,
    prev_hash        BYTEA  NOT NULL CHECK (octet_length(prev_hash) = 32),
    hash             BYTEA  NOT NULL CHECK (octet_length(hash) = 32)
);

CREATE INDEX audit_log_trace_id ON audit_log (trace_id);

-- One row: the sequence number and hash of the newest record. Appenders lock it
-- (SELECT ... FOR UPDATE) before extending the chain, so appenders on any number of instances
-- serialize and the chain never forks; it also lets verify_chain notice records deleted from the tail.
CREATE TABLE audit_chain_head (
    id        SMALLINT PRIMARY KEY CHECK (id = 1),
    last_seq  BIGINT   NOT NULL CHECK (last_seq >= 0),
    last_hash BYTEA    NOT NULL CHECK (octet_length(last_hash) = 32)
);

INSERT INTO audit_chain_head (id, last_seq, last_hash) VALUES (1, 0, decode(repeat('00', 32), 'hex'));
