-- name: move a pending task to another queue or priority (tombstone and re-append)

-- Move a task no worker holds to another (queue, priority). A deferred row is rewritten in
-- place (deferred storage is not the ring). A ready entry is tombstoned (under its lane's row
-- lock, version bumped so no claim with an older snapshot can lease it) and re-appended to the
-- target lane with the same id, payload and attempts. Returns 'moved', 'leased' or 'not_found'.
CREATE FUNCTION {{schema}}.move_task(p_id bigint, p_queue text, p_priority smallint)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE r record;
BEGIN
  IF p_id IS NULL OR p_queue IS NULL OR p_priority IS NULL THEN
    RAISE EXCEPTION 'berth: move_task arguments must not be null' USING ERRCODE = '22004';
  END IF;
  UPDATE {{schema}}.deferred SET queue = p_queue, priority = p_priority WHERE id = p_id;
  IF FOUND THEN RETURN 'moved'; END IF;
  SELECT e.* INTO r FROM {{schema}}.ready e
   WHERE e.id = p_id
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.tombstones t
                      WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.slot = e.slot)
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.settlements st
                      WHERE st.lane_id = e.lane_id AND st.lane_seq = e.lane_seq AND st.slot = e.slot)
   ORDER BY e.appended_at DESC LIMIT 1;
  IF NOT FOUND THEN RETURN 'not_found'; END IF;
  UPDATE {{schema}}.lanes SET version = version + 1 WHERE lane_id = r.lane_id;
  IF EXISTS (SELECT 1 FROM {{schema}}.leases l
              WHERE l.lane_id = r.lane_id AND l.lane_seq = r.lane_seq AND l.slot = r.slot) THEN
    RETURN 'leased';
  END IF;
  INSERT INTO {{schema}}.tombstones (slot, lane_id, lane_seq, id, reason)
  VALUES (r.slot, r.lane_id, r.lane_seq, p_id, 'moved') ON CONFLICT DO NOTHING;
  PERFORM {{schema}}.append_ready({{schema}}.provision_lane(p_queue, p_priority, r.shard), ARRAY[r.id],
            ARRAY[r.type], ARRAY[r.payload], ARRAY[r.attempts], ARRAY[r.max_attempts],
            ARRAY[r.dedupe_key], ARRAY[r.last_error], ARRAY[r.created_at], ARRAY[r.run_at]);
  RETURN 'moved';
END $fn$;
