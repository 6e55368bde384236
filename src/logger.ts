import { pino, type Logger } from 'pino';

export type { Logger };

/** The default structured logger: JSON lines on stdout, level from BERTH_LOG_LEVEL. */
export function createLogger(bindings: Record<string, unknown> = {}): Logger {
  return pino({ name: 'berth', level: process.env.BERTH_LOG_LEVEL ?? 'info' }).child(bindings);
}
