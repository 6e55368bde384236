/**
 * libpq-style host lists in the connection layer: `postgres://h1:p1,h2:p2/db` (or `?host=h1,h2&
 * port=p1,p2`) with `target_session_attrs`. Each connect goes to the host that last gave a good
 * session; once it fails, the next connect searches the list in order and takes the first host
 * whose session is the wanted kind. Against real servers: the shared one, proxies to it that a
 * test cuts, a refused port, and a cluster of its own that is read-only
 * (default_transaction_read_only), standing in for a demoted primary.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { ConnectError, defineTask, enqueue, migrate, openPool, Worker } from '../src/index.js';
import { BerthInputError } from '../src/errors.js';
import { isConnectionError, resolveDatabase } from '../src/db/connections.js';
import { parseHosts } from '../src/db/hosts.js';
import { sessionKind } from '../src/db/host-selector.js';
import { TcpProxy } from './support/tcp-proxy.js';
import { freePort, TestCluster } from './support/cluster.js';
import { DATABASE_URL, FAST_MAINTENANCE, freshSchema, leaderWorkerId, testLogger, waitFor } from './helpers.js';

const { schema } = await freshSchema('multihost');
const shared = new URL(DATABASE_URL);
const DB = shared.pathname.slice(1);
const PASSWORD = 'mh-Secr3t';

/** A URL on DATABASE_URL's user and database over `hosts` (`host:port` each). */
function listUrl(hosts: string[], attrs?: string, password = false): string {
  const user = `${shared.username}${password ? `:${PASSWORD}` : ''}@`;
  return `postgres://${user}${hosts.join(',')}/${DB}${attrs ? `?target_session_attrs=${attrs}` : ''}`;
}
const SHARED = `${shared.hostname}:${shared.port || '5432'}`;

const pools: pg.Pool[] = [];
function pool(url: string): pg.Pool {
  const p = openPool({ connectionString: url, max: 2, connectTimeoutMs: 5000 });
  pools.push(p);
  return p;
}
after(async () => {
  await Promise.all(pools.map((p) => p.end().catch(() => undefined)));
});

async function port(p: pg.Pool): Promise<number> {
  const { rows } = await p.query<{ port: string }>(`SELECT current_setting('port') AS port`);
  return Number(rows[0]?.port);
}

/**
 * Run `fn` until it succeeds (a connect whose remembered host failed fails itself; the next one
 * searches); how many attempts failed first.
 */
async function eventually(fn: () => Promise<unknown>, what: string): Promise<number> {
  let last: unknown;
  let failures = 0;
  await waitFor(
    async () => {
      try {
        await fn();
        return true;
      } catch (err) {
        last = err;
        failures++;
        return false;
      }
    },
    20_000,
    `${what} (last error: ${String(last)})`,
  );
  return failures;
}

test('host lists are read as libpq reads them; a single-host string is left as it was', () => {
  assert.deepEqual(parseHosts('postgres://u:p@a:1,b:2/db?target_session_attrs=read-write&sslmode=disable', 'x'), {
    hosts: ['postgres://u:p@a:1/db?sslmode=disable', 'postgres://u:p@b:2/db?sslmode=disable'],
    sessionAttrs: 'read-write',
  });
  assert.deepEqual(parseHosts('postgres://u@a,[::1]:7/db', 'x').hosts, [
    'postgres://u@a/db',
    'postgres://u@[::1]:7/db',
  ]);
  assert.deepEqual(parseHosts('postgresql://u@/db?host=a,b&port=1,2', 'x').hosts, [
    'postgresql://u@a:1/db',
    'postgresql://u@b:2/db',
  ]);
  assert.deepEqual(parseHosts('postgres://u@/db?host=a,b&port=5', 'x').hosts, [
    'postgres://u@a:5/db',
    'postgres://u@b:5/db',
  ]);
  const plain = 'postgres://u:p%40x@h:5/db?options=-c%20jit%3Doff';
  assert.deepEqual(parseHosts(plain, 'x'), { hosts: [plain], sessionAttrs: 'any' });
  assert.deepEqual(parseHosts('postgres://u@h/db?target_session_attrs=primary', 'x'), {
    hosts: ['postgres://u@h/db'],
    sessionAttrs: 'primary',
  });
  assert.deepEqual(parseHosts('/var/run/postgresql db', 'x'), {
    hosts: ['/var/run/postgresql db'],
    sessionAttrs: 'any',
  });
});

