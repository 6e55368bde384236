/**
 * An embedded PostgreSQL for the zero-setup demo, in a process of its own.
 *
 * Ctrl-C in a terminal sends SIGINT to the whole foreground process group. PostgreSQL started
 * in-process (a child of the demo) would get it too and shut down while the worker still holds
 * leases and has settlements to write. So the PostgreSQL owner, demo/embedded-postgres-host.ts,
 * is forked detached (a session of its own, out of reach of the terminal's signals) with an IPC
 * channel: the demo stops its worker first, then calls `stop()`. If the demo dies instead, the
 * channel drops and the host stops PostgreSQL by itself.
 */
import { fork } from 'node:child_process';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export interface EmbeddedPostgresOptions {
  /** Data directory. `./.berth/pgdata`. */
  dir?: string;
  /** `BERTH_EMBEDDED_PORT`, else 54329. */
  port?: number;
}

export interface EmbeddedPostgres {
  /** `postgres://berth:berth@127.0.0.1:<port>/berth`. */
  readonly url: string;
  /** Stops PostgreSQL cleanly and resolves once its host process has exited. Idempotent. */
  stop(): Promise<void>;
}

/** What the host says over IPC. */
export type HostMessage = { type: 'ready'; url: string } | { type: 'failed'; message: string };

/** How long `stop()` waits for a clean shutdown before sending the host SIGTERM. */
const STOP_GRACE_MS = 30_000;

export async function startEmbeddedPostgres(options: EmbeddedPostgresOptions = {}): Promise<EmbeddedPostgres> {
  const dir = resolve(options.dir ?? '.berth/pgdata');
  const port = options.port ?? Number(process.env.BERTH_EMBEDDED_PORT ?? 54329);
  const host = fileURLToPath(new URL('./embedded-postgres-host.ts', import.meta.url));
  const child = fork(host, [JSON.stringify({ dir, port })], {
    // The host is TypeScript like the demo; its own flags only (no inherited --inspect port),
    // and tsx resolved from here, so any working directory will do.
    execArgv: ['--import', import.meta.resolve('tsx')],
    detached: true,
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const exited = new Promise<number | null>((res) => child.once('exit', (code) => res(code)));

  const url = await new Promise<string>((res, rej) => {
    child.on('message', (m: HostMessage) => {
      if (m.type === 'ready') res(m.url);
      else rej(new Error(`embedded PostgreSQL failed to start: ${m.message}`));
    });
    void exited.then((code) => rej(new Error(`embedded PostgreSQL host exited during start-up (code ${code})`)));
  });

  let stopping: Promise<void> | null = null;
  return {
    url,
    stop: () =>
      (stopping ??= (async () => {
        if (child.exitCode !== null || child.signalCode !== null) return;
        if (child.connected) child.send({ type: 'stop' });
        else child.kill('SIGTERM');
        const grace = setTimeout(() => child.kill('SIGTERM'), STOP_GRACE_MS);
        await exited;
        clearTimeout(grace);
      })()),
  };
}
