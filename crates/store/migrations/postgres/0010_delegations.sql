-- The delegation ledger (PostgreSQL): one row per delegated capability, keyed by the SHA-256 of its
-- reference (the reference is never stored), with its parent (NULL for a root), the root of its
-- chain and its depth, the keyed digest of the principal it acts for, the holder agent, the body
-- (JSON object text, opaque to the store), the call budget granted (`calls`) and what is left of
-- it to spend or to reserve for children (`remaining`). A child is minted in one transaction that
-- locks the parent row (SELECT ... FOR UPDATE), checks it and moves the child's budget out of it;
-- a call is spent by one conditional UPDATE. No foreign key on `parent`: the retention job deletes
-- expired rows in bounded batches, and a chain whose ancestor is gone is refused by the server.
-- Times are Unix milliseconds from the server's clock.

CREATE TABLE delegations (
    digest        BYTEA   PRIMARY KEY CHECK (octet_length(digest) = 32),
    parent        BYTEA   CHECK (octet_length(parent) = 32),
    root          BYTEA   NOT NULL CHECK (octet_length(root) = 32),
    depth         INTEGER NOT NULL CHECK (depth BETWEEN 0 AND 16), -- MAX_DELEGATION_DEPTH
    principal_key BYTEA   NOT NULL CHECK (octet_length(principal_key) = 32),
    agent         TEXT    NOT NULL CHECK (agent <> ''),
    body          TEXT    NOT NULL,
    expires_ms    BIGINT  NOT NULL CHECK (expires_ms > created_ms),
    calls         BIGINT  NOT NULL CHECK (calls >= 0),
    remaining     BIGINT  NOT NULL CHECK (remaining >= 0 AND remaining <= calls),
    created_ms    BIGINT  NOT NULL CHECK (created_ms >= 0),
    revoked_ms    BIGINT,
    -- A root is its own root at depth 0; a child has a parent and a depth of at least 1.
    CHECK ((parent IS NULL) = (depth = 0)),
    CHECK (parent IS NOT NULL OR root = digest)
);

-- A principal's delegations, newest first.
CREATE INDEX delegations_principal ON delegations (principal_key, created_ms);
-- The children of a delegation.
CREATE INDEX delegations_parent ON delegations (parent);
-- The retention job.
CREATE INDEX delegations_expiry ON delegations (expires_ms);

-- Single-use approvals: recorded with INSERT ... ON CONFLICT DO NOTHING, taken by one DELETE whose
-- row count says whether this caller took it, so an approval is taken at most once, whichever
-- instance takes it.
CREATE TABLE delegation_approvals (
    key        BYTEA  PRIMARY KEY CHECK (octet_length(key) = 32),
    expires_ms BIGINT NOT NULL
);

-- The retention job.
CREATE INDEX delegation_approvals_expiry ON delegation_approvals (expires_ms);

-- Per-tool call budgets of a capability (optional): a counter per (capability, tool name). A
-- child's counter for a tool its parent counts is reserved from the parent's in the mint's
-- transaction; a call spends the capability's counter and its overall budget together.
CREATE TABLE delegation_tool_budgets (
    digest    BYTEA    NOT NULL CHECK (octet_length(digest) = 32),
    tool      TEXT    NOT NULL CHECK (length(tool) BETWEEN 1 AND 256),
    calls     BIGINT NOT NULL CHECK (calls >= 0),
    remaining BIGINT NOT NULL CHECK (remaining >= 0 AND remaining <= calls),
    PRIMARY KEY (digest, tool)
);
