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
 * the donor never ran, and a field that starts as a small integer and later holds a fractional
 * number. So a donor is made by its class's own constructor and then taken through those steps
 * as a real instance is (test/shape-anchor.test.ts compares every donor with the engine's
 * objects of a real drain).
 */
const anchors: object[] = [];

/** Keep `donor` alive for as long as the process runs. */
export function anchorShape(donor: object): void {
  anchors.push(donor);
}

/** The donors kept so far, for the test that checks their shapes. */
export function anchoredShapes(): readonly object[] {
  return anchors;
}
