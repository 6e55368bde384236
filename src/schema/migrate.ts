import pg from 'pg';
import { DEFAULT_SCHEMA, quoteIdent, schemaLockKey } from '../sql.js';
import { MIGRATIONS } from './migrations.js';

export interface MigrateOptions {
  /** Connection string of the database to migrate. Either this or `client`. */
  connectionString?: string;
  /** An already connected client (not inside a transaction). */
  client?: pg.ClientBase;
  /** Schema to install into; default `berth`. */
  schema?: string;
}

export interface MigrationReport {
  schema: string;
  /** Version before this run (0 for a fresh schema). */
  from: number;
  /** Version after this run. */
  to: number;
  applied: { version: number; name: string }[];
}

/** Raised when the database holds a newer schema than this code knows. Nothing is changed. */
export class SchemaTooNewError extends Error {
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

/** The advisory lock id (second key) that serialises migrators of one schema. */
const MIGRATE_LOCK = -2;

/**
 * Apply every pending migration in one transaction, under an advisory transaction lock so two
 * migrators never interleave. Idempotent; refuses a schema newer than the code.
 */
export async function migrate(options: MigrateOptions): Promise<MigrationReport> {
  const schema = options.schema ?? DEFAULT_SCHEMA;
  const owned = options.client === undefined;
  const client =
    options.client ?? new pg.Client({ connectionString: requireConnection(options.connectionString) });
  if (owned) await client.connect();
  const s = quoteIdent(schema);
  try {
    await client.query('BEGIN');
    try {
      await client.query('SELECT pg_advisory_xact_lock($1, $2)', [schemaLockKey(schema), MIGRATE_LOCK]);
      const exists = await client.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [schema]);
      if (exists.rowCount === 0) await client.query(`CREATE SCHEMA ${s}`);
      await client.query(
        `CREATE TABLE IF NOT EXISTS ${s}.schema_migrations (
           version integer PRIMARY KEY,
           name text NOT NULL,
           applied_at timestamptz NOT NULL DEFAULT now())`,
      );
      const current = await client.query<{ v: number }>(
        `SELECT coalesce(max(version), 0)::integer AS v FROM ${s}.schema_migrations`,
      );
      const from = current.rows[0]?.v ?? 0;
      if (from > LATEST_SCHEMA_VERSION) throw new SchemaTooNewError(schema, from, LATEST_SCHEMA_VERSION);
      const applied: MigrationReport['applied'] = [];
      for (const m of [...MIGRATIONS].sort((a, b) => a.version - b.version)) {
        if (m.version <= from) continue;
        await client.query(m.sql(schema));
        await client.query(`INSERT INTO ${s}.schema_migrations (version, name) VALUES ($1, $2)`, [
          m.version,
          m.name,
        ]);
        applied.push({ version: m.version, name: m.name });
      }
      await client.query('COMMIT');
      return { schema, from, to: Math.max(from, LATEST_SCHEMA_VERSION), applied };
    } catch (err) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw err;
    }
  } finally {
    if (owned) await (client as pg.Client).end();
  }
}

function requireConnection(connectionString: string | undefined): string {
  if (!connectionString) throw new Error('migrate needs a connectionString (or DATABASE_URL) or a client');
  return connectionString;
}
