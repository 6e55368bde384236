import { afterEach, test } from 'node:test';
import assert from 'node:assert/strict';
import { Registry, Counter } from 'prom-client';
import {
  BerthInputError,
  defineTask,
  enqueue,
  enqueueMany,
  getTask,
  listKeyLimits,
  listQueueLimits,
  listQueues,
  listTypeLimits,
  pauseQueue,
  resumeQueue,
  setQueueLimit,
  Worker,
} from '../src/index.js';
import { promoteDue } from '../src/maintenance-api.js';
import { claim } from '../src/processor/claim.js';
import { claimParams } from './claim-params.js';
import {
  createDashboardHandler,
  dashboardOptionsFromEnv,
  startDashboard,
  type DashboardOptions,
} from '../src/dashboard/index.js';
import { listen } from '../src/http/listen.js';
import { ContentionTally } from '../src/maintenance/promoter.js';
import {
  captureLogger,
  DATABASE_URL,
  FAST_MAINTENANCE,
  freshSchema,
  holdLaneLock,
  testLogger,
  waitFor,
} from './helpers.js';
import { httpCall, type Reply } from './support/http.js';

const { schema, pool } = await freshSchema('dashboard');
const S = `"${schema}"`;

const call = httpCall;

// Each test's dashboards close when it ends: left open to the file's end, their pools (up to four
// sessions each, a test or two apiece) held over fifty of the shared server's connections at once.
const servers: { close(): Promise<void> }[] = [];
afterEach(async () => {
  for (let s = servers.pop(); s !== undefined; s = servers.pop()) await s.close();
});

async function dashboard(opts: Partial<DashboardOptions> = {}): Promise<string> {
  const d = await startDashboard({ connectionString: DATABASE_URL, schema, port: 0, logger: testLogger, ...opts });
  servers.push(d);
  return d.url;
}

const basic = (user: string, pass: string) => `Basic ${Buffer.from(`${user}:${pass}`).toString('base64')}`;

/** The CSRF token the page for these credentials carries. */
async function csrfFor(url: string, headers: Record<string, string> = {}): Promise<string> {
  const r = await call(`${url}api/session`, { headers });
  assert.equal(r.status, 200, r.body);
  return r.json().csrf as string;
}

