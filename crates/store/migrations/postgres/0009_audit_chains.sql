-- One hash chain per writer (an instance's segment, or a store handle's own chain), and signed
-- checkpoints over every chain's head. Records are keyed by (chain_id, seq); each chain's head
-- row is written only by that chain's one writer, so no row, lock or sequence is shared between
-- writers. The records of the single global chain before this migration become the chain
-- '00000000000000000000000000000000' (their hashes are unchanged: the chain id is not hashed).

ALTER TABLE audit_log ADD COLUMN chain_id TEXT NOT NULL DEFAULT '00000000000000000000000000000000'
    CHECK (length(chain_id) = 32);
ALTER TABLE audit_log ALTER COLUMN chain_id DROP DEFAULT;
ALTER TABLE audit_log DROP CONSTRAINT audit_log_pkey;
ALTER TABLE audit_log ADD PRIMARY KEY (chain_id, seq);

-- Each chain's head: the newest record's seq and hash (verify notices a deleted tail by it), and
-- the head as of the latest checkpoint that included a change of the chain.
CREATE TABLE audit_chains (
    chain_id         TEXT   PRIMARY KEY CHECK (length(chain_id) = 32),
    head_seq         BIGINT NOT NULL CHECK (head_seq > 0),
    head_hash        BYTEA  NOT NULL CHECK (octet_length(head_hash) = 32),
    checkpointed_seq BIGINT NOT NULL DEFAULT 0 CHECK (checkpointed_seq >= 0)
);

INSERT INTO audit_chains (chain_id, head_seq, head_hash)
    SELECT '00000000000000000000000000000000', last_seq, last_hash FROM audit_chain_head WHERE last_seq > 0;

DROP TABLE audit_chain_head;

-- `palisade audit tail` and `recent` read the newest records across chains.
CREATE INDEX audit_log_at_ms ON audit_log (at_ms);

-- Signed checkpoints: `body` is the signed canonical JSON (seq, time, chain and record counts,
-- the Merkle root over every chain's head, the previous checkpoint's hash, the key id);
-- `delta` the heads that changed since the previous checkpoint (JSON), from which a verifier
-- rebuilds the leaves and recomputes the root.
CREATE TABLE audit_checkpoints (
    seq       BIGINT PRIMARY KEY CHECK (seq > 0),
    at_ms     BIGINT NOT NULL CHECK (at_ms >= 0),
    body      TEXT   NOT NULL,
    signature BYTEA  NOT NULL CHECK (octet_length(signature) = 64),
    delta     TEXT   NOT NULL
);

-- Who signs the next checkpoints: a lease any instance takes over once it has run out.
CREATE TABLE audit_checkpointer (
    id       SMALLINT PRIMARY KEY CHECK (id = 1),
    holder   TEXT     NOT NULL,
    until_ms BIGINT   NOT NULL
);

INSERT INTO audit_checkpointer (id, holder, until_ms) VALUES (1, '', 0);
