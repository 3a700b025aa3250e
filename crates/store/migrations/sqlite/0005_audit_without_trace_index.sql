-- The embedded store drops the trace-id index of the audit log. Trace ids are random, so every
-- appended record dirtied a different index page: with small group-commit batches that was most
-- of the pages each commit wrote to the WAL (and later checkpointed), on the request path of
-- every call. Nothing in Palisade looks records up by trace id; an operator's ad-hoc query by
-- trace id scans the table (or can create the index on a copy). PostgreSQL keeps its index.
DROP INDEX IF EXISTS audit_log_trace_id;
