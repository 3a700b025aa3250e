-- Per-user OAuth connections to upstream servers (SQLite). A connection is one principal's grant
-- at one upstream: keyed by the keyed digest of the principal and the upstream id, with a display
-- label of the principal for operators, the upstream's authorization server (issuer), Palisade's
-- client id there, the granted scopes and the tokens as one AEAD ciphertext the server sealed
-- (`sealed`; the store never sees a token in clear). `version` starts at 1 and goes up by one with
-- every write; a refresh replaces the row only if it still has the version the refresher read (one
-- conditional UPDATE), so a rotated refresh token is stored by exactly one writer. Times are Unix
-- milliseconds from the server's clock; `expires_ms` is when the connection stops being usable
-- without a refresh (NULL: unknown). A rowid table: a sealed value may be far larger than the rows
-- WITHOUT ROWID suits.

CREATE TABLE oauth_connections (
    principal_key BLOB    NOT NULL CHECK (length(principal_key) = 32),
    upstream      TEXT    NOT NULL CHECK (length(CAST(upstream AS BLOB)) BETWEEN 1 AND 128),
    principal     TEXT    NOT NULL CHECK (length(CAST(principal AS BLOB)) <= 1024),
    issuer        TEXT    NOT NULL CHECK (length(CAST(issuer AS BLOB)) BETWEEN 1 AND 1024),
    client_id     TEXT    NOT NULL CHECK (length(CAST(client_id AS BLOB)) BETWEEN 1 AND 1024),
    scopes        TEXT    NOT NULL CHECK (length(CAST(scopes AS BLOB)) <= 4096),
    sealed        BLOB    NOT NULL CHECK (length(sealed) BETWEEN 1 AND 65536),
    version       INTEGER NOT NULL CHECK (version >= 1),
    created_ms    INTEGER NOT NULL CHECK (created_ms >= 0),
    updated_ms    INTEGER NOT NULL CHECK (updated_ms >= 0),
    expires_ms    INTEGER CHECK (expires_ms >= 0),
    PRIMARY KEY (principal_key, upstream)
) STRICT;

-- Every connection, newest first.
CREATE INDEX oauth_connections_created ON oauth_connections (created_ms);

-- The MCP clients a principal approved for an upstream (consent: approved once, until revoked).
CREATE TABLE oauth_client_approvals (
    principal_key BLOB    NOT NULL CHECK (length(principal_key) = 32),
    upstream      TEXT    NOT NULL CHECK (length(CAST(upstream AS BLOB)) BETWEEN 1 AND 128),
    client_id     TEXT    NOT NULL CHECK (length(CAST(client_id AS BLOB)) BETWEEN 1 AND 1024),
    approved_ms   INTEGER NOT NULL CHECK (approved_ms >= 0),
    PRIMARY KEY (principal_key, upstream, client_id)
) STRICT, WITHOUT ROWID;

-- Every approval, newest first.
CREATE INDEX oauth_client_approvals_approved ON oauth_client_approvals (approved_ms);

-- Pending browser flows (connect links, sign-in state, an authorization request's `state`): keyed
-- by the SHA-256 of the flow's id (the id is never stored), of one kind, with an opaque JSON body
-- and an expiry. Inserted once (an existing digest is never overwritten) and consumed by one
-- DELETE ... RETURNING, so a flow is taken at most once.
CREATE TABLE oauth_flows (
    id_digest  BLOB    PRIMARY KEY CHECK (length(id_digest) = 32),
    kind       TEXT    NOT NULL CHECK (length(CAST(kind AS BLOB)) BETWEEN 1 AND 32),
    body       TEXT    NOT NULL CHECK (body <> ''),
    expires_ms INTEGER NOT NULL
) STRICT;

-- The retention job.
CREATE INDEX oauth_flows_expiry ON oauth_flows (expires_ms);

-- Palisade's own registration at an authorization server (the Dynamic Client Registration
-- response, opaque JSON text), per issuer and redirect URI.
CREATE TABLE oauth_clients (
    issuer        TEXT    NOT NULL CHECK (length(CAST(issuer AS BLOB)) BETWEEN 1 AND 1024),
    redirect_uri  TEXT    NOT NULL CHECK (length(CAST(redirect_uri AS BLOB)) BETWEEN 1 AND 1024),
    body          TEXT    NOT NULL CHECK (body <> ''),
    registered_ms INTEGER NOT NULL CHECK (registered_ms >= 0),
    PRIMARY KEY (issuer, redirect_uri)
) STRICT;
