import { createHash } from 'node:crypto';
import type pg from 'pg';

/**
 * Anything that can run a parameterised query: a `pg.Pool`, a `pg.Client`, or a
 * `pg.PoolClient` checked out inside the caller's own transaction.
 */
export interface Queryable {
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(text: string, values?: unknown[]): Promise<pg.QueryResult<R>>;
  /** Named form: hot statements are prepared once per connection (planning a statement over
   * every ring partition costs more than running it). */
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(config: pg.QueryConfig<unknown[]>): Promise<pg.QueryResult<R>>;
}

/**
 * The one place an identifier (schema, partition, sequence, channel name) becomes SQL text.
 * Everything a user passes as a value travels as a bind parameter instead.
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const quoteIdent = (function (name: string): string {
  if (name.length === 0) throw new Error('identifier must not be empty');
  if (name.includes('\u0000')) throw new Error('identifier must not contain NUL');
  return `"${name.replaceAll('"', '""')}"`;
});

/** A SQL string literal, for the few DDL places (function bodies) that cannot take a bind. */
export function quoteLiteral(value: string): string {
  if (value.includes('\u0000')) throw new Error('literal must not contain NUL');
  return `'${value.replaceAll("'", "''")}'`;
}

/**
 * Wrap a call to a function that relies on READ COMMITTED: it takes a lane's row lock and then
 * needs a fresh snapshot to see a lease committed meanwhile. Under REPEATABLE READ or
 * SERIALIZABLE the caller's old snapshot would miss that lease, so the call is not made and
 * `isolation` is returned instead (the caller raises a clear error).
 */
export function readCommittedOnly(call: string): string {
  return `CASE WHEN current_setting('transaction_isolation') = 'read committed' THEN ${call} ELSE 'isolation' END`;
}

export const READ_COMMITTED_REQUIRED =
  'this operation must run at READ COMMITTED (the default): under REPEATABLE READ or SERIALIZABLE it could not see a lease taken meanwhile';

/** The schema name every statement of one berth installation is qualified with. */
export const DEFAULT_SCHEMA = 'berth';

/** The NOTIFY channel a schema's producers signal and its workers LISTEN on. */
export function wakeChannel(schema: string): string {
  return `${schema}.wake`;
}

/**
 * A schema bound once: its name (for statement names, the wake channel and lock keys) and its
 * identifier quoted for SQL text. Each schema's Storage (src/storage/storage.ts) holds one,
 * bound when the Storage is made, so no statement re-quotes it.
 */
export interface Schema {
  readonly name: string;
  /** `quoteIdent(name)`: what statements write before `.table`. */
  readonly q: string;
}

/** The bytes of a prepared statement's name PostgreSQL keeps (NAMEDATALEN − 1). */
const STATEMENT_NAME_BYTES = 63;

/**
 * A prepared statement's name as the server keeps it whole. The server cuts a name at 63 bytes,
 * and node-postgres tracks each connection's statements by the whole name, so two names that
 * share their first 63 bytes (a long schema name plus two ring windows' segments: claim
 * statements are named per window) met as "prepared statement … already exists" on the second,
 * and every claim in that window failed. A longer name becomes its kind (the part before the
 * first colon) and a hash of the whole: still one name per statement text, and distinct.
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const statementName = (function (name: string): string {
  // A UTF-16 unit is at most 3 UTF-8 bytes: a name of 21 units or fewer fits without counting.
  if (name.length * 3 <= STATEMENT_NAME_BYTES || Buffer.byteLength(name) <= STATEMENT_NAME_BYTES) return name;
  // Not cached: it runs once per compiled statement (preparedName), and Storage keeps those.
  const kind = name.slice(0, Math.min(Math.max(name.indexOf(':'), 0), 30));
  return `${kind}:#${createHash('sha256').update(name).digest('base64url').slice(0, 24)}`;
});

/**
 * The name a statement is prepared under: `name` (its kind, schema and window) and a hash of its
 * text, within the 63 bytes the server keeps (statementName). Behind a transaction pooler the
 * server's connections, and the statements prepared on them, are shared by every client: a name
 * alone would let a process of one berth version bind a statement another version prepared on
 * that connection under the same name with other text (a rolling upgrade, before the worker
 * detects that the pooler does not keep statements), and run the other version's SQL with its
 * own parameters. With the text's hash in the name, two texts never share a name, and the same
 * text, from any process of any version, shares one. Computed once per compiled statement.
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const preparedName = (function (name: string, text: string): string {
  return statementName(`${name}@${textHash(text)}`);
});

/**
 * 60 bits of a statement's text as 10 base64url characters: two 32-bit hashes over its UTF-16
 * units, FNV-1a and an FNV-1a with another offset whose state folds its high bits down each
 * step. Not a cryptographic hash: it tells berth's own texts apart. A new process's first
 * `createHash('sha256')` cost its first enqueue 0.4-0.5 ms (loading the digest), about half of
 * berth's own time in that call; this, not yet compiled, ~0.1 ms.
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
const textHash = (function (text: string): string {
  let a = 0x811c9dc5;
  let b = 0x050c5d1f;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    a = Math.imul(a ^ c, 0x01000193);
    b = Math.imul(b ^ c, 0x01000193) ^ (b >>> 15);
  }
  let out = '';
  for (let i = 0; i < 5; i++) out += BASE64URL[(a >>> (i * 6)) & 63];
  for (let i = 0; i < 5; i++) out += BASE64URL[(b >>> (i * 6)) & 63];
  return out;
});
const BASE64URL = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';

/** Bind a schema name: validated and quoted here, once (storageFor in src/storage/storage.ts). */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const bindSchema = (function (schema: string): Schema {
  return Object.freeze({ name: schema, q: quoteIdent(schema) });
});

