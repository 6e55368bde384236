/**
 * Shared by scripts/explain-hot.ts and scripts/explain-admin.ts: a `Queryable` that EXPLAINs
 * (ANALYZE, BUFFERS) every statement a production function sends through it, so the docs show
 * the plans of the statements berth really runs, never hand-copied SQL.
 *
 * Each statement runs on one dedicated session opened with the worker's SESSION_OPTIONS
 * (jit off, `plan_cache_mode = force_generic_plan`, bitmap scans off), inside BEGIN/ROLLBACK:
 * `PREPARE` of its text, then `EXPLAIN (ANALYZE, BUFFERS) EXECUTE` with its values. Prefixing
 * EXPLAIN to the text would not do: the bind values of an EXPLAIN are folded into the plan as
 * constants (a custom plan), while the worker's sessions run every parameterised statement
 * with a generic plan; through EXECUTE the session's plan_cache_mode decides, as it does for
 * the worker. The `name` of a named statement is dropped (the PREPARE has its own).
 *
 * A statement that writes is applied by EXPLAIN ANALYZE and rolled back, so the data set stays
 * as described. The function then gets either the result of the statement run for real after
 * the rollback (`real`, for reads) or an empty result (`rows: []`, for writes); a function that
 * cannot go on from an empty result throws, and `capture` catches that once it has a plan.
 */
import { createRequire } from 'node:module';
import type pg from 'pg';
import type { Queryable } from '../src/index.js';

/** node-postgres' own serialisation of a bind value (arrays, dates, JSON) to its text form. */
const { prepareValue } = createRequire(import.meta.url)('pg/lib/utils.js') as {
  prepareValue: (v: unknown) => string | null;
};

export interface Captured {
  label: string;
  sql: string;
  values: unknown[];
  plan: string[];
  /** Wall time of the real run (real mode only), ms. */
  wallMs: number | null;
}

/** Thrown to end a function once it sent `max` statements (an empty result may loop it). */
class Enough extends Error {}

