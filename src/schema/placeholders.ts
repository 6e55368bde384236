import { quoteIdent, quoteLiteral, wakeChannel } from '../sql.js';
import { queueLockKey, schemaLockKey } from '../storage/locks.js';

/**
 * The placeholders a migration file may use, each replaced by a value made safe for where it
 * stands: the schema as an identifier (through `quoteIdent`, the only way an identifier becomes
 * SQL), string literals (through `quoteLiteral`) for the places a function body names the
 * schema as data, and the schema's advisory lock key (an int4 computed here, never text from
 * outside). One database can hold several berth installations (tests use a schema per file),
 * so nothing in a migration names its schema directly.
 *
 * | placeholder | becomes (schema `berth`) |
 * | --- | --- |
 * | `{{schema}}` | `"berth"` |
 * | `{{schema_literal}}` | `'berth'` (for `format('%I', …)`) |
 * | `{{schema_lock_key}}` | `schemaLockKey('berth')`, the lane lock's first key |
 * | `{{wake_channel_literal}}` | `'berth.wake'`, the NOTIFY channel (`wakeChannel`) |
 * | `{{queue_lock_prefix_literal}}` | `'berth:queue:'`, hashed with the queue name into the queue lock key |
 * | `{{qualified_literal:NAME}}` | `'"berth".NAME'`, for a `::regclass` / `::regprocedure` cast |
 */
const FIXED = new Map<string, (schema: string) => string>([
  ['schema', (schema) => quoteIdent(schema)],
  ['schema_literal', (schema) => quoteLiteral(schema)],
  ['schema_lock_key', (schema) => String(schemaLockKey(schema))],
  ['wake_channel_literal', (schema) => quoteLiteral(wakeChannel(schema))],
  ['queue_lock_prefix_literal', (schema) => quoteLiteral(queueLockKey(schema))],
]);

const QUALIFIED_LITERAL = 'qualified_literal:';

const PLACEHOLDER = /\{\{([^{}]*)\}\}/g;

/** The placeholder names in `template` that are not one of the above (empty when all are known). */
export function unknownPlaceholders(template: string): string[] {
  return [...template.matchAll(PLACEHOLDER)].map((m) => m[1]!).filter((name) => !isKnown(name));
}

function isKnown(name: string): boolean {
  return FIXED.has(name) || (name.startsWith(QUALIFIED_LITERAL) && name.length > QUALIFIED_LITERAL.length);
}

/**
 * `template` with every placeholder replaced for `schema`, in one pass: a replacement is never
 * scanned again, so a schema named `{{schema}}` stays a name.
 */
export function renderPlaceholders(template: string, schema: string): string {
  return template.replace(PLACEHOLDER, (token, name: string) => {
    const fixed = FIXED.get(name);
    if (fixed) return fixed(schema);
    if (isKnown(name)) return quoteLiteral(`${quoteIdent(schema)}.${name.slice(QUALIFIED_LITERAL.length)}`);
    throw new Error(`unknown placeholder ${token} in a migration`);
  });
}
