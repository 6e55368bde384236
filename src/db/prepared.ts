import type { Queryable } from '../sql.js';

/**
 * Named (server-side prepared) statements, and how to do without them.
 *
 * berth names its hot statements so that each session plans them once (src/statement.ts). A
 * named statement lives in one server session, and node-postgres remembers per client which
 * names it has prepared: the second run sends only Bind/Execute. Behind a transaction-mode
 * pooler without prepared-statement support (PgBouncer before 1.21, or 1.21+ with
 * `max_prepared_statements = 0`) consecutive transactions of one client run on different server
 * sessions, so that second run meets a session that never saw the name (26000, `prepared
 * statement "…" does not exist`), and a client that prepares a name on a session another client
 * prepared it on is refused (42P05, `… already exists`).
 *
 * Without a name, node-postgres sends the query as an unnamed statement (Parse, Bind, Execute,
 * Sync in one message batch), which the server forgets at the next Parse: that works through
 * any pooler, at the cost of planning every run.
 */

/** The SQLSTATEs of a named statement that met the wrong server session. */
const PREPARED_STATEMENT_CODES: ReadonlySet<string> = new Set(['26000', '42P05']);

const HINT =
  ' (berth: a transaction-mode pooler, such as PgBouncer before 1.21, does not keep prepared statements from one transaction to the next; pass preparedStatements: false, or use a direct or session-pooled connection; docs/operations.md, "Connection poolers")';

/**
 * A named statement's error that says "this connection is a transaction-mode pooler": its
 * message gets a hint naming the option. Returned as it was otherwise. The error object is
 * kept (its `code`, its fields), only its message is extended, once.
 */
export function explainPreparedStatementError<E>(err: E): E {
  if (typeof err !== 'object' || err === null) return err;
  const e = err as { code?: unknown; message?: unknown };
  if (typeof e.code !== 'string' || !PREPARED_STATEMENT_CODES.has(e.code)) return err;
  if (typeof e.message !== 'string' || !e.message.includes('prepared statement') || e.message.endsWith(HINT))
    return err;
  e.message += HINT;
  return err;
}

/** A query's arguments with the statement's name dropped (a query config object only). */
export function unnamedArgs(args: unknown[]): unknown[] {
  const first = args[0];
  if (typeof first !== 'object' || first === null || !('name' in first)) return args;
  // A Submittable (pg-cursor, pg-query-stream) is sent as it is: it owns its protocol.
  if (typeof (first as { submit?: unknown }).submit === 'function') return args;
  const { name: _name, ...rest } = first as Record<string, unknown>;
  return [rest, ...args.slice(1)];
}

const wrapped = new WeakSet<object>();

/**
 * `db` (a pg.Pool, a pg.Client, a checked-out pool client, or any Queryable) with berth's
 * statement names dropped: every berth function given it sends unnamed statements, so it works
 * through a transaction-mode pooler without prepared-statement support. A pool's checked-out
 * clients are unnamed too. Everything else (events, `release`, `end`, pool counters) is the
 * object's own. What the `preparedStatements: false` options of `enqueue`, `enqueueMany` and
 * `getTask` do for one call.
 */
export function withoutPreparedStatements<Q extends Queryable>(db: Q): Q {
  if (wrapped.has(db)) return db;
  const proxy = new Proxy(db, {
    get(target, prop) {
      const value: unknown = Reflect.get(target, prop, target);
      if (typeof value !== 'function') return value;
      const fn = value as (...args: unknown[]) => unknown;
      if (prop === 'query') return (...args: unknown[]) => fn.apply(target, unnamedArgs(args));
      if (prop === 'connect' && typeof (target as { totalCount?: unknown }).totalCount === 'number')
        return (...args: unknown[]) => {
          const last = args[args.length - 1];
          if (typeof last === 'function') {
            const callback = last as (err: unknown, client?: Queryable, ...rest: unknown[]) => void;
            return fn.apply(target, [
              ...args.slice(0, -1),
              (err: unknown, client?: Queryable, ...rest: unknown[]) =>
                callback(err, client === undefined ? client : withoutPreparedStatements(client), ...rest),
            ]);
          }
          return (fn.apply(target, args) as Promise<Queryable>).then((c) => withoutPreparedStatements(c));
        };
      return fn.bind(target);
    },
  });
  wrapped.add(proxy);
  return proxy;
}

/** `withoutPreparedStatements(db)` when `preparedStatements` is false, else `db` itself. */
export function executorFor<Q extends Queryable>(db: Q, preparedStatements: boolean | undefined): Q {
  return preparedStatements === false ? withoutPreparedStatements(db) : db;
}

/** `preparedStatements` as an option: absent or a boolean, anything else refused by the caller. */
export function isPreparedStatementsOption(value: unknown): value is boolean | undefined {
  return value === undefined || typeof value === 'boolean';
}
