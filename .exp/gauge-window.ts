import pg from 'pg';
import { readGauges } from '../src/maintenance/gauges.js';
const url = 'postgres://postgres@127.0.0.1:56200/test';
const schema = 'pickup_probe_a';
const segs = (process.argv[2] ?? '1').split(',').map(Number);
function windowed(text: string): string {
  const s = `"${schema}"`;
  return text.replace(new RegExp(`${s.replace(/"/g, '"')}\\.(ready|range_leases|range_settlements|tombstones)\\b(?!_)`, 'g'),
    (_m, t) => `(${segs.map((k) => `SELECT * FROM ${s}."${t}_${k}"`).join(' UNION ALL ')})`);
}
for (const mode of ['full', 'window', 'full', 'window']) {
  const pool = new pg.Pool({ connectionString: url, max: 1 });
  if (mode === 'window') {
    const q = pg.Client.prototype.query;
    pool.on('connect', (c) => {
      (c as unknown as { query: unknown }).query = function (this: pg.Client, cfg: unknown, ...rest: unknown[]) {
        if (cfg && typeof cfg === 'object' && 'text' in cfg) cfg = { ...(cfg as object), text: windowed((cfg as { text: string }).text), name: process.env.UNNAMED ? undefined : (cfg as { name?: string }).name ? (cfg as { name: string }).name + 'w' : undefined };
        return (q as Function).call(this, cfg, ...rest);
      };
    });
  }
  const times: string[] = [];
  for (let i = 0; i < 6; i++) {
    if (i === 3) await pool.query(`TRUNCATE ${schema}.ready_5`);
    const a = performance.now();
    const g = await readGauges(pool as never, schema as never);
    times.push((performance.now() - a).toFixed(1) + (i === 0 ? `[${[...g.pending.values()]}]` : ''));
  }
  console.log(mode, times.join(' '));
  await pool.end();
}
