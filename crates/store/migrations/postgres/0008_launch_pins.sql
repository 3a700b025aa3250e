-- A stdio upstream's launch (its exact command, arguments, grants, limits and the executable's
-- digest) is pinned and reviewed like a definition: the `launch` kind.

ALTER TABLE pins DROP CONSTRAINT pins_kind_check;
ALTER TABLE pins ADD CONSTRAINT pins_kind_check
    CHECK (kind IN ('tool', 'prompt', 'resource', 'resource_template', 'instructions', 'launch'));