test('a host list names every host; a malformed list is a BerthInputError that never shows the password', () => {
  const t = resolveDatabase(listUrl(['a:1', '[::1]:2', 'c'], 'read-write', true));
  assert.equal(t.where, `a:1,[::1]:2,c:5432, database "${DB}"`);
  assert.equal(resolveDatabase(listUrl(['a:1'])).hosts, undefined, 'a plain string needs no selector');
  for (const [url, why] of [
    [listUrl(['a:1', 'b:2'], 'sometimes', true), /target_session_attrs must be one of any, read-write/],
    [listUrl(['a:1', '', 'b:2'], undefined, true), /a host of the list is empty/],
    [listUrl(['a:x', 'b:2'], undefined, true), /port "x" is not a number/],
    [`postgres://u:${PASSWORD}@/db?host=a,b&port=1,2,3`, /2 hosts but 3 ports/],
    [`postgres://u:${PASSWORD}@a,b/db?host=c,d`, /both before the path and in the host parameter/],
  ] as const) {
    assert.throws(
      () => resolveDatabase(url),
      (err: unknown) => {
        assert.ok(err instanceof BerthInputError, String(err));
        assert.match(err.message, why);
        assert.ok(!err.message.includes(PASSWORD));
        return true;
      },
    );
  }
  assert.throws(() => openPool({ connectionString: listUrl(['a:1']), maxx: 2 } as never), /maxx/);
});

test('a refused first host: pool, migrate and a worker (its leader too) use the next one', async () => {
  const refused = await freePort();
  const url = listUrl([`127.0.0.1:${refused}`, SHARED], 'read-write');
  const p = pool(url);
  assert.equal(await port(p), Number(shared.port || 5432));
  assert.equal((await migrate({ connectionString: url, schema })).applied.length, 0);

  const ran: string[] = [];
  const task = defineTask<{ n: number }>({
    type: 'multihost_echo',
    ceilingMs: 5000,
    handler: async (payload) => {
      ran.push(String(payload.n));
    },
  });
  const worker = new Worker({
    connectionString: url,
    schema,
    tasks: [task],
    logger: testLogger,
    maintenance: FAST_MAINTENANCE,
  });
  await worker.start();
  try {
    for (let n = 0; n < 3; n++) await enqueue(p, 'multihost_echo', { n }, { schema });
    await waitFor(() => ran.length === 3, 30_000, 'three tasks run through the host list');
    await waitFor(
      async () => (await leaderWorkerId(p, schema)) === worker.id,
      30_000,
      'the worker leads through the host list',
    );
  } finally {
    await worker.stop();
  }
});

test('no host answers: one ConnectError naming each host and why, a connection fault, no password', async () => {
  const [a, b] = [await freePort(), await freePort()];
  const p = openPool({ connectionString: listUrl([`127.0.0.1:${a}`, `127.0.0.1:${b}`], 'read-write', true), max: 1 });
  pools.push(p);
  await assert.rejects(p.query('SELECT 1'), (err: unknown) => {
    assert.ok(err instanceof ConnectError, String(err));
    assert.ok(err.message.includes(`127.0.0.1:${a},127.0.0.1:${b}, database "${DB}"`), err.message);
    assert.ok(err.message.includes(`127.0.0.1:${a}: connect ECONNREFUSED`), err.message);
    assert.ok(err.message.includes(`127.0.0.1:${b}: connect ECONNREFUSED`), err.message);
    assert.ok(!err.message.includes(PASSWORD) && !String(err.stack).includes(PASSWORD));
    assert.ok(isConnectionError(err));
    return true;
  });
});

