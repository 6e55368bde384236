import { didYouMean } from '../util/nearest.js';
import { createHash } from 'node:crypto';
import type pg from 'pg';
import { openClient, resolveDatabase } from '../db/connections.js';
import { BerthError, BerthInputError, SchemaNotMigratedError } from '../errors.js';
import { checkSchemaName } from '../limits.js';
import { DEFAULT_SCHEMA, quoteIdent, type Queryable } from '../sql.js';
import { MIGRATE_LOCK, schemaLockKey } from '../storage/locks.js';
import { repairLaneSequences, type LaneSequenceRepairReport } from '../storage/lane-sequences.js';
import { MIGRATIONS, strongestLocks } from './migrations.js';
import { ROLE_KINDS, runtimeGrantStatements, type RoleKind } from './roles.js';

/** How to reach the database: a connection string, or a connected client not inside a transaction. */
export interface ConnectionOptions {
  /** Connection string of the database. Either this or `client`. */
  connectionString?: string;
  /** An already connected client (not inside a transaction). */
  client?: pg.ClientBase;
  /**
   * With `connectionString`: how long the connect may take; 0 waits indefinitely. Default: the
   * URL's `connect_timeout`, else PGCONNECT_TIMEOUT (seconds, as libpq), else 10 s.
   */
  connectTimeoutMs?: number;
  /** Schema berth is installed in; default `berth`. */
  schema?: string;
}

export interface MigrateOptions extends ConnectionOptions {
  /**
   * Roles to make worker roles (what a Worker and the maintenance leader need; see
   * `grantRuntimeRole`), in the migration's own transaction: migration 3 revokes PUBLIC's
   * EXECUTE on berth's functions, so an install whose runtime roles relied on it keeps working
   * only if they are granted in the same step.
   */
  runtimeRoles?: readonly string[];
  /** Roles to make producer roles (enqueue and getTask only), in the same transaction. */
  producerRoles?: readonly string[];
}

const CONNECTION_KEYS = ['connectionString', 'client', 'connectTimeoutMs', 'schema'] as const;

/** Unknown keys are errors (a misspelt `producerRole` must not silently grant nothing). */
function checkKeys(options: object, allowed: readonly string[], what: string): void {
  if (typeof options !== 'object' || options === null) throw new BerthInputError(`${what} needs an options object`);
  for (const key of Object.keys(options)) {
    if (!allowed.includes(key))
      throw new BerthInputError(
        `unknown ${what} option "${key}"${didYouMean(key, allowed)} (known: ${allowed.join(', ')})`,
      );
  }
}

function roleList(value: unknown, name: string): string[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) throw new BerthInputError(`${name} must be an array of role names`);
  for (const r of value) roleName(r, name);
  return [...new Set(value as string[])];
}

function roleName(value: unknown, name: string): string {
  if (typeof value !== 'string' || value.length === 0 || value.includes('\u0000')) {
    throw new BerthInputError(`${name}: a role name is a non-empty string without NUL`);
  }
  return value;
}

export interface MigrationReport {
  schema: string;
  /** Version before this run (0 for a fresh schema). */
  from: number;
  /** Version after this run. */
  to: number;
  applied: { version: number; name: string }[];
  /** The `runtimeRoles` made worker roles (in the migration transaction). */
  grantedRoles: string[];
  /** The `producerRoles` made producer roles (in the migration transaction). */
  grantedProducerRoles: string[];
  /**
   * The lane sequence repair run after the migration committed (one statement per sequence).
   * Anything busy or not permitted is still listed by `berth storage lane-sequences`.
   */
  laneSequences: LaneSequenceRepairReport;
}

/** Raised when the database holds a newer schema than this code knows. Nothing is changed. */
export class SchemaTooNewError extends BerthError {
  override readonly code = 'SCHEMA_TOO_NEW';

  constructor(
    readonly schema: string,
    readonly databaseVersion: number,
    readonly codeVersion: number,
  ) {
    super(
      `berth schema "${schema}" is at version ${databaseVersion} but this code only knows up to ` +
        `${codeVersion}; upgrade berth before running it against this database`,
    );
    this.name = 'SchemaTooNewError';
  }
}

export const LATEST_SCHEMA_VERSION = MIGRATIONS.reduce((m, x) => Math.max(m, x.version), 0);