function post(url: string, headers: Record<string, string>, body: unknown = {}): Promise<Reply> {
  return call(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
}

/** A list /api/queues answers (`limits`, `typeLimits`, `keyLimits`), each row's updatedAt replaced by its type. */
async function queuesList(url: string, list: string): Promise<Record<string, unknown>[]> {
  const rows = (await call(`${url}api/queues`)).json()[list] as Record<string, unknown>[];
  return rows.map(({ updatedAt, ...l }) => ({ ...l, updatedAt: typeof updatedAt }));
}

const AUTH = { token: 'tok-0123456789abcdef', users: { alice: 'wonderland-42', bob: 'builder-bob-7' } };

test('with auth configured every page and API call needs it: 401 without, 200 with a bearer token or Basic credentials', async () => {
  const url = await dashboard({ auth: AUTH });
  const none = await call(`${url}api/overview`);
  assert.equal(none.status, 401);
  assert.match(String(none.headers['www-authenticate']), /^Basic realm="berth dashboard"/);
  assert.deepEqual(none.json(), { error: 'authentication required' });
  assert.equal((await call(url)).status, 401, 'the page too (it shows the login form)');
  assert.equal((await call(`${url}api/overview`, { headers: { authorization: 'Bearer wrong' } })).status, 401);
  assert.equal((await call(`${url}api/overview`, { headers: { authorization: basic('alice', 'nope') } })).status, 401);
  assert.equal(
    (await call(`${url}api/overview`, { headers: { authorization: basic('mallory', 'wonderland') } })).status,
    401,
  );

  const bearer = await call(`${url}api/overview`, { headers: { authorization: `Bearer ${AUTH.token}` } });
  assert.equal(bearer.status, 200, bearer.body);
  const viaBasic = await call(`${url}api/session`, { headers: { authorization: basic('alice', 'wonderland-42') } });
  assert.equal(viaBasic.status, 200);
  assert.equal(viaBasic.json().actor, 'dashboard:alice');
  const page = await call(url, { headers: { authorization: basic('bob', 'builder-bob-7') } });
  assert.equal(page.status, 200);
  assert.match(page.body, /<meta name="berth-csrf" content="[A-Za-z0-9_-]{20,}">/);
  // The assets hold no data: the login page needs them before anyone logs in.
  assert.equal((await call(`${url}assets/app.css`)).status, 200);
});

test('the login form sets an HttpOnly SameSite=Strict session cookie (a random id, not the token) that works for pages and actions', async () => {
  const url = await dashboard({ auth: { token: AUTH.token } });
  const form = { 'content-type': 'application/x-www-form-urlencoded' };
  const wrong = await call(`${url}login`, { method: 'POST', headers: form, body: 'token=nope' });
  assert.equal(wrong.status, 401);
  assert.equal(wrong.headers['set-cookie'], undefined);

  const ok = await call(`${url}login`, {
    method: 'POST',
    headers: form,
    body: `token=${encodeURIComponent(AUTH.token)}`,
  });
  assert.equal(ok.status, 303);
  const setCookie = String(ok.headers['set-cookie']);
  assert.match(setCookie, /^berth_session=[A-Za-z0-9_-]{40,};/);
  assert.match(setCookie, /HttpOnly/);
  assert.match(setCookie, /SameSite=Strict/);
  assert.ok(!setCookie.includes(AUTH.token), 'the cookie never carries the token');
  const cookie = setCookie.split(';')[0]!;

  const page = await call(url, { headers: { cookie } });
  assert.equal(page.status, 200);
  assert.match(page.body, /id="logout"/);
  const csrf = await csrfFor(url, { cookie });
  const act = await post(`${url}api/queues/login-q/pause`, { cookie, 'x-berth-csrf': csrf });
  assert.equal(act.status, 200, act.body);
  assert.equal((await listQueues(pool, schema)).find((q) => q.queue === 'login-q')?.pausedBy, 'dashboard:token');

  assert.equal((await call(`${url}api/overview`, { headers: { cookie: 'berth_session=forged' } })).status, 401);
  const out = await call(`${url}logout`, { method: 'POST', headers: { cookie, 'x-berth-csrf': csrf } });
  assert.equal(out.status, 303);
  assert.equal((await call(`${url}api/overview`, { headers: { cookie } })).status, 401, 'logged out');
});

test('token and Basic both configured: a page shows the login form (no Basic prompt first) with a Basic sign-in link; logging in keeps the #/route', async () => {
  const url = await dashboard({ auth: AUTH });
  const page = await call(url);
  assert.equal(page.status, 401);
  assert.equal(page.headers['www-authenticate'], undefined, 'no browser prompt before the form');
  assert.match(page.body, /name="token"/);
  assert.match(page.body, /<a id="basic-login" href="\/basic">/);
  assert.match(page.body, /<script src="\/assets\/login.js" defer><\/script>/);
  assert.equal((await call(`${url}assets/login.js`)).status, 200);
  assert.match(
    String((await call(`${url}api/overview`)).headers['www-authenticate']),
    /^Basic /,
    'scripts still get the challenge',
  );

  const challenge = await call(`${url}basic?next=${encodeURIComponent('#/dead?queue=billing')}`);
  assert.equal(challenge.status, 401);
  assert.match(String(challenge.headers['www-authenticate']), /^Basic realm="berth dashboard"/);
  const signedIn = await call(`${url}basic?next=${encodeURIComponent('#/dead?queue=billing')}`, {
    headers: { authorization: basic('alice', 'wonderland-42') },
  });
  assert.equal(signedIn.status, 303);
  assert.equal(signedIn.headers.location, '/#/dead?queue=billing');

  const form = { 'content-type': 'application/x-www-form-urlencoded' };
  const login = (next: string) =>
    call(`${url}login`, {
      method: 'POST',
      headers: form,
      body: `token=${encodeURIComponent(AUTH.token)}&next=${encodeURIComponent(next)}`,
    });
  assert.equal((await login('#/tasks/42')).headers.location, '/#/tasks/42');
  for (const bad of ['//evil.example/', 'https://evil.example/#/x', '#/x\r\nset-cookie: a=b', '/#/x']) {
    const r = await login(bad);
    assert.equal(r.status, 303);
    assert.equal(r.headers.location, '/', `next ${JSON.stringify(bad)} is ignored`);
  }
});

test('a wildcard bind (0.0.0.0) reports a URL a browser can open', async () => {
  const d = await startDashboard({
    connectionString: DATABASE_URL,
    schema,
    port: 0,
    host: '0.0.0.0',
    auth: { token: AUTH.token },
    logger: testLogger,
  });
  servers.push(d);
  assert.match(d.url, /^http:\/\/127\.0\.0\.1:\d+\/$/);
  assert.equal((await call(`${d.url}api/session`, { headers: { authorization: `Bearer ${AUTH.token}` } })).status, 200);
});

test('without auth the dashboard refuses a non-loopback address, warns, and answers loopback Host headers only', async () => {
  await assert.rejects(startDashboard({ pool, schema, port: 0, host: '0.0.0.0', logger: testLogger }), (err: Error) => {
    assert.ok(err instanceof BerthInputError);
    assert.match(err.message, /no authentication.*BERTH_DASHBOARD_TOKEN/s);
    return true;
  });
  const { logger, lines } = captureLogger();
  const url = await dashboard({ logger });
  assert.ok(
    lines.some((l) => l.msg === 'dashboard has no authentication; bound to 127.0.0.1 only'),
    JSON.stringify(lines),
  );
  const session = await call(`${url}api/session`);
  assert.equal(session.status, 200);
  assert.equal(session.json().actor, 'dashboard:local');
  const port = new URL(url).port;
  const rebound = await call(`${url}api/overview`, { headers: { host: `evil.example:${port}` } });
  assert.equal(rebound.status, 403, 'a page on another site cannot reach it by DNS rebinding');
});

test('CSRF: an action needs POST, the x-berth-csrf token, and a matching Origin; GET never acts', async () => {
  const url = await dashboard({ auth: AUTH });
  const auth = { authorization: basic('alice', 'wonderland-42') };
  const csrf = await csrfFor(url, auth);
  const target = `${url}api/queues/csrf-q/pause`;
  const missing = await post(target, auth);
  assert.equal(missing.status, 403);
  assert.match(String(missing.json().error), /x-berth-csrf/);
  assert.equal((await post(target, { ...auth, 'x-berth-csrf': 'guess' })).status, 403);
  assert.equal(
    (
      await post(target, {
        ...auth,
        'x-berth-csrf': await csrfFor(url, { authorization: basic('bob', 'builder-bob-7') }),
      })
    ).status,
    403,
    "another user's token",
  );
  const foreign = await post(target, { ...auth, 'x-berth-csrf': csrf, origin: 'https://evil.example' });
  assert.equal(foreign.status, 403);
  assert.match(String(foreign.json().error), /cross-origin/);
  assert.equal((await post(target, { ...auth, 'x-berth-csrf': csrf, referer: 'https://evil.example/x' })).status, 403);
  assert.equal((await post(target, { ...auth, 'x-berth-csrf': csrf, origin: 'null' })).status, 403);
  assert.equal((await call(target, { headers: { ...auth, 'x-berth-csrf': csrf } })).status, 405, 'GET on an action');
  assert.equal(
    (await listQueues(pool, schema)).some((q) => q.queue === 'csrf-q'),
    false,
    'nothing happened',
  );

  const ok = await post(target, { ...auth, 'x-berth-csrf': csrf, origin: new URL(url).origin });
  assert.equal(ok.status, 200, ok.body);
});

test('an action is audited under the actor who did it', async () => {
  const url = await dashboard({ auth: AUTH });
  const auth = { authorization: basic('alice', 'wonderland-42') };
  const r = await post(
    `${url}api/queues/${encodeURIComponent('audit/q')}/pause`,
    { ...auth, 'x-berth-csrf': await csrfFor(url, auth) },
    { reason: 'incident 7' },
  );
  assert.equal(r.status, 200, r.body);
  assert.deepEqual(r.json(), { lanes: 0 });
  const row = await pool.query(
    `SELECT actor, action, target FROM ${S}.audit_log WHERE action = 'queue.pause' AND target->>'queue' = 'audit/q'`,
  );
  assert.deepEqual(row.rows, [
    { actor: 'dashboard:alice', action: 'queue.pause', target: { queue: 'audit/q', reason: 'incident 7' } },
  ]);
  const q = (await listQueues(pool, schema)).find((x) => x.queue === 'audit/q');
  assert.equal(q?.pausedBy, 'dashboard:alice');

  const maintenance = await call(`${url}api/maintenance`, { headers: auth });
  const audit = maintenance.json().audit as { actor: string; action: string }[];
  assert.ok(audit.some((a) => a.actor === 'dashboard:alice' && a.action === 'queue.pause'));
});

test('read-only: every action answers 403 with a clear error; the page says read-only', async () => {
  const url = await dashboard({ readOnly: true });
  const csrf = await csrfFor(url);
  const id = (await enqueue(pool, 'ro', {}, { schema, queue: 'ro-q' })).id!;
  for (const path of [`api/tasks/${id}/cancel`, `api/tasks/${id}/move`, 'api/dead/purge', 'api/queues/ro-q/pause']) {
    const r = await post(`${url}${path}`, { 'x-berth-csrf': csrf }, { all: true, queue: 'x' });
    assert.equal(r.status, 403, path);
    assert.match(String(r.json().error), /read-only/);
  }
  assert.equal((await getTask(pool, schema, id))?.state, 'ready');
  const page = await call(url);
  assert.match(page.body, /class="badge ro"[^>]*>read-only</);
  assert.equal((await call(`${url}api/session`)).json().readOnly, true);
});

test('bad input answers 400 with the reason; unknown routes 404; no stack traces', async () => {
  const url = await dashboard();
  for (const path of [
    'api/tasks?state=finished',
    'api/tasks?after=1%3B%20drop',
    'api/tasks?limit=0',
    'api/tasks?limit=abc',
    'api/tasks/abc',
    'api/dead?after=x',
    'api/tasks?queue=%00',
    'api/dead?type=a%00',
  ]) {
    const r = await call(`${url}${path}`);
    assert.equal(r.status, 400, `${path}: ${r.body}`);
    assert.equal(typeof r.json().error, 'string');
    assert.doesNotMatch(r.body, /at .*\.ts:\d+/);
  }
  assert.match(String((await call(`${url}api/tasks?state=finished`)).json().error), /unknown state "finished"/);
  assert.equal((await call(`${url}api/nope`)).status, 404);
  assert.equal((await call(`${url}nope`)).status, 404);
  assert.equal((await call(`${url}api/tasks/999999999`)).status, 404);
  const csrf = await csrfFor(url);
  const bulk = await post(`${url}api/dead/retry`, { 'x-berth-csrf': csrf }, {});
  assert.equal(bulk.status, 400);
  assert.match(String(bulk.json().error), /needs a filter/);
  assert.equal((await post(`${url}api/dead/purge`, { 'x-berth-csrf': csrf }, { ids: ['1; drop'] })).status, 400);
  // Ids past bigint's range (2^63 .. 10^19 - 1) look like ids but are not: 400, not a 500 from PostgreSQL.
  const big = '9999999999999999999';
  for (const path of [`api/tasks/${big}`, `api/tasks?after=${big}`, `api/dead?after=${big}`, 'api/tasks/0']) {
    const r = await call(`${url}${path}`);
    assert.equal(r.status, 400, `${path}: ${r.body}`);
    assert.match(String(r.json().error), /bad (task id|page cursor)/);
  }
  for (const action of ['retry', 'cancel', 'delete', 'move']) {
    const r = await post(`${url}api/tasks/${big}/${action}`, { 'x-berth-csrf': csrf }, { queue: 'q' });
    assert.equal(r.status, 400, `${action}: ${r.body}`);
  }
  for (const action of ['retry', 'purge']) {
    const r = await post(`${url}api/dead/${action}`, { 'x-berth-csrf': csrf }, { ids: ['1', big] });
    assert.equal(r.status, 400, `dead ${action}: ${r.body}`);
    assert.match(String(r.json().error), /bad task id/);
  }
  // Text PostgreSQL cannot store (a NUL, a lone surrogate) is refused by the checks enqueue uses.
  const id = (await enqueue(pool, 'dash_text', {}, { schema })).id!;
  for (const queue of ['x\u0000', 'x\ud800']) {
    const r = await post(`${url}api/tasks/${id}/move`, { 'x-berth-csrf': csrf }, { queue });
    assert.equal(r.status, 400, `move to ${JSON.stringify(queue)}: ${r.body}`);
    assert.match(String(r.json().error), /(queue|the request body) contains a (NUL character|lone surrogate)/);
  }
  const pause = await post(`${url}api/queues/a%00b/pause`, { 'x-berth-csrf': csrf });
  assert.equal(pause.status, 400, pause.body);
  const badJson = await call(`${url}api/dead/purge`, {
    method: 'POST',
    headers: { 'x-berth-csrf': csrf },
    body: '{nope',
  });
  assert.equal(badJson.status, 400);
});

test('queue limits through the API: set (the rate as an object or as 20/1s), listed with /api/queues, cleared, audited; bad input answers 400 naming the field', async () => {
  const url = await dashboard();
  const csrf = { 'x-berth-csrf': await csrfFor(url) };
  await enqueue(pool, 'dash_limit', {}, { schema, queue: 'api-limited' });
  const base = `${url}api/queues/api-limited/limits`;
  const set = await post(base, csrf, { maxRunning: 2, rate: '20/1s' });
  assert.equal(set.status, 200, set.body);
  assert.deepEqual(set.json(), { queue: 'api-limited', limit: { maxRunning: 2, rate: '20/1s' } });
  const changed = await post(base, csrf, { rate: { limit: 5, intervalMs: 60_000 } });
  assert.deepEqual(changed.json(), { queue: 'api-limited', limit: { maxRunning: 2, rate: '5/1m' } });
  assert.deepEqual(await queuesList(url, 'limits'), [
    {
      queue: 'api-limited',
      maxRunning: 2,
      running: 0,
      rateLimit: 5,
      rateIntervalMs: 60_000,
      rate: '5/1m',
      started: 0,
      atLimit: false,
      heldTasks: 0,
      updatedBy: 'dashboard:local',
      updatedAt: 'string',
    },
  ]);

  const bad: [string, unknown, RegExp][] = [
    [base, {}, /a limit needs maxRunning, rate, or both/],
    [base, { maxRunning: 0 }, /maxRunning must be an integer from 1 to 1000000 \(got 0\)/],
    [base, { maxRunning: -1 }, /maxRunning must be an integer from 1/],
    [base, { maxRunning: 2.5 }, /maxRunning must be an integer/],
    [base, { maxRunning: 'many' }, /maxRunning must be an integer from 1 to 1000000 \(got "many"\)/],
    [base, { rate: '20' }, /rate must be a count and an interval with its unit, such as 20\/1s/],
    [base, { rate: '0/1s' }, /rate's count must be an integer from 1/],
    [base, { rate: '5/2d' }, /rate must be a count and an interval.*expected a duration/],
    [base, { rate: { limit: 5 } }, /rate\.intervalMs must be an integer/],
    [base, { rate: 5 }, /rate must be an object \{ limit, intervalMs \} or null/],
    [base, { concurrency: 3 }, /unknown option "concurrency"; did you mean "maxRunning"\?/],
    [`${url}api/queues/no-such-queue/limits`, { maxRunning: 1 }, /queue "no-such-queue" does not exist/],
    [`${url}api/queues/${'q'.repeat(300)}/limits`, { maxRunning: 1 }, /queue must be a name of at most 255 bytes/],
    [`${url}api/queues/a%00b/limits`, { maxRunning: 1 }, /the path contains a NUL byte/],
    [`${base}/clear`, { force: true }, /unknown field "force" in a limit clear/],
  ];
  for (const [path, body, message] of bad) {
    const r = await post(path, csrf, body);
    assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.body}`);
    assert.match(String(r.json().error), message, JSON.stringify(body));
  }
  const [kept] = await listQueueLimits(pool, schema);
  assert.deepEqual([kept?.maxRunning, kept?.rateLimit, kept?.rateIntervalMs], [2, 5, 60_000]);

  const cleared = await post(`${base}/clear`, csrf);
  assert.deepEqual(cleared.json(), { queue: 'api-limited', cleared: true });
  assert.deepEqual((await post(`${base}/clear`, csrf)).json(), { queue: 'api-limited', cleared: false });
  assert.deepEqual((await call(`${url}api/queues`)).json().limits, []);
  const audit = await pool.query(
    `SELECT actor, action, target FROM ${S}.audit_log
      WHERE target->>'queue' = 'api-limited' AND NOT result ? 'error' ORDER BY id`,
  );
  assert.deepEqual(audit.rows, [
    {
      actor: 'dashboard:local',
      action: 'queue.limit',
      target: { queue: 'api-limited', maxRunning: 2, rate: { limit: 20, intervalMs: 1000 } },
    },
    {
      actor: 'dashboard:local',
      action: 'queue.limit',
      target: { queue: 'api-limited', rate: { limit: 5, intervalMs: 60_000 } },
    },
    { actor: 'dashboard:local', action: 'queue.unlimit', target: { queue: 'api-limited' } },
    { actor: 'dashboard:local', action: 'queue.unlimit', target: { queue: 'api-limited' } },
  ]);
  const readOnly = await dashboard({ readOnly: true });
  const refused = await post(
    `${readOnly}api/queues/api-limited/limits`,
    { 'x-berth-csrf': await csrfFor(readOnly) },
    { maxRunning: 1 },
  );
  assert.equal(refused.status, 403);
});

test('key limits through the API: set, changed and cleared (audited), listed with the held keys by /api/queues; bad input answers 400 naming the field; CSRF and read-only as every action', async () => {
  const url = await dashboard();
  const csrf = { 'x-berth-csrf': await csrfFor(url) };
  await enqueueMany(
    pool,
    [1, 2, 3].map((i) => ({ type: 'dash_key', payload: { i }, queue: 'api-keyed', concurrencyKey: 'tenant-a' })),
    { schema },
  );
  const base = `${url}api/keys/limits`;
  const set = await post(base, csrf, { queue: 'api-keyed', perKey: 2 });
  assert.equal(set.status, 200, set.body);
  assert.deepEqual(set.json(), { keyLimit: { scope: 'queue', name: 'api-keyed', perKey: 2 } });
  const byType = await post(base, csrf, { type: 'dash_key', perKey: 3 });
  assert.deepEqual(byType.json(), { keyLimit: { scope: 'type', name: 'dash_key', perKey: 3 } });
  const queues = (await call(`${url}api/queues`)).json() as {
    keyLimits: Record<string, unknown>[];
    heldKeys: Record<string, unknown>[];
  };
  assert.deepEqual(
    queues.keyLimits.map(({ updatedAt, ...l }) => ({ ...l, updatedAt: typeof updatedAt })),
    [
      { scope: 'queue', name: 'api-keyed', perKey: 2, updatedBy: 'dashboard:local', updatedAt: 'string' },
      { scope: 'type', name: 'dash_key', perKey: 3, updatedBy: 'dashboard:local', updatedAt: 'string' },
    ],
  );
  const held = queues.heldKeys.find((k) => k.key === 'tenant-a');
  assert.deepEqual([held?.held, held?.running, typeof held?.since], [3, 0, 'string']);

  const bad: [string, unknown, RegExp][] = [
    [base, { queue: 'api-keyed' }, /a key limit needs perKey/],
    [base, { queue: 'api-keyed', perKey: 0 }, /perKey must be an integer from 1 to 1000000 \(got 0\)/],
    [base, { queue: 'api-keyed', perKey: 2.5 }, /perKey must be an integer/],
    [base, { queue: 'api-keyed', perKey: 'many' }, /perKey must be an integer from 1 to 1000000 \(got "many"\)/],
    [base, { perKey: 2 }, /the target names exactly one of queue or type/],
    [base, { queue: 'a', type: 'b', perKey: 2 }, /exactly one of queue or type/],
    [base, { taskType: 'x', perKey: 2 }, /unknown option "taskType"; did you mean "type"\?/],
    [base, { queue: 'q'.repeat(300), perKey: 2 }, /queue must be a string of at most 255 UTF-8 bytes/],
    [`${base}/clear`, {}, /clearKeyLimit: the target names exactly one of queue or type/],
    [`${base}/clear`, { queue: 'api-keyed', force: true }, /unknown option "force"/],
  ];
  for (const [path, body, message] of bad) {
    const r = await post(path, csrf, body);
    assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.body}`);
    assert.match(String(r.json().error), message, JSON.stringify(body));
  }
  assert.deepEqual(
    (await listKeyLimits(pool, schema)).map((l) => [l.scope, l.name, l.perKey]),
    [
      ['queue', 'api-keyed', 2],
      ['type', 'dash_key', 3],
    ],
  );
  const noCsrf = await post(base, {}, { queue: 'api-keyed', perKey: 9 });
  assert.equal(noCsrf.status, 403);

  assert.deepEqual((await post(`${base}/clear`, csrf, { queue: 'api-keyed' })).json(), { keyLimitCleared: true });
  assert.deepEqual((await post(`${base}/clear`, csrf, { queue: 'api-keyed' })).json(), { keyLimitCleared: false });
  assert.deepEqual((await post(`${base}/clear`, csrf, { type: 'dash_key' })).json(), { keyLimitCleared: true });
  assert.deepEqual((await call(`${url}api/queues`)).json().keyLimits, []);
  const audit = await pool.query(
    `SELECT actor, action, target FROM ${S}.audit_log
      WHERE action LIKE 'key.%' AND NOT result ? 'error' ORDER BY id`,
  );
  assert.deepEqual(
    audit.rows.map((r) => [r.actor, r.action, r.target]),
    [
      ['dashboard:local', 'key.limit', { queue: 'api-keyed', perKey: 2 }],
      ['dashboard:local', 'key.limit', { type: 'dash_key', perKey: 3 }],
      ['dashboard:local', 'key.unlimit', { queue: 'api-keyed' }],
      ['dashboard:local', 'key.unlimit', { queue: 'api-keyed' }],
      ['dashboard:local', 'key.unlimit', { type: 'dash_key' }],
    ],
  );
  const readOnly = await dashboard({ readOnly: true });
  const refused = await post(base, { 'x-berth-csrf': await csrfFor(readOnly) }, { queue: 'api-keyed', perKey: 1 });
  assert.equal(refused.status, 403);
  assert.deepEqual(await listKeyLimits(pool, schema), []);
});

