import { request } from 'node:http';

/** An HTTP answer as the dashboard tests read it. */
export interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
  json: () => Record<string, unknown>;
}

export type RequestOptions = { method?: string; headers?: Record<string, string>; body?: string };

/** A plain node:http request, so a test controls every header (Host, Origin, CSRF) and body byte. */
export function httpCall(url: string, opts: RequestOptions = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: opts.method ?? 'GET', headers: opts.headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8');
        resolve({
          status: res.statusCode ?? 0,
          headers: res.headers,
          body,
          json: () => JSON.parse(body) as Record<string, unknown>,
        });
      });
    });
    req.on('error', reject);
    req.end(opts.body);
  });
}
