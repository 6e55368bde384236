/**
 * Issue 12, item 3: no hang on connect. Against a TCP server that accepts and never answers,
 * Worker.start(), migrate, `berth stats`, the dashboard, the LISTEN session and the election
 * session each fail (or back off) with a ConnectError naming host, port and database once the
 * connect timeout passes; the password never reaches a message or a log line. The timeout is
 * resolved as: the option, else the URL's connect_timeout, else PGCONNECT_TIMEOUT, else 10 s.
 * Assertions are on the errors, never on how long anything took.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Socket } from 'node:net';
import { ConnectError, DEFAULT_CONNECT_TIMEOUT_MS, defineTask, migrate, startDashboard, Worker } from '../src/index.js';
import { Maintenance } from '../src/maintenance-api.js';
import { BerthInputError } from '../src/errors.js';
import { isConnectionError, resolveDatabase } from '../src/db/connections.js';
import { WakeListener } from '../src/processor/wake.js';
import { BerthMetrics } from '../src/metrics/catalogue.js';
import { runCli } from './support/run-cli.js';
import { captureLogger, DATABASE_URL, FAST_MAINTENANCE, freshSchema, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('connect');
const PASSWORD = 's3cret-Pa55word';

/** Accepts every connection and never writes a byte: a wedged proxy, a server stopped by SIGSTOP. */
const sockets = new Set<Socket>();
const silent = createServer((s) => {
  sockets.add(s);
  s.on('close', () => sockets.delete(s));
  s.on('error', () => undefined);
});
await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
const port = (silent.address() as { port: number }).port;
after(async () => {
  for (const s of sockets) s.destroy();
  await new Promise((r) => silent.close(r));
});

const SILENT_URL = `postgres://berth:${PASSWORD}@127.0.0.1:${port}/appdb`;
const WHERE = `127.0.0.1:${port}, database "appdb"`;
const SHORT = 300;

function assertTimedOut(err: unknown): true {
  assert.ok(err instanceof ConnectError, `a ConnectError, got ${String(err)}`);
  assert.equal(err.code, 'CONNECT');
  assert.equal(err.timedOut, true);
  assert.ok(err.message.includes(WHERE), err.message);
  assert.match(err.message, /no answer within 300 ms/);
  assert.ok(!err.message.includes(PASSWORD));
  assert.ok(!String(err.stack).includes(PASSWORD));
  assert.ok(isConnectionError(err), 'a timed-out connect is a connection fault (retried, not a bug)');
  return true;
}

const tasks = [defineTask<Record<string, never>>({ type: 'connect_noop', ceilingMs: 5000, handler: async () => {} })];

test('Worker.start() against a silent server fails with a ConnectError; nothing is left running; no password in logs', async () => {
  const { logger, lines } = captureLogger();
  const worker = new Worker({ connectionString: SILENT_URL, connectTimeoutMs: SHORT, schema, tasks, logger });
  await assert.rejects(worker.start(), assertTimedOut);
  await worker.stop();
  assert.ok(!JSON.stringify(lines).includes(PASSWORD));
});

test('migrate and the dashboard fail with a ConnectError within their timeout', async () => {
  await assert.rejects(migrate({ connectionString: SILENT_URL, connectTimeoutMs: SHORT, schema }), assertTimedOut);
  const { logger, lines } = captureLogger();
  await assert.rejects(
    startDashboard({ connectionString: SILENT_URL, connectTimeoutMs: SHORT, schema, port: 0, logger }),
    assertTimedOut,
  );
  assert.ok(!JSON.stringify(lines).includes(PASSWORD));
});

const berth = runCli;

test('berth stats against a silent server: one line naming the server, exit 1; --connect-timeout, the URL and PGCONNECT_TIMEOUT all bound it', async () => {
  const flag = await berth(['stats', '--database-url', SILENT_URL, '--connect-timeout', '300ms', '--schema', schema]);
  assert.equal(flag.code, 1, flag.err);
  assert.equal(flag.err.trim().split('\n').length, 1, flag.err);
  assert.ok(flag.err.includes(`could not connect to PostgreSQL at ${WHERE}: no answer within 300 ms`), flag.err);
  assert.ok(!flag.err.includes(PASSWORD));
  // The URL's connect_timeout (seconds; libpq's minimum of 2) and the environment variable.
  const url = await berth(['stats', '--database-url', `${SILENT_URL}?connect_timeout=2`, '--schema', schema]);
  assert.equal(url.code, 1, url.err);
  assert.match(url.err, /no answer within 2 s/);
  const env = await berth(['stats', '--schema', schema], { DATABASE_URL: SILENT_URL, PGCONNECT_TIMEOUT: '2' });
  assert.equal(env.code, 1, env.err);
  assert.match(env.err, /no answer within 2 s/);
  assert.ok(!env.err.includes(PASSWORD));
  // A malformed URL is a usage error that names where it came from, without echoing it.
  const bad = await berth(['stats', '--database-url', `postgres://berth:${PASSWORD}@127.0.0.1:notaport/db`]);
  assert.equal(bad.code, 2, bad.err);
  assert.match(bad.err, /--database-url is not a valid PostgreSQL connection string/);
  assert.ok(!bad.err.includes(PASSWORD));
  const unit = await berth(['stats', '--database-url', SILENT_URL, '--connect-timeout', '3']);
  assert.equal(unit.code, 2, unit.err);
  assert.match(unit.err, /"3" has no unit/);
});

