import type { ErrorDetail } from '../util/error-detail.js';
import { jsonSafe } from './terminal.js';

/**
 * How `berth tasks show` prints the errors of a task's attempts: each error with its cause chain,
 * and each stack once. A task that failed five times with the same error has five identical
 * stacks in attempt history, and an error class that appends its cause's stack to its own (a
 * common idiom) stores the cause's frames twice; printed as stored, one failure filled a screen
 * several times over. So a stack printed before is named instead of printed again, and a stack's
 * header (its first lines, before the frames) is left out when it only repeats the error's line.
 */
export class ErrorPrinter {
  /** Each stack printed so far, with the attempt it was printed under. */
  private readonly printed: { stack: string; attempt: number }[] = [];

  /** The lines of one attempt's error and its causes, indented under the attempt's line. */
  lines(attempt: number, error: ErrorDetail | null): string[] {
    const out: string[] = [];
    for (let e = error ?? undefined, prefix = 'error'; e; e = e.cause, prefix = 'caused by') {
      const heading = `${e.name ? `${e.name}: ` : ''}${e.message}`;
      out.push(`    ${prefix}: ${heading}`);
      if (e.data) out.push(`    data: ${jsonSafe(e.data)}`);
      if (e.stack) out.push(...this.stackLines(attempt, e.stack, heading));
    }
    return out;
  }

  private stackLines(attempt: number, stack: string, heading: string): string[] {
    const same = this.printed.find((p) => p.stack === stack || p.stack.includes(stack));
    if (same) {
      if (same.attempt === attempt) return ['      (stack: within the one above)'];
      return [`      (stack: as in attempt #${same.attempt} above)`];
    }
    this.printed.push({ stack, attempt });
    return framesOf(stack, heading).map((l) => `      ${l}`);
  }
}

/**
 * A stack without its header when the header is the error's line again: V8 writes
 * `Name: message` (or `Error: message`) before the first `at` frame, and the line above already
 * says it. A header that says something else (a custom stack, a message the stack does not
 * repeat) is kept.
 */
function framesOf(stack: string, heading: string): string[] {
  const lines = stack.split('\n');
  const first = lines.findIndex((l) => /^\s+at /.test(l));
  if (first <= 0) return lines;
  const header = lines.slice(0, first).join('\n');
  return header === heading || header === `Error: ${heading}` ? lines.slice(first) : lines;
}

/**
 * A timeline event's detail as `tasks show` prints it: an attempt's error reduced to its line
 * (`TypeError: upstream failed`), because the attempts above print it whole, stack and causes.
 * `--json` keeps the full detail.
 */
export function timelineDetail(detail: Record<string, unknown>): Record<string, unknown> {
  const error = detail.error as ErrorDetail | null | undefined;
  if (!error || typeof error !== 'object') return detail;
  return { ...detail, error: `${error.name ? `${error.name}: ` : ''}${error.message}` };
}
