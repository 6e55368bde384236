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
 * Each donor must be made by its class's own constructor with values of the same kinds as a
 * real instance's (a small integer where they hold one, a fractional number where they do):
 * a field that changed kind would give later instances a shape the donor does not hold
 * (test/shape-anchor.test.ts checks the engine's objects share the donors' shapes).
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
