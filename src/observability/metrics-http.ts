import { checkKeys } from '../limits.js';
import { listen } from '../http/listen.js';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Registry } from 'prom-client';

/** Serves a request and returns true, or returns false for a path it does not own. */
export type MetricsRequestHandler = (req: IncomingMessage, res: ServerResponse) => Promise<boolean>;

/**
 * The Prometheus scrape endpoint, `GET /metrics`, as a handler a larger server can route
 * through: it answers `/metrics` (405 for a method other than GET or HEAD) and returns false for
 * any other path. Several registries (say a worker's and a dashboard's) are merged per scrape
 * with `Registry.merge`, so metrics registered after this call are served too; merging needs
 * distinct metric names and drops the registries' default labels — a scrape of registries that
 * share a name answers 500 with prom-client's error. One registry is served as it is.
 */
export function metricsRequestHandler(registries: Registry[] | Registry): MetricsRequestHandler {
  const list = Array.isArray(registries) ? [...registries] : [registries];
  if (list.length === 0) throw new Error('metricsRequestHandler needs at least one registry');
  return async (req, res) => {
    if (new URL(req.url ?? '/', 'http://localhost').pathname !== '/metrics') return false;
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain; charset=utf-8' });
      res.end('method not allowed\n');
      return true;
    }
    try {
      const registry = list.length === 1 ? list[0]! : Registry.merge(list);
      const body = await registry.metrics();
      res.writeHead(200, { 'content-type': registry.contentType, 'cache-control': 'no-store' });
      res.end(body);
    } catch (err) {
      res.writeHead(500, { 'content-type': 'text/plain; charset=utf-8' });
      res.end(`metrics collection failed: ${(err as Error).message}\n`);
    }
    return true;
  };
}

export interface MetricsServerOptions {
  /** 0 picks a free port (see `url`). */
  port: number;
  /** Loopback by default: a scrape endpoint is opened to the network on purpose, not by accident. */
  host?: string;
  registry: Registry[] | Registry;
}

export interface MetricsServer {
  /** The scrape URL, with the port actually bound. */
  readonly url: string;
  /** Stops listening and drops open (keep-alive) connections. */
  close(): Promise<void>;
}

const METRICS_SERVER_KEYS: ReadonlySet<string> = new Set<keyof MetricsServerOptions>(['port', 'host', 'registry']);

/** A standalone HTTP server serving only `GET /metrics` (404 elsewhere). */
export async function startMetricsServer(options: MetricsServerOptions): Promise<MetricsServer> {
  checkKeys(options, METRICS_SERVER_KEYS, 'startMetricsServer');
  const { port, host = '127.0.0.1', registry } = options;
  const server = await listen([metricsRequestHandler(registry)], port, host);
  return { url: `${server.url}/metrics`, close: () => server.close() };
}
