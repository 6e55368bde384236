import { BerthInputError } from './errors.js';
import { pino, type DestinationStream, type LogFn, type Logger, type LoggerOptions } from 'pino';

export type { Logger };

/**
 * The default structured logger: JSON lines on stdout (or `destination`) at `level` (info). The
 * library never reads the environment: BERTH_LOG_LEVEL reaches it through the CLI or
 * `fromEnv()` (src/process/env.ts).
 */
export function createLogger(
  bindings: Record<string, unknown> = {},
  destination?: DestinationStream,
  level = 'info',
): Logger {
  const options: LoggerOptions = { name: 'berth', level: logLevel(level), hooks: { logMethod: noRepeatedKeys } };
  return childLogger(destination ? pino(options, destination) : pino(options), bindings);
}

/**
 * The keys a logger binds, its own and its ancestors': a chain (a child adds its own few keys to
 * its parent's), so making a per-task child copies nothing.
 */
interface BoundKeys {
  has(key: string): boolean;
}

class KeyChain implements BoundKeys {
  constructor(
    private readonly parent: BoundKeys,
    private readonly own: readonly string[],
  ) {}

  has(key: string): boolean {
    return this.own.includes(key) || this.parent.has(key);
  }
}

/**
 * Where a logger made (or first seen) here keeps its bound keys: an own property, since a pino
 * child inherits its parent's properties (it is made with Object.create), and cheaper per child
 * than a WeakMap entry.
 */
const BOUND_KEYS = Symbol('berth.boundKeys');
const PINO_KEYS = ['level', 'time', 'pid', 'hostname', 'msg'];
type Keyed = Logger & { [BOUND_KEYS]?: BoundKeys };

function keysOf(logger: Logger): BoundKeys {
  const l = logger as Keyed;
  if (Object.hasOwn(l, BOUND_KEYS)) return l[BOUND_KEYS]!;
  // pino's bindings() parses the logger's serialised bindings: once per logger, then kept. It
  // leaves out pid and hostname, which pino writes in every line like level, time and msg.
  const keys = new Set([...PINO_KEYS, ...Object.keys(logger.bindings())]);
  Object.defineProperty(l, BOUND_KEYS, { value: keys, enumerable: false });
  return keys;
}

/**
 * `parent.child(bindings)` without ever writing a key twice. pino appends a child's bindings to
 * its parent's as text, so a child binding a key its parent already has puts that key twice in
 * every line: `{"component":"berth-worker",…,"component":"maintenance"}` is JSON that strict
 * parsers and log pipelines reject (issue 12). A key the parent already binds keeps the parent's
 * value; the child's is written as `berth_<key>` (numbered if that is taken too). Every logger
 * berth derives goes through here, so a logger you pass in may bind any key. The parent's keys
 * are read once per logger and cached, so a per-task child costs about what a pino child does.
 */
export function childLogger(parent: Logger, bindings: Record<string, unknown>): Logger {
  const taken = keysOf(parent);
  const own: Record<string, unknown> = {};
  const names: string[] = [];
  for (const key in bindings) {
    let name = key;
    for (let n = 1; taken.has(name) || names.includes(name); n++) name = n === 1 ? `berth_${key}` : `berth_${key}_${n}`;
    names.push(name);
    own[name] = bindings[key];
  }
  const child = parent.child(own);
  Object.defineProperty(child, BOUND_KEYS, { value: new KeyChain(taken, names), enumerable: false });
  return child;
}

/**
 * pino's logMethod hook for the loggers createLogger makes: a field of a log call that the logger
 * already binds (`ctx.logger.info({ task_type })` in a handler) is written as `log_<key>`, not as
 * a second `task_type`. Only calls with a fields object pay for it: one cached lookup and a scan
 * of that object's keys. A logger of your own does not have the hook (pino would write the key
 * twice): keep berth's bound keys (docs/operations.md, "Logs") out of your log calls there.
 */
function noRepeatedKeys(this: Logger, args: Parameters<LogFn>, method: LogFn): void {
  const fields = args[0];
  if (typeof fields === 'object' && fields !== null && !(fields instanceof Error)) {
    const bound = keysOf(this);
    let copy: Record<string, unknown> | null = null;
    for (const key of Object.keys(fields)) {
      if (!bound.has(key)) continue;
      copy ??= { ...(fields as Record<string, unknown>) };
      let name = `log_${key}`;
      for (let n = 2; bound.has(name) || Object.hasOwn(copy, name); n++) name = `log_${key}_${n}`;
      copy[name] = copy[key];
      delete copy[key];
    }
    if (copy !== null) args[0] = copy;
  }
  method.apply(this, args);
}

const LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'];

/** A log level (BERTH_LOG_LEVEL), checked: a typo is a clear error, not pino's internal one. */
export function logLevel(value: string | undefined): string {
  if (value === undefined || value.trim() === '') return 'info';
  const v = value.trim().toLowerCase();
  if (!LEVELS.includes(v))
    throw new BerthInputError(`BERTH_LOG_LEVEL must be one of ${LEVELS.join(', ')}, got "${value}"`);
  return v;
}
