/**
 * What the start-order review files share: a fixture (a schema, a task that counts its runs, the
 * sessions and events of a worker, the successes attempt history holds), and a TCP proxy in front
 * of the shared test server whose handling of NEW connections can be switched at any moment: passed through,
 * delayed, held (never forwarded: the client's connect timeout ends it) or refused (reset).
 * Switched from a `worker:started` listener, it reaches exactly the sessions the change moved
 * after engine.start(): the settlement session and the shared pool's first connect.
 */
import net from 'node:net';
import { after } from 'node:test';
import { defineTask, type Worker, type WorkerEventName } from '../src/index.js';
import { DATABASE_URL, freshSchema } from './helpers.js';

/**
 * A schema of its own, a proxy, a task type that counts its runs by task id (its ceiling
 * `ceilingMs`: how long a lease a stop could not hand back stays taken), unhandled rejections kept.
 */
export async function reviewFixture(name: string, type: string, ceilingMs = 60_000) {
  const { schema, pool } = await freshSchema(name);
  const S = `"${schema}"`;
  const proxy = await startProxy();
  after(() => proxy.close());
  const unhandled: unknown[] = [];
  process.on('unhandledRejection', (e) => void unhandled.push(e));
  const runs = new Map<string, number>();
  const instant = defineTask<{ i: number }>({
    type,
    ceilingMs,
    handler: async (_p, ctx) => {
      runs.set(ctx.id, (runs.get(ctx.id) ?? 0) + 1);
    },
  });
  /** The sessions of worker `id` still open (their application_name ends with it). */
  const workerSessions = async (id: string): Promise<string[]> => {
    const r = await pool.query<{ application_name: string }>(
      `SELECT application_name FROM pg_stat_activity WHERE application_name LIKE $1`,
      [`% ${id}`],
    );
    return r.rows.map((x) => x.application_name);
  };
  /** How many of `ids` attempt history shows completed. */
  const succeeded = async (ids: readonly string[]): Promise<number> =>
    (
      await pool.query<{ n: number }>(
        `SELECT count(DISTINCT x.id)::int AS n FROM ${S}.attempt_history h CROSS JOIN LATERAL unnest(h.ids) x(id)
          WHERE h.outcome = 'success' AND x.id = ANY($1::bigint[])`,
        [ids],
      )
    ).rows[0]!.n;
  return { schema, pool, S, proxy, unhandled, runs, instant, workerSessions, succeeded };
}

/** The worker's events of `names`, in the order they came. */
export function recordEvents(w: Worker, names: readonly WorkerEventName[]): WorkerEventName[] {
  const seen: WorkerEventName[] = [];
  for (const name of names) w.events.on(name, () => void seen.push(name));
  return seen;
}

export type ProxyMode = { kind: 'pass' } | { kind: 'delay'; ms: number } | { kind: 'hold' } | { kind: 'refuse' };

export interface Proxy {
  url: string;
  mode: ProxyMode;
  /** Connections accepted, by the mode they met. */
  seen: Record<ProxyMode['kind'], number>;
  close(): Promise<void>;
}

export async function startProxy(): Promise<Proxy> {
  const target = new URL(DATABASE_URL);
  const sockets = new Set<net.Socket>();
  const track = (s: net.Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => undefined);
  };
  const proxy: Proxy = {
    url: '',
    mode: { kind: 'pass' },
    seen: { pass: 0, delay: 0, hold: 0, refuse: 0 },
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
  const forward = (client: net.Socket) => {
    if (client.destroyed) return;
    const upstream = net.connect(Number(target.port || 5432), target.hostname);
    track(upstream);
    client.pipe(upstream);
    upstream.pipe(client);
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
  };
  const server = net.createServer((client) => {
    track(client);
    const mode = proxy.mode;
    proxy.seen[mode.kind]++;
    if (mode.kind === 'pass') forward(client);
    else if (mode.kind === 'delay') setTimeout(() => forward(client), mode.ms);
    else if (mode.kind === 'refuse') client.resetAndDestroy();
    // hold: nothing; the client gives up at its connect timeout.
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const port = (server.address() as net.AddressInfo).port;
  const url = new URL(DATABASE_URL);
  url.hostname = '127.0.0.1';
  url.port = String(port);
  proxy.url = url.toString();
  return proxy;
}
