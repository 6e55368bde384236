/**
 * Connections a berth worker process holds, as the server sees them: `pg_stat_activity` sampled
 * every 100 ms, client backends of the bench database grouped by `application_name`, which berth
 * sets per session as `berth <role> <worker id>` (src/db/connections.ts sessionName). The sampler
 * connects to another database, so its own reads never count in the bench database's commits.
 * A session shorter than a sample can be missed; berth's pools keep theirs for 10 s idle.
 */
import type pg from 'pg';

/**
 * The roles of a worker's sessions. `worker` is every session of its primary pools: the claim
 * session, the settlement session and the shared pool all carry that name. `election` is the
 * leader's or a follower's election session.
 */
export const ROLES = ['worker', 'listen', 'election', 'read', 'dashboard'] as const;
export type Role = (typeof ROLES)[number];

export interface ConnectionPeaks {
  /** Per worker id: the most sessions it held at once. */
  perProcess: Map<string, number>;
  /** Per role: the most sessions of that role any one process held at once. */
  byRole: Map<Role, number>;
  /** The most berth sessions of the whole fleet at once. */
  fleet: number;
  samples: number;
}

const NAME = /^berth (worker|read|listen|dashboard|leader|follower) (.+)$/;

function roleOf(kind: string): Role {
  if (kind === 'leader' || kind === 'follower') return 'election';
  return kind as Role;
}

export class ConnectionSampler {
  private timer: NodeJS.Timeout | null = null;
  private inFlight: Promise<void> | null = null;
  private peaks: ConnectionPeaks = { perProcess: new Map(), byRole: new Map(), fleet: 0, samples: 0 };

  constructor(
    private readonly client: pg.Client,
    private readonly database: string,
    private readonly everyMs = 100,
  ) {}

  start(): void {
    this.peaks = { perProcess: new Map(), byRole: new Map(), fleet: 0, samples: 0 };
    this.timer = setInterval(() => {
      if (this.inFlight === null) this.inFlight = this.sample().finally(() => (this.inFlight = null));
    }, this.everyMs);
  }

  async stop(): Promise<ConnectionPeaks> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.inFlight;
    return this.peaks;
  }

  private async sample(): Promise<void> {
    const r = await this.client.query<{ name: string; n: number }>(
      `SELECT application_name AS name, count(*)::int AS n FROM pg_stat_activity
        WHERE datname = $1 AND backend_type = 'client backend' GROUP BY 1`,
      [this.database],
    );
    const perProcess = new Map<string, Map<Role, number>>();
    let fleet = 0;
    for (const row of r.rows) {
      const m = NAME.exec(row.name);
      if (!m) continue;
      const id = m[2]!;
      const byRole = perProcess.get(id) ?? new Map<Role, number>();
      perProcess.set(id, byRole);
      const role = roleOf(m[1]!);
      byRole.set(role, (byRole.get(role) ?? 0) + row.n);
      fleet += row.n;
    }
    const p = this.peaks;
    p.samples++;
    p.fleet = Math.max(p.fleet, fleet);
    for (const [id, byRole] of perProcess) {
      let total = 0;
      for (const n of byRole.values()) total += n;
      p.perProcess.set(id, Math.max(p.perProcess.get(id) ?? 0, total));
      for (const [role, n] of byRole) p.byRole.set(role, Math.max(p.byRole.get(role) ?? 0, n));
    }
  }
}
