-- A stdio upstream's launch (its exact command, arguments, grants, limits and the executable's
-- digest) is pinned and reviewed like a definition: the `launch` kind. SQLite cannot alter a
-- CHECK constraint, so the table is rebuilt with the same columns and every row copied.

CREATE TABLE pins_v8 (
    pin_id             TEXT    PRIMARY KEY CHECK (length(pin_id) BETWEEN 1 AND 64),
    upstream_id        TEXT    NOT NULL CHECK (length(upstream_id) BETWEEN 1 AND 63),
    upstream_url       TEXT    NOT NULL CHECK (upstream_url <> ''),
    kind               TEXT    NOT NULL
                       CHECK (kind IN ('tool', 'prompt', 'resource', 'resource_template', 'instructions', 'launch')),
    name               TEXT    NOT NULL,
    digest             TEXT    NOT NULL CHECK (length(digest) = 64),
    definition         TEXT    NOT NULL,
    first_seen_ms      INTEGER NOT NULL CHECK (first_seen_ms >= 0),
    seen_at_ms         INTEGER NOT NULL CHECK (seen_at_ms >= 0),
    verdict            TEXT    CHECK (verdict IN ('approved', 'rejected')),
    decision_digest    TEXT    CHECK (length(decision_digest) = 64),
    reviewer           TEXT,
    note               TEXT,
    signature          TEXT,
    decided_at_ms      INTEGER,
    decided_definition TEXT,
    -- A decision is all of verdict, digest, reviewer, time and definition, or none of them.
    CHECK ((verdict IS NULL) = (decision_digest IS NULL)
       AND (verdict IS NULL) = (reviewer IS NULL)
       AND (verdict IS NULL) = (decided_at_ms IS NULL)
       AND (verdict IS NULL) = (decided_definition IS NULL))
) STRICT, WITHOUT ROWID;

INSERT INTO pins_v8 SELECT * FROM pins;
DROP TABLE pins;
ALTER TABLE pins_v8 RENAME TO pins;
CREATE INDEX pins_by_upstream ON pins (upstream_id, kind, name);
