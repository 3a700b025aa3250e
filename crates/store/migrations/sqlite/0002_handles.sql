-- Explicit application handles (SQLite). Only the handle's SHA-256 is stored; the owner is a keyed
-- subject digest plus tenant and client. Times are Unix milliseconds from the server's clock.

CREATE TABLE handles (
    handle_digest      BLOB    PRIMARY KEY CHECK (length(handle_digest) = 32),
    subject_key        BLOB    NOT NULL CHECK (length(subject_key) = 32),
    tenant_id          TEXT    NOT NULL CHECK (tenant_id <> ''),
    client_id          TEXT    NOT NULL CHECK (client_id <> ''),
    object_type        TEXT    NOT NULL CHECK (object_type <> ''),
    object_ref         TEXT    NOT NULL CHECK (object_ref <> ''),
    object_version     TEXT    NOT NULL CHECK (object_version <> ''),
    scopes             TEXT    NOT NULL CHECK (scopes <> ''), -- sorted, unique, space-separated
    policy_version     INTEGER NOT NULL CHECK (policy_version > 0),
    created_ms         INTEGER NOT NULL CHECK (created_ms >= 0),
    expires_ms         INTEGER NOT NULL CHECK (expires_ms > created_ms),
    revoked_ms         INTEGER,
    revocation_reason  TEXT,
    revocation_receipt TEXT,
    CHECK ((revoked_ms IS NULL) = (revocation_reason IS NULL))
) WITHOUT ROWID;

-- Owner listing and bulk revocation by subject / tenant / client.
CREATE INDEX handles_owner ON handles (subject_key, tenant_id, client_id);
CREATE INDEX handles_tenant ON handles (tenant_id);
CREATE INDEX handles_client ON handles (client_id);
-- Revocation when an object is deleted, and by policy version.
CREATE INDEX handles_object ON handles (tenant_id, object_type, object_ref);
CREATE INDEX handles_policy ON handles (object_type, policy_version);
-- The retention job.
CREATE INDEX handles_expiry ON handles (expires_ms);
