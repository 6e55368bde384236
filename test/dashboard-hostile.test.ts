import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import pg from 'pg';
import { enqueue, leaderInfo, listWorkers } from '../src/index.js';
import { startDashboard } from '../src/dashboard/index.js';
import { MAX_QUEUE_NAME_BYTES, MAX_TASK_TYPE_CHARS } from '../src/dashboard/params.js';
import { pruneOperatorHistory } from '../src/maintenance/retention.js';
import { LEADER_LOCK, leaderApplicationName, schemaLockKey } from '../src/storage/locks.js';
import { captureLogger, DATABASE_URL, freshSchema } from './helpers.js';
import { httpCall, type Reply, type RequestOptions } from './support/http.js';

/**
 * What the runtime role can write (any `workers` row, any time in the tables it inserts into),
 * and what any client can send (NUL bytes, over-long names): the dashboard answers 200 with
 * what it can show, or 400 with the reason; never 500.
 */
const { schema, pool } = await freshSchema('dashhostile');
const S = `"${schema}"`;
const { logger, lines } = captureLogger();
// On the file's own pool: one of its own would be named "berth dashboard", which dashboard.test.ts
// counts as the worker's while files run in parallel.
const d = await startDashboard({ pool, schema, port: 0, logger });
after(() => d.close());

const at = (url: string, path: string, opts: RequestOptions = {}): Promise<Reply> => httpCall(`${url}${path}`, opts);

const call = (path: string, opts: RequestOptions = {}) => at(d.url, path, opts);

const csrf = async () => (await call('api/session')).json().csrf as string;
const post = async (path: string, body: string, type = 'application/json') =>
  call(path, { method: 'POST', headers: { 'content-type': type, 'x-berth-csrf': await csrf() }, body });

const READS = ['', 'api/overview', 'api/lanes', 'api/tasks', 'api/dead', 'api/queues', 'api/maintenance'];

async function forge(
  workerId: string,
  maintenance: string,
  lastSeen = "now() + interval '10 years'",
  leader = true,
): Promise<void> {
  await pool.query(
    `INSERT INTO ${S}.workers (worker_id, host, pid, queues, slots, busy, prefetched, leader, maintenance, started_at, last_seen_at)
     VALUES ($1, 'forged-host', 1, NULL, 4, 0, 0, $2, $3::jsonb, now(), ${lastSeen})`,
    [workerId, leader, maintenance],
  );
}

test('a forged workers row (leader = true, ten years ahead, malformed maintenance) never breaks a read and is never shown as the leader', async () => {
  const reports = [
    '"garbage"',
    '[1,2]',
    '{"branches": 5}',
    '{"branches": {"promote": 1}}',
    '{"waitingLanes": "x"}',
    '{"waitingLanes": [null]}',
    '{"contention": [{"queue": 1}]}',
    'null',
  ];
  // One at a time (the leader read picks one row, so each must be the only one), then all together.
  for (const [i, report] of reports.entries()) {
    await pool.query(`DELETE FROM ${S}.workers`);
    await forge(`forged-${i}`, report);
    for (const path of ['api/lanes', 'api/maintenance', 'api/overview']) {
      const r = await call(path);
      assert.equal(r.status, 200, `${report} on ${path}: ${r.body.slice(0, 300)}`);
    }
  }
  await pool.query(`DELETE FROM ${S}.workers`);
  for (const [i, report] of reports.entries()) await forge(`forged-${i}`, report);
  for (const path of READS) {
    const r = await call(path);
    assert.equal(r.status, 200, `${path}: ${r.body.slice(0, 300)}`);
  }
  const m = (await call('api/maintenance')).json() as {
    leader: { session: unknown; worker: unknown };
    workers: { workerId: string; leader: boolean; alive: boolean; invalid: string | null }[];
  };
  assert.equal(m.leader.session, null);
  assert.equal(m.leader.worker, null, 'a row saying leader = true is not the leader');
  assert.equal(m.workers.length, reports.length);
  for (const w of m.workers) {
    assert.equal(w.leader, false, w.workerId);
    assert.equal(w.alive, false, `${w.workerId}: a heartbeat from the future is not alive`);
    assert.match(String(w.invalid), /dated in the future/);
  }
  assert.match(String(m.workers.find((w) => w.workerId === 'forged-2')?.invalid), /malformed branches/);
  assert.match(String(m.workers.find((w) => w.workerId === 'forged-0')?.invalid), /not a JSON object/);
  const overview = (await call('api/overview')).json() as { workers: { alive: number }; leader: unknown };
  assert.deepEqual([overview.workers.alive, overview.leader], [0, null]);
  // Logged once per row, not on every refresh.
  await call('api/maintenance');
  const logged = lines.filter(
    (l) => l.msg === 'a workers row could not be read as written (shown without the bad parts)',
  );
  assert.equal(logged.length, reports.length, JSON.stringify(logged.map((l) => l.worker)));

  // Retention removes rows dated in the future (and the one with a report that is null is just empty).
  const pruned = await pruneOperatorHistory(pool, schema);
  assert.equal(pruned.workers, reports.length);
  await forge('stale-infinite', '{}', "'-infinity'");
  await forge('future-infinite', '{}', "'infinity'");
  assert.equal((await call('api/maintenance')).status, 200);
  assert.equal((await pruneOperatorHistory(pool, schema)).workers, 2);
});

