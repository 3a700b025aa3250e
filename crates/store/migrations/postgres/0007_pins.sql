-- Pins of a gateway's upstream definitions (PostgreSQL): per pin, the definition the upstream sent
-- when it was last observed (its SHA-256 `digest` over the canonical JSON `definition`) and the
-- latest reviewer decision, made on one digest (`decision_digest`) whose definition text is kept
-- beside it (`decided_definition`). A decision is written by one UPDATE that requires the current
-- digest to equal the digest the reviewer was shown. Times are Unix milliseconds. The listing
-- columns use the "C" collation so every instance (and the SQLite backend) sorts them by bytes.

CREATE TABLE pins (
    pin_id             TEXT COLLATE "C" PRIMARY KEY CHECK (octet_length(pin_id) BETWEEN 1 AND 64),
    upstream_id        TEXT COLLATE "C" NOT NULL CHECK (octet_length(upstream_id) BETWEEN 1 AND 63),
    upstream_url       TEXT   NOT NULL CHECK (upstream_url <> ''),
    kind               TEXT COLLATE "C" NOT NULL
                       CHECK (kind IN ('tool', 'prompt', 'resource', 'resource_template', 'instructions')),
    name               TEXT COLLATE "C" NOT NULL,
    digest             TEXT   NOT NULL CHECK (octet_length(digest) = 64),
    definition         TEXT   NOT NULL,
    first_seen_ms      BIGINT NOT NULL CHECK (first_seen_ms >= 0),
    seen_at_ms         BIGINT NOT NULL CHECK (seen_at_ms >= 0),
    verdict            TEXT   CHECK (verdict IN ('approved', 'rejected')),
    decision_digest    TEXT   CHECK (octet_length(decision_digest) = 64),
    reviewer           TEXT,
    note               TEXT,
    signature          TEXT,
    decided_at_ms      BIGINT,
    decided_definition TEXT,
    -- A decision is all of verdict, digest, reviewer, time and definition, or none of them.
    CHECK ((verdict IS NULL) = (decision_digest IS NULL)
       AND (verdict IS NULL) = (reviewer IS NULL)
       AND (verdict IS NULL) = (decided_at_ms IS NULL)
       AND (verdict IS NULL) = (decided_definition IS NULL))
);

-- The review listing, per upstream, in (upstream_id, kind, name) order.
CREATE INDEX pins_by_upstream ON pins (upstream_id, kind, name);
