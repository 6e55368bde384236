/**
 * The maintenance election on one session per process (issue 8, item 7): a follower tries the
 * leader lock on the same session poll after poll, only the session holding the lock carries the
 * leader's application_name, and a lost session is replaced (after a backoff) without crashing.
 * Sessions are told apart by application_name, which embeds this file's schema, so the test
 * only ever looks at (and terminates) sessions of its own.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { Maintenance } from '../src/maintenance-api.js';
import { BerthMetrics } from '../src/metrics/catalogue.js';
import { RECONNECT_MAX_MS, reconnectDelayMs } from '../src/maintenance/election.js';
import { followerApplicationName, leaderApplicationName, schemaLockKey } from '../src/storage/locks.js';
import { captureLogger, DATABASE_URL, FAST_MAINTENANCE, freshSchema, testLogger, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('election');

function start(id: string, connectionString = DATABASE_URL, logger = testLogger): Maintenance {
  const m = new Maintenance({
    connectionString,
    schema,
    pool,
    logger,
    metrics: new BerthMetrics(),
    options: FAST_MAINTENANCE,
    workerId: `${schema}-${id}`,
  });
  m.start();
  return m;
}

type Session = { pid: number; started: string; name: string; queryStart: string | null };

/** This file's election sessions (follower or leader), by application_name. */
async function sessions(): Promise<Session[]> {
  const r = await pool.query<Session>(
    `SELECT pid, backend_start::text AS started, application_name AS name, query_start::text AS "queryStart"
       FROM pg_stat_activity WHERE application_name LIKE 'berth %' AND application_name LIKE '%' || $1 || '-%'`,
    [schema],
  );
  return r.rows;
}

/** The application_name of the session holding this schema's leader lock. */
async function lockHolder(): Promise<{ pid: number; name: string } | null> {
  const r = await pool.query<{ pid: number; name: string }>(
    `SELECT a.pid, a.application_name AS name FROM pg_locks l JOIN pg_stat_activity a USING (pid)
      WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        AND l.classid = $1::oid AND l.objid = $2::oid AND l.objsubid = 2`,
    [schemaLockKey(schema) >>> 0, -1 >>> 0],
  );
  return r.rows[0] ?? null;
}

/** Start three Maintenance instances, wait for one to lead, run `fn`, and stop them all. */
async function withThree(
  keys: string[],
  fn: (ms: Map<string, Maintenance>, leaderId: string) => Promise<void>,
): Promise<void> {
  const ms = new Map(keys.map((k) => [k, start(k)]));
  try {
    const leader = await waitFor(() => [...ms.values()].find((m) => m.isLeader), 20_000, 'a leader');
    await fn(ms, [...ms].find(([, v]) => v === leader)![0]);
  } finally {
    await Promise.all([...ms.values()].map((m) => m.stop()));
  }
}

async function terminate(pid: number): Promise<void> {
  await pool.query('SELECT pg_terminate_backend($1)', [pid]);
}

test('followers keep one election session across polls; only the lock holder is named leader', async () => {
  await withThree(['a', 'b', 'c'], async (ms, leaderId) => {
    const followers = [...ms.keys()].filter((k) => k !== leaderId);
    // Watch the followers' sessions until each has run at least 10 polls (10 different
    // query_start values): every (pid, backend_start) seen is recorded.
    const seen = new Map<string, Set<string>>(followers.map((k) => [k, new Set()]));
    const polls = new Map<string, Set<string>>(followers.map((k) => [k, new Set()]));
    const namedLeader = new Set<number>();
    await waitFor(
      async () => {
        for (const s of await sessions()) {
          if (s.name.startsWith('berth leader ')) namedLeader.add(s.pid);
          const k = followers.find((f) => s.name === followerApplicationName(`${schema}-${f}`));
          if (!k) continue;
          seen.get(k)!.add(`${s.pid}/${s.started}`);
          if (s.queryStart) polls.get(k)!.add(s.queryStart);
        }
        return [...polls.values()].every((p) => p.size >= 10);
      },
      60_000,
      '10 polls by each follower',
    );
    for (const k of followers) assert.equal(seen.get(k)!.size, 1, `follower ${k} used one session for all its polls`);
    const holder = await lockHolder();
    assert.equal(
      holder?.name,
      leaderApplicationName(`${schema}-${leaderId}`),
      'the lock holder carries the leader name',
    );
    assert.deepEqual([...namedLeader], [holder!.pid], 'no other session was ever named like the leader');
    assert.equal([...ms.values()].filter((m) => m.isLeader).length, 1);
  });
});

