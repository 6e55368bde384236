/**
 * EXPLAIN (ANALYZE, BUFFERS) of every operator-surface read (and the heartbeat upsert) on a large
 * installation, written to docs/explain-admin.md. Run: npx tsx scripts/explain-admin.ts
 * (DATABASE_URL or the local test db; schema `explain_admin`, dropped and rebuilt each run).
 *
 * The statements are not copied here: the real admin functions (and getTask, Heartbeat.beat)
 * run against the explaining Queryable of scripts/explain-capture.ts, which for every query a
 * function sends runs it for real (the function gets its real result) and then EXPLAINs
 * (ANALYZE, BUFFERS) it through PREPARE/EXECUTE inside a rolled-back transaction (so the
 * heartbeat's upsert is not applied twice), on a session with the worker's SESSION_OPTIONS.
 *
 * The "Reading" section of the doc is hand-written: it is kept, between its markers, when the
 * doc is regenerated.
 */
import { storageFor } from '../src/storage/storage.js';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import pg from 'pg';
import {
  countDead,
  createLogger,
  enqueueMany,
  laneActivity,
  laneStats,
  leaderInfo,
  listAudit,
  listDead,
  listQueues,
  listTasks,
  listWorkers,
  migrate,
  taskCounts,
  taskTimeline,
  throughput,
  type Queryable,
  type TaskSpec,
} from '../src/index.js';
import { claim, type ClaimParams } from '../src/processor/claim.js';
import { Heartbeat } from '../src/processor/heartbeat.js';
import { SESSION_OPTIONS } from '../src/process/worker.js';
import { quoteIdent, wakeChannel } from '../src/sql.js';
import { completeLeases } from '../src/storage/complete.js';
import { recordFailures } from '../src/storage/fail.js';
import { cancelTasks } from '../src/storage/cancel.js';
import { LEADER_LOCK, schemaLockKey } from '../src/storage/locks.js';
import { getTask } from '../src/storage/tasks.js';
import { Explainer, readable, summarise } from './explain-capture.js';

const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = 'explain_admin';
const S = quoteIdent(schema);
const DOC = new URL('../docs/explain-admin.md', import.meta.url);
const pool = new pg.Pool({ connectionString: url, max: 4, options: SESSION_OPTIONS });
const log = (msg: string) => console.log(`[${new Date().toISOString().slice(11, 19)}] ${msg}`);

// ---------------------------------------------------------------------------------------------
// The installation
// ---------------------------------------------------------------------------------------------

const QUEUES = ['default', 'mail', 'media'] as const;
const SHARDS = 16;
const BATCHES = 200; // x 1,000 ready tasks
const DEFERRED_PER_BATCH = 100; // 20,000 deferred, half due
const DEAD_PER_BATCH = 500; // 100,000 dead letters, ids interleaved with the tasks'
const RARE_TYPE = 'export-ledger'; // 20 tasks: 10 in the oldest batch, 10 in the middle one
const COMMON_TYPE = 'send-email';
const CANCELS = 1000; // ready tasks cancelled, recorded in attempt history
/** Half the tasks are send-email, then resize-image, sync-account, build-report. */
function typeOf(i: number): string {
  const k = i % 20;
  return k < 10 ? 'send-email' : k < 16 ? 'resize-image' : k < 19 ? 'sync-account' : 'build-report';
}