/**
 * Raised when a migration this database already applied differs from the code's copy: the
 * schema may not be what the code expects (a shipped migration was edited). Nothing is changed.
 */
export class MigrationChangedError extends BerthError {
  override readonly code = 'MIGRATION_CHANGED';

  constructor(
    readonly schema: string,
    readonly versions: number[],
  ) {
    super(
      `berth schema "${schema}": applied migration(s) ${versions.join(', ')} differ from this code's copy; ` +
        'a shipped migration must never change. Restore the matching berth version or rebuild the schema.',
    );
    this.name = 'MigrationChangedError';
  }
}

/**
 * SHA-256 of a migration as it runs for one schema: its file's text after the header, with the
 * placeholders replaced (src/schema/migrations.ts). That is byte for byte what the in-code
 * template strings produced before the migrations moved to .sql files, so the checksums
 * installed databases recorded still match; computing it over anything else (the raw file, the
 * header) would have every existing installation refused as changed.
 * test/migration-files.test.ts pins the values.
 */
function checksum(sql: string): string {
  return createHash('sha256').update(sql).digest('hex');
}

/** Compare the checksums recorded at apply time with the code's migrations (NULL: not recorded). */
async function refuseChangedMigrations(client: pg.ClientBase, schema: string): Promise<void> {
  const rows = await client.query<{ version: number; checksum: string | null }>(
    `SELECT version, checksum FROM ${quoteIdent(schema)}.schema_migrations WHERE checksum IS NOT NULL`,
  );
  const changed = rows.rows
    .filter((r) => {
      const m = MIGRATIONS.find((x) => x.version === r.version);
      return m !== undefined && checksum(m.sql(schema)) !== r.checksum;
    })
    .map((r) => r.version);
  if (changed.length > 0) throw new MigrationChangedError(schema, changed);
}

/**
 * Apply every pending migration in one transaction, under an advisory transaction lock so two
 * migrators never interleave, and grant `runtimeRoles` in it. Idempotent; refuses a schema
 * newer than the code. After the commit, repairs wrongly owned or missing lane sequences one
 * statement each (never inside the migration transaction: a repair holds its sequence's
 * ACCESS EXCLUSIVE lock until it commits) and reports what it could not.
 */
export async function migrate(options: MigrateOptions): Promise<MigrationReport> {
  checkKeys(options, [...CONNECTION_KEYS, 'runtimeRoles', 'producerRoles'], 'migrate');
  const schema = checkSchemaName(options.schema ?? DEFAULT_SCHEMA, 'migrate');
  const roles = roleList(options.runtimeRoles, 'runtimeRoles');
  const producers = roleList(options.producerRoles, 'producerRoles');
  const both = roles.filter((r) => producers.includes(r));
  if (both.length > 0) {
    throw new BerthInputError(
      `role ${both.map((r) => `"${r}"`).join(', ')} is in both runtimeRoles and producerRoles; a role has one kind`,
    );
  }
  return withClient(options, 'migrate', async (client) => {
    const s = quoteIdent(schema);
    await requireRoles(client, [...roles, ...producers]);
    const { from, applied } = await retryLockConflicts(() =>
      inTransaction(client, async () => {
        await client.query('SELECT pg_advisory_xact_lock($1, $2)', [schemaLockKey(schema), MIGRATE_LOCK]);
        const exists = await client.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [schema]);
        if (exists.rowCount === 0) await client.query(`CREATE SCHEMA ${s}`);
        await client.query(
          `CREATE TABLE IF NOT EXISTS ${s}.schema_migrations (
           version integer PRIMARY KEY,
           name text NOT NULL,
           applied_at timestamptz NOT NULL DEFAULT now(),
           checksum text)`,
        );
        const from = (await schemaVersion(client, schema)) ?? 0;
        if (from > LATEST_SCHEMA_VERSION) throw new SchemaTooNewError(schema, from, LATEST_SCHEMA_VERSION);
        await refuseChangedMigrations(client, schema);
        if (from > 0) await lockAltered(client, schema, from);
        const applied: MigrationReport['applied'] = [];
        for (const m of [...MIGRATIONS].sort((a, b) => a.version - b.version)) {
          if (m.version <= from) continue;
          const sql = m.sql(schema);
          await client.query(sql);
          await client.query(`INSERT INTO ${s}.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)`, [
            m.version,
            m.name,
            checksum(sql),
          ]);
          applied.push({ version: m.version, name: m.name });
        }
        for (const role of roles) await applyGrants(client, schema, role, 'worker');
        for (const role of producers) await applyGrants(client, schema, role, 'producer');
        return { from, applied };
      }),
    );
    const to = Math.max(from, LATEST_SCHEMA_VERSION);
    let laneSequences: LaneSequenceRepairReport;
    try {
      laneSequences = await repairLaneSequences(client, schema);
    } catch (err) {
      throw new Error(
        `schema "${schema}" migrated to version ${to}, but checking its lane sequences failed: ${(err as Error).message}`,
        { cause: err },
      );
    }
    return { schema, from, to, applied, grantedRoles: roles, grantedProducerRoles: producers, laneSequences };
  });
}

