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

/** Whether `err` is a named statement's error that means the server session was not the one it was prepared on. */
export function isPreparedStatementError(err: unknown): boolean {
  if (typeof err !== 'object' || err === null) return false;
  const e = err as { code?: unknown; message?: unknown };
  return (
    typeof e.code === 'string' &&
    PREPARED_STATEMENT_CODES.has(e.code) &&
    typeof e.message === 'string' &&
    e.message.includes('prepared statement')
  );
}

/**
 * A worker's detection, shared by every client of its pools: statements are named until one of
 * them fails as only a transaction-mode pooler makes them fail (26000 or 42P05, above), then
 * unnamed for good, and `onUnkept` is told once. Detection, not a probe at start: a probe would
 * need two server connections behind the pooler to see anything, and a pooler with few
 * connections can hand the same one back every time. The statement that failed is not retried
 * here: it fails as any database fault does, and its caller's own retry (the fetcher's backoff,
 * the settlement batcher's retry, a handler's next attempt) runs unnamed.
 */
export class StatementNaming {
  private kept = true;

  constructor(private readonly onUnkept: (err: Error) => void) {}

  /** False once the server has shown that prepared statements are not kept. */
  get named(): boolean {
    return this.kept;
  }

  /** Look at a failed statement's error: the first that shows a pooler turns names off. */
  saw(err: unknown): void {
    if (!this.kept || !isPreparedStatementError(err)) return;
    this.kept = false;
    this.onUnkept(err as Error);
  }
}

/**
 * A named statement's error that says "this connection is a transaction-mode pooler": its
 * message gets a hint naming the option. Returned as it was otherwise. The error object is
 * kept (its `code`, its fields), only its message is extended, once.
 */
export function explainPreparedStatementError<E>(err: E): E {
  if (!isPreparedStatementError(err)) return err;
  const e = err as { message: string };
  if (!e.message.endsWith(HINT)) e.message += HINT;
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
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const executorFor = (function <Q extends Queryable>(db: Q, preparedStatements: boolean | undefined): Q {
  return preparedStatements === false ? withoutPreparedStatements(db) : db;
});

/** `preparedStatements` as an option: absent or a boolean, anything else refused by the caller. */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const isPreparedStatementsOption = (function (value: unknown): value is boolean | undefined {
  return value === undefined || typeof value === 'boolean';
});