test('the leader is the worker whose session holds the leader lock, not a later row that says leader = true', async () => {
  await pool.query(`DELETE FROM ${S}.workers`);
  const holder = new pg.Client({
    connectionString: DATABASE_URL,
    application_name: leaderApplicationName('real-leader'),
  });
  await holder.connect();
  try {
    await holder.query('SELECT pg_advisory_lock($1, $2)', [schemaLockKey(schema), LEADER_LOCK]);
    await forge('real-leader', '{"branches": {}, "waitingLanes": [], "contention": []}', 'now()');
    await pool.query(`UPDATE ${S}.workers SET started_at = now() - interval '1 hour'`);
    await forge('impostor', '{"waitingLanes": [{"queue": "q", "priority": 0, "shard": 0}]}', 'now()');
    const info = await leaderInfo(pool, schema);
    assert.equal(info.worker?.workerId, 'real-leader');
    assert.deepEqual(
      (await listWorkers(pool, schema)).map((w) => [w.workerId, w.leader, w.invalid]),
      [
        ['impostor', false, null],
        ['real-leader', true, null],
      ],
    );
    const lanes = (await call('api/lanes')).json() as { leader: string; waitingLanes: unknown[] };
    assert.deepEqual([lanes.leader, lanes.waitingLanes], ['real-leader', []], "the impostor's waiters are not shown");
  } finally {
    await holder.end();
    await pool.query(`DELETE FROM ${S}.workers`);
  }
});

test('infinite times written by the runtime role (run_at, minute, died_at) leave every read answering 200', async () => {
  const { id } = await enqueue(pool, 'inf.task', {}, { schema, queue: 'inf', delay: 60_000 });
  await pool.query(`UPDATE ${S}.deferred SET run_at = '-infinity' WHERE id = $1`, [id]);
  await pool.query(
    `INSERT INTO ${S}.outcome_counts (minute, worker_id, queue, type, outcome, count)
     VALUES ('infinity', 'w', 'inf', 'inf.task', 'success', 1), (now() + interval '1 day', 'w', 'inf', 'inf.task', 'success', 1),
            (date_trunc('minute', now()), 'w', 'inf', 'inf.task', 'failure', -5)`,
  );
  const dead = await enqueue(pool, 'inf.dead', {}, { schema, queue: 'inf', delay: 60_000 });
  await pool.query(
    `WITH moved AS (DELETE FROM ${S}.deferred WHERE id = $1 RETURNING *)
     INSERT INTO ${S}.dead_letters (id, type, payload, queue, priority, shard, attempts, last_error, created_at, last_attempted_at, died_at)
     SELECT id, type, payload, queue, priority, shard, 1, 'x', '-infinity', 'infinity', 'infinity' FROM moved`,
    [dead.id],
  );
  for (const path of [
    ...READS,
    `api/tasks/${id}`,
    `api/tasks/${dead.id}`,
    'api/tasks?queue=inf',
    'api/dead?queue=inf',
  ]) {
    const r = await call(path);
    assert.equal(r.status, 200, `${path}: ${r.body.slice(0, 300)}`);
  }
  const overview = (await call('api/overview')).json() as { throughput: { failed: number; completed: number }[] };
  assert.ok(
    overview.throughput.every((p) => p.failed >= 0 && p.completed >= 0),
    'a negative count is left out',
  );
  assert.equal((await pruneOperatorHistory(pool, schema)).outcomeCounts >= 2, true, 'counts dated ahead are pruned');
});

