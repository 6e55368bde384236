import net from 'node:net';

/**
 * A TCP proxy in front of the shared PostgreSQL server that a test can cut and restore: an
 * outage (every connection dropped, new ones refused at once) without stopping, restarting or
 * disturbing the server other test files use.
 */
export class TcpProxy {
  private readonly server: net.Server;
  private readonly sockets = new Set<net.Socket>();
  private down = false;
  port = 0;

  constructor(private readonly target: { host: string; port: number }) {
    this.server = net.createServer((client) => {
      if (this.down) {
        client.destroy();
        return;
      }
      const upstream = net.connect(this.target.port, this.target.host);
      for (const s of [client, upstream]) {
        this.sockets.add(s);
        s.on('close', () => this.sockets.delete(s));
        s.on('error', () => undefined);
      }
      client.pipe(upstream);
      upstream.pipe(client);
      client.on('close', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
    });
  }

  async start(): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as net.AddressInfo).port;
  }

  /** The URL `url` rewritten to go through this proxy. */
  url(url: string): string {
    const u = new URL(url);
    u.hostname = '127.0.0.1';
    u.port = String(this.port);
    return u.toString();
  }

  /** Drop every connection and refuse new ones until `restore()`. */
  cut(): void {
    this.down = true;
    for (const s of this.sockets) s.destroy();
  }

  restore(): void {
    this.down = false;
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
