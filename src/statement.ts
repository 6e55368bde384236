import { preparedName } from './sql.js';

/**
 * Statements with named parameters. A fragment names what it binds (`${p('laneId')}`), never a
 * position: positions are given when a whole statement is compiled, in the order its names first
 * appear, and the values are assembled from an object by name. Before this, fragments shared by
 * several statements fixed `$1`–`$4` and took other positions as arguments (`'$8'` from one
 * caller, `'$5'` from another), and a reordered values array bound silently wrong.
 *
 * A compiled statement's text never changes, so the server can keep it prepared; compile it once
 * (per schema, and per ring segment where its text names one) and reuse it.
 */

/** A bind parameter named `N`, written into a fragment as `${p.N}` (see `p`). */
export interface Param<N extends string = string> {
  readonly param: N;
}

/**
 * A parameter by name: `${p('laneId')}::integer` in a fragment binds the value named `laneId`.
 * Two markers of one name are one placeholder.
 */
export function p<N extends string>(name: N): Param<N> {
  return { param: name };
}

/**
 * SQL text with named parameters. Interpolated strings are SQL text taken as they are: only
 * identifiers quoted by `quoteIdent` (src/sql.ts) and constant SQL; everything a caller passes
 * travels as a parameter.
 */
export class Sql<N extends string = string> {
  /** Text pieces and parameters, alternating as written. */
  readonly parts: readonly (string | Param<N>)[];
  /** Only for the type: the names this fragment binds. */
  declare readonly names?: N;
  constructor(parts: readonly (string | Param<N>)[]) {
    this.parts = parts;
  }
}

type Part = string | number | Param | Sql;
type NamesOf<P> = P extends Param<infer N> ? N : P extends Sql<infer N> ? N : never;

/** A fragment: `sql\`… ${p('name')} … ${otherFragment} …\``. Numbers are written as text. */
export function sql<const P extends readonly Part[]>(
  strings: TemplateStringsArray,
  ...values: P
): Sql<NamesOf<P[number]>> {
  const parts: (string | Param)[] = [];
  const text = (t: string) => {
    const last = parts.length - 1;
    if (last >= 0 && typeof parts[last] === 'string') parts[last] = `${parts[last]}${t}`;
    else parts.push(t);
  };
  strings.forEach((s, i) => {
    text(s);
    if (i >= values.length) return;
    const v = values[i]!;
    if (typeof v === 'string' || typeof v === 'number') text(String(v));
    else if (v instanceof Sql) for (const q of v.parts) typeof q === 'string' ? text(q) : parts.push(q);
    else parts.push(v);
  });
  return new Sql(parts) as Sql<NamesOf<P[number]>>;
}

/** Fragments joined by `separator` (plain SQL text). */
export function joinSql<N extends string>(fragments: readonly Sql<N>[], separator: string): Sql<N> {
  const parts: (string | Param<N>)[] = [];
  fragments.forEach((f, i) => {
    if (i > 0) parts.push(separator);
    parts.push(...f.parts);
  });
  return sql`${new Sql(parts)}` as Sql<N>;
}

/** The values of a statement's parameters, by name. */
export type Args<N extends string> = { readonly [K in N]: unknown };

/** A statement compiled from a fragment: its text with `$1…$n`, and how to order its values. */
export class Statement<N extends string = string> {
  readonly text: string;
  /** Parameter names by position: `names[0]` is `$1`. */
  readonly names: readonly N[];
  /**
   * A server-side prepared statement's name, if any: the name it was compiled with and a hash of
   * its text (`preparedName` in src/sql.ts), so no other text is ever prepared under it.
   */
  readonly name: string | undefined;
  /** The name it was compiled with, for errors (its prepared name adds the hash). */
  private readonly given: string | undefined;

  /** `name`: the statement's kind, schema and window (`berth-claim:<schema>:w0.1`), if it is prepared. */
  constructor(fragment: Sql<N> | { text: string; names: readonly N[] }, name?: string) {
    this.given = name;
    if (!(fragment instanceof Sql)) {
      // A whole statement written in one place with `$n` placeholders, and their names in order.
      const found = placeholdersOf(fragment.text);
      const expected = fragment.names.map((_, i) => i + 1);
      if (found.size !== expected.length || expected.some((n) => !found.has(n)))
        throw new Error(
          `statement ${name ?? fragment.text.trim().slice(0, 40)}: placeholders $${[...found].sort((a, b) => a - b).join(', $')} but ${fragment.names.length} names`,
        );
      this.text = fragment.text;
      this.names = fragment.names;
      this.name = name === undefined ? undefined : preparedName(name, this.text);
      return;
    }
    const positions = new Map<string, number>();
    let text = '';
    for (const part of fragment.parts) {
      if (typeof part === 'string') {
        text += part;
        continue;
      }
      let at = positions.get(part.param);
      if (at === undefined) {
        at = positions.size + 1;
        positions.set(part.param, at);
      }
      text += `$${at}`;
    }
    this.text = text;
    this.names = [...positions.keys()] as N[];
    this.name = name === undefined ? undefined : preparedName(name, this.text);
  }

  /**
   * The values in placeholder order. Throws when a name the statement binds is missing or
   * `undefined` (pass `null` for SQL NULL), or when `args` names a parameter it does not bind:
   * either is a caller's mistake that would otherwise bind silently wrong.
   */
  values(args: Args<N>): unknown[] {
    const out = new Array<unknown>(this.names.length);
    for (let i = 0; i < this.names.length; i++) {
      const v = (args as Record<string, unknown>)[this.names[i]!];
      if (v === undefined) throw new Error(`statement ${this.label()}: no value for parameter "${this.names[i]}"`);
      out[i] = v;
    }
    let given = 0;
    for (const k in args) if (Object.hasOwn(args, k)) given++;
    if (given !== this.names.length) {
      const extra = Object.keys(args).filter((k) => !this.names.includes(k as N));
      throw new Error(
        `statement ${this.label()}: it binds no parameter named ${extra.map((k) => `"${k}"`).join(', ')}`,
      );
    }
    return out;
  }

  /** The query to run: `db.query(statement.query({ … }))`. Named when the statement is. */
  query(args: Args<N>): { text: string; values: unknown[]; name?: string } {
    const values = this.values(args);
    return this.name === undefined ? { text: this.text, values } : { name: this.name, text: this.text, values };
  }

  private label(): string {
    return this.given ?? this.text.trim().slice(0, 40).replace(/\s+/g, ' ');
  }
}

/** Compile a fragment; with `name`, the statement is prepared once per connection. */
export function compile<N extends string>(fragment: Sql<N>, name?: string): Statement<N> {
  return new Statement(fragment, name);
}

/**
 * A statement written whole in one place with positional placeholders (`$1` … `$n`), for a
 * self-contained statement that shares no fragment: `names[i]` names `$i+1`. Refused when the
 * text's placeholders are not exactly `$1` … `$n` for n names.
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const positional = (function <const N extends string>(text: string, names: readonly N[], name?: string): Statement<N> {
  return new Statement({ text, names }, name);
});

/**
 * The positional placeholders of a statement's text (`$1`, `$12`), outside string literals,
 * quoted identifiers and comments. For the check that values and placeholders agree.
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const placeholdersOf = (function (text: string): Set<number> {
  const out = new Set<number>();
  const stripped = text
    .replace(/--[^\n]*/g, ' ')
    .replace(/'(?:[^']|'')*'/g, "''")
    .replace(/"(?:[^"]|"")*"/g, '""');
  for (const m of stripped.matchAll(/\$(\d+)/g)) out.add(Number(m[1]));
  return out;
});