test('NUL bytes in paths, query parameters and bodies answer 400 on every route family, with a JSON reason', async () => {
  const cases: [string, () => Promise<Reply>][] = [
    ['page path', () => call('%00')],
    ['page query', () => call('?x=%00')],
    ['asset path', () => call('assets/app.js%00')],
    ['asset query', () => call('assets/app.js?v=a%00b')],
    ['api path', () => call('api/tasks/1%00')],
    ['api query', () => call('api/tasks?queue=a%00b')],
    ['api query name', () => call('api/dead?a%00=1')],
    ['action path', async () => post('api/queues/a%00b/pause', '{}')],
    ['action body', async () => post('api/queues/q/pause', JSON.stringify({ reason: 'a\u0000b' }))],
    ['action body key', async () => post('api/dead/purge', JSON.stringify({ queue: 'q', 'x\u0000': 1 }))],
    ['action body raw', async () => post('api/dead/purge', '{"queue": "q"}\u0000')],
    ['bulk task ids', async () => post('api/tasks/bulk/cancel', JSON.stringify({ ids: ['1\u0000'] }))],
  ];
  // The login form and the Basic link exist when auth is configured.
  const authed = await startDashboard({
    pool,
    schema,
    port: 0,
    logger,
    auth: { token: 'tok-0123456789abcdef', users: { alice: 'wonderland-42' } },
  });
  after(() => authed.close());
  cases.push(
    [
      'login body',
      () =>
        at(authed.url, 'login', {
          method: 'POST',
          headers: { 'content-type': 'application/x-www-form-urlencoded' },
          body: 'token=a%00b',
        }),
    ],
    ['login query', () => at(authed.url, 'login?next=%00')],
    ['basic query', () => at(authed.url, 'basic?next=%00')],
  );
  for (const [what, send] of cases) {
    const r = await send();
    assert.equal(r.status, 400, `${what}: ${r.status} ${r.body.slice(0, 200)}`);
    assert.match(String(r.json().error), /NUL/, what);
  }
  // A raw NUL in the request line never reaches the handler: Node's parser answers 400 itself.
  const raw = await new Promise<string>((resolve, reject) => {
    const { port } = new URL(d.url);
    const socket = connect(Number(port), '127.0.0.1', () =>
      socket.end('GET /api/tasks?q=a\u0000b HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n'),
    );
    let text = '';
    socket.on('data', (c) => (text += c.toString()));
    socket.on('close', () => resolve(text));
    socket.on('error', reject);
  });
  assert.match(raw, /^HTTP\/1\.1 400/);
  assert.equal(lines.filter((l) => l.msg === 'dashboard request failed').length, 0, 'nothing reached the 500 path');
});

test('names over the documented limits answer 400 naming the limit, on reads and actions', async () => {
  const longQueue = 'q'.repeat(MAX_QUEUE_NAME_BYTES + 1);
  const wideQueue = 'é'.repeat(MAX_QUEUE_NAME_BYTES / 2 + 1); // within the characters, over the bytes
  const longType = 't'.repeat(MAX_TASK_TYPE_CHARS + 1);
  const queueLimit = new RegExp(`queue .*at most ${MAX_QUEUE_NAME_BYTES} bytes`);
  const typeLimit = new RegExp(`type .*at most ${MAX_TASK_TYPE_CHARS} characters`);
  const cases: [string, () => Promise<Reply>, RegExp][] = [
    ['pause path', () => post(`api/queues/${longQueue}/pause`, '{}'), queueLimit],
    ['resume path (multibyte)', () => post(`api/queues/${encodeURIComponent(wideQueue)}/resume`, '{}'), queueLimit],
    ['tasks query', () => call(`api/tasks?queue=${longQueue}`), queueLimit],
    ['tasks type', () => call(`api/tasks?type=${longType}`), typeLimit],
    ['dead query', () => call(`api/dead?queue=${encodeURIComponent(wideQueue)}`), queueLimit],
    ['dead count', () => call(`api/dead/count?type=${longType}`), typeLimit],
    ['move body', async () => post('api/tasks/1/move', JSON.stringify({ queue: longQueue })), queueLimit],
    ['bulk body', async () => post('api/dead/retry', JSON.stringify({ type: longType })), typeLimit],
    [
      'bulk task ids',
      async () => post('api/tasks/bulk/retry', JSON.stringify({ ids: Array.from({ length: 501 }, (_, i) => i + 1) })),
      /ids must be a list of 1 to 500 task ids/,
    ],
    [
      'bulk task id',
      async () => post('api/tasks/bulk/cancel', JSON.stringify({ ids: ['9'.repeat(5000)] })),
      /bad task id/,
    ],
    ['path segment', () => call(`api/tasks/${'9'.repeat(5000)}`), /bad task id/],
  ];
  for (const [what, send, reason] of cases) {
    const r = await send();
    assert.equal(r.status, 400, `${what}: ${r.status} ${r.body.slice(0, 200)}`);
    assert.match(String(r.json().error), reason, what);
  }
  // At the limit is fine.
  assert.equal((await post(`api/queues/${'q'.repeat(MAX_QUEUE_NAME_BYTES)}/pause`, '{}')).status, 200);
  assert.equal((await call(`api/tasks?type=${'t'.repeat(MAX_TASK_TYPE_CHARS)}`)).status, 200);
});
