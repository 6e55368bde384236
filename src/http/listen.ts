import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from '../logger.js';

/** A request handler that returns false for a request it does not serve. */
export type RequestHandler = (req: IncomingMessage, res: ServerResponse) => Promise<boolean>;

export interface Listening {
  /** http://host:port with the port actually bound (no trailing slash); loopback for a wildcard bind. */
  readonly url: string;
  /** Stops listening and drops open (keep-alive) connections. */
  close(): Promise<void>;
}

/**
 * Listen on `host:port` and offer each request to `handlers` in order; 404 when none serves it.
 * Shared by the dashboard, the worker's http port and the standalone metrics server.
 */
export async function listen(
  handlers: RequestHandler[],
  port: number,
  host: string,
  logger?: Logger,
): Promise<Listening> {
  const server = createServer((req, res) => {
    void (async () => {
      for (const handle of handlers) if (await handle(req, res)) return;
      res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8', 'x-content-type-options': 'nosniff' });
      res.end('not found\n');
    })().catch((err: unknown) => {
      logger?.error({ err: (err as Error)?.message }, 'http request failed');
      res.destroy();
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const { address, port: bound } = server.address() as AddressInfo;
  // A wildcard bind answers on loopback too: show an address a browser can open.
  const reachable = address === '0.0.0.0' ? '127.0.0.1' : address === '::' ? '::1' : address;
  const shown = reachable.includes(':') ? `[${reachable}]` : reachable;
  let closed: Promise<void> | null = null;
  return {
    url: `http://${shown}:${bound}`,
    close: () =>
      (closed ??= new Promise<void>((resolve, reject) => {
        server.close((err) => (err ? reject(err) : resolve()));
        server.closeAllConnections();
      })),
  };
}
