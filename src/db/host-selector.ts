import type pg from 'pg';
import type { SessionAttrs } from './hosts.js';

/**
 * Which host of a multi-host target a new connection goes to, and whether a session is the kind
 * `target_session_attrs` asks for (libpq 14's rules).
 *
 * The selector remembers the host that last gave a good session and sends every connection
 * there, so in steady state a connection costs what a single-host one does. Once that host fails
 * (refused, timed out, or now the wrong kind: a demoted primary come back as a standby), it is
 * forgotten and the next connect searches the list in order with throwaway probes, one search at
 * a time however many connects wait for it. The connection whose host failed fails itself (a pg
 * client cannot be connected twice); every berth path retries a failed connect with its backoff,
 * and the retry lands on the host the search found.
 */

/** What a connected session is: `in_hot_standby` and `default_transaction_read_only`, or the query's answer. */
export interface SessionKind {
  readonly standby: boolean;
  readonly readOnly: boolean;
}

/** Which sessions a search pass accepts: prefer-standby searches for a standby first, then for any. */
export type SessionWant = Exclude<SessionAttrs, 'prefer-standby'>;

export function accepts(want: SessionWant, kind: SessionKind): boolean {
  switch (want) {
    case 'any':
      return true;
    case 'read-write':
      return !kind.readOnly && !kind.standby;
    case 'read-only':
      return kind.readOnly || kind.standby;
    case 'primary':
      return !kind.standby;
    case 'standby':
      return kind.standby;
  }
}

/** What a refused session was, in libpq's words. */
export function describeMismatch(want: SessionWant, kind: SessionKind): string {
  const is = kind.standby
    ? 'the server is in hot standby mode'
    : kind.readOnly
      ? 'the session is read-only'
      : 'the server is a primary';
  return `${is} (target_session_attrs=${want})`;
}

/**
 * The session's kind. A PostgreSQL 14+ server reports `in_hot_standby` and
 * `default_transaction_read_only` at startup (they are GUC_REPORT), so this costs no round trip;
 * an older server, or a pooler that does not pass them on, is asked.
 */
export async function sessionKind(client: pg.Client, reported: ReadonlyMap<string, string>): Promise<SessionKind> {
  const standby = reported.get('in_hot_standby');
  const readOnly = reported.get('default_transaction_read_only');
  if (standby !== undefined && readOnly !== undefined)
    return { standby: standby === 'on', readOnly: readOnly === 'on' };
  const { rows } = await client.query<{ standby: boolean; read_only: boolean }>(
    `SELECT pg_is_in_recovery() AS standby, current_setting('transaction_read_only') = 'on' AS read_only`,
  );
  return { standby: rows[0]?.standby === true, readOnly: rows[0]?.read_only === true };
}

/** A refused session: a connection fault (retried later), as libpq treats it. */
export class WrongSessionError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'WrongSessionError';
  }
}

/** Try one host: resolves when it gave a session `want` accepts, rejects with why not. */
export type Probe = (index: number, want: SessionWant) => Promise<void>;

export class HostSelector {
  private preferred: number | null;
  private search: Promise<number> | null = null;

  constructor(
    private readonly count: number,
    private readonly attrs: SessionAttrs,
    private readonly probe: Probe,
    private readonly onNoHost: (failures: readonly unknown[]) => Error,
  ) {
    // One host needs no search; `any` starts at the first host as libpq does, and moves on only
    // when it fails.
    this.preferred = count === 1 || attrs === 'any' ? 0 : null;
  }

  /** The host for the next connection: the remembered one, else the first the search accepts. */
  choose(): Promise<number> {
    if (this.preferred !== null) return Promise.resolve(this.preferred);
    this.search ??= this.runSearch().finally(() => {
      this.search = null;
    });
    return this.search;
  }

  /** The host gave a good session. */
  confirm(index: number): void {
    this.preferred = index;
  }

  /** The host failed or gave the wrong kind of session: the next connect searches. */
  forget(index: number): void {
    if (this.count === 1) return;
    if (this.preferred === index) this.preferred = null;
  }

  /** Whether a connection to `index` must check its session itself (the probe did for a search). */
  get sessionAttrs(): SessionAttrs {
    return this.attrs;
  }

  private async runSearch(): Promise<number> {
    const passes: SessionWant[] = this.attrs === 'prefer-standby' ? ['standby', 'any'] : [this.attrs];
    const failures: unknown[] = [];
    for (const want of passes) {
      for (let i = 0; i < this.count; i++) {
        try {
          await this.probe(i, want);
          this.preferred = i;
          return i;
        } catch (err) {
          failures.push(err);
        }
      }
    }
    throw this.onNoHost(failures);
  }
}
