-- One hash chain per writer (an instance's segment, or a store handle's own chain), and signed
-- checkpoints over every chain's head. Records are keyed by (chain_id, seq); each chain's head
-- row is written only by that chain's one writer, so no row, lock or sequence is shared between
-- writers. The records of the single global chain before this migration become the chain
-- '00000000000000000000000000000000' (their hashes are unchanged: the chain id is not hashed).

CREATE TABLE audit_log_chained (
    chain_id         TEXT    NOT NULL CHECK (length(chain_id) = 32),
    seq              INTEGER NOT NULL CHECK (seq > 0),
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
    hash             BLOB    NOT NULL CHECK (length(hash) = 32),
    PRIMARY KEY (chain_id, seq)
) STRICT, WITHOUT ROWID;

INSERT INTO audit_log_chained
    SELECT '00000000000000000000000000000000', seq, at_ms, trace_id, stage, decision, operation, principal_digest,
           tenant_digest, client_digest, scopes, policy_version, code, detail, prev_hash, hash
    FROM audit_log;

-- Each chain's head: the newest record's seq and hash (verify notices a deleted tail by it), and
-- the head as of the latest checkpoint that included a change of the chain.
CREATE TABLE audit_chains (
    chain_id         TEXT    PRIMARY KEY CHECK (length(chain_id) = 32),
    head_seq         INTEGER NOT NULL CHECK (head_seq > 0),
    head_hash        BLOB    NOT NULL CHECK (length(head_hash) = 32),
    checkpointed_seq INTEGER NOT NULL DEFAULT 0 CHECK (checkpointed_seq >= 0)
) STRICT;

INSERT INTO audit_chains (chain_id, head_seq, head_hash)
    SELECT '00000000000000000000000000000000', last_seq, last_hash FROM audit_chain_head WHERE last_seq > 0;

DROP TABLE audit_log;
DROP TABLE audit_chain_head;
ALTER TABLE audit_log_chained RENAME TO audit_log;

-- `palisade audit tail` and `recent` read the newest records across chains.
CREATE INDEX audit_log_at_ms ON audit_log (at_ms);

-- Signed checkpoints: `body` is the signed canonical JSON (seq, time, chain and record counts,
-- the Merkle root over every chain's head, the previous checkpoint's hash, the key id);
-- `delta` the heads that changed since the previous checkpoint (JSON), from which a verifier
-- rebuilds the leaves and recomputes the root.
CREATE TABLE audit_checkpoints (
    seq       INTEGER PRIMARY KEY CHECK (seq > 0),
    at_ms     INTEGER NOT NULL CHECK (at_ms >= 0),
    body      TEXT    NOT NULL,
    signature BLOB    NOT NULL CHECK (length(signature) = 64),
    delta     TEXT    NOT NULL
) STRICT;

-- Who signs the next checkpoints: a lease any instance takes over once it has run out.
CREATE TABLE audit_checkpointer (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    holder   TEXT    NOT NULL,
    until_ms INTEGER NOT NULL
) STRICT;

INSERT INTO audit_checkpointer (id, holder, until_ms) VALUES (1, '', 0);
