-- name: task results: the value a handler returned, stored with its accepted completion, kept by its own retention
--
-- A handler that returns a value other than one of berth's answers ('done', 'continue', a
-- snooze, nothing) succeeds, and the value (as JSON, within the worker's `resultMaxBytes`) is
-- its result. It is written by the completion statement that settles the task, in the same
-- statement, only from the entries whose completion row won the fence: a refused or lost
-- completion stores nothing, and a stored result always belongs to the accepted completion.
-- A completion that carries no result sends the same statement as before this migration.
--
-- Keyed by task id (a later feature hands a parent's result to its dependents by the parent's
-- id), not partitioned with attempt history: a result must stay readable while a dependent
-- waits, whatever attempt history's retention. The maintenance leader deletes rows older than
-- its `resultRetentionMs` (7 days by default) through `stored_at`'s index.
-- `attempt`: the attempt whose completion stored it.

CREATE TABLE {{schema}}.task_results (
  id bigint PRIMARY KEY,
  attempt integer NOT NULL,
  result jsonb NOT NULL,
  stored_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON {{schema}}.task_results (stored_at);