const t0 = Date.now();
await pool.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`);
await migrate({ connectionString: url, schema });
log('migrated');

for (let b = 0; b < BATCHES; b++) {
  const ready: TaskSpec[] = Array.from({ length: 1000 }, (_, i) => ({
    type: (b === 0 || b === BATCHES / 2) && i < 10 ? RARE_TYPE : typeOf(i),
    payload: { b, i, account: `acct-${(b * 1000 + i) % 9973}`, note: 'x'.repeat(40) },
    queue: QUEUES[i % QUEUES.length],
    shard: Math.floor(i / QUEUES.length) % SHARDS,
  }));
  await enqueueMany(pool, ready, { schema });
  const deferred: TaskSpec[] = Array.from({ length: DEFERRED_PER_BATCH }, (_, i) => ({
    type: typeOf(i),
    payload: { b, i, later: true },
    queue: QUEUES[i % QUEUES.length],
    shard: (b + i) % SHARDS,
    delay: i % 2 ? 3_600_000 : 1,
  }));
  await enqueueMany(pool, deferred, { schema });
  await pool.query(
    `INSERT INTO ${S}.dead_letters (id, type, payload, queue, priority, shard, attempts, max_attempts, last_error,
                                    created_at, last_attempted_at, died_at)
     SELECT nextval('${schema}.task_id_seq'),
            (ARRAY['send-email','send-email','resize-image','sync-account'])[1 + g % 4],
            jsonb_build_object('g', g, 'account', 'acct-' || g % 9973),
            (ARRAY['default','mail','media'])[1 + g % 3], 0, g % ${SHARDS}, 20, 20,
            CASE WHEN g % 1000 = 0 THEN 'QuotaExceeded: tenant ' || g || ' is over its daily export quota'
                 WHEN g % 7 = 0 THEN 'TimeoutError: handler exceeded its 60000 ms ceiling'
                 ELSE 'Error: upstream returned 503 Service Unavailable (attempt 20 of 20)' END,
            now() - make_interval(mins => ${BATCHES - b}), now() - make_interval(mins => ${BATCHES - b}),
            now() - make_interval(mins => ${BATCHES - b})
       FROM generate_series(${b * DEAD_PER_BATCH}, ${(b + 1) * DEAD_PER_BATCH - 1}) g`,
  );
  if ((b + 1) % 50 === 0)
    log(`enqueued ${(b + 1) * 1000} ready, ${(b + 1) * DEFERRED_PER_BATCH} deferred, ${(b + 1) * DEAD_PER_BATCH} dead`);
}

const lanes = (await pool.query<{ lane_id: number }>(`SELECT lane_id FROM ${S}.lanes ORDER BY lane_id`)).rows.map(
  (r) => r.lane_id,
);
const HOUR = 3_600_000;
const claimParams: ClaimParams = {
  storage: storageFor(schema),
  laneIds: lanes,
  limit: 500,
  ceilings: new Map(),
  maxAttempts: new Map(),
  defaultMaxAttempts: 20,
  defaultCeilingMs: HOUR,
  marginMs: 30_000,
  workerId: 'worker-02',
  wakeChannel: wakeChannel(schema),
};
let claimed = 0;
while (claimed < 100_000) {
  const got = await claim(pool, claimParams);
  if (got.length === 0) throw new Error('nothing left to claim');
  await completeLeases(pool, storageFor(schema), got);
  claimed += got.length;
}
// 1,000 failures with a one-hour backoff: retryable rows in deferred (and their settlements).
const failing = await claim(pool, { ...claimParams, limit: 1000, workerId: 'worker-04' });
await recordFailures(
  pool,
  storageFor(schema),
  failing.map((ref) => ({ ref, error: 'Error: upstream returned 503', delayMs: HOUR, permanent: false })),
);
const running = await claim(pool, { ...claimParams, limit: 300, workerId: 'worker-03' });
log(`claimed and completed ${claimed}; ${failing.length} failed to retry; ${running.length} running`);

// Attempt history of ~100,000 rows: an earlier failed attempt of each completed task, written as
// fail() writes one (one row per task), then 1,000 cancels of ready tasks through cancel_tasks()
// (one `cancelled` row each), every 200th ready task from the oldest, so cancels are rare among
// the history rows and spread over its id buckets.
await pool.query(
  `INSERT INTO ${S}.attempt_history (part, bucket, settled_at, outcome, lane_id, type, worker, claimed_at, ids, attempts,
                                     created_at, run_ms, error, cursor, dead)
   SELECT 0, r.id >> 10, r.appended_at, 'failure', r.lane_id, r.type, 'worker-05', r.appended_at, ARRAY[r.id], ARRAY[1],
          ARRAY[r.created_at], ARRAY[12], '{"message":"Error: upstream returned 503"}'::jsonb, NULL, false
     FROM ${S}.ready r
    WHERE EXISTS (SELECT 1 FROM ${S}.leased_entries le
                   WHERE le.id = r.id AND le.lane_id = r.lane_id AND le.lane_seq = r.lane_seq AND le.slot = r.slot
                     AND le.outcome = 'completed')`,
);
const toCancel = (
  await pool.query<{ id: string }>(
    `SELECT id::text AS id FROM (SELECT r.id, row_number() OVER (ORDER BY r.id) AS n FROM ${S}.ready r
       WHERE NOT EXISTS (SELECT 1 FROM ${S}.leased_entries le WHERE le.id = r.id)) x
      WHERE x.n % 50 = 0 ORDER BY id LIMIT ${CANCELS}`,
  )
).rows.map((r) => r.id);
await cancelTasks(pool, storageFor(schema), toCancel, 'cli:alice');
log(`cancelled ${toCancel.length} ready tasks`);

// 7 days of per-minute outcome counts: 10 workers x 5 types x 3 outcomes.
await pool.query(
  `INSERT INTO ${S}.outcome_counts (minute, worker_id, queue, type, outcome, count)
   SELECT date_trunc('minute', now()) - make_interval(mins => m), 'worker-' || lpad(w::text, 2, '0'), t.queue, t.type, o,
          1 + (m + w) % 17
     FROM generate_series(0, 7 * 24 * 60 - 1) m, generate_series(1, 10) w,
          (VALUES ('mail', 'send-email'), ('media', 'resize-image'), ('default', 'sync-account'),
                  ('default', 'build-report'), ('default', '${RARE_TYPE}')) t(queue, type),
          unnest(ARRAY['success', 'failure', 'timeout']) o`,
);
await pool.query(
  `INSERT INTO ${S}.workers (worker_id, host, pid, queues, slots, busy, prefetched, leader, maintenance, started_at, last_seen_at)
   SELECT 'worker-' || lpad(w::text, 2, '0'), 'host-' || (w % 3), 1000 + w, NULL, 32, w % 32, 0, w = 1,
          CASE WHEN w = 1 THEN '{"branches":{"promote":{"runs":8640,"failures":0,"overruns":2,"lastMs":4,"maxMs":310,"lastRunAt":null}},"waitingLanes":[]}'::jsonb
               ELSE '{}'::jsonb END,
          now() - make_interval(hours => w), now() - make_interval(secs => w)
     FROM generate_series(1, 10) w`,
);
await pool.query(
  `INSERT INTO ${S}.audit_log (at, actor, action, target, result)
   SELECT now() - make_interval(mins => 1000 - g), 'cli:alice', (ARRAY['dead.retry','queue.pause','queue.resume','task.cancel'])[1 + g % 4],
          jsonb_build_object('queue', 'mail'), jsonb_build_object('items', g)
     FROM generate_series(1, 1000) g`,
);
await pool.query(`ANALYZE ${S}.attempt_history, ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dead_letters,
                  ${S}.lanes, ${S}.outcome_counts, ${S}.workers, ${S}.audit_log, ${S}.dedupe`);
const setupSeconds = Math.round((Date.now() - t0) / 1000);
log(`built in ${setupSeconds} s`);

const explainClient = new pg.Client({
  connectionString: url,
  options: SESSION_OPTIONS,
  application_name: 'berth-explain',
});
await explainClient.connect();
const explainer = new Explainer(explainClient);
const captured = explainer.captured;

/** A completed task (it has an append, a claim and a settlement to show). */
const sample = (
  await pool.query<{ id: string }>(
    `SELECT r.id::text AS id FROM ${S}.range_settlements st
       JOIN ${S}.ready r ON r.lane_id = st.lane_id AND r.slot = st.slot AND st.seqs @> r.lane_seq
      WHERE st.outcome = 'completed' ORDER BY r.lane_id, r.lane_seq LIMIT 1 OFFSET 500`,
  )
).rows[0]!.id;

/** Page 50 of the unfiltered list: the cursor after 49 pages of 50 (walked on the plain pool). */
let after: string | undefined;
for (let p = 1; p < 50; p++) after = (await listTasks(pool, schema, {}, { after })).next ?? undefined;

/** Page 10 of the cancelled tasks. */
let cancelledAfter: string | undefined;
for (let p = 1; p < 10; p++)
  cancelledAfter = (await listTasks(pool, schema, { state: 'cancelled' }, { after: cancelledAfter })).next ?? undefined;

/** Past the oldest ready task: every older entry is leased, so no ready row is left below (a drained queue). */
const oldestReady = (
  await pool.query<{ id: string }>(
    `SELECT min(r.id)::text AS id FROM ${S}.ready r
      WHERE NOT EXISTS (SELECT 1 FROM ${S}.range_leases l
                         WHERE l.lane_id = r.lane_id AND l.slot = r.slot AND r.lane_seq BETWEEN l.from_seq AND l.to_seq)`,
  )
).rows[0]!.id;

const leaderClient = new pg.Client({ connectionString: url, application_name: 'berth-explain-leader' });
await leaderClient.connect();
await leaderClient.query('SELECT pg_advisory_lock($1, $2)', [schemaLockKey(schema), LEADER_LOCK]);

const BOUNDED = 'bounded';
const CANCELS_KEPT = 'operator cancels in attempt history (partial index)';
const cases: [string, string, (db: Queryable) => Promise<unknown>][] = [
  ['getTask: one completed task', BOUNDED, (db) => getTask(db, schema, sample)],
  ['getTask: one running task', BOUNDED, (db) => getTask(db, schema, running[0]!.id)],
  ['getTask: one cancelled task (read from attempt history)', BOUNDED, (db) => getTask(db, schema, toCancel[500]!)],
  ['listTasks: first page, no filter', BOUNDED, (db) => listTasks(db, schema)],
  ['listTasks: page 50 (keyset `after`)', BOUNDED, (db) => listTasks(db, schema, {}, { after })],
  [
    `listTasks: type = ${RARE_TYPE} (rare, 20 tasks)`,
    'rows walked until the page fills',
    (db) => listTasks(db, schema, { type: RARE_TYPE }),
  ],
  [`listTasks: type = ${COMMON_TYPE} (common)`, BOUNDED, (db) => listTasks(db, schema, { type: COMMON_TYPE })],
  ['listTasks: state = ready', BOUNDED, (db) => listTasks(db, schema, { state: 'ready' })],
  [
    'listTasks: state = ready, past the oldest ready task (as on a drained queue)',
    'rows walked until the page fills: here the whole claimed ring',
    (db) => listTasks(db, schema, { state: 'ready' }, { after: oldestReady }),
  ],
  ['listTasks: state = running', 'leases in the ring (anti-join)', (db) => listTasks(db, schema, { state: 'running' })],
  [
    'listTasks: state = completed',
    'unclaimed entries newer than the page (one comparison each)',
    (db) => listTasks(db, schema, { state: 'completed' }),
  ],
  ['listTasks: state = cancelled', CANCELS_KEPT, (db) => listTasks(db, schema, { state: 'cancelled' })],
  [
    'listTasks: state = cancelled, page 10 (keyset `after`)',
    CANCELS_KEPT,
    (db) => listTasks(db, schema, { state: 'cancelled' }, { after: cancelledAfter }),
  ],
  ['listTasks: state = scheduled', BOUNDED, (db) => listTasks(db, schema, { state: 'scheduled' })],
  ['listTasks: state = retryable', BOUNDED, (db) => listTasks(db, schema, { state: 'retryable' })],
  ['listTasks: state = dead', BOUNDED, (db) => listTasks(db, schema, { state: 'dead' })],
  ['listTasks: queue = media', BOUNDED, (db) => listTasks(db, schema, { queue: 'media' })],
  ['taskTimeline: one completed task', BOUNDED, (db) => taskTimeline(db, schema, sample)],
  ['listDead: first page, no filter', BOUNDED, (db) => listDead(db, schema)],
  ['listDead: errorContains "503" (common)', BOUNDED, (db) => listDead(db, schema, { errorContains: '503' })],
  [
    'listDead: errorContains "quota" (1 in 1,000)',
    'rows walked until the page fills',
    (db) => listDead(db, schema, { errorContains: 'quota' }),
  ],
  ['countDead: queue = mail', 'matching dead letters', (db) => countDead(db, schema, { queue: 'mail' })],
  ['laneStats', 'lanes', (db) => laneStats(db, schema)],
  ['laneActivity', 'work in flight; dead letters', (db) => laneActivity(db, schema)],
  ['taskCounts', 'every unfinished row + every dead letter', (db) => taskCounts(db, schema)],
  ['throughput(60)', 'the window (rows per minute)', (db) => throughput(db, schema, 60)],
  ['throughput(7 * 24 * 60)', 'the window (rows per minute)', (db) => throughput(db, schema, 7 * 24 * 60)],
  ['listWorkers', 'workers', (db) => listWorkers(db, schema)],
  ['leaderInfo', 'sessions holding locks; workers', (db) => leaderInfo(db, schema)],
  ['listQueues', 'lanes', (db) => listQueues(db, schema)],
  ['listAudit: first page', BOUNDED, (db) => listAudit(db, schema)],
  [
    'heartbeat upsert (Heartbeat.beat, 10 outcome counts)',
    BOUNDED,
    async (db) => {
      const hb = new Heartbeat(
        db,
        storageFor(schema),
        {
          workerId: 'worker-01',
          queues: null,
          slots: 32,
          startedAt: new Date(Date.now() - HOUR),
          busy: () => 12,
          prefetched: () => 3,
          leader: () => true,
          maintenance: () => ({
            branches: { promote: { runs: 8641, failures: 0, overruns: 2, lastMs: 3, maxMs: 310, lastRunAt: null } },
            waitingLanes: [],
          }),
        },
        createLogger({ script: 'explain-admin' }),
      );
      for (const type of ['send-email', 'resize-image', 'sync-account', 'build-report', RARE_TYPE]) {
        hb.tally.record(
          type === 'send-email' ? 'mail' : type === 'resize-image' ? 'media' : 'default',
          type,
          'success',
        );
        hb.tally.record(
          type === 'send-email' ? 'mail' : type === 'resize-image' ? 'media' : 'default',
          type,
          'failure',
        );
      }
      await hb.beat();
    },
  ],
];

const results = new Map<string, unknown>();
const scalingOf = new Map<string, string>();
for (const [label, scaling, run] of cases) {
  const before = captured.length;
  scalingOf.set(label, scaling);
  results.set(label, await explainer.capture(label, run, { real: true }));
  for (const c of captured.slice(before)) log(`${label}: ${c.plan.find((l) => l.startsWith('Execution Time'))}`);
}
await leaderClient.end();
await explainClient.end();

// Sanity: the reads return what the data says, so the plans are of real work.
const first = results.get('listTasks: first page, no filter') as { tasks: unknown[] };
const rare = results.get(`listTasks: type = ${RARE_TYPE} (rare, 20 tasks)`) as { tasks: unknown[] };
const run = results.get('listTasks: state = running') as { tasks: unknown[] };
const drained = results.get('listTasks: state = ready, past the oldest ready task (as on a drained queue)') as {
  tasks: unknown[];
};
const cancelled = results.get('listTasks: state = cancelled') as { tasks: { state: string }[] };
const cancelledOne = results.get('getTask: one cancelled task (read from attempt history)') as { state: string } | null;
if (
  cancelled.tasks.length !== 50 ||
  cancelled.tasks.some((t) => t.state !== 'cancelled') ||
  cancelledOne?.state !== 'cancelled'
)
  throw new Error(`unexpected cancelled reads: ${cancelled.tasks.length}, ${cancelledOne?.state}`);
if (first.tasks.length !== 50 || rare.tasks.length !== 20 || run.tasks.length !== 50 || drained.tasks.length !== 0) {
  throw new Error(
    `unexpected result sizes: ${first.tasks.length}, ${rare.tasks.length}, ${run.tasks.length}, ${drained.tasks.length}`,
  );
}

// ---------------------------------------------------------------------------------------------
// The doc
// ---------------------------------------------------------------------------------------------

const version = (await pool.query<{ server_version: string }>('SHOW server_version')).rows[0]!.server_version;
const fmt = (n: number) => n.toLocaleString('en-US');
const TABLE_ORDER = [
  'lanes',
  'ready',
  'range_leases',
  'range_settlements',
  'deferred',
  'deferred (due)',
  'dead_letters',
  'outcome_counts',
  'workers',
  'audit_log',
  'attempt_history',
  'attempt_history (cancelled)',
];
const counts = (
  await pool.query<{ t: string; n: string }>(
    `SELECT 'ready' AS t, count(*)::text AS n FROM ${S}.ready
   UNION ALL SELECT 'range_leases', count(*)::text FROM ${S}.range_leases
   UNION ALL SELECT 'range_settlements', count(*)::text FROM ${S}.range_settlements UNION ALL SELECT 'deferred', count(*)::text FROM ${S}.deferred
   UNION ALL SELECT 'deferred (due)', count(*)::text FROM ${S}.deferred WHERE run_at <= now()
   UNION ALL SELECT 'dead_letters', count(*)::text FROM ${S}.dead_letters UNION ALL SELECT 'outcome_counts', count(*)::text FROM ${S}.outcome_counts
   UNION ALL SELECT 'lanes', count(*)::text FROM ${S}.lanes UNION ALL SELECT 'workers', count(*)::text FROM ${S}.workers
   UNION ALL SELECT 'audit_log', count(*)::text FROM ${S}.audit_log
   UNION ALL SELECT 'attempt_history', count(*)::text FROM ${S}.attempt_history
   UNION ALL SELECT 'attempt_history (cancelled)', count(*)::text FROM ${S}.attempt_history WHERE outcome = 'cancelled'`,
  )
).rows.sort((a, b) => TABLE_ORDER.indexOf(a.t) - TABLE_ORDER.indexOf(b.t));

const READING_START = '<!-- reading:start (hand-written; kept when the script regenerates this file) -->';
const READING_END = '<!-- reading:end -->';
const previous = existsSync(DOC) ? readFileSync(DOC, 'utf8') : '';
const kept =
  previous.includes(READING_START) && previous.includes(READING_END)
    ? previous.slice(previous.indexOf(READING_START), previous.indexOf(READING_END) + READING_END.length)
    : `${READING_START}\n\n(to be written)\n\n${READING_END}`;

let out =
  `# EXPLAIN of the operator-surface reads\n\n` +
  `Generated by \`npx tsx scripts/explain-admin.ts\` on ${new Date().toISOString().slice(0, 10)} (PostgreSQL ${version}, ` +
  `sessions with the worker's options \`${SESSION_OPTIONS}\`, default \`shared_buffers\`/\`work_mem\`); setup took ${setupSeconds} s. The hot path is in [explain.md](explain.md).\n\n` +
  `## Setup\n\n` +
  `Schema \`${schema}\`, rebuilt each run. 48 lanes (queues ${QUEUES.map((q) => `\`${q}\``).join(', ')} x 16 shards, priority 0). ` +
  `Each of ${BATCHES} rounds enqueues 1,000 ready tasks (half \`send-email\`, then \`resize-image\`, \`sync-account\`, \`build-report\`; ` +
  `the oldest round and the middle one each carry 10 \`${RARE_TYPE}\`), ${DEFERRED_PER_BATCH} deferred ones (half due: delay 1 ms, ` +
  `never promoted) and inserts ${DEAD_PER_BATCH} dead letters with \`generate_series\` (ids from the task sequence, so the three ` +
  `kinds interleave by id as they would in a live system; 1 in 1,000 has a "quota" error). Then \`claim\` + \`completeLeases\` ` +
  `lease and complete 100,000 (the older half of every lane) into \`range_leases\`/\`range_settlements\`, \`claim\` + ` +
  `\`recordFailures\` fail ${failing.length} with a one-hour backoff (retryable), and one more \`claim\` leaves ${running.length} running. ` +
  `Attempt history gets one \`failure\` row per completed task (an earlier attempt, as \`recordFailures\` writes it), and ` +
  `\`cancel_tasks()\` cancels ${toCancel.length} ready tasks (every 50th unclaimed one by id; one \`cancelled\` row each). ` +
  `7 days of \`outcome_counts\` (10 workers x 5 types x 3 outcomes per minute), 10 \`workers\` rows (worker-01 leads and a ` +
  `session holds the leader lock), 1,000 \`audit_log\` rows, then ANALYZE.\n\n` +
  `| table | rows |\n| --- | ---: |\n${counts.map((c) => `| ${c.t} | ${fmt(Number(c.n))} |`).join('\n')}\n\n` +
  `Method: the real functions from \`src/admin\` (and \`getTask\`, \`Heartbeat.beat()\`) run against the explaining ` +
  `\`Queryable\` of scripts/explain-capture.ts, on one session with the worker's options. For every statement a function ` +
  `sends, it runs it (the **wall** column: one round trip on a warm cache, measured in the client), then \`PREPARE\`s its ` +
  `text and runs \`EXPLAIN (ANALYZE, BUFFERS) EXECUTE\` with its values in a rolled-back transaction: with ` +
  `\`plan_cache_mode = force_generic_plan\` these are the generic plans berth's sessions run (an EXPLAIN of the text with ` +
  `bind values would fold them into a custom plan). ` +
  `Buffers are the top node's (inclusive of children and subplans); **rows visited** sums, over every scan node, the rows it ` +
  `returned plus the rows its filter removed, times its loops: the measure of work that does or does not grow with the tables. ` +
  `Plans leave out the nodes that never ran (with everything under them) and \`Heap Fetches: 0\`; the ring's 15 empty ` +
  `partitions still show as \`rows=0\` nodes (all entries sit in slot 0: the ring never rotated here). ` +
  `Timings are one run on a development machine: read them as orders of magnitude. No test asserts any of them.\n\n` +
  `## Summary\n\n` +
  `| # | statement | exec ms | plan ms | wall ms | shared hit+read | rows visited | top node | access | cost grows with |\n` +
  `| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |\n`;
captured.forEach((c, i) => {
  const s = summarise(c.plan);
  const n = captured.filter((x) => x.label === c.label);
  const name = n.length > 1 ? `${c.label} (${n.indexOf(c) + 1}/${n.length})` : c.label;
  out +=
    `| ${i + 1} | ${name} | ${s.execMs.toFixed(2)} | ${s.planMs.toFixed(2)} | ${(c.wallMs ?? Number.NaN).toFixed(1)} | ` +
    `${fmt(s.buffers.hit)}+${fmt(s.buffers.read)} | ${fmt(s.rowsVisited)} | ${s.top} | ${s.access} | ${scalingOf.get(c.label)} |\n`;
});
out += `\n## Reading\n\n${kept}\n\n## Plans\n`;
captured.forEach((c, i) => {
  const n = captured.filter((x) => x.label === c.label);
  const name = n.length > 1 ? `${c.label} (${n.indexOf(c) + 1}/${n.length})` : c.label;
  const values = JSON.stringify(c.values, (_k, v: unknown) =>
    Array.isArray(v) && v.length > 12 ? `[${v.length} values]` : v,
  );
  out +=
    `\n### ${i + 1}. ${name}\n\nValues: \`${values}\`\n\n\`\`\`sql\n${c.sql.replace(/^\s*\n/, '').replace(/\s+$/, '')}\n\`\`\`\n\n` +
    `\`\`\`\n${readable(c.plan).join('\n')}\n\`\`\`\n`;
});
writeFileSync(DOC, out);
log(`wrote ${DOC.pathname}`);
if (!process.env.KEEP_SCHEMA) await pool.query(`DROP SCHEMA ${S} CASCADE`);
await pool.end();
