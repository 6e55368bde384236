-- name: schedules: recurring tasks declared by workers, fired by the leader exactly once per instant
--
-- Issue 31. A schedule (a cron expression in a time zone, a task type with its payload and
-- options, a misfire policy) is declared in the worker's code and upserted here when the worker
-- starts. Only the elected leader fires schedules, each fire an ordinary task enqueued through
-- enqueue() in the same transaction as a conditional UPDATE of the schedule's row:
--
--   UPDATE schedules SET fired_through = $instant ... WHERE name = $name AND fired_through < $instant
--
-- `fired_through` is the watermark: every instant up to it has been fired or decided (skipped by
-- the misfire policy, passed while paused). It only moves forward, under the row's lock, so a
-- second fire of an instant (a leader that died between computing the instant and committing, a
-- second leader during a failover, a host whose clock jumped back) updates no row and rolls its
-- enqueue back. The task's dedupe key (`berth-schedule:<name>@<instant>`) refuses the same
-- instant too while its task is pending; once that task settles its key is freed, and the
-- watermark is what remains.
--
-- `schedule_fires` records each fire (the instant, the task, how late it was), for the attempt
-- history's schedule name and the operator's last-fire view; its partial unique index on
-- (schedule, instant) for cron fires is a second refusal of a duplicate instant. The leader's
-- retention branch prunes it after 7 days.
--
-- `workers.schedules`: the schedule names each worker declares, written with its heartbeat, and
-- `workers.heartbeat_ms`, its heartbeat interval. The leader marks stale (and stops firing) a
-- schedule no live worker declares (live: seen within three of its own intervals, so a worker
-- beating every minute is not taken for gone between beats), and unmarks it when one does again. Pausing is an operator's (`paused`, `paused_at`, `paused_by`): no runtime role
-- may write those columns.

CREATE TABLE {{schema}}.schedules (
  name text PRIMARY KEY,
  cron text NOT NULL,
  time_zone text NOT NULL,
  task_type text NOT NULL,
  payload jsonb NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  max_attempts integer,
  misfire text NOT NULL CHECK (misfire IN ('skip', 'once', 'all')),
  misfire_cap integer NOT NULL CHECK (misfire_cap >= 1),
  misfire_grace_ms integer NOT NULL CHECK (misfire_grace_ms >= 0),
  -- The typical gap between two instants (ms), for the "has not fired" alert.
  interval_ms double precision NOT NULL,
  declared_by text,
  declared_at timestamptz NOT NULL DEFAULT now(),
  created_at timestamptz NOT NULL DEFAULT now(),
  fired_through timestamptz NOT NULL DEFAULT now(),
  last_instant timestamptz,
  last_fired_at timestamptz,
  last_task_id bigint,
  stale boolean NOT NULL DEFAULT false,
  stale_since timestamptz,
  paused boolean NOT NULL DEFAULT false,
  paused_at timestamptz,
  paused_by text
);

CREATE TABLE {{schema}}.schedule_fires (
  fire_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  schedule text NOT NULL,
  instant timestamptz NOT NULL,
  kind text NOT NULL CHECK (kind IN ('cron', 'trigger')),
  task_id bigint,
  fired_at timestamptz NOT NULL DEFAULT now(),
  late_ms double precision
);

CREATE UNIQUE INDEX schedule_fires_instant ON {{schema}}.schedule_fires (schedule, instant) WHERE kind = 'cron';
CREATE INDEX schedule_fires_task ON {{schema}}.schedule_fires (task_id);
CREATE INDEX schedule_fires_fired_at ON {{schema}}.schedule_fires (fired_at);

ALTER TABLE {{schema}}.workers ADD COLUMN schedules text[], ADD COLUMN heartbeat_ms integer;
