/**
 * EXPLAIN (ANALYZE, BUFFERS) of every hot statement on a large table, written to
 * docs/explain.md. Run: npx tsx scripts/explain-hot.ts  (DATABASE_URL or the local test db)
 *
 * The statements are not copied here: the production functions (discover, claimBatch,
 * completeLeases, recordFailures, returnUnstarted, releaseLease, dequeue, rescueLapsedLeases,
 * readGauges, getTask, attemptsOf, listAttempts) run against the explaining Queryable of scripts/explain-capture.ts, on a
 * session with the worker's SESSION_OPTIONS. Writes are rolled back, so every statement sees the
 * data set below.
 *
 * Setup (all through the real functions): 200,000 ready tasks over 16 lanes; 100,000 of them
 * claimed and completed (so range_leases and range_settlements hold the settled history and the
 * claim cursor sits mid-lane); 1,000 claimed and failed permanently (dead letters); 200 claimed
 * with a zero ceiling (lapsed, for the rescue); 64 claimed and running; 20,000 deferred (half due).
 */
import { storageFor } from '../src/storage/storage.js';
import { writeFileSync } from 'node:fs';
import pg from 'pg';
import { enqueueMany, migrate } from '../src/index.js';
import { readGauges } from '../src/maintenance/gauges.js';
import { type ClaimParams, claim, claimBatch, discover } from '../src/processor/claim.js';
import { SESSION_OPTIONS } from '../src/process/worker.js';
import { quoteIdent, wakeChannel } from '../src/sql.js';
import { completeLeases, dequeue } from '../src/storage/complete.js';
import { recordFailures } from '../src/storage/fail.js';
import { rescueLapsedLeases } from '../src/storage/rescue.js';
import { releaseLease, returnUnstarted } from '../src/storage/return.js';
import { attemptsOf, listAttempts } from '../src/storage/history.js';
import { getTask } from '../src/storage/tasks.js';
import { readRingWindow } from '../src/storage/ring-window.js';
import { Explainer, readable, summarise } from './explain-capture.js';

