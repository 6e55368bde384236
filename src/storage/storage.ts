import { bindSchema, type Schema } from '../sql.js';
import type { Statement } from '../statement.js';

/**
 * One schema's storage, made once per schema: its name bound and quoted, and every statement
 * compiled for it. Everything below the public functions takes this value; a public function
 * takes a schema name and binds it at the door (`storageFor`).
 *
 * Statements are compiled on first use and kept: per schema, and per ring segment or ring window
 * where the text names one (the key says which). A statement's text is then the same string on
 * every call, which is what lets a connection keep it prepared, and no call rebuilds or re-quotes
 * its SQL.
 */
export class Storage {
  readonly schema: Schema;
  private readonly statements = new Map<string, Statement>();

  constructor(schema: Schema) {
    this.schema = schema;
  }

  /**
   * The statement `key` names (its kind, plus the segment or window its text depends on),
   * compiled by `build` the first time. Keyed texts that depend on a ring window come and go
   * with the ring's rotations, so the oldest are forgotten past STATEMENTS_KEPT (a forgotten
   * one is compiled again if it is used again; nothing else changes).
   */
  statement<N extends string>(key: string, build: (schema: Schema) => Statement<N>): Statement<N> {
    let st = this.statements.get(key) as Statement<N> | undefined;
    if (st === undefined) {
      st = build(this.schema);
      if (this.statements.size >= STATEMENTS_KEPT) this.forgetOne();
      this.statements.set(key, st);
    }
    return st;
  }

  /**
   * Make room: the oldest statement of a ring window (its key holds the window, `:w…`), which a
   * rotation retired, else the oldest of all. The per-schema statements (enqueue, completion,
   * settlements) were compiled first and would otherwise be the first forgotten.
   */
  private forgetOne(): void {
    for (const key of this.statements.keys()) {
      if (key.includes(':w')) {
        this.statements.delete(key);
        return;
      }
    }
    const oldest = this.statements.keys().next();
    if (!oldest.done) this.statements.delete(oldest.value);
  }
}

/**
 * About 40 statements per schema, a few per ring segment (the completion names a segment's
 * partitions) and a few per ring window (claims and discovery), with a window per rotation.
 */
const STATEMENTS_KEPT = 512;

const bySchema = new Map<string, Storage>();

/**
 * The storage of a schema, made once per name and process: the door where a public function's
 * schema name is bound.
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const storageFor = (function (schema: string): Storage {
  let storage = bySchema.get(schema);
  if (storage === undefined) {
    storage = new Storage(bindSchema(schema));
    bySchema.set(schema, storage);
  }
  return storage;
});