export interface GrantRuntimeRoleOptions extends ConnectionOptions {
  /** An existing role (login, or a group the login roles are members of); not the schema owner. */
  role: string;
  /**
   * `worker` (the default: what a Worker and the maintenance leader need, enqueue and getTask
   * included) or `producer` (enqueue and getTask only).
   */
  kind?: RoleKind;
}

/**
 * Make one role a `worker` role (the default) or a `producer` role on a migrated schema: USAGE
 * on the schema, EXECUTE on the SECURITY DEFINER functions its kind calls, and the few table
 * privileges its own statements need (the lists and the reason for each are in
 * `src/schema/roles.ts`). Nothing more: no CREATE, no TRUNCATE, no sequence privilege (lanes
 * and their sequences are created by the definer functions as the schema owner, so a role
 * without CREATE opens new lanes and every granted role can use them). Whatever an earlier
 * runtime grant gave the role beyond its kind is revoked, so regranting converges. Idempotent;
 * run it as the schema owner or a superuser. The schema must be at the latest version.
 */
export async function grantRuntimeRole(options: GrantRuntimeRoleOptions): Promise<void> {
  checkKeys(options, [...CONNECTION_KEYS, 'role', 'kind'], 'grantRuntimeRole');
  const schema = options.schema ?? DEFAULT_SCHEMA;
  const role = roleName(options.role, 'grantRuntimeRole needs a role name');
  const kind = options.kind ?? 'worker';
  if (!ROLE_KINDS.includes(kind))
    throw new BerthInputError(
      `grantRuntimeRole kind must be ${ROLE_KINDS.map((k) => `"${k}"`).join(' or ')}, got ${JSON.stringify(kind)}`,
    );
  await withClient(options, 'grantRuntimeRole', async (client) => {
    await requireRoles(client, [role]);
    await inTransaction(client, async () => {
      await client.query('SELECT pg_advisory_xact_lock($1, $2)', [schemaLockKey(schema), MIGRATE_LOCK]);
      const version = await schemaVersion(client, schema);
      if (version === null || version < LATEST_SCHEMA_VERSION) {
        throw new BerthInputError(
          `schema "${schema}" is at version ${version ?? 0}, not ${LATEST_SCHEMA_VERSION}: migrate it before granting roles`,
        );
      }
      if (version > LATEST_SCHEMA_VERSION) throw new SchemaTooNewError(schema, version, LATEST_SCHEMA_VERSION);
      await applyGrants(client, schema, role, kind);
    });
  });
}

/**
 * Refuses the schema owner and the role berth's tables and functions belong to: they hold every
 * privilege by ownership, and the kind's revokes would take the owner's own privileges away
 * (and with them the definer functions' power). Runtime roles are separate roles.
 */
async function applyGrants(client: pg.ClientBase, schema: string, role: string, kind: RoleKind): Promise<void> {
  const owners = await client.query<{ owns: boolean }>(
    `SELECT (SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = $1) = $3
            OR (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = to_regclass($2)) = $3 AS owns`,
    [schema, `${quoteIdent(schema)}.lanes`, role],
  );
  if (owners.rows[0]?.owns) {
    throw new BerthInputError(
      `role "${role}" owns schema "${schema}" (or its tables): grant the ${kind} privileges to a separate role`,
    );
  }
  for (const statement of runtimeGrantStatements(schema, role, kind)) await client.query(statement);
}

