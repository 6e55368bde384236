/** Every system `npm run bench` compares, in its order, kept to those a label filter names. */
import { berthAdapter, berthBaseAdapter } from './berth.js';
import { graphileAdapter } from './graphile.js';
import { pgBossAdapter } from './pgboss.js';
import type { AdapterContext, SystemAdapter } from './types.js';

/** `filter`: lower-case parts of labels (BENCH_SYSTEMS); empty keeps every system. */
export function benchSystems(ctx: AdapterContext, filter: readonly string[]): SystemAdapter[] {
  const base = berthBaseAdapter(ctx);
  const systems = [
    berthAdapter(ctx),
    ...(base ? [base] : []),
    graphileAdapter(ctx, 'default'),
    graphileAdapter(ctx, 'throughput'),
    pgBossAdapter(ctx, 'default'),
    pgBossAdapter(ctx, 'batched'),
  ];
  if (filter.length === 0) return systems;
  return systems.filter((s) => filter.some((f) => s.label.toLowerCase().includes(f)));
}
