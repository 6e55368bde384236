/**
 * The dependency graphs `npm run bench:deps` enqueues (bench/deps.ts), as plain data: task i's
 * parents are earlier tasks (indices below i), so every graph is in topological order and any
 * split into consecutive calls names only parents of the same call or of an earlier one.
 */

export type ShapeName = 'baseline' | 'fan-out' | 'fan-in' | 'layers' | 'chain';

export interface Shape {
  name: ShapeName;
  /** How the shape reads in the report, sizes included. */
  label: string;
  /** parents[i]: the tasks task i depends on (indices < i); empty for a task without. */
  parents: number[][];
  /** Where one call per layer ends each call (exclusive), for the layered graph; else null. */
  layerEnds: number[] | null;
}

/** Sizes at scale 1 (the issue's): 10,000 tasks a shape, 20 layers of 500, 3 parents a task. */
export const FULL = { tasks: 10_000, layers: 20, perLayerParents: 3 } as const;

const int = (x: number) => x.toLocaleString('en-US');

/** The five shapes at `scale` (0 < scale <= 1): task counts scaled, the layer count kept. */
export function shapesAt(scale: number): Record<ShapeName, Shape> {
  const n = Math.max(FULL.perLayerParents * FULL.layers, Math.round(FULL.tasks * scale));
  const width = Math.max(FULL.perLayerParents, Math.round(n / FULL.layers));

  const baseline: number[][] = Array.from({ length: n }, () => []);

  // One parent (task 0), n dependents.
  const fanOut: number[][] = [[], ...Array.from({ length: n }, () => [0])];

  // n parents, then one dependent of them all.
  const fanIn: number[][] = [...Array.from({ length: n }, () => []), Array.from({ length: n }, (_, i) => i)];

  // Layer 0 has no parents; task j of layer L depends on tasks j, j + w/3 and j + 2w/3 (mod w)
  // of layer L - 1: three distinct parents spread over the layer, every parent with three children.
  const layers: number[][] = [];
  const layerEnds: number[] = [];
  const step = Math.floor(width / FULL.perLayerParents);
  for (let l = 0; l < FULL.layers; l++) {
    for (let j = 0; j < width; j++) {
      if (l === 0) layers.push([]);
      else {
        const prev = (l - 1) * width;
        layers.push(Array.from({ length: FULL.perLayerParents }, (_, k) => prev + ((j + k * step) % width)));
      }
    }
    layerEnds.push((l + 1) * width);
  }

  const chain: number[][] = Array.from({ length: n }, (_, i) => (i === 0 ? [] : [i - 1]));

  return {
    baseline: {
      name: 'baseline',
      label: `baseline: ${int(n)} tasks, no dependencies`,
      parents: baseline,
      layerEnds: null,
    },
    'fan-out': { name: 'fan-out', label: `fan-out: 1 → ${int(n)}`, parents: fanOut, layerEnds: null },
    'fan-in': { name: 'fan-in', label: `fan-in: ${int(n)} → 1`, parents: fanIn, layerEnds: null },
    layers: {
      name: 'layers',
      label: `layers: ${FULL.layers} × ${int(width)}, ${FULL.perLayerParents} parents each`,
      parents: layers,
      layerEnds,
    },
    chain: { name: 'chain', label: `chain: ${int(n)} links`, parents: chain, layerEnds: null },
  };
}

/** How a shape is enqueued: in one enqueueMany call, or one call per layer or per link naming earlier ids. */
export type CallMode = 'one call' | 'per layer' | 'per link';

/** The [start, end) ranges of the calls that enqueue `shape` in `mode`. */
export function callRanges(shape: Shape, mode: CallMode): [number, number][] {
  const n = shape.parents.length;
  if (mode === 'one call') return [[0, n]];
  if (mode === 'per link') return Array.from({ length: n }, (_, i): [number, number] => [i, i + 1]);
  if (shape.layerEnds === null) throw new Error(`${shape.name} has no layers`);
  return shape.layerEnds.map((end, k): [number, number] => [k === 0 ? 0 : shape.layerEnds![k - 1]!, end]);
}

/** Every task that depends on another (the ones the delay is measured for). */
export function dependents(shape: Shape): number[] {
  const out: number[] = [];
  for (let i = 0; i < shape.parents.length; i++) if (shape.parents[i]!.length > 0) out.push(i);
  return out;
}
