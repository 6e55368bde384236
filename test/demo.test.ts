/**
 * The zero-setup demo stops cleanly on Ctrl-C: SIGINT to its whole process group (what a
 * terminal does) stops the worker, which releases its leases, then exits 0 with 'demo stopped'.
 * DATABASE_URL path only: the embedded-PostgreSQL path downloads nothing but takes seconds to
 * initialise a cluster, and is checked by hand (see demo/embedded-postgres.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DATABASE_URL, freshSchema, scaled, waitFor } from './helpers.js';
import { quoteIdent } from '../src/sql.js';

const { schema, pool } = await freshSchema('demo');
const S = quoteIdent(schema);
const root = fileURLToPath(new URL('..', import.meta.url));

/** Run the demo in a process group of its own until a task has completed; then send `signals` to the group. */
async function runAndInterrupt(
  signals: { signal: NodeJS.Signals; afterMs: number }[],
): Promise<{ code: number | null; lines: string[]; dashboard: { overview: number; metrics: string } }> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'demo/main.ts'], {
    cwd: root,
    detached: true,
    env: { ...process.env, DATABASE_URL, BERTH_SCHEMA: schema, BERTH_LOG_LEVEL: 'info', BERTH_DASHBOARD_PORT: '0' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr.on('data', (c: Buffer) => {
    out += c.toString();
    err += c.toString();
  });
  const exited = new Promise<number | null>((res) => child.once('exit', (code) => res(code)));
  try {
    const before = await completed();
    await waitFor(async () => (await completed()) > before, 20_000, 'a demo task completed');
    // The demo prints where its dashboard is; both it and /metrics answer while it runs.
    // On stderr, apart from the JSON lines on stdout, where a person running `npm start` sees it.
    const url = await waitFor(() => /dashboard at (http:\/\/\S+\/) /.exec(err)?.[1], 10_000, 'the dashboard URL');
    const overview = (await fetch(new URL('api/overview', url))).status;
    const metrics = await (await fetch(new URL('metrics', url))).text();
    for (const { signal, afterMs } of signals) {
      await new Promise((r) => setTimeout(r, afterMs));
      try {
        process.kill(-child.pid!, signal);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err; // already gone
      }
    }
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>(
      (_, rej) => (timer = setTimeout(() => rej(new Error(`demo did not exit:\n${out}`)), scaled(20_000))),
    );
    const code = await Promise.race([exited, timeout]).finally(() => clearTimeout(timer));
    return { code, lines: out.split('\n').filter(Boolean), dashboard: { overview, metrics } };
  } finally {
    if (child.exitCode === null && child.signalCode === null) process.kill(-child.pid!, 'SIGKILL');
  }
}

async function completed(): Promise<number> {
  const r = await pool.query<{ n: number }>(
    `SELECT coalesce(sum(n), 0)::int AS n FROM ${S}.range_settlements WHERE outcome = 'completed'`,
  );
  return r.rows[0]!.n;
}

function messages(lines: string[]): string[] {
  return lines.flatMap((l) => {
    try {
      return [String((JSON.parse(l) as { msg?: unknown }).msg)];
    } catch {
      return [l];
    }
  });
}

async function unsettledLeases(): Promise<number> {
  const r = await pool.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM ${S}.leased_entries l WHERE l.outcome IS NULL`,
  );
  return r.rows[0]!.n;
}

test('the demo serves the dashboard and /metrics; Ctrl-C (SIGINT to the process group): worker stopped, then demo stopped; exit 0; no lease left open', async () => {
  const { code, lines, dashboard } = await runAndInterrupt([{ signal: 'SIGINT', afterMs: 0 }]);
  assert.equal(dashboard.overview, 200);
  assert.match(dashboard.metrics, /berth_task_outcomes_total\{task_type="[a-z_]+",outcome="success"\}/);
  const msgs = messages(lines);
  assert.equal(code, 0, lines.join('\n'));
  // By each line's own time, not the order the lines reached the pipe: under load (stress-ng) the
  // last two lines, logged within a millisecond and just before process.exit, reached it in the
  // other order (2 runs in 6; 'worker stopped' timed 1 ms before 'demo stopped'), one logger and
  // one pino stream notwithstanding.
  const at = (msg: string) => {
    const line = lines.find((l) => messages([l])[0] === msg);
    assert.ok(line, `"${msg}" is logged:\n${lines.join('\n')}`);
    return (JSON.parse(line) as { time: number }).time;
  };
  assert.ok(
    at('worker stopped') <= at('demo stopped'),
    `the worker stops before the demo reports stopped:\n${lines.join('\n')}`,
  );
  assert.ok(!msgs.includes('forced exit'));
  assert.equal(await unsettledLeases(), 0);
});

test('one Ctrl-C delivered twice within a moment (npm and tsx relay it) is still a clean stop', async () => {
  const { code, lines } = await runAndInterrupt([
    { signal: 'SIGINT', afterMs: 0 },
    { signal: 'SIGINT', afterMs: 10 },
  ]);
  const msgs = messages(lines);
  assert.equal(code, 0, lines.join('\n'));
  assert.ok(msgs.includes('demo stopped'), msgs.join('\n'));
  assert.ok(!msgs.includes('forced exit'));
});

test('a busy dashboard port is one line on stderr and exit 1, no stack trace', async () => {
  const busy = createServer();
  await new Promise<void>((r) => busy.listen(0, '127.0.0.1', r));
  const port = (busy.address() as { port: number }).port;
  try {
    const r = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
      const child = spawn(process.execPath, ['--import', 'tsx', 'demo/main.ts'], {
        cwd: root,
        env: { ...process.env, DATABASE_URL, BERTH_SCHEMA: schema, BERTH_DASHBOARD_PORT: String(port) },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
      child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
      child.once('exit', (code) => resolve({ code, stdout, stderr }));
    });
    assert.equal(r.code, 1, r.stderr);
    assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
    assert.match(
      r.stderr,
      new RegExp(`^berth demo: port ${port} on 127\\.0\\.0\\.1 is already in use .*BERTH_DASHBOARD_PORT`),
    );
    assert.doesNotMatch(r.stderr + r.stdout, /^\s+at /m);
  } finally {
    await new Promise((r) => busy.close(r));
  }
});

test('npm start installs only when package.json or package-lock.json changed (or on a fresh clone)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'berth-start-'));
  try {
    // A fake npm that records each call and, for install, makes node_modules as npm would.
    const calls = join(dir, 'calls.txt');
    const fake = join(dir, 'fake-npm.mjs');
    writeFileSync(
      fake,
      `import { appendFileSync, mkdirSync } from 'node:fs';
       appendFileSync(${JSON.stringify(calls)}, process.argv.slice(2).join(' ') + '\\n');
       if (process.argv[2] === 'install') mkdirSync('node_modules', { recursive: true });`,
    );
    writeFileSync(join(dir, 'package.json'), '{"name":"x","version":"1.0.0"}');
    writeFileSync(join(dir, 'package-lock.json'), '{"lockfileVersion":3}');
    mkdirSync(join(dir, 'dist', 'dashboard', 'static'), { recursive: true });
    writeFileSync(join(dir, 'dist', 'dashboard', 'static', 'app.css'), '');
    const start = () => {
      const r = spawnSync(process.execPath, [join(root, 'scripts', 'ensure-deps.mjs')], {
        cwd: dir,
        encoding: 'utf8',
        env: { ...process.env, BERTH_NPM: fake },
      });
      assert.equal(r.status, 0, r.stderr);
      return existsSync(calls) ? readFileSync(calls, 'utf8').trim().split('\n') : [];
    };
    assert.deepEqual(start(), ['install --no-audit --no-fund'], 'a fresh clone installs');
    assert.deepEqual(start(), ['install --no-audit --no-fund'], 'a second start installs nothing');
    writeFileSync(join(dir, 'package-lock.json'), '{"lockfileVersion":3,"packages":{}}');
    assert.equal(start().length, 2, 'a changed lock file installs again');
    assert.equal(start().length, 2);
    rmSync(join(dir, 'dist'), { recursive: true });
    assert.deepEqual(start().slice(2), ['run build'], 'a missing dashboard client is built, without an install');
    rmSync(join(dir, 'node_modules'), { recursive: true });
    assert.deepEqual(start().slice(3), ['install --no-audit --no-fund'], 'no node_modules: install');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