/** Session-setting round trips of queryWithoutJit (jit is off already): run as they are, not shown. */
const PASS_THROUGH = /^\s*SELECT (current_setting|set_config)\('jit'/;

export class Explainer {
  readonly captured: Captured[] = [];
  constructor(private readonly client: pg.Client) {}

  /**
   * Run `fn` against the explaining Queryable; its statements are recorded under `label`.
   * `real`: return each statement's real result (reads); otherwise an empty one (writes). A
   * function of the statement's text: real for the statements it picks (a function that reads
   * first and writes only when the read found something, as rescue does).
   * `max`: stop the function after this many statements.
   */
  async capture<T>(
    label: string,
    fn: (db: Queryable) => Promise<T>,
    opts: { real: boolean | ((text: string) => boolean); max?: number },
  ): Promise<T | undefined> {
    const before = this.captured.length;
    const query = async (q: string | pg.QueryConfig<unknown[]>, values?: unknown[]) => {
      const text = typeof q === 'string' ? q : q.text;
      const vals = (typeof q === 'string' ? values : q.values) ?? [];
      if (PASS_THROUGH.test(text)) return this.client.query(text, vals);
      if (opts.max !== undefined && this.captured.length - before >= opts.max) throw new Enough();
      let real: pg.QueryResult | null = null;
      let wallMs: number | null = null;
      if (typeof opts.real === 'function' ? opts.real(text) : opts.real) {
        const started = process.hrtime.bigint();
        real = await this.client.query(text, vals);
        wallMs = Number(process.hrtime.bigint() - started) / 1e6;
      }
      this.captured.push({ label, sql: text, values: vals, plan: await this.explain(text, vals), wallMs });
      return real ?? { command: 'SELECT', rowCount: 0, oid: 0, fields: [], rows: [] };
    };
    let result: T | undefined;
    try {
      result = await fn({ query } as unknown as Queryable);
    } catch (err) {
      if (this.captured.length === before) throw err;
      if (!(err instanceof Enough)) console.log(`${label}: stopped after its plans (${(err as Error).message})`);
    }
    if (this.captured.length === before) throw new Error(`${label}: no statement captured`);
    return result;
  }

  private async explain(text: string, values: unknown[]): Promise<string[]> {
    const c = this.client;
    await c.query('BEGIN');
    try {
      await c.query(`PREPARE berth_explain AS ${text}`);
      const types = (
        await c.query<{ t: string[] }>(
          `SELECT parameter_types::text[] AS t FROM pg_prepared_statements WHERE name = 'berth_explain'`,
        )
      ).rows[0]!.t;
      // A utility statement takes no bind parameters: the values go in as literals, in the text
      // form node-postgres would have sent them.
      const args = types
        .map((t, i) => {
          const v = prepareValue(values[i]);
          return `${v === null ? 'NULL' : c.escapeLiteral(v)}::${t === 'unknown' ? 'text' : t}`;
        })
        .join(', ');
      const r = await c.query<{ 'QUERY PLAN': string }>(
        `EXPLAIN (ANALYZE, BUFFERS) EXECUTE berth_explain${args ? `(${args})` : ''}`,
      );
      return r.rows.map((x) => x['QUERY PLAN']);
    } finally {
      await c.query('ROLLBACK');
      // Prepared statements outlive a rollback.
      await c.query('DEALLOCATE berth_explain').catch(() => undefined);
    }
  }
}

/** The plan without the nodes that never ran (and everything under them) and without `Heap Fetches: 0`. */
export function readable(plan: readonly string[]): string[] {
  const out: string[] = [];
  let skipBelow = -1;
  for (const line of plan) {
    const indent = /^ */.exec(line)![0].length;
    if (skipBelow >= 0 && indent > skipBelow) continue;
    skipBelow = -1;
    if (line.includes('(never executed)')) {
      skipBelow = indent;
      continue;
    }
    if (!/Heap Fetches: 0$/.test(line)) out.push(line);
  }
  return out;
}

export interface Summary {
  execMs: number;
  planMs: number;
  buffers: { hit: number; read: number };
  rowsVisited: number;
  top: string;
  access: string;
  /** The scan nodes that visited the most rows (rows returned + removed, times loops). */
  widest: { node: string; rows: number }[];
}

export function summarise(plan: readonly string[]): Summary {
  const num = (re: RegExp) => Number(plan.map((l) => re.exec(l)?.[1]).find((x) => x !== undefined) ?? Number.NaN);
  const planningAt = plan.findIndex((l) => l.startsWith('Planning'));
  const body = planningAt < 0 ? plan : plan.slice(0, planningAt);
  // The top node's Buffers line (instrumentation is inclusive of children and subplans).
  const topBuf = body.find((l) => /^ {2}Buffers:/.test(l)) ?? '';
  const buffers = {
    hit: Number(/hit=(\d+)/.exec(topBuf)?.[1] ?? 0),
    read: Number(/read=(\d+)/.exec(topBuf)?.[1] ?? 0),
  };
  // Rows each scan node produced plus those its filter threw away, times its loops.
  let rowsVisited = 0;
  const scans: { node: string; rows: number }[] = [];
  for (let i = 0; i < body.length; i++) {
    const m =
      /(?:^|->\s+)((?:Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan|Function Scan)(?: Backward)?(?: using \S+)? on \S+)[^(]*\(cost=[^)]*\) \(actual time=[^ ]+ rows=(\d+) loops=(\d+)\)/.exec(
        body[i]!,
      );
    if (!m) continue;
    const loops = Number(m[3]);
    let removed = 0;
    const indent = /^ */.exec(body[i]!)![0].length;
    for (let j = i + 1; j < body.length && !/^\s*->/.test(body[j]!) && /^ */.exec(body[j]!)![0].length > indent; j++) {
      const r = /Rows Removed by (?:Filter|Index Recheck): (\d+)/.exec(body[j]!);
      if (r) removed += Number(r[1]);
    }
    const rows = (Number(m[2]) + removed) * loops;
    rowsVisited += rows;
    scans.push({ node: m[1]!, rows });
  }
  const indexes = [
    ...new Set(
      body.flatMap((l) => {
        const m =
          /(?:Index Scan|Index Only Scan|Bitmap Index Scan)(?: Backward)? (?:using|on) (\S+)|Conflict Arbiter Indexes: (.+)$/.exec(
            l,
          );
        return m ? [(m[1] ?? m[2]!).replace(/_\d+_/, '_N_')] : [];
      }),
    ),
  ];
  const seqs = [
    ...new Map(
      body.flatMap((l) => {
        const m = /Seq Scan on (\S+) .*actual time=[^ ]+ rows=(\d+) loops=(\d+)/.exec(l);
        return m && Number(m[2]) * Number(m[3]) >= 1000 ? [[m[1]!, Number(m[2]) * Number(m[3])] as const] : [];
      }),
    ).entries(),
  ];
  const access = [
    indexes.length ? `index: ${indexes.join(', ')}` : 'no index',
    ...seqs.map(([rel, n]) => `**seq scan ${rel}** (${n.toLocaleString('en-US')} rows)`),
  ].join('; ');
  return {
    execMs: num(/^Execution Time: ([\d.]+)/),
    planMs: num(/^Planning Time: ([\d.]+)/),
    buffers,
    rowsVisited,
    top: plan[0]!.replace(/\s+\(cost=.*$/, '').trim(),
    access,
    widest: scans.sort((a, b) => b.rows - a.rows).slice(0, 2),
  };
}
