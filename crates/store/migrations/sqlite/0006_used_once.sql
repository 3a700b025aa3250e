-- Single-use records (SQLite): a digest the server computes for one use (e.g. the SHA-256 of a
-- sealed confirmation state), claimed with INSERT ... ON CONFLICT DO NOTHING so that exactly one
-- claim succeeds. A row is kept until the retention job deletes it after `expires_ms` (Unix
-- milliseconds from the server's clock); until then the digest stays used, expired or not.

CREATE TABLE used_once (
    digest     BLOB    PRIMARY KEY CHECK (length(digest) = 32),
    expires_ms INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- The retention job.
CREATE INDEX used_once_expiry ON used_once (expires_ms);