/**
 * Run one statement that walks the ring (rescue, the gauges, task counts and listings) with the
 * planner settings it needs, whatever the session's:
 * - JIT off: these statements plan over every ring partition; on partitions that were never
 *   analyzed (every freshly truncated ring segment) their estimates pass `jit_above_cost`, and
 *   compiling such a plan took 10–28 s for a statement that runs in milliseconds.
 * - Bitmap scans on: worker sessions turn them off for the claim (see SESSION_OPTIONS in
 *   src/process/worker-pools.ts), and without them the gauges read each lane's backlog with a
 *   sequential scan of the ring partition per lane (553 ms against 177 ms at 200k entries,
 *   docs/explain.md).
 * - Sequential scans on: worker sessions turn them off too (SESSION_OPTIONS), and these reads
 *   scan whole partitions on purpose.
 * - On a pool: a short transaction that turns JIT off for itself (`SET LOCAL`), which holds
 *   behind a transaction-mode pooler too.
 * - On a client (maybe inside the caller's own transaction): JIT off for the session around the
 *   statement, then the caller's setting back (inside a transaction that the statement aborts,
 *   the rollback restores it).
 */
export async function queryRingRead<R extends pg.QueryResultRow = pg.QueryResultRow>(
  db: Queryable,
  /** The statement; with a `name`, prepared once per session (see RingReadStatement). */
  statement: string | RingReadStatement,
  values?: unknown[],
): Promise<pg.QueryResult<R>> {
  const { text, name } = typeof statement === 'string' ? { text: statement, name: undefined } : statement;
  const query = name === undefined ? { text, values } : { name, text, values };
  if (isPool(db)) return inJitOffTransaction<R>(db, query);
  const prev = await db.query<{ jit: string; bitmap: string; seq: string }>(
    `SELECT current_setting('jit') AS jit, current_setting('enable_bitmapscan') AS bitmap,
            current_setting('enable_seqscan') AS seq,
            set_config('jit', 'off', false), set_config('enable_bitmapscan', 'on', false),
            set_config('enable_seqscan', 'on', false)`,
  );
  const was = prev.rows[0] ?? { jit: 'off', bitmap: 'on', seq: 'on' };
  try {
    return await db.query<R>(query);
  } finally {
    if (was.jit !== 'off' || was.bitmap !== 'on' || was.seq !== 'on')
      await db
        .query(
          `SELECT set_config('jit', $1, false), set_config('enable_bitmapscan', $2, false),
                  set_config('enable_seqscan', $3, false)`,
          [was.jit, was.bitmap, was.seq],
        )
        .catch(() => undefined);
  }
}

/**
 * A ring read the leader runs every few seconds, prepared once per session: planned over every
 * ring partition, rescue took ~21 ms to plan for ~4 ms of work and the gauges ~15 + 11 ms, a burst
 * of server CPU every 5 s that pickups running at the same moment waited behind (their p99,
 * docs/benchmarks-journal.md, "Ring windows"). Planned inside the ring read's transaction, so with its
 * settings; PostgreSQL plans it again when a partition it reads is truncated or analyzed.
 */
export interface RingReadStatement {
  /** Without a name (a `Statement` compiled unnamed), the text is sent unprepared. */
  readonly name?: string | undefined;
  readonly text: string;
}

async function inJitOffTransaction<R extends pg.QueryResultRow>(
  pool: pg.Pool,
  query: { text: string; values?: unknown[]; name?: string },
): Promise<pg.QueryResult<R>> {
  let broken = false;
  const onError = () => {
    broken = true;
  };
  const client = await checkoutListening(pool, onError);
  try {
    // One round trip for all of them (simple protocol, no parameters). A prepared ring read is
    // planned generically from its first run (worker sessions already are, SESSION_OPTIONS; this
    // is for other pools): its custom plans (the first five of a session, with rescue's LIMIT as
    // a constant) planned all ~100 partitions each run, ~20 ms against one generic planning.
    await client.query(
      `BEGIN; SET LOCAL jit = off; SET LOCAL enable_bitmapscan = on; SET LOCAL enable_seqscan = on${
        query.name === undefined ? '' : '; SET LOCAL plan_cache_mode = force_generic_plan'
      }`,
    );
    try {
      const res = await client.query<R>(query);
      await client.query('COMMIT');
      return res;
    } catch (err) {
      await client.query('ROLLBACK').catch(() => {
        broken = true;
      });
      throw err;
    }
  } finally {
    client.removeListener('error', onError);
    client.release(broken);
  }
}

/**
 * Check a client out with an `'error'` listener attached in the same tick the pool hands it
 * over. A checked-out client emits `'error'` when its backend goes away (a terminated session,
 * a restart), and unheard that event crashes the process. With `await pool.connect()` the
 * listener is attached one microtask later, and the pool hands a client over from inside the
 * previous holder's release, which can run inside that client's own socket read: an error in
 * the same read (its backend terminated right after the previous statement) was emitted into
 * the gap and crashed a worker in the chaos suite. The callback form runs synchronously there.
 */
export function checkoutListening(pool: pg.Pool, onError: (err: Error) => void): Promise<pg.PoolClient> {
  return new Promise((resolve, reject) => {
    pool.connect((err, client) => {
      if (err || !client) {
        reject(err ?? new Error('pool.connect returned no client'));
        return;
      }
      client.on('error', onError);
      resolve(client);
    });
  });
}

function isPool(db: Queryable): db is pg.Pool {
  const candidate = db as Partial<pg.Pool>;
  return typeof candidate.connect === 'function' && typeof candidate.totalCount === 'number';
}
