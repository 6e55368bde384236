import type { AuthLimits } from './auth-limits.js';

/** One key's failed authentications: how many since it was last forgotten, when, and until when it waits. */
interface FailureState {
  failures: number;
  lastAt: number;
  blockedUntil: number;
}

/**
 * A Map that keeps at most `cap` entries: setting moves a key to the end, and past the cap the
 * first (least recently set) is dropped. Memory stays bounded whatever a client sends.
 */
class BoundedMap<V> {
  private readonly map = new Map<string, V>();
  constructor(private readonly cap: number) {}

  get(key: string): V | undefined {
    return this.map.get(key);
  }

  set(key: string, value: V): void {
    this.map.delete(key);
    this.map.set(key, value);
    if (this.map.size > this.cap) {
      const oldest = this.map.keys().next().value;
      if (oldest !== undefined) this.map.delete(oldest);
    }
  }

  delete(key: string): void {
    this.map.delete(key);
  }

  get size(): number {
    return this.map.size;
  }
}

/** What a failure did to the keys it was counted on: which of them it just locked out. */
export interface FailureOutcome {
  lockedOut: string[];
}

/**
 * In-process limiter for failed authentications (the dashboard is one process; several replicas
 * each count their own). Every attempt names its client key (an address) and a shared key (a
 * user name, or the token): `retryAfterMs` says whether it may be compared at all, `failed` and
 * `succeeded` record the result. Shared keys of configured users and the token are never
 * evicted; guessed user names go into a bounded map, so a flood of made-up names cannot push a
 * real user's lockout out.
 */
export class AuthLimiter {
  private readonly clients: BoundedMap<FailureState>;
  private readonly guessedNames: BoundedMap<FailureState>;
  private readonly known = new Map<string, FailureState>();
  /** `client\0shared` -> until when that address is exempt from the shared key's lockout. */
  private readonly trusted: BoundedMap<number>;

  constructor(
    private readonly limits: AuthLimits,
    private readonly knownShared: ReadonlySet<string>,
    private readonly now: () => number = Date.now,
  ) {
    this.clients = new BoundedMap(limits.maxTrackedKeys);
    this.guessedNames = new BoundedMap(limits.maxTrackedKeys);
    this.trusted = new BoundedMap(limits.maxTrackedKeys);
  }

  /** 0 when the attempt may be compared; else how long (ms) until it may. */
  retryAfterMs(client: string, shared: string): number {
    const now = this.now();
    const c = this.current(this.clients, client, now);
    let wait = c ? c.blockedUntil - now : 0;
    if (!this.isTrusted(client, shared, now)) {
      const s = this.current(this.sharedMap(shared), shared, now);
      if (s) wait = Math.max(wait, s.blockedUntil - now);
    }
    return Math.max(0, wait);
  }

  failed(client: string, shared: string): FailureOutcome {
    const now = this.now();
    const lockedOut: string[] = [];
    if (this.bump(this.clients, client, now, this.limits.clientFreeFailures, this.limits.clientLockoutFailures))
      lockedOut.push(client);
    if (
      this.bump(this.sharedMap(shared), shared, now, this.limits.sharedFreeFailures, this.limits.sharedLockoutFailures)
    )
      lockedOut.push(shared);
    return { lockedOut };
  }

  /** A correct secret: the address's count starts again, and it is trusted for this shared key. */
  succeeded(client: string, shared: string): void {
    this.clients.delete(client);
    this.trusted.set(`${client}\0${shared}`, this.now() + this.limits.trustedClientMs);
  }

  /** Keys tracked now (for tests: memory stays bounded). */
  get trackedKeys(): number {
    return this.clients.size + this.guessedNames.size + this.known.size + this.trusted.size;
  }

  private sharedMap(shared: string): Pick<BoundedMap<FailureState>, 'get' | 'set' | 'delete'> {
    return this.knownShared.has(shared) ? this.known : this.guessedNames;
  }

  private isTrusted(client: string, shared: string, now: number): boolean {
    const until = this.trusted.get(`${client}\0${shared}`);
    return until !== undefined && until > now;
  }

  /** The key's state, or undefined when it has none or it was forgotten. */
  private current(
    map: Pick<BoundedMap<FailureState>, 'get' | 'delete'>,
    key: string,
    now: number,
  ): FailureState | undefined {
    const s = map.get(key);
    if (s && now - s.lastAt >= this.limits.forgetAfterMs && now >= s.blockedUntil) {
      map.delete(key);
      return undefined;
    }
    return s;
  }

  /** Count one failure on a key; true when it has just been locked out. */
  private bump(
    map: Pick<BoundedMap<FailureState>, 'get' | 'set' | 'delete'>,
    key: string,
    now: number,
    free: number,
    lockout: number,
  ): boolean {
    const s = this.current(map, key, now) ?? { failures: 0, lastAt: now, blockedUntil: 0 };
    s.failures++;
    s.lastAt = now;
    let locked = false;
    if (s.failures >= lockout) {
      // Not "again" while already locked (a trusted address can still fail against a locked user).
      locked = s.blockedUntil <= now;
      s.blockedUntil = now + this.limits.lockoutMs;
    } else if (s.failures >= free) {
      s.blockedUntil =
        now + Math.min(this.limits.maxBackoffMs, this.limits.backoffMs * 2 ** Math.min(s.failures - free, 40));
    }
    map.set(key, s);
    return locked;
  }
}
