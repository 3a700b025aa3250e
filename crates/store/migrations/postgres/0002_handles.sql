-- Explicit application handles (PostgreSQL). Only the handle's SHA-256 is stored; the owner is a
-- keyed subject digest plus tenant and client. Times are Unix milliseconds from the server's clock
-- (one clock for expiry on every backend, and testable at the exact edge).

CREATE TABLE handles (
    handle_digest      BYTEA   PRIMARY KEY CHECK (octet_length(handle_digest) = 32),
    subject_key        BYTEA   NOT NULL CHECK (octet_length(subject_key) = 32),
    tenant_id          TEXT    NOT NULL CHECK (tenant_id <> ''),
    client_id          TEXT    NOT NULL CHECK (client_id <> ''),
    object_type        TEXT    NOT NULL CHECK (object_type <> ''),
    object_ref         TEXT    NOT NULL CHECK (object_ref <> ''),
    object_version     TEXT    NOT NULL CHECK (object_version <> ''),
    scopes             TEXT    NOT NULL CHECK (scopes <> ''), -- sorted, unique, space-separated
    policy_version     BIGINT  NOT NULL CHECK (policy_version > 0),
    created_ms         BIGINT  NOT NULL CHECK (created_ms >= 0),
    expires_ms         BIGINT  NOT NULL CHECK (expires_ms > created_ms),
    revoked_ms         BIGINT,
    revocation_reason  TEXT,
    revocation_receipt TEXT,
    CHECK ((revoked_ms IS NULL) = (revocation_reason IS NULL))
);

CREATE INDEX handles_owner ON handles (subject_key, tenant_id, client_id);
CREATE INDEX handles_tenant ON handles (tenant_id);
CREATE INDEX handles_client ON handles (client_id);
CREATE INDEX handles_object ON handles (tenant_id, object_type, object_ref);
CREATE INDEX handles_policy ON handles (object_type, policy_version);
CREATE INDEX handles_expiry ON handles (expires_ms);