test("terminating the leader's session hands leadership over; the old leader comes back as a follower", async () => {
  await withThree(['d', 'e', 'f'], async (ms, leaderId) => {
    const leader = ms.get(leaderId)!;
    const holder = await waitFor(lockHolder, 20_000, 'the lock holder');
    assert.equal(holder.name, leaderApplicationName(`${schema}-${leaderId}`));
    await terminate(holder.pid);
    const next = await waitFor(
      async () => {
        const h = await lockHolder();
        return h && h.pid !== holder.pid ? h : null;
      },
      20_000,
      'a new lock holder',
    );
    assert.notEqual(next.name, leaderApplicationName(`${schema}-${leaderId}`), 'another process leads');
    await waitFor(() => !leader.isLeader, 20_000, 'the old leader to step down');
    await waitFor(
      async () => (await sessions()).some((s) => s.name === followerApplicationName(`${schema}-${leaderId}`)),
      30_000,
      'the old leader to reconnect as a follower',
    );
    await waitFor(() => [...ms.values()].filter((m) => m.isLeader).length === 1, 20_000, 'exactly one leader');
  });
});

test('a follower whose session is terminated reconnects, keeps following, and can still lead', async () => {
  await withThree(['g', 'h', 'i'], async (ms, leaderId) => {
    const leader = ms.get(leaderId)!;
    const victimId = [...ms.keys()].find((k) => k !== leaderId)!;
    const name = followerApplicationName(`${schema}-${victimId}`);
    const first = await waitFor(
      async () => (await sessions()).find((s) => s.name === name),
      20_000,
      'the follower session',
    );
    await terminate(first.pid);
    const second = await waitFor(
      async () => (await sessions()).find((s) => s.name === name && s.pid !== first.pid),
      30_000,
      'the follower to reconnect',
    );
    // It follows on the new session: its polls run there (query_start moves on).
    await waitFor(
      async () => {
        const s = (await sessions()).find((x) => x.pid === second.pid);
        return s && s.queryStart !== second.queryStart;
      },
      20_000,
      'a poll on the new session',
    );
    assert.ok(leader.isLeader, 'the leader was not disturbed');
    // Every other process stops: the reconnected follower takes over.
    const victim = ms.get(victimId)!;
    await Promise.all([...ms].filter(([k]) => k !== victimId).map(([, m]) => m.stop()));
    await waitFor(() => victim.isLeader, 20_000, 'the reconnected follower to lead');
    const holder = await waitFor(lockHolder, 20_000, 'the lock holder');
    assert.equal(holder.pid, second.pid, 'it leads on the session it reconnected');
    assert.equal(holder.name, leaderApplicationName(`${schema}-${victimId}`));
  });
});

test('an unreachable server is retried with a growing, bounded backoff, not on every poll', async () => {
  // A port nothing listens on: every connect is refused at once.
  const port = await new Promise<number>((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const p = (s.address() as { port: number }).port;
      s.close(() => resolve(p));
    });
  });
  const { logger, lines } = captureLogger();
  const m = start('down', `postgres://postgres@127.0.0.1:${port}/test`, logger);
  try {
    const failures = () => lines.filter((l) => l.msg === 'maintenance election session could not connect');
    await waitFor(() => failures().length >= 4, 60_000, 'four failed connects');
    const delays = failures().map((l) => Number(l.retryInMs));
    const poll = FAST_MAINTENANCE.leaderPollMs;
    // Attempt n waits [0.5, 1) × poll × 2^(n-1): the 4th waits at least 4 polls, not one.
    delays.slice(0, 4).forEach((d, i) => {
      assert.ok(d >= 0.5 * poll * 2 ** i - 5, `delay ${i + 1} (${d} ms) is backed off`);
    });
    assert.equal(m.isLeader, false);
  } finally {
    await m.stop();
  }
});

test('reconnect delays double from the poll, are jittered, and stay under the cap', () => {
  for (let n = 1; n <= 30; n++) {
    const d = reconnectDelayMs(1000, n);
    const full = Math.min(1000 * 2 ** (n - 1), RECONNECT_MAX_MS);
    assert.ok(d >= full / 2 && d < full, `attempt ${n}: ${d} in [${full / 2}, ${full})`);
  }
  assert.ok(reconnectDelayMs(60_000, 5) <= 60_000, 'a poll longer than the cap is its own cap');
});
