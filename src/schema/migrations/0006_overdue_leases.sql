-- name: overdue leases: a handler still running past its deadline keeps its lease while its holder lives

-- A lease whose handler is still running past its deadline, as its holder reports it. Written
-- only on that rare path (the handler ignored its AbortSignal), refreshed by the holder every
-- heartbeat interval while the handler runs, and deleted once the lease is settled. Rescue
-- leaves a lapsed lease alone while its row is fresh (seen_at within stale_after): the holder
-- is alive and still running it, so handing the task to another worker would run it twice.
-- A holder that dies stops refreshing, the row goes stale, and rescue takes the lease.
CREATE TABLE {{schema}}.overdue_leases (
  slot smallint NOT NULL,
  lane_id integer NOT NULL,
  lane_seq bigint NOT NULL,
  id bigint NOT NULL,
  type text NOT NULL,
  attempt integer NOT NULL,
  worker_id text NOT NULL,
  -- When the holder wrote the row (its handler was past its deadline), and when the handler
  -- counts as stuck (deadline + the worker's grace): what the dashboard marks.
  since timestamptz NOT NULL DEFAULT now(),
  stuck_at timestamptz NOT NULL,
  seen_at timestamptz NOT NULL DEFAULT now(),
  stale_after interval NOT NULL,
  PRIMARY KEY (lane_id, lane_seq, slot)
);
CREATE INDEX ON {{schema}}.overdue_leases (id);
