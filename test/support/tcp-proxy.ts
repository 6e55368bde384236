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
      const upstream = openUpstream(client, this.target, this.sockets);
      upstream.pipe(client);
      upstream.on('close', () => client.destroy());
    });
  }

  async start(): Promise<void> {
    this.port = await listenOnLoopback(this.server);
  }

  /** The URL `url` rewritten to go through this proxy. */
  url(url: string): string {
    return throughPort(url, this.port);
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

/**
 * A proxy that has every session it carries terminated the moment the server says the session
 * is ready, and hands the client the server's ReadyForQuery and its FATAL in one write: what a
 * loaded machine does when a backend is terminated right after its start-up (the client reads
 * both in one packet, and parses them in one tick). `terminate` is given the backend's pid.
 */
export class ReadyThenFatalProxy {
  private readonly server: net.Server;
  private readonly sockets = new Set<net.Socket>();
  port = 0;

  constructor(
    private readonly target: { host: string; port: number },
    private readonly terminate: (pid: number) => Promise<void>,
  ) {
    this.server = net.createServer((client) => this.carry(client));
  }

  private carry(client: net.Socket): void {
    const upstream = openUpstream(client, this.target, this.sockets);
    let held = Buffer.alloc(0);
    let pid: number | null = null;
    let ready = false;
    upstream.on('data', (chunk: Buffer) => {
      held = Buffer.concat([held, chunk]);
      if (ready) return;
      // Server messages: a type byte, then a length that counts itself.
      for (let at = 0; at + 5 <= held.length; ) {
        const type = String.fromCharCode(held[at]!);
        const end = at + 1 + held.readInt32BE(at + 1);
        if (end > held.length) break;
        if (type === 'K') pid = held.readInt32BE(at + 5);
        if (type === 'Z') {
          ready = true;
          if (pid !== null) void this.terminate(pid);
          break;
        }
        at = end;
      }
    });
    // The server closes the session after its FATAL: everything it sent goes out in one write.
    upstream.on('end', () => {
      client.end(held);
    });
  }

  async start(): Promise<void> {
    this.port = await listenOnLoopback(this.server);
  }

  /** The URL `url` rewritten to go through this proxy. */
  url(url: string): string {
    return throughPort(url, this.port);
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

async function listenOnLoopback(server: net.Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return (server.address() as net.AddressInfo).port;
}

function throughPort(url: string, port: number): string {
  const u = new URL(url);
  u.hostname = '127.0.0.1';
  u.port = String(port);
  return u.toString();
}

/** The server side of a carried connection: the client's bytes piped to it, both sockets tracked in `sockets`. */
function openUpstream(
  client: net.Socket,
  target: { host: string; port: number },
  sockets: Set<net.Socket>,
): net.Socket {
  const upstream = net.connect(target.port, target.host);
  for (const s of [client, upstream]) {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => undefined);
  }
  client.pipe(upstream);
  client.on('close', () => upstream.destroy());
  return upstream;
}