/** Fail before touching anything when a role to grant does not exist. */
async function requireRoles(client: pg.ClientBase, roles: readonly string[]): Promise<void> {
  if (roles.length === 0) return;
  const missing = await client.query<{ name: string }>(
    `SELECT x AS name FROM unnest($1::text[]) x WHERE NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = x)`,
    [roles],
  );
  if (missing.rows.length > 0) {
    throw new BerthInputError(
      `role ${missing.rows.map((r) => `"${r.name}"`).join(', ')} does not exist; create it first`,
    );
  }
}

/**
 * Refuse to run against a schema `migrate()` has not brought up to date, with the command that
 * fixes it, instead of failing later on every statement with "relation does not exist". Looks
 * for the core tables and the newest migration's function with `to_regclass` /
 * `to_regprocedure` (which need no privilege on them, so a runtime role without access to
 * schema_migrations can run it).
 */
export async function assertMigrated(db: Queryable, schema: string): Promise<void> {
  const s = quoteIdent(schema);
  const r = await db.query<{ core: boolean; latest: boolean }>(
    `SELECT to_regclass($1) IS NOT NULL AS core,
            to_regprocedure($2) IS NOT NULL
              AND EXISTS (SELECT 1 FROM pg_attribute
                           WHERE attrelid = to_regclass($3) AND attname = $4 AND NOT attisdropped) AS latest`,
    [`${s}.lanes`, `${s}.${LATEST_MARKER}`, `${s}.${LATEST_TABLE}`, LATEST_COLUMN],
  );
  const row = r.rows[0]!;
  if (!row.core)
    throw new SchemaNotMigratedError(
      schema,
      `berth schema "${schema}" is not migrated (no such tables): run \`berth migrate --schema ${schema}\` or migrate()`,
    );
  if (!row.latest)
    throw new SchemaNotMigratedError(
      schema,
      `berth schema "${schema}" is older than this code (version ${LATEST_SCHEMA_VERSION}): run \`berth migrate --schema ${schema}\` or migrate()`,
    );
}

/**
 * A function the newest migration this code needs creates: its presence means the schema is
 * current enough. Migration 33's `enqueue_one`, which the client's single plain enqueue calls
 * (migration 20's `check_tasks`, 18's ring epoch and 19's `count_lost_claim` come before it).
 * Migrations 21 and 22 changed nothing this code calls; 32 changed `enqueue()`'s body, not what
 * it takes or answers.
 */
const LATEST_MARKER = 'enqueue_one(text, smallint, smallint, smallint, text, jsonb, text)';
/**
 * A column the newest migration this code needs adds, and its table: migration 31's
 * `task_waits.on_parent_failure` (its `ready.has_dependents` every claim reads; migration 30's
 * `type_paced.refused_at`, its `type_limits` every worker's fetcher reads once a poll; migration 29's
 * `key_holders`, migration 28's `lanes.limited`, which both claims filter on, migration 27's
 * `schedules.ceiling_ms`, migration 26's `schedules` and `workers.schedules`, and migration 24's
 * `task_results` come before it). With the function above, this code refuses a schema older than 33. Read from
 * `pg_attribute`, which, like `to_regclass`, needs no privilege on the table.
 */
const LATEST_TABLE = 'task_waits';
const LATEST_COLUMN = 'on_parent_failure';

export { SchemaNotMigratedError } from '../errors.js';

/** The applied version, or null when the schema has no schema_migrations table. */
async function schemaVersion(client: pg.ClientBase, schema: string): Promise<number | null> {
  const table = await client.query<{ present: boolean }>('SELECT to_regclass($1) IS NOT NULL AS present', [
    `${quoteIdent(schema)}.schema_migrations`,
  ]);
  if (!table.rows[0]?.present) return null;
  const current = await client.query<{ v: number }>(
    `SELECT coalesce(max(version), 0)::integer AS v FROM ${quoteIdent(schema)}.schema_migrations`,
  );
  return current.rows[0]?.v ?? 0;
}