test('the LISTEN session and the election session time out, log a ConnectError and retry: no hang, no password', async () => {
  const { logger, lines } = captureLogger();
  const listener = new WakeListener({
    database: resolveDatabase(SILENT_URL, { connectTimeoutMs: SHORT }),
    channel: 'berth_connect_test',
    logger,
    onNotify: () => undefined,
    reconnectBaseMs: 60_000,
  });
  await listener.start();
  assert.equal(listener.connected, false);
  await listener.stop();
  const listen = lines.find((l) => l.msg === 'wake LISTEN connect failed; retrying');
  assert.ok(listen, JSON.stringify(lines));
  assert.ok(String(listen.err).includes(WHERE), String(listen.err));
  const m = new Maintenance({
    connectionString: SILENT_URL,
    connectTimeoutMs: SHORT,
    schema,
    pool,
    logger,
    metrics: new BerthMetrics(),
    options: FAST_MAINTENANCE,
    workerId: `${schema}-silent`,
  });
  m.start();
  try {
    const election = await waitFor(
      () => lines.find((l) => l.msg === 'maintenance election session could not connect'),
      30_000,
      'the election connect to time out',
    );
    assert.match(String(election.err), /no answer within 300 ms/);
  } finally {
    await m.stop();
  }
  assert.ok(!JSON.stringify(lines).includes(PASSWORD));
});

test('the connect timeout: option > URL connect_timeout > PGCONNECT_TIMEOUT > 10 s; libpq seconds; bad values name their source', () => {
  const url = 'postgres://u:pw@db.example:6543/app';
  const ms = (s: string, o: { connectTimeoutMs?: unknown; env?: Record<string, string> } = {}) =>
    resolveDatabase(s, { env: {}, ...o }).connectTimeoutMs;
  assert.equal(ms(url), DEFAULT_CONNECT_TIMEOUT_MS);
  assert.equal(ms(url, { env: { PGCONNECT_TIMEOUT: '7' } }), 7000);
  assert.equal(ms(`${url}?connect_timeout=5`, { env: { PGCONNECT_TIMEOUT: '7' } }), 5000);
  assert.equal(ms(`${url}?connect_timeout=5`, { connectTimeoutMs: 1500, env: { PGCONNECT_TIMEOUT: '7' } }), 1500);
  // libpq: 0 or less waits indefinitely; 1 is raised to its minimum of 2.
  assert.equal(ms(`${url}?connect_timeout=0`), 0);
  assert.equal(ms(`${url}?connect_timeout=1`), 2000);
  assert.equal(ms(url, { env: { PGCONNECT_TIMEOUT: '-3' } }), 0);
  assert.equal(resolveDatabase(url, { env: {} }).where, 'db.example:6543, database "app"');
  assert.equal(resolveDatabase('postgres://u@[::1]:5/d', { env: {} }).where, '[::1]:5, database "d"');
  const input = (f: () => unknown, re: RegExp) =>
    assert.throws(f, (e: unknown) => e instanceof BerthInputError && re.test(e.message) && !e.message.includes('pw'));
  input(() => ms(`${url}?connect_timeout=ten`), /connectionString's connect_timeout must be a whole number/);
  input(() => ms(url, { env: { PGCONNECT_TIMEOUT: '2.5' } }), /PGCONNECT_TIMEOUT must be a whole number/);
  input(() => ms(url, { connectTimeoutMs: -1 }), /connectTimeoutMs must be a finite number/);
  input(() => ms(url, { connectTimeoutMs: '5s' }), /connectTimeoutMs must be a finite number/);
  input(() => resolveDatabase('u:pw@localhost/db'), /connectionString is not a valid PostgreSQL connection string/);
  input(() => resolveDatabase('localhost:5432/db'), /not a valid PostgreSQL connection string/);
  input(() => resolveDatabase('postgres://u:pw@h:99999/db'), /not a valid PostgreSQL connection string/);
  input(() => resolveDatabase(''), /connectionString must be a non-empty/);
  input(
    () => new Worker({ connectionString: DATABASE_URL, readConnectionString: 'http://u:pw@h/db', tasks }),
    /readConnectionString is not a valid PostgreSQL connection string \(scheme "http:"/,
  );
  input(() => new Worker({ connectionString: DATABASE_URL, tasks, connectTimeoutMs: Number.NaN }), /connectTimeoutMs/);
});

test('a reachable database connects as before under the default timeout', async () => {
  const report = await migrate({ connectionString: DATABASE_URL, schema });
  assert.equal(report.applied.length, 0);
});