test('the remembered host goes away: after at most one failed connect, connects go to the next host', async () => {
  const a = new TcpProxy({ host: shared.hostname, port: Number(shared.port || 5432) });
  const b = new TcpProxy({ host: shared.hostname, port: Number(shared.port || 5432) });
  await a.start();
  await b.start();
  after(async () => {
    await a.close();
    await b.close();
  });
  const p = pool(listUrl([`127.0.0.1:${a.port}`, `127.0.0.1:${b.port}`], 'read-write'));
  // A new connection each time: released as broken, so the next one connects again.
  const fresh = async () => {
    const c = await p.connect();
    try {
      await c.query('SELECT 1');
    } finally {
      c.release(true);
    }
  };
  await fresh();
  a.cut();
  assert.ok((await eventually(fresh, 'a connect after the first host went away')) <= 1, 'at most one failed connect');
  // The search remembered the second host: every connect now goes straight there.
  for (let i = 0; i < 5; i++) await Promise.all([fresh(), fresh()]);
  b.cut();
  a.restore();
  assert.ok((await eventually(fresh, 'a connect after the hosts swapped')) <= 1, 'at most one failed connect');
  for (let i = 0; i < 5; i++) await fresh();
});

test('target_session_attrs against a read-only server (a demoted primary) and a writable one', async () => {
  const cluster = await TestCluster.create({ settings: { default_transaction_read_only: 'on' } });
  after(() => cluster.destroy());
  // The cluster's own sessions for setting it up are writable.
  const admin = openPool({
    connectionString: `${cluster.url()}?options=-c%20default_transaction_read_only%3Doff`,
    max: 1,
  });
  pools.push(admin);
  await admin.query(`CREATE DATABASE "${DB}"`);
  const ro = `127.0.0.1:${cluster.port}`;
  const sharedPort = Number(shared.port || 5432);
  const expect: [string, number][] = [
    ['read-write', sharedPort],
    ['read-only', cluster.port],
    ['primary', cluster.port],
    ['any', cluster.port],
    ['prefer-standby', cluster.port],
  ];
  for (const [attrs, want] of expect) {
    assert.equal(await port(pool(listUrl([ro, SHARED], attrs))), want, attrs);
  }
  await assert.rejects(pool(listUrl([ro, SHARED], 'standby')).query('SELECT 1'), (err: unknown) => {
    assert.ok(err instanceof ConnectError);
    assert.match(err.message, /the session is read-only \(target_session_attrs=standby\); .*the server is a primary/);
    return true;
  });
  await assert.rejects(
    pool(listUrl([ro], 'read-write')).query('SELECT 1'),
    /the session is read-only \(target_session_attrs=read-write\)/,
  );

  // The writable server turns read-only under a pool that remembers it (a primary demoted in
  // place): a new connection checks its own session, refuses it, and the search finds the other.
  await admin.query(`ALTER SYSTEM SET default_transaction_read_only = off`);
  await admin.query('SELECT pg_reload_conf()');
  const p = openPool({ connectionString: listUrl([ro, SHARED], 'read-write'), max: 1 });
  pools.push(p);
  await waitFor(async () => (await port(p)) === cluster.port, 20_000, 'the cluster is writable and chosen');
  await admin.query(`ALTER SYSTEM SET default_transaction_read_only = on`);
  await admin.query('SELECT pg_reload_conf()');
  // The pool's one connection predates the change; end it so the next query connects anew.
  await admin.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, [DB]);
  await eventually(() => port(p), 'a query after the demotion');
  assert.equal(await port(p), sharedPort);
});

test('without the startup report (a server before 14, a pooler that drops it) the session is asked', async () => {
  for (const [options, readOnly] of [
    ['-c default_transaction_read_only=on', true],
    ['', false],
  ] as const) {
    const client = new pg.Client({ connectionString: DATABASE_URL, options });
    await client.connect();
    try {
      assert.deepEqual(await sessionKind(client, new Map()), { standby: false, readOnly });
    } finally {
      await client.end();
    }
  }
  // With a read-only default on every host, read-write finds none and read-only takes the first.
  const ro = `${listUrl([`127.0.0.1:${await freePort()}`, SHARED])}?options=-c%20default_transaction_read_only%3Don`;
  await assert.rejects(
    pool(`${ro}&target_session_attrs=read-write`).query('SELECT 1'),
    /the session is read-only \(target_session_attrs=read-write\)/,
  );
  assert.equal(await port(pool(`${ro}&target_session_attrs=read-only`)), Number(shared.port || 5432));
});
