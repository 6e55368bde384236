-- name: ring window: ring_window() in PL/pgSQL, so a session plans its query once
--
-- Issue 11 (worker start, the leader's reads). ring_window() (migration 13) was a LANGUAGE sql
-- function with a SET clause, which PostgreSQL never inlines and, for a SQL function, plans
-- again on every call: its query probes the 16 `ready` partitions by name, and each call
-- planned all 16 probes. A call took 0.42 ms warm against 0.09 ms for the same query in
-- PL/pgSQL, whose plan a session keeps (pgbench -M prepared, one client, stock PostgreSQL 15
-- cluster on the 2-core development machine); a worker reads it at start, after every poll
-- tick and after every stale claim, and the leader every second. Same signature, same result,
-- same privileges (CREATE OR REPLACE keeps them): a worker of either version reads it alike.
-- The query is migration 13's, word for word: a shipped migration is never edited.

DO $do$
BEGIN
  EXECUTE format(
    'CREATE OR REPLACE FUNCTION %1$I.ring_window() RETURNS TABLE (generation bigint, current_slot smallint, slot_count smallint, rotated_at timestamptz, filled smallint[]) '
    'LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$ BEGIN RETURN QUERY '
    'SELECT rs.generation, rs.current_slot, rs.slot_count, rs.rotated_at, '
    '       ARRAY(SELECT (f.o - 1)::smallint FROM unnest(ARRAY[%2$s]) WITH ORDINALITY AS f(filled, o) '
    '              WHERE f.filled ORDER BY f.o) '
    '  FROM %1$I.ring_state rs; END $fn$',
    {{schema_literal}},
    (SELECT string_agg(format('EXISTS (SELECT 1 FROM %I.%I)', {{schema_literal}}, 'ready_' || g), ', ' ORDER BY g)
       FROM generate_series(0, 15) AS g));
END $do$;
-- Kept by CREATE OR REPLACE; said again so the function is never executable by PUBLIC.
REVOKE EXECUTE ON FUNCTION {{schema}}.ring_window() FROM PUBLIC;