test('task type rate limits through the API: set (the rate as 20/1s or as an object), listed with /api/queues, cleared, audited; bad input answers 400 naming the field and changes nothing', async () => {
  const url = await dashboard();
  const csrf = { 'x-berth-csrf': await csrfFor(url) };
  // A type needs no task yet: a limit can be set before the type is deployed.
  const base = `${url}api/types/dash_rated/limits`;
  const set = await post(base, csrf, { rate: '20/1s' });
  assert.equal(set.status, 200, set.body);
  assert.deepEqual(set.json(), { type: 'dash_rated', limit: { rate: '20/1s' } });
  const changed = await post(base, csrf, { rate: { limit: 5, intervalMs: 60_000 } });
  assert.deepEqual(changed.json(), { type: 'dash_rated', limit: { rate: '5/1m' } });
  assert.deepEqual(await queuesList(url, 'typeLimits'), [
    {
      type: 'dash_rated',
      rateLimit: 5,
      rateIntervalMs: 60_000,
      rate: '5/1m',
      started: 0,
      refused: 0,
      paced: 0,
      atLimit: false,
      updatedBy: 'dashboard:local',
      updatedAt: 'string',
    },
  ]);

  const bad: [string, unknown, RegExp][] = [
    [base, {}, /a type limit needs rate, such as 20\/1s/],
    [base, { rate: null }, /a type limit needs rate/],
    [base, { rate: '' }, /rate must be a count and an interval with its unit, such as 20\/1s/],
    [base, { rate: '20' }, /rate must be a count and an interval with its unit, such as 20\/1s/],
    [base, { rate: '0/1s' }, /rate's count must be an integer from 1/],
    [base, { rate: '5/2d' }, /rate must be a count and an interval.*expected a duration/],
    [base, { rate: { limit: 5 } }, /rate\.intervalMs must be an integer/],
    [base, { rate: 5 }, /rate must be an object \{ limit, intervalMs \} or null/],
    [base, { rate: '5/1s', maxRunning: 2 }, /unknown field "maxRunning" in a type limit \(only rate\)/],
    [
      `${url}api/types/${'t'.repeat(201)}/limits`,
      { rate: '5/1s' },
      /type must be a task type of at most 200 characters, got 201/,
    ],
    [`${url}api/types/${'t'.repeat(201)}/limits/clear`, {}, /type must be a task type of at most 200 characters/],
    [`${url}api/types/a%00b/limits`, { rate: '5/1s' }, /the path contains a NUL byte/],
    [`${base}/clear`, { force: true }, /unknown field "force" in a type limit clear \(it takes none\)/],
  ];
  for (const [path, body, message] of bad) {
    const r = await post(path, csrf, body);
    assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.body}`);
    assert.match(String(r.json().error), message, JSON.stringify(body));
  }
  const noCsrf = await post(base, {}, { rate: '9/1s' });
  assert.equal(noCsrf.status, 403);
  const readOnly = await dashboard({ readOnly: true });
  const refused = await post(
    `${readOnly}api/types/dash_rated/limits`,
    { 'x-berth-csrf': await csrfFor(readOnly) },
    { rate: '9/1s' },
  );
  assert.equal(refused.status, 403);
  assert.deepEqual(
    (await listTypeLimits(pool, schema)).map((l) => [l.type, l.rateLimit, l.rateIntervalMs]),
    [['dash_rated', 5, 60_000]],
  );

  assert.deepEqual((await post(`${base}/clear`, csrf)).json(), { type: 'dash_rated', cleared: true });
  assert.deepEqual((await post(`${base}/clear`, csrf)).json(), { type: 'dash_rated', cleared: false });
  assert.deepEqual((await call(`${url}api/queues`)).json().typeLimits, []);
  // Refused input was refused before the action ran: no audit row for it, error or not.
  const audit = await pool.query(
    `SELECT actor, action, target FROM ${S}.audit_log WHERE action LIKE 'type.%' ORDER BY id`,
  );
  assert.deepEqual(
    audit.rows.map((r) => [r.actor, r.action, r.target]),
    [
      ['dashboard:local', 'type.limit', { type: 'dash_rated', rate: { limit: 20, intervalMs: 1000 } }],
      ['dashboard:local', 'type.limit', { type: 'dash_rated', rate: { limit: 5, intervalMs: 60_000 } }],
      ['dashboard:local', 'type.unlimit', { type: 'dash_rated' }],
      ['dashboard:local', 'type.unlimit', { type: 'dash_rated' }],
    ],
  );
});

test('security headers: a CSP without inline script, no framing, no sniffing', async () => {
  const url = await dashboard();
  for (const path of ['', 'api/overview']) {
    const r = await call(`${url}${path}`);
    const csp = String(r.headers['content-security-policy']);
    assert.match(csp, /script-src 'self'/);
    assert.doesNotMatch(csp, /unsafe-inline/);
    assert.match(csp, /frame-ancestors 'none'/);
    assert.equal(r.headers['x-content-type-options'], 'nosniff');
  }
  assert.doesNotMatch((await call(url)).body, /<script>/, 'no inline script in the shell');
});

test('/metrics is served (behind the same auth) when a registry is given, and not otherwise', async () => {
  const registry = new Registry();
  new Counter({ name: 'dashboard_test_total', help: 'x', registers: [registry] }).inc(3);
  const url = await dashboard({ auth: AUTH, metricsRegistry: registry });
  assert.equal((await call(`${url}metrics`)).status, 401);
  const r = await call(`${url}metrics`, { headers: { authorization: `Bearer ${AUTH.token}` } });
  assert.equal(r.status, 200);
  assert.match(r.body, /dashboard_test_total 3/);
  const plain = await dashboard();
  assert.equal((await call(`${plain}metrics`)).status, 404);
});

test('/api/tasks pages by keyset; a task reads with its payload and timeline; overview counts by queue and type', async () => {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dead_letters, ${S}.dedupe`,
  );
  const ids: string[] = [];
  for (let i = 0; i < 7; i++)
    ids.push(
      (await enqueue(pool, i % 2 ? 'page.odd' : 'page.even', { i, html: '<b>x</b>' }, { schema, queue: 'paging' })).id!,
    );
  const url = await dashboard();
  const seen: string[] = [];
  let after = '';
  for (let n = 0; n < 10; n++) {
    const r = await call(`${url}api/tasks?queue=paging&limit=3${after ? `&after=${after}` : ''}`);
    assert.equal(r.status, 200, r.body);
    const page = r.json() as { tasks: { id: string }[]; next: string | null };
    assert.ok(page.tasks.length <= 3);
    seen.push(...page.tasks.map((t) => t.id));
    if (!page.next) break;
    after = page.next;
  }
  assert.deepEqual(seen, [...ids].reverse(), 'newest first, each once');
  const odd = (await call(`${url}api/tasks?type=page.odd&state=ready`)).json() as { tasks: { id: string }[] };
  assert.deepEqual(
    odd.tasks.map((t) => t.id),
    [ids[5], ids[3], ids[1]],
  );

  const detail = await call(`${url}api/tasks/${ids[0]}`);
  const { task, timeline } = detail.json() as { task: Record<string, unknown>; timeline: { event: string }[] };
  assert.deepEqual(task.payload, { i: 0, html: '<b>x</b>' });
  assert.equal(task.state, 'ready');
  assert.deepEqual(
    timeline.map((e) => e.event),
    ['created', 'appended'],
  );

  const overview = (await call(`${url}api/overview`)).json() as {
    counts: { byType: { type: string; pending: number }[] };
    queues: { queue: string; pending: number }[];
    throughput: unknown[];
  };
  assert.equal(overview.queues.find((q) => q.queue === 'paging')?.pending, 7);
  assert.equal(overview.counts.byType.find((t) => t.type === 'page.odd')?.pending, 3);
  assert.equal(overview.throughput.length, 60);
});

