-- name: add_task and add_tasks: a stable, documented SQL door to enqueue, through enqueue() itself
--
-- Until now the only way into the queue from SQL was enqueue(), an internal array-form function
-- shaped for the client's bulk path (one lane per call, parallel arrays, a trace context) whose
-- signature changes when the client's needs do. Users enqueue from triggers, psql, other
-- languages and ORMs, and need what graphile-worker's add_job is: named, defaulted parameters.
--
-- add_task(type, payload, queue, run_at, priority, dedupe_key, max_attempts, delay, shard, shards)
-- returns the new task's id, or NULL when the dedupe key is held by a live task (the client's
-- enqueue answers `id: null, state: 'duplicate'` then). add_tasks(tasks jsonb) takes a JSON array
-- of objects with the same keys and returns one row per task in input order (ord from 1, id,
-- state ready/scheduled/duplicate, duplicate_of): the client's EnqueueResult as rows. A JSON
-- array, not parallel SQL arrays: every client and ORM can bind one JSON value, a task's optional
-- keys are simply left out, and a mistyped key is caught (parallel arrays fail silently on a
-- length mismatch or a swapped column).
--
-- NULL (or a JSON null, or a missing key) means the default for every optional parameter, as in
-- add_job, so a positional call can skip one; type and payload must not be NULL. priority,
-- max_attempts, shard and shards are integer, not smallint: an integer literal (`priority => 5`)
-- does not resolve to a smallint parameter, and an out-of-range value gets a 22023 naming it
-- instead of a raw 22003. delay is an interval measured on the database clock; run_at wins when
-- both are given, as in the client.
--
-- Both go through add_task_rows(), which checks what enqueue() takes as smallint (priority, shard,
-- shards) and the delay, resolves a default shard per transaction as the client does, groups the
-- tasks by lane, and calls enqueue() once per lane in the client's lock order (the JSON text of
-- [queue, priority, shard, 0] compared by UTF-16 code unit, as JavaScript sorts it), so a SQL
-- batch and a client batch that share lanes take their lane locks in the same order. enqueue() then applies every check and keeps
-- every storage invariant as for the client: check_tasks, dedupe, the lane lock and lane_seq
-- order, the ring epoch's segment for a task due now, deferred storage for a later one, and the
-- NOTIFY on the wake channel that append_ready sends (delivered when the caller commits).
--
-- add_task and add_tasks are definer functions, granted below to every role that may run
-- enqueue() (and by src/schema/roles.ts to producers and workers from now on); add_task_rows is
-- called only from them, as the owner, and granted to no one.

CREATE FUNCTION {{schema}}.add_task_rows(
  p_fn text, p_types text[], p_payloads jsonb[], p_queues text[], p_run_at timestamptz[], p_priorities integer[],
  p_dedupe text[], p_max_attempts integer[], p_delays interval[], p_shard integer[], p_shards integer[])
RETURNS TABLE (ord integer, id bigint, state text, duplicate_of bigint)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  x record;
  g record;
  v_queues text[];
  v_priorities integer[];
  v_shard integer[];
  v_run_at timestamptz[];
  v_ids bigint[];
  v_states text[];
  v_dups bigint[];