const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = 'explain_hot';
const S = quoteIdent(schema);
const pool = new pg.Pool({ connectionString: url, max: 4, options: SESSION_OPTIONS });
await pool.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`);
await migrate({ connectionString: url, schema });
for (let b = 0; b < 200; b++) {
  await enqueueMany(
    pool,
    Array.from({ length: 1000 }, (_, i) => ({ type: 'noop', payload: { b, i }, shard: b % 16 })),
    { schema },
  );
}
await enqueueMany(
  pool,
  Array.from({ length: 20_000 }, (_, i) => ({ type: 'later', payload: { i }, delay: i % 2 ? 3_600_000 : 1 })),
  { schema },
);
const lanes = (await pool.query<{ lane_id: number }>(`SELECT lane_id FROM ${S}.lanes ORDER BY lane_id`)).rows.map(
  (r) => r.lane_id,
);
const params: ClaimParams = {
  storage: storageFor(schema),
  laneIds: lanes,
  limit: 500,
  ceilings: new Map([['noop', 60_000]]),
  maxAttempts: new Map<string, number>(),
  defaultMaxAttempts: 20,
  defaultCeilingMs: 300_000,
  marginMs: 30_000,
  workerId: 'explain',
  wakeChannel: wakeChannel(schema),
};
let claimed = 0;
while (claimed < 100_000) {
  const got = await claim(pool, params);
  if (got.length === 0) throw new Error('nothing left to claim');
  await completeLeases(pool, storageFor(schema), got);
  claimed += got.length;
}
const failed = await claim(pool, { ...params, limit: 1000 });
await recordFailures(
  pool,
  storageFor(schema),
  failed.map((ref) => ({ ref, error: 'Error: permanent', delayMs: 0, permanent: true })),
);
// A zero ceiling and margin: these leases lapse at once (the rescue's work).
const lapsed = await claim(pool, {
  ...params,
  limit: 200,
  ceilings: new Map(),
  defaultCeilingMs: 0,
  marginMs: 0,
  workerId: 'gone',
});
const live = await claim(pool, { ...params, limit: 64 });
await pool.query(`ANALYZE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred,
                  ${S}.dead_letters, ${S}.lanes, ${S}.dedupe, ${S}.overdue_leases, ${S}.workers`);
console.log(`set up: ${claimed} completed, ${failed.length} dead, ${lapsed.length} lapsed, ${live.length} running`);

const counts = (
  await pool.query<{ t: string; n: string }>(
    `SELECT 'ready' AS t, count(*)::text AS n FROM ${S}.ready
     UNION ALL SELECT 'range_leases', count(*)::text FROM ${S}.range_leases
     UNION ALL SELECT 'range_settlements', count(*)::text FROM ${S}.range_settlements
     UNION ALL SELECT 'deferred', count(*)::text FROM ${S}.deferred
     UNION ALL SELECT 'dead_letters', count(*)::text FROM ${S}.dead_letters
     UNION ALL SELECT 'attempt_history', count(*)::text FROM ${S}.attempt_history`,
  )
).rows;

const client = new pg.Client({ connectionString: url, options: SESSION_OPTIONS, application_name: 'berth-explain' });
await client.connect();
const x = new Explainer(client);
const lane0 = live.filter((t) => t.laneId === live[0]!.laneId);
const window = await readRingWindow(client, storageFor(schema));
const lanes12 = (
  await client.query<{ lane_id: number }>(`SELECT lane_id FROM ${S}.lanes ORDER BY lane_id LIMIT 12`)
).rows.map((r) => r.lane_id);
const cases: [string, string, () => Promise<unknown>][] = [
  [
    'discover (read pool; the worker asks one head per lane)',
    'one backward probe of range_leases per lane for the cursor, one forward probe of ready for the head',
    () => x.capture('discover', (db) => discover(db, storageFor(schema), null, 20, 1), { real: true }),
  ],
  [
    'claimBatch (32 slots over 2 of the discovered lanes, as the fetcher asks)',
    'reads only the entries past each locked lane’s cursor, inserts one range_leases row per lane',
    () =>
      x.capture(
        'claimBatch',
        (db) => claimBatch(db, { ...params, laneIds: lanes, limit: 32, maxLanes: 2, perLane: 16 }),
        { real: false },
      ),
  ],
  [
    'discover in the ring window (as the worker runs it: the window’s segments by name)',
    'per lane and segment, the cursor probes and the head probe under a LIMIT',
    () => x.capture('discover', (db) => discover(db, storageFor(schema), null, 20, 1, window), { real: true }),
  ],
  [
    'claimBatch in the ring window (as the worker runs it; 540 over 12 lanes, the drain’s shape)',
    'per lane and segment, an index range scan under the lane’s share; one range_leases row per lane; the ring generation checked',
    () =>
      x.capture(
        'claimBatch',
        (db) => claimBatch(db, { ...params, laneIds: lanes12, limit: 540, maxLanes: 12, perLane: 45, window }),
        { real: false },
      ),
  ],
  [
    `completeLeases (${lane0.length} entries of one range lease: one settlement row)`,
    'one probe of the segment’s range_leases partition, one exclusion-constraint check',
    () => x.capture('completeLeases', (db) => completeLeases(db, storageFor(schema), lane0), { real: false, max: 1 }),
  ],
  [
    'recordFailures (one failure, retried into deferred)',
    'fenced settlement row, then the move to deferred',
    () =>
      x.capture(
        'recordFailures',
        (db) =>
          recordFailures(db, storageFor(schema), [
            { ref: live[1]!, error: 'Error: boom', delayMs: 1000, permanent: false },
          ]),
        { real: false },
      ),
  ],
  [
    'returnUnstarted (a prefetched task handed back)',
    'fenced settlement row, then the move to deferred',
    () => x.capture('returnUnstarted', (db) => returnUnstarted(db, storageFor(schema), live[2]!), { real: false }),
  ],
  [
    'releaseLease (burnt attempt kept)',
    'same statement as returnUnstarted, another mode',
    () =>
      x.capture('releaseLease', (db) => releaseLease(db, storageFor(schema), live[3]!, 'Error: shutdown'), {
        real: false,
      }),
  ],
  [
    'dequeue (a handler’s own Dequeue with its lease token)',
    'through leased_entries by id',
    () => x.capture('dequeue', (db) => dequeue(db, schema, live[4]!.id, live[4]!.token), { real: false }),
  ],
  [
    `rescueLapsedLeases (${lapsed.length} lapsed entries)`,
    'unsettled ranges only, then one range scan of ready per lapsed range',
    // Its first statement is the check for anything to rescue (a read, run for real so the
    // rescue itself follows); the rescue writes, and is only explained.
    () =>
      x.capture('rescueLapsedLeases', (db) => rescueLapsedLeases(db, schema), {
        real: (text) => text.trimStart().startsWith('SELECT EXISTS'),
      }),
  ],
  [
    'readGauges (maintenance leader, every few seconds)',
    'live entries (backlog + work in flight), deferred, dead letters',
    () => x.capture('readGauges', (db) => readGauges(db, schema), { real: true }),
  ],
  [
    'getTask: a running task',
    'point read by id in deferred, dead_letters and ready (+ leased_entries)',
    () => x.capture('getTask (running)', (db) => getTask(db, schema, live[5]!.id), { real: true }),
  ],
];
// One claimed-and-completed task, one never claimed.
const [completedId, readyId] = (
  await pool.query<{ id: string }>(
    `(SELECT id::text AS id FROM ${S}.ready ORDER BY lane_id, lane_seq LIMIT 1)
     UNION ALL (SELECT id::text FROM ${S}.ready ORDER BY lane_id DESC, lane_seq DESC LIMIT 1)`,
  )
).rows.map((r) => r.id);
cases.push(
  [
    'getTask: a completed task',
    'as above',
    () => x.capture('getTask (completed)', (db) => getTask(db, schema, completedId!), { real: true }),
  ],
  [
    'getTask: a ready task',
    'as above',
    () => x.capture('getTask (ready)', (db) => getTask(db, schema, readyId!), { real: true }),
  ],
  [
    'attemptsOf: a completed task’s attempts (attempt history)',
    'one probe of the history’s bucket index per partition, then the `= ANY (ids)` recheck',
    () => x.capture('attemptsOf', (db) => attemptsOf(db, schema, completedId!), { real: true }),
  ],
  [
    'listAttempts: the newest failures of one type (the dashboard’s Attempts page)',
    'the settled_at index backwards across partitions, stopping at the page',
    () =>
      x.capture('listAttempts', (db) => listAttempts(db, schema, { type: 'noop', outcome: 'failure' }), {
        real: true,
      }),
  ],
);
const version = (await pool.query<{ server_version: string }>('SHOW server_version')).rows[0]!.server_version;
const fmt = (n: number) => n.toLocaleString('en-US');
let out =
  `# EXPLAIN of the hot statements\n\n` +
  `Generated by \`npx tsx scripts/explain-hot.ts\` on ${new Date().toISOString().slice(0, 10)} (PostgreSQL ${version}).\n` +
  `Data: 200,000 ready entries in 16 lanes, 100,000 of them leased and completed, 1,000 failed into the dead letters, ` +
  `attempt history on (the default: the settling statements below include its insert), ` +
  `${lapsed.length} leased with a lapsed deadline, ${live.length} running, 20,000 deferred (10,000 due); all through the ` +
  `real claim, complete and fail functions, then ANALYZE. ` +
  `Rows: ${counts.map((c) => `${c.t} ${fmt(Number(c.n))}`).join(', ')}.\n\n` +
  `Method: the production functions run against a Queryable that, for each statement they send, runs ` +
  `\`PREPARE\` of its text and \`EXPLAIN (ANALYZE, BUFFERS) EXECUTE\` with its values in a rolled-back transaction ` +
  `(scripts/explain-capture.ts), on a session with the worker's options \`${SESSION_OPTIONS}\`: the plans are the ` +
  `generic plans the worker runs. Writes are rolled back, so each statement sees the data set above. ` +
  `Plans leave out the nodes that never ran and \`Heap Fetches: 0\`. "Rows visited" sums, over the scan nodes, the rows ` +
  `returned plus those a filter removed, times loops.\n`;
for (const [title, expect, run] of cases) {
  const before = x.captured.length;
  await run();
  const mine = x.captured.slice(before);
  mine.forEach((c, i) => {
    const s = summarise(c.plan);
    const name = mine.length > 1 ? `${title} (${i + 1}/${mine.length})` : title;
    const widest = s.widest.map((w) => `${w.node} ${fmt(w.rows)}`).join(', ');
    out +=
      `\n## ${name}\n\n` +
      `Reading: ${s.execMs.toFixed(2)} ms, ${fmt(s.buffers.hit + s.buffers.read)} buffers, ${fmt(s.rowsVisited)} rows visited ` +
      `(widest: ${widest || 'none'}); ${s.access}. Expected: ${expect}.\n\n` +
      `\`\`\`\n${readable(c.plan).join('\n')}\n\`\`\`\n`;
    console.log(`${name}: ${s.execMs.toFixed(2)} ms, ${fmt(s.rowsVisited)} rows visited; ${widest}`);
  });
}
await client.end();
writeFileSync(new URL('../docs/explain.md', import.meta.url), out);
if (!process.env.KEEP_SCHEMA) await pool.query(`DROP SCHEMA ${S} CASCADE`);
await pool.end();
