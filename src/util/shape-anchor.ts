/**
 * Objects kept for the life of the process so that V8 keeps their classes' instance shapes.
 *
 * V8 gives every object a shape (a "map"), and optimized code checks the shapes it was compiled
 * for. A class's instance shape is reached from the class only through weak links: once no
 * instance of it is alive, a full garbage collection drops it, and every compiled function
 * that checked it is thrown away ("reason: weak objects" in `node --trace-deopt`). The next
 * instance gets a new shape and its code runs interpreted until V8 compiles it again. A worker's
 * per-task objects live only while their task does, so this happened after every idle spell's
 * full collection and to every new worker in a process (docs/benchmarks-journal.md, "Issue 35's
 * tenth round"). One object of each such class, made here once and holding no worker and no
 * task, keeps its shape for good.
 *
 * Each donor must have exactly the shape real instances end up with, or it keeps the wrong one.
 * Two things change an instance's shape after its constructor: a field added later, in a method
 * the donor never ran, and a field that starts as a small integer and later holds a number that
 * is not one (a fraction, or an epoch time, too large for V8's small integers). So a donor is
 * made by its class's own constructor and then taken through those steps as a real instance is
 * (test/shape-anchor.test.ts compares every donor with the engine's objects of a real drain).
 */
const anchors = new Map<string, object>();

/** Keep `donor` alive for as long as the process runs, under a name the shape test finds it by. */
export function anchorShape(name: string, donor: object): void {
  anchors.set(name, donor);
}

/** The donors kept so far, by name, for the test that checks their shapes. */
export function anchoredShapes(): ReadonlyMap<string, object> {
  return anchors;
}

/** How many results of each statement anchorRow has seen (a constant name per statement). */
const rowsSeen = new Map<string, number>();
/** Results after which anchorRow no longer looks: the rows' shape has settled long before. */
const ROWS_WATCHED = 64;
/** Berth's own sessions (a worker's claim and settlement pools): the only ones whose rows are kept. */
const ownSessions = new WeakSet<object>();

/** Let anchorRow keep rows that `db` returns: a pool berth opened, whose results no one else sees. */
export function keepRowShapesOf(db: object): void {
  ownSessions.add(db);
}

/**
 * Keep the shape of the rows `statement` returns on `db`. pg makes every row of a result as a
 * copy of one object holding the result's column names, so the rows of every result with the
 * same columns share a shape, and that shape dies like a class's once no row is alive: the
 * claim's row parser and the completion's reader were thrown away with it at every full
 * collection between two drains (docs/benchmarks-journal.md, "Issue 35's eleventh round").
 *
 * So a row itself is kept: a copy would not do (`{ ...row }` gets a shape of its own). The shape
 * settles only after a statement's first few results (V8 moves a new shape's fields to their final
 * form as it sees them filled: the rows of a probe's first three results had a shape the later
 * ones did not), so a row is taken at a statement's 1st, 2nd, 4th … 64th result, each replacing the
 * one before. The row is taken from its caller: call this once the row is read. Its text is emptied
 * and its arrays replaced by empty ones, which keeps its shape and no task's data (the claims and
 * the completion return no parsed JSON).
 *
 * Only rows of berth's own sessions (`keepRowShapesOf`): a pool a caller passed in (runDueTasks',
 * a producer's executor) may hand its results to code of its own, which must not find them
 * emptied. And only a plain object whose fields are all plain writable values, as pg's rows are:
 * any other row is not kept. Nothing here throws: it runs after a claim has leased its tasks.
 */
export function anchorRow(statement: string, db: object, row: object | undefined): void {
  if (row === undefined || !ownSessions.has(db)) return;
  const seen = (rowsSeen.get(statement) ?? 0) + 1;
  if (seen > ROWS_WATCHED) return;
  rowsSeen.set(statement, seen);
  if ((seen & (seen - 1)) !== 0) return;
  try {
    if (Object.getPrototypeOf(row) !== Object.prototype || !Object.isExtensible(row)) return;
    const fields = Object.getOwnPropertyDescriptors(row);
    for (const k of Reflect.ownKeys(fields)) {
      const f = (fields as Record<string | symbol, PropertyDescriptor>)[k]!;
      if (typeof k !== 'string' || !f.writable || !f.enumerable || f.get !== undefined || f.set !== undefined) return;
      // An object other than an array (parsed JSON, a Date): data this would keep.
      if (typeof f.value === 'object' && f.value !== null && !Array.isArray(f.value)) return;
    }
    const kept = row as Record<string, unknown>;
    for (const k of Object.keys(kept)) {
      const v = kept[k];
      if (typeof v === 'string') kept[k] = '';
      else if (Array.isArray(v)) kept[k] = v.slice(0, 0);
    }
    anchors.set(`row:${statement}`, kept);
  } catch {
    // Only an object that is not pg's row (a proxy, an array subclass) gets here; not kept.
  }
}