BEGIN
  -- What enqueue() takes as smallint, and the delay, checked before any cast could fail with a
  -- raw 22003 or 22008. NULL is the default.
  SELECT u.o, u.q, u.pr, u.sh, u.shs, u.d INTO x
    FROM unnest(p_queues, p_priorities, p_shard, p_shards, p_delays) WITH ORDINALITY AS u(q, pr, sh, shs, d, o)
   WHERE octet_length(u.q) > 255 OR u.pr NOT BETWEEN -32768 AND 32767 OR u.sh NOT BETWEEN 0 AND 63
      OR u.shs NOT BETWEEN 1 AND 64 OR u.d < interval '0' OR u.d > interval '10000 years'
   ORDER BY u.o LIMIT 1;
  IF FOUND THEN
    IF octet_length(x.q) > 255 THEN
      RAISE EXCEPTION 'berth: %: task #%: queue must be at most 255 UTF-8 bytes (got %)', p_fn, x.o, octet_length(x.q)
        USING ERRCODE = '22023';
    ELSIF x.pr NOT BETWEEN -32768 AND 32767 THEN
      RAISE EXCEPTION 'berth: %: task #%: priority must be an integer from -32768 to 32767 (got %)', p_fn, x.o, x.pr
        USING ERRCODE = '22023';
    ELSIF x.sh NOT BETWEEN 0 AND 63 THEN
      RAISE EXCEPTION 'berth: %: task #%: shard must be an integer from 0 to 63 (got %)', p_fn, x.o, x.sh
        USING ERRCODE = '22023';
    ELSIF x.shs NOT BETWEEN 1 AND 64 THEN
      RAISE EXCEPTION 'berth: %: task #%: shards must be an integer from 1 to 64 (got %)', p_fn, x.o, x.shs
        USING ERRCODE = '22023';
    ELSE
      RAISE EXCEPTION 'berth: %: task #%: delay must be an interval from 0 to 10000 years (got %)', p_fn, x.o, x.d
        USING ERRCODE = '22023';
    END IF;
  END IF;
  v_queues := ARRAY(SELECT coalesce(u.q, 'default') FROM unnest(p_queues) WITH ORDINALITY AS u(q, o) ORDER BY u.o);
  v_priorities := ARRAY(SELECT coalesce(u.pr, 0) FROM unnest(p_priorities) WITH ORDINALITY AS u(pr, o) ORDER BY u.o);
  -- run_at wins over delay, as in the client; the delay is added to the database's clock.
  v_run_at := ARRAY(SELECT coalesce(u.r, now() + u.d)
                      FROM unnest(p_run_at, p_delays) WITH ORDINALITY AS u(r, d, o) ORDER BY u.o);
  -- Checked here too (enqueue() checks again per lane) so a bad task is named by its place in
  -- the whole call, not in its lane's share of it.
  PERFORM {{schema}}.check_tasks(p_fn, p_types, p_payloads, v_run_at, p_max_attempts, p_dedupe, NULL);
  -- A type's 200 characters are JavaScript's: UTF-16 code units, as enqueue and defineTask count
  -- them, so a character above U+FFFF counts twice. check_tasks counts code points, and passed a
  -- type of 150 emoji that no worker could define: the task would wait for ever.
  SELECT u.o, char_length(u.t) + char_length(regexp_replace(u.t, '[^\U00010000-\U0010FFFF]', '', 'g')) AS n INTO x
    FROM unnest(p_types) WITH ORDINALITY AS u(t, o)
   WHERE octet_length(u.t) > 200
     AND char_length(u.t) + char_length(regexp_replace(u.t, '[^\U00010000-\U0010FFFF]', '', 'g')) > 200
   ORDER BY u.o LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'berth: %: task #%: type must be a non-empty string of at most 200 characters, counted as UTF-16 code units as JavaScript counts them (got %)',
      p_fn, x.o, x.n USING ERRCODE = '22023';
  END IF;
  -- The client's default shard: the transaction id modulo the shard count, one lane per
  -- transaction and queue/priority.
  v_shard := ARRAY(SELECT coalesce(u.sh, (txid_current() % coalesce(u.shs, 16))::integer)
                     FROM unnest(p_shard, p_shards) WITH ORDINALITY AS u(sh, shs, o) ORDER BY u.o);
  -- One enqueue() per lane, in the client's lock order (src/producer/enqueue.ts, `groupKey`:
  -- JSON.stringify([queue, priority, shard, 0]) sorted; to_json escapes as JSON.stringify does).
  -- JavaScript sorts strings by UTF-16 code unit, so the key is compared as its code units: by
  -- code point (COLLATE "C") a queue with a character above U+FFFF sorts after one with a
  -- character in U+E000-U+FFFF, by code unit before it, and a SQL batch and a client batch over
  -- two such lanes deadlocked (40P01).
  -- Each lane's columns are aggregated in the one pass that groups them: taking them out of the
  -- whole call's arrays by subscript walked a text or jsonb array from its start for every task,
  -- which made a call quadratic (80,000 tasks took 38 s, 20,000 took 2.4 s).
  FOR g IN
    SELECT u.q, u.pr, u.sh, array_agg(u.o::integer ORDER BY u.o) AS ords, array_agg(u.t ORDER BY u.o) AS types,
           array_agg(u.p ORDER BY u.o) AS payloads, array_agg(u.r ORDER BY u.o) AS run_at,
           array_agg(u.m ORDER BY u.o) AS max_attempts, array_agg(u.k ORDER BY u.o) AS dedupe
      FROM unnest(v_queues, v_priorities, v_shard, p_types, p_payloads, v_run_at, p_max_attempts, p_dedupe)
           WITH ORDINALITY AS u(q, pr, sh, t, p, r, m, k, o)
     GROUP BY u.q, u.pr, u.sh
     ORDER BY ARRAY(SELECT w.unit
                      FROM regexp_split_to_table('[' || to_json(u.q)::text || ',' || u.pr || ',' || u.sh || ',0]', '')
                           WITH ORDINALITY AS c(ch, i),
                           unnest(CASE WHEN ascii(c.ch) > 65535
                                       THEN ARRAY[55296 + ((ascii(c.ch) - 65536) >> 10), 56320 + ((ascii(c.ch) - 65536) & 1023)]
                                       ELSE ARRAY[ascii(c.ch)] END) WITH ORDINALITY AS w(unit, j)
                     ORDER BY c.i, w.j)
  LOOP
    SELECT array_agg(e.id ORDER BY e.ord), array_agg(e.state ORDER BY e.ord), array_agg(e.duplicate_of ORDER BY e.ord)
      INTO v_ids, v_states, v_dups
      FROM {{schema}}.enqueue(g.q, g.pr::smallint, g.sh::smallint, NULL, g.types, g.payloads, g.run_at,
                              g.max_attempts, g.dedupe, NULL) AS e;
    -- A duplicate of a key taken earlier in the same enqueue() call has no duplicate_of there (its
    -- dedupe row was written by the same statement); it is visible now. The rows go out lane by
    -- lane: the callers put them in input order.
    RETURN QUERY
    SELECT u.o, u.i, u.s,
           coalesce(u.d, CASE WHEN u.s = 'duplicate'
                              THEN (SELECT dd.id FROM {{schema}}.dedupe dd WHERE dd.dedupe_key = u.k) END)
      FROM unnest(g.ords, v_ids, v_states, v_dups, g.dedupe) AS u(o, i, s, d, k);
  END LOOP;
