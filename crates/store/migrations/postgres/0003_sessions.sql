-- Sessions of the 2025-era wire (PostgreSQL). Only the session id's SHA-256 is stored; the owner
-- is a keyed subject digest plus tenant and client (empty when the principal has none). A session
-- is dead once `expires_ms` (absolute) or `last_seen_ms + idle_ms` (idle) has passed. Times are
-- Unix milliseconds from the server's clock.

CREATE TABLE sessions (
    session_digest      BYTEA  PRIMARY KEY CHECK (octet_length(session_digest) = 32),
    subject_key         BYTEA  NOT NULL CHECK (octet_length(subject_key) = 32),
    tenant_id           TEXT   NOT NULL,
    client_id           TEXT   NOT NULL,
    protocol_version    TEXT   NOT NULL CHECK (protocol_version <> ''),
    client_capabilities TEXT   NOT NULL, -- JSON object
    client_info         TEXT,            -- JSON object
    log_level           TEXT,
    created_ms          BIGINT NOT NULL CHECK (created_ms >= 0),
    last_seen_ms        BIGINT NOT NULL CHECK (last_seen_ms >= created_ms),
    idle_ms             BIGINT NOT NULL CHECK (idle_ms > 0),
    expires_ms          BIGINT NOT NULL CHECK (expires_ms > created_ms)
);

CREATE INDEX sessions_expiry ON sessions (expires_ms);

CREATE TABLE session_subscriptions (
    session_digest BYTEA NOT NULL REFERENCES sessions (session_digest) ON DELETE CASCADE,
    uri            TEXT  NOT NULL CHECK (uri <> ''),
    PRIMARY KEY (session_digest, uri)
);
