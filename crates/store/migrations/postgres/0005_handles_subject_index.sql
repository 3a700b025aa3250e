-- The owner index (subject_key, tenant_id, client_id) matched every owner column of the
-- owner-bound lookup, so on a table without planner statistics (a fresh or freshly grown one,
-- before autovacuum's analyze) PostgreSQL could answer the lookup through it, reading all of an
-- owner's handles and filtering on the digest, instead of one primary-key probe. The subject's
-- listing (newest first) is what needs a subject index; revocations by subject use it too.
-- Migrations run in a transaction, so the index is built without CONCURRENTLY: on a large
-- handles table, handle writes wait while it builds.
DROP INDEX handles_owner;
CREATE INDEX handles_subject ON handles (subject_key, created_ms DESC);