END $fn$;

CREATE FUNCTION {{schema}}.add_task(
  type text, payload jsonb DEFAULT '{}', queue text DEFAULT 'default', run_at timestamptz DEFAULT NULL,
  priority integer DEFAULT 0, dedupe_key text DEFAULT NULL, max_attempts integer DEFAULT NULL,
  delay interval DEFAULT NULL, shard integer DEFAULT NULL, shards integer DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  -- Positional references: the parameters' names are the public ones, and would shadow columns.
  RETURN (SELECT r.id FROM {{schema}}.add_task_rows('add_task', ARRAY[$1], ARRAY[$2], ARRAY[$3], ARRAY[$4],
                                                     ARRAY[$5], ARRAY[$6], ARRAY[$7], ARRAY[$8], ARRAY[$9],
                                                     ARRAY[$10]) AS r);
END $fn$;

CREATE FUNCTION {{schema}}.add_tasks(tasks jsonb)
RETURNS TABLE (ord integer, id bigint, state text, duplicate_of bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_keys CONSTANT text[] := ARRAY['type', 'payload', 'queue', 'run_at', 'priority', 'dedupe_key', 'max_attempts',
                                  'delay', 'shard', 'shards'];
  v_integers CONSTANT text[] := ARRAY['priority', 'max_attempts', 'shard', 'shards'];
  v_run_at timestamptz[];
  v_delays interval[];
  v_near text;
  x record;
BEGIN
  IF jsonb_typeof($1) IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION 'berth: add_tasks: tasks must be a JSON array of task objects (got %)',
      coalesce(jsonb_typeof($1), 'NULL') USING ERRCODE = '22023';
  END IF;
  -- The first task that is not an object, or the first key of it that is unknown or of the
  -- wrong JSON type (a JSON null is the default, as a missing key; payload may be any JSON).
  SELECT e.o, jsonb_typeof(e.t) AS kind, k.key, k.value INTO x
    FROM jsonb_array_elements($1) WITH ORDINALITY AS e(t, o)
    LEFT JOIN LATERAL (
      SELECT f.key, f.value FROM jsonb_each(CASE WHEN jsonb_typeof(e.t) = 'object' THEN e.t ELSE '{}' END) AS f
       WHERE f.key <> ALL (v_keys)
          OR (f.key <> 'payload' AND jsonb_typeof(f.value) <> 'null' AND
              CASE WHEN f.key <> ALL (v_integers) THEN jsonb_typeof(f.value) <> 'string'
                   WHEN jsonb_typeof(f.value) <> 'number' THEN true
                   ELSE (f.value::numeric <> trunc(f.value::numeric) OR abs(f.value::numeric) > 2147483647) END)
       ORDER BY f.key LIMIT 1) AS k ON true
   WHERE jsonb_typeof(e.t) <> 'object' OR k.key IS NOT NULL
   ORDER BY e.o LIMIT 1;
  IF FOUND THEN
    IF x.kind <> 'object' THEN
      RAISE EXCEPTION 'berth: add_tasks: task #%: must be a JSON object (got %)', x.o, x.kind USING ERRCODE = '22023';
    ELSIF x.key <> ALL (v_keys) THEN
      -- runAt for run_at: the client's spelling of a key.
      v_near := lower(regexp_replace(x.key, '([A-Z])', '_\1', 'g'));
      RAISE EXCEPTION 'berth: add_tasks: task #%: unknown key "%"%', x.o, x.key,
        CASE WHEN v_near = ANY (v_keys) THEN format('; did you mean "%s"?', v_near) ELSE '' END
        USING ERRCODE = '22023', HINT = 'keys: ' || array_to_string(v_keys, ', ');
    ELSIF x.key = ANY (v_integers) THEN
      RAISE EXCEPTION 'berth: add_tasks: task #%: % must be an integer (got %)', x.o, x.key, x.value
        USING ERRCODE = '22023';
    ELSE
      RAISE EXCEPTION 'berth: add_tasks: task #%: % must be a string (got %)', x.o, x.key, jsonb_typeof(x.value)
        USING ERRCODE = '22023';
    END IF;
  END IF;
  BEGIN
    SELECT array_agg((e.t ->> 'run_at')::timestamptz ORDER BY e.o), array_agg((e.t ->> 'delay')::interval ORDER BY e.o)
      INTO v_run_at, v_delays
      FROM jsonb_array_elements($1) WITH ORDINALITY AS e(t, o);
  EXCEPTION WHEN data_exception THEN
    RAISE EXCEPTION 'berth: add_tasks: run_at must be a timestamp and delay an interval: %', SQLERRM
      USING ERRCODE = '22023';
  END;
  RETURN QUERY
  SELECT r.ord, r.id, r.state, r.duplicate_of
    FROM {{schema}}.add_task_rows('add_tasks',
           ARRAY(SELECT e.t ->> 'type' FROM jsonb_array_elements($1) WITH ORDINALITY AS e(t, o) ORDER BY e.o),
           ARRAY(SELECT coalesce(e.t -> 'payload', '{}') FROM jsonb_array_elements($1) WITH ORDINALITY AS e(t, o) ORDER BY e.o),
           ARRAY(SELECT e.t ->> 'queue' FROM jsonb_array_elements($1) WITH ORDINALITY AS e(t, o) ORDER BY e.o),
           coalesce(v_run_at, '{}'),
           ARRAY(SELECT (e.t ->> 'priority')::numeric::integer FROM jsonb_array_elements($1) WITH ORDINALITY AS e(t, o) ORDER BY e.o),
           ARRAY(SELECT e.t ->> 'dedupe_key' FROM jsonb_array_elements($1) WITH ORDINALITY AS e(t, o) ORDER BY e.o),
           ARRAY(SELECT (e.t ->> 'max_attempts')::numeric::integer FROM jsonb_array_elements($1) WITH ORDINALITY AS e(t, o) ORDER BY e.o),
           coalesce(v_delays, '{}'),
           ARRAY(SELECT (e.t ->> 'shard')::numeric::integer FROM jsonb_array_elements($1) WITH ORDINALITY AS e(t, o) ORDER BY e.o),
           ARRAY(SELECT (e.t ->> 'shards')::numeric::integer FROM jsonb_array_elements($1) WITH ORDINALITY AS e(t, o) ORDER BY e.o)) AS r
   ORDER BY r.ord;
END $fn$;

-- New functions are executable by PUBLIC by default (migration 3): take it away, then give the
-- two doors to every role that may run enqueue() (src/schema/roles.ts grants them from now on).
REVOKE EXECUTE ON FUNCTION {{schema}}.add_task_rows(text, text[], jsonb[], text[], timestamptz[], integer[], text[],
  integer[], interval[], integer[], integer[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.add_task(text, jsonb, text, timestamptz, integer, text, integer, interval,
  integer, integer), {{schema}}.add_tasks(jsonb) FROM PUBLIC;

DO $do$
DECLARE v_role text;
BEGIN
  FOR v_role IN
    SELECT DISTINCT pg_get_userbyid(a.grantee)
      FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.oid = {{qualified_literal:enqueue(text,smallint,smallint,smallint,text[],jsonb[],timestamptz[],integer[],text[],text)}}::regprocedure
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %1$I.add_task(text, jsonb, text, timestamptz, integer, text, integer, '
                   'interval, integer, integer), %1$I.add_tasks(jsonb) TO %2$I', {{schema_literal}}, v_role);
  END LOOP;
END $do$;