/** Run `fn` on the caller's client, or on a client of its own that is closed afterwards. */
export async function withClient<T>(
  options: ConnectionOptions,
  what: string,
  fn: (client: pg.ClientBase) => Promise<T>,
): Promise<T> {
  if (options.client) {
    if (options.connectTimeoutMs !== undefined)
      throw new BerthInputError(`${what}: connectTimeoutMs applies to a connectionString, not to a client`);
    return fn(options.client);
  }
  if (!options.connectionString)
    throw new BerthInputError(`${what} needs a connectionString (or DATABASE_URL) or a client`);
  const target = resolveDatabase(options.connectionString, { connectTimeoutMs: options.connectTimeoutMs });
  // A fault mid-migration surfaces as the failed statement's error (the transaction rolls
  // back); the listener only keeps the 'error' event from crashing the process.
  const client = await openClient(target, {}, () => undefined);
  try {
    return await fn(client);
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** How long migrate() keeps trying to take the locks a migration needs from a busy fleet. */
const LOCK_RETRY_MS = 120_000;

/**
 * How long the up-front LOCK waits for one table before the attempt gives up, rolls back and
 * tries again: shorter than deadlock_timeout (1 s by default), so that a worker transaction
 * which holds a later table and waits for an earlier one is freed by the migration stepping
 * back, not by a deadlock error in either.
 */
const LOCK_WAIT_MS = 250;

/**
 * The order the fleet's transactions take the hot tables in (a producer: lanes, then ready;
 * promotion: lanes, deferred, ready; a settlement: ready, then its records), so that the
 * migration's LOCK, which takes them one after another, meets them in the same order. Tables
 * not named here come after, by name.
 */
const FLEET_LOCK_ORDER = ['lanes', 'deferred', 'ready', 'attempt_history', 'dead_letters', 'workers'];

/**
 * Lock every existing table the pending migrations alter, one after another before any of
 * them runs. Without it a migration held the first table it altered while it ran on, and a
 * worker that held a later one and waited for the first deadlocked with it; under a steady load
 * that happened at every attempt. A wait longer than LOCK_WAIT_MS is 55P03, which
 * retryLockConflicts answers by trying again.
 */
async function lockAltered(client: pg.ClientBase, schema: string, from: number): Promise<void> {
  const wanted = strongestLocks(MIGRATIONS.filter((m) => m.version > from).flatMap((m) => m.locks));
  if (wanted.size === 0) return;
  const existing = await client.query<{ name: string }>(
    `SELECT t AS name FROM unnest($2::text[]) t WHERE to_regclass(format('%I.%I', $1::text, t)) IS NOT NULL`,
    [schema, [...wanted.keys()]],
  );
  const rank = (t: string) => {
    const i = FLEET_LOCK_ORDER.indexOf(t);
    return i === -1 ? FLEET_LOCK_ORDER.length : i;
  };
  const tables = existing.rows.map((r) => r.name).sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  if (tables.length === 0) return;
  const s = quoteIdent(schema);
  const before = await client.query<{ v: string }>(`SELECT current_setting('lock_timeout') AS v`);
  await client.query(`SELECT set_config('lock_timeout', $1, true)`, [`${LOCK_WAIT_MS}ms`]);
  for (const t of tables) await client.query(`LOCK TABLE ${s}.${quoteIdent(t)} IN ${wanted.get(t)!} MODE`);
  await client.query(`SELECT set_config('lock_timeout', $1, true)`, [before.rows[0]!.v]);
}

/**
 * Run `attempt` (one migrating transaction) again when it lost a deadlock with the live fleet
 * (40P01: a migration that alters several tables of the hot path takes their locks one after
 * another, and a worker may hold one of them while it waits for another), or gave up a lock
 * (55P03), with a growing pause, for up to LOCK_RETRY_MS; then the error says what happened.
 */
async function retryLockConflicts<T>(attempt: () => Promise<T>): Promise<T> {
  const giveUpAt = Date.now() + LOCK_RETRY_MS;
  for (let n = 0; ; n++) {
    try {
      return await attempt();
    } catch (err) {
      const code = (err as { code?: string }).code;
      if ((code !== '55P03' && code !== '40P01') || Date.now() > giveUpAt) {
        if (code === '55P03' || code === '40P01')
          throw new Error(
            `migrate could not take the locks it needs for ${LOCK_RETRY_MS / 1000} s: the tables stayed busy (${(err as Error).message}); run it again, at a quieter moment if this repeats`,
            { cause: err },
          );
        throw err;
      }
      await new Promise((r) => setTimeout(r, Math.min(50 * 2 ** n, 1000) * (0.5 + Math.random())));
    }
  }
}

async function inTransaction<T>(client: pg.ClientBase, fn: () => Promise<T>): Promise<T> {
  await client.query('BEGIN');
  try {
    const result = await fn();
    await client.query('COMMIT');
    return result;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => undefined);
    throw err;
  }
}