test('createDashboardHandler serves under a base path inside another server and leaves other paths alone', async () => {
  const handle = createDashboardHandler({ pool, schema, basePath: '/ops/berth', logger: testLogger });
  const { createServer } = await import('node:http');
  const server = createServer((req, res) => {
    void handle(req, res).then((served) => {
      if (!served) res.end('app');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  servers.push({ close: () => new Promise((r) => server.close(() => r())) });
  const base = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  assert.equal((await call(`${base}/other`)).body, 'app');
  const page = await call(`${base}/ops/berth/`);
  assert.equal(page.status, 200);
  assert.match(page.body, /src="\/ops\/berth\/assets\/app\.js"/);
  assert.equal((await call(`${base}/ops/berth/api/queues`)).status, 200);
});

test("the worker's http option serves /metrics and the dashboard; bad settings fail in the constructor", async () => {
  const base = { connectionString: DATABASE_URL, schema, tasks: [], logger: testLogger, maintenance: false as const };
  assert.throws(() => new Worker({ ...base, http: { port: -1 } }), BerthInputError);
  assert.throws(
    () => new Worker({ ...base, http: { port: 0, host: '0.0.0.0', dashboard: true } }),
    /no authentication/,
  );
  assert.throws(() => new Worker({ ...base, http: { port: 0, metrics: false } }), /serves nothing/);
  assert.throws(() => new Worker({ ...base, http: { port: 0, dashboard: { auth: { token: '' } } } }), BerthInputError);

  const def = defineTask({ type: 'http.ok', ceilingMs: 10_000, handler: async () => {} });
  const w = new Worker({
    ...base,
    tasks: [def],
    maintenance: FAST_MAINTENANCE,
    heartbeatIntervalMs: 100,
    pollIntervalMs: 100,
    http: { port: 0, dashboard: true },
  });
  // The worker names its dashboard pool's sessions after itself.
  const dashboardPids = async () =>
    new Set(
      (
        await pool.query<{ pid: number }>(
          `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`,
          [`berth dashboard ${w.id}`.slice(0, 63)],
        )
      ).rows.map((r) => r.pid),
    );
  const before = await dashboardPids();
  await w.start();
  let ownPids: number[] = [];
  try {
    const url = w.httpUrl!;
    assert.match(url, /^http:\/\/127\.0\.0\.1:\d+$/);
    const metrics = await call(`${url}/metrics`);
    assert.equal(metrics.status, 200);
    assert.match(metrics.body, /berth_task_slots 4/);
    assert.equal((await call(`${url}/`)).status, 200);
    await waitFor(
      async () => ((await call(`${url}/api/overview`)).json() as { workers: { alive: number } }).workers.alive === 1,
      10_000,
      'the worker on the overview',
    );
    // The dashboard reads on a pool of its own (at most two connections), not the worker's.
    const replies = await Promise.all(Array.from({ length: 8 }, () => call(`${url}/api/overview`)));
    assert.ok(replies.every((r) => r.status === 200));
    ownPids = [...(await dashboardPids())].filter((p) => !before.has(p));
    assert.ok(ownPids.length >= 1 && ownPids.length <= 2, `dashboard connections: ${ownPids.length}`);
  } finally {
    await w.stop();
  }
  await assert.rejects(call(`${w.httpUrl}/metrics`), /ECONNREFUSED/, 'stop() closed it');
  await waitFor(
    async () => {
      const now = await dashboardPids();
      return ownPids.every((p) => !now.has(p));
    },
    5000,
    "stop() ended the dashboard's pool",
  );

  const metricsOnly = new Worker({ ...base, http: { port: 0 } });
  await metricsOnly.start();
  try {
    assert.equal((await call(`${metricsOnly.httpUrl}/metrics`)).status, 200);
    assert.equal((await call(`${metricsOnly.httpUrl}/`)).status, 404);
  } finally {
    await metricsOnly.stop();
  }
});

interface LaneRow {
  queue: string;
  running: number;
  dead: number;
  waiting: boolean;
  contention: {
    handedOff: number;
    waiterLimit: number;
    waiterTimedOut: number;
    failed: number;
    lastOutcome: string;
    lastAt: string;
  } | null;
}

test("/api/lanes: running and dead per lane, and the leader's per-lane promotion contention and waiter", async () => {
  const own = await freshSchema('dashboard_lanes');
  let release: () => void = () => {};
  const blocked = new Promise<void>((r) => (release = r));
  const block = defineTask({ type: 'lanes.block', ceilingMs: 60_000, handler: async () => blocked });
  const fail = defineTask({
    type: 'lanes.fail',
    ceilingMs: 10_000,
    maxAttempts: 1,
    handler: async () => {
      throw new Error('boom');
    },
  });
  await enqueue(own.pool, block, {}, { schema: own.schema, queue: 'busy', shard: 0 });
  await enqueue(own.pool, fail, {}, { schema: own.schema, queue: 'busy', shard: 0 });
  // A due deferred row on a lane someone holds: the leader's promotion hands it to a waiter.
  await enqueue(own.pool, block, {}, { schema: own.schema, queue: 'contended', shard: 0, delay: 60_000 });
  await own.pool.query(`UPDATE "${own.schema}".deferred SET run_at = now() - interval '1 s'`);
  const laneId = (
    await own.pool.query(
      `SELECT "${own.schema}".provision_lane(queue, priority, shard) AS id FROM "${own.schema}".deferred WHERE queue = 'contended'`,
    )
  ).rows[0].id as number;
  const unlock = await holdLaneLock(own.schema, laneId);
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema: own.schema,
    tasks: [block, fail],
    logger: testLogger,
    queues: ['busy'],
    heartbeatIntervalMs: 100,
    pollIntervalMs: 50,
    maintenance: { ...FAST_MAINTENANCE, waiterLockTimeoutMs: 60_000 },
  });
  await w.start();
  const d = await startDashboard({ connectionString: DATABASE_URL, schema: own.schema, port: 0, logger: testLogger });
  try {
    const lanes = await waitFor(
      async () => {
        const r = (await call(`${d.url}api/lanes`)).json() as { lanes: LaneRow[] };
        const busy = r.lanes.find((l) => l.queue === 'busy');
        const contended = r.lanes.find((l) => l.queue === 'contended');
        return busy?.running === 1 && busy.dead === 1 && contended?.contention && contended.waiting
          ? { busy, contended }
          : null;
      },
      15_000,
      'running, dead and contention on /api/lanes',
    );
    assert.equal(lanes.contended.running, 0);
    assert.equal(lanes.contended.contention!.handedOff, 1, 'one hand-off: the lane is skipped while its waiter waits');
    assert.equal(lanes.contended.contention!.lastOutcome, 'handed_off');
    assert.ok(Math.abs(Date.parse(lanes.contended.contention!.lastAt) - Date.now()) < 60_000);
    assert.equal(lanes.busy.contention, null);
    const heartbeat = (await own.pool.query(`SELECT maintenance FROM "${own.schema}".workers WHERE leader`)).rows[0]
      .maintenance;
    assert.deepEqual(Object.keys(heartbeat).sort(), ['branches', 'contention', 'waitingLanes']);
  } finally {
    release();
    await unlock();
    await d.close();
    await w.stop();
  }
});

test('ContentionTally keeps at most maxLanes lanes, dropping the one contended longest ago', () => {
  const t = new ContentionTally(3);
  const lane = (queue: string) => ({ queue, priority: 0, shard: 0 });
  t.record(lane('a'), 'handed_off', new Date(1000));
  t.record(lane('b'), 'waiter_limit', new Date(2000));
  t.record(lane('c'), 'failed', new Date(3000));
  t.record(lane('a'), 'waiter_timed_out', new Date(4000));
  t.record(lane('d'), 'handed_off', new Date(5000));
  assert.equal(t.size, 3);
  assert.deepEqual(
    t.list().map((c) => c.queue),
    ['d', 'a', 'c'],
    'b, contended longest ago, was dropped; newest first',
  );
  const a = t.list().find((c) => c.queue === 'a')!;
  assert.deepEqual(
    { ...a },
    {
      queue: 'a',
      priority: 0,
      shard: 0,
      handed_off: 1,
      waiter_limit: 0,
      waiter_timed_out: 1,
      failed: 0,
      lastOutcome: 'waiter_timed_out',
      lastAt: new Date(4000).toISOString(),
    },
  );
});

test('an unmigrated schema: startDashboard refuses it with the fix; a mounted handler answers 503 saying so', async () => {
  const missing = `t_dashboard_missing_${process.pid}`;
  await assert.rejects(
    startDashboard({ connectionString: DATABASE_URL, schema: missing, port: 0, logger: testLogger }),
    (err: Error) =>
      err instanceof BerthInputError &&
      err.name === 'SchemaNotMigratedError' &&
      /berth migrate --schema/.test(err.message),
  );
  const handler = createDashboardHandler({ pool, schema: missing, logger: testLogger });
  const server = await listen([handler], 0, '127.0.0.1');
  try {
    const r = await call(`${server.url}/api/overview`);
    assert.equal(r.status, 503, r.body);
    assert.match(String(r.json().error), /not migrated.*berth migrate/);
  } finally {
    await server.close();
  }
});

test("the overview's oldest due leaves paused queues out (as the metric does); their rows keep the age and the paused flag", async () => {
  const own = await freshSchema('dashboard_paused');
  const minutesAgo = (m: number) => ({ schema: own.schema, runAt: new Date(Date.now() - m * 60_000) });
  await enqueue(own.pool, 'held.task', {}, { ...minutesAgo(30), queue: 'held' });
  await enqueue(own.pool, 'live.task', {}, { ...minutesAgo(2), queue: 'live' });
  await pauseQueue(own.pool, own.schema, 'held', 'cli:test');
  const d = await startDashboard({ connectionString: DATABASE_URL, schema: own.schema, port: 0, logger: testLogger });
  try {
    const o = (await call(`${d.url}api/overview`)).json() as {
      oldestDue: { seconds: number; queue: string | null };
      queues: { queue: string; oldestDueSeconds: number; paused: boolean }[];
    };
    const held = o.queues.find((q) => q.queue === 'held')!;
    const live = o.queues.find((q) => q.queue === 'live')!;
    assert.equal(held.paused, true);
    assert.ok(held.oldestDueSeconds > 25 * 60, `held: ${held.oldestDueSeconds}`);
    assert.equal(o.oldestDue.queue, 'live');
    assert.equal(o.oldestDue.seconds, live.oldestDueSeconds);
    assert.ok(live.oldestDueSeconds < 10 * 60);
    await resumeQueue(own.pool, own.schema, 'held', 'cli:test');
    await waitFor(
      async () => ((await call(`${d.url}api/overview`)).json() as typeof o).oldestDue.queue === 'held',
      5000,
      'held is the headline once resumed',
    );
  } finally {
    await d.close();
  }
});

test("the overview's oldest due leaves out a queue at its limit (as the metric does), and counts it below its limit", async () => {
  const own = await freshSchema('dashboard_limited');
  const minutesAgo = (m: number) => new Date(Date.now() - m * 60_000);
  await enqueueMany(
    own.pool,
    [0, 1].map((i) => ({ type: 'held.task', payload: { i }, queue: 'held', runAt: minutesAgo(30) })),
    { schema: own.schema },
  );
  await enqueue(own.pool, 'live.task', {}, { schema: own.schema, queue: 'live', runAt: minutesAgo(2) });
  await promoteDue(own.pool, own.schema);
  const lane = (await own.pool.query(`SELECT lane_id FROM "${own.schema}".lanes WHERE queue = 'held'`)).rows[0].lane_id;
  assert.equal((await claim(own.pool, claimParams(own.schema, [lane], 1))).length, 1);
  await setQueueLimit(own.pool, own.schema, 'held', { maxRunning: 1 }, 'cli:test');
  const d = await startDashboard({ connectionString: DATABASE_URL, schema: own.schema, port: 0, logger: testLogger });
  try {
    const overview = async () =>
      (await call(`${d.url}api/overview`)).json() as {
        oldestDue: { seconds: number; queue: string | null };
        queues: { queue: string; oldestDueSeconds: number }[];
      };
    const o = await overview();
    assert.equal(o.oldestDue.queue, 'live');
    assert.ok(o.queues.find((q) => q.queue === 'held')!.oldestDueSeconds > 25 * 60, 'its row keeps the age');
    await setQueueLimit(own.pool, own.schema, 'held', { maxRunning: 2 }, 'cli:test');
    await waitFor(
      async () => (await overview()).oldestDue.queue === 'held',
      5000,
      'held is the headline below its limit',
    );
  } finally {
    await d.close();
  }
});

test('dashboardOptionsFromEnv reads and checks the BERTH_DASHBOARD_* variables', () => {
  assert.deepEqual(dashboardOptionsFromEnv({}), {});
  assert.deepEqual(
    dashboardOptionsFromEnv({
      BERTH_DASHBOARD_TOKEN: 'abc',
      BERTH_DASHBOARD_USERS: 'alice:pa:ss,bob:x',
      BERTH_DASHBOARD_READ_ONLY: '1',
      BERTH_DASHBOARD_HOST: '0.0.0.0',
      BERTH_DASHBOARD_PORT: '8080',
    }),
    { host: '0.0.0.0', port: 8080, auth: { token: 'abc', users: { alice: 'pa:ss', bob: 'x' } }, readOnly: true },
  );
  assert.throws(() => dashboardOptionsFromEnv({ BERTH_DASHBOARD_PORT: 'eighty' }), /BERTH_DASHBOARD_PORT/);
  assert.throws(() => dashboardOptionsFromEnv({ BERTH_DASHBOARD_PORT: '70000' }), BerthInputError);
  assert.throws(() => dashboardOptionsFromEnv({ BERTH_DASHBOARD_USERS: 'alice' }), /user:password/);
  assert.throws(() => dashboardOptionsFromEnv({ BERTH_DASHBOARD_READ_ONLY: 'maybe' }), /BERTH_DASHBOARD_READ_ONLY/);
  assert.deepEqual(dashboardOptionsFromEnv({ BERTH_DASHBOARD_TRUST_PROXY: 'true' }), {
    authLimits: { trustProxy: true },
  });
  assert.throws(
    () => dashboardOptionsFromEnv({ BERTH_DASHBOARD_TRUST_PROXY: 'sometimes' }),
    /BERTH_DASHBOARD_TRUST_PROXY/,
  );
});

test('dashboard options are resolved once: an unknown key is refused by startDashboard and createDashboardHandler, before anything listens', async () => {
  await assert.rejects(
    startDashboard({
      connectionString: DATABASE_URL,
      schema,
      port: 0,
      logger: testLogger,
      prot: 80,
    } as DashboardOptions),
    (e: Error) => e instanceof BerthInputError && /unknown dashboard option "prot"/.test(e.message),
  );
  assert.throws(
    () => createDashboardHandler({ pool, schema, logger: testLogger, host: '0.0.0.0' } as never),
    /unknown dashboard option "host"/,
  );
  assert.throws(
    () => createDashboardHandler({ pool, schema, logger: testLogger, readOnly: 'yes' as never }),
    /readOnly must be true or false/,
  );
});

test("a worker's dashboard settings are resolved once, in its constructor: an unknown or worker-owned key is refused before anything starts", () => {
  const worker = (dashboard: unknown) =>
    new Worker({
      connectionString: DATABASE_URL,
      schema,
      tasks: [],
      logger: testLogger,
      maintenance: false,
      http: { port: 0, dashboard: dashboard as never },
    });
  assert.throws(() => worker({ readOnlyy: true }), /unknown http\.dashboard option "readOnlyy"/);
  // The worker serves its own registry and schema: passing them is a mistake, not a silent no-op.
  assert.throws(() => worker({ metricsRegistry: new Registry() }), /unknown http\.dashboard option "metricsRegistry"/);
  assert.throws(() => worker({ schema: 'other' }), /unknown http\.dashboard option "schema"/);
  assert.throws(() => worker({ readOnly: 'yes' }), /readOnly must be true or false/);
  assert.throws(() => worker({ basePath: '/a/../b' }), /basePath/);
  assert.throws(() => worker([]), /http\.dashboard must be true, false or dashboard options/);
  assert.ok(worker({ readOnly: true, basePath: '/ops' }), 'valid settings construct a worker (nothing started)');
});

test('cancel a running task from the dashboard: its handler is aborted, the settlement and the audit log carry the dashboard actor', async () => {
  let reason: string | null = null;
  let started = false;
  const def = defineTask({
    type: 'dash_cancel',
    ceilingMs: 60_000,
    handler: async (_p, ctx) => {
      started = true;
      await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve(), { once: true }));
      reason = (ctx.signal.reason as { code?: string }).code ?? 'unknown';
      throw ctx.signal.reason;
    },
  });
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    logger: testLogger,
    maintenance: false,
  });
  await w.start();
  try {
    const { id } = await enqueue(pool, 'dash_cancel', {}, { schema });
    await waitFor(() => started, 20_000, 'the handler to start');
    const url = await dashboard();
    const r = await post(`${url}api/tasks/${id}/cancel`, { 'x-berth-csrf': await csrfFor(url) });
    assert.equal(r.status, 200, r.body);
    assert.deepEqual(r.json(), { result: 'cancelled' });
    await waitFor(() => reason !== null, 20_000, 'the handler to be aborted');
    assert.equal(reason, 'CANCEL_ABORT');
    const st = await pool.query(`SELECT actor FROM ${S}.range_settlements WHERE outcome = 'cancelled'`);
    const audit = await pool.query(
      `SELECT actor FROM ${S}.audit_log WHERE action = 'task.cancel' AND target->>'id' = $1`,
      [id],
    );
    assert.equal(st.rows.length, 1);
    assert.match(st.rows[0].actor, /^dashboard:/);
    assert.deepEqual(audit.rows, st.rows);
  } finally {
    await w.stop();
  }
});
