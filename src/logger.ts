import { BerthInputError } from './errors.js';
import { pino, type DestinationStream, type Logger } from 'pino';

export type { Logger };

/**
 * The default structured logger: JSON lines on stdout (or `destination`) at `level` (info). The
 * library never reads the environment: BERTH_LOG_LEVEL reaches it through the CLI or
 * `fromEnv()` (src/env.ts).
 */
export function createLogger(
  bindings: Record<string, unknown> = {},
  destination?: DestinationStream,
  level = 'info',
): Logger {
  const options = { name: 'berth', level: logLevel(level) };
  return (destination ? pino(options, destination) : pino(options)).child(bindings);
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
