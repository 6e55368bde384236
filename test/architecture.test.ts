/**
 * The import graph of src/ keeps its layers (docs/architecture.md, "Layers"): no module imports
 * from a layer above its own, and neither folders nor files import each other in a cycle. Pure:
 * reads the sources, needs no database.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { transform } from 'esbuild';

const SRC = fileURLToPath(new URL('../src/', import.meta.url));

/**
 * Bottom to top. A module may import from its own layer and the layers below it; in a layer of
 * `peers`, a folder may not import another folder of its layer either (they meet only below, in
 * storage). Entries are paths under src/: a folder (`storage/`) or a file; the longest entry
 * that matches a module decides its layer, so a file can sit above the rest of its folder.
 */
const LAYERS: readonly { name: string; paths: readonly string[]; peers?: true }[] = [
  {
    name: 'foundation',
    paths: [
      'util/',
      'errors.ts',
      'logger.ts',
      'limits.ts',
      'sql.ts',
      'statement.ts',
      'db/',
      'metrics/',
      'tracing.ts',
      'task.ts',
      'task-type.ts',
      'schedule.ts',
      'lane.ts',
    ],
  },
  { name: 'storage', paths: ['storage/'] },
  { name: 'schema', paths: ['schema/'] },
  { name: 'roles', paths: ['producer/', 'processor/', 'maintenance/', 'admin/'], peers: true },
  { name: 'serving', paths: ['http/', 'observability/', 'dashboard/'] },
  // The worker's composition root and its options (worker.ts, worker-options.ts), the
  // environment reader (env.ts: the library never reads it elsewhere) and runDueTasks for tests
  // (run-due.ts): they wire the engine, the maintenance leader and the worker's HTTP server.
  { name: 'process', paths: ['process/'] },
  { name: 'entry', paths: ['cli/', 'cli.ts', 'index.ts', 'maintenance-api.ts', 'testing-api.ts'] },
];

type Graph = Map<string, { specifier: string; target: string }[]>;

function layerOf(module: string): number | null {
  let best: { index: number; length: number } | null = null;
  LAYERS.forEach((layer, index) => {
    for (const p of layer.paths) {
      const hit = p.endsWith('/') ? module.startsWith(p) : module === p;
      if (hit && (!best || p.length > best.length)) best = { index, length: p.length };
    }
  });
  return best === null ? null : (best as { index: number }).index;
}

/** The folder a module belongs to (`processor`), or the module itself for a file at the top of src/. */
function unitOf(module: string): string {
  const slash = module.indexOf('/');
  return slash < 0 ? module : module.slice(0, slash);
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (e.isDirectory()) return sourceFiles(path);
    return e.name.endsWith('.ts') && !e.name.endsWith('.d.ts') ? [path] : [];
  });
}

// Static `import … from` and `export … from` at the start of a line (both may span lines;
// `[^'"`;]` stops at the first string or statement end), side-effect `import '…'`, and dynamic
// `import('…')` with a literal specifier. A specifier that names no file under src/ fails the
// test, so a misread is loud, never a silently missing edge.
const IMPORT_PATTERNS = [
  /^[ \t]*(?:import|export)\b[^'"`;]*?\bfrom\s*['"]([^'"]+)['"]/gm,
  /^[ \t]*import\s*['"]([^'"]+)['"]/gm,
  /\bimport\(\s*['"]([^'"]+)['"]\s*\)/g,
];

/** The relative specifiers a source imports (package imports are not part of the layering). */
export function relativeImports(source: string): string[] {
  const out: string[] = [];
  for (const pattern of IMPORT_PATTERNS) {
    for (const m of source.matchAll(pattern)) if (m[1]!.startsWith('.')) out.push(m[1]!);
  }
  return out;
}

function readGraph(): Graph {
  const graph: Graph = new Map();
  for (const file of sourceFiles(SRC)) {
    const from = relative(SRC, file).split('\\').join('/');
    const edges = relativeImports(readFileSync(file, 'utf8')).map((specifier) => {
      const abs = resolve(dirname(file), specifier.replace(/\.js$/u, '.ts'));
      assert.ok(existsSync(abs), `src/${from} imports '${specifier}', which is not a file under src/`);
      return { specifier, target: relative(SRC, abs).split('\\').join('/') };
    });
    graph.set(from, edges);
  }
  return graph;
}

/**
 * Every import from a module into a layer above its own, or into a peer folder of its layer, as
 * "file imports 'x' (why)".
 */
function upwardImports(graph: Graph): string[] {
  const out: string[] = [];
  for (const [from, edges] of graph) {
    const own = layerOf(from)!;
    for (const e of edges) {
      const theirs = layerOf(e.target)!;
      if (theirs > own)
        out.push(`src/${from} imports '${e.specifier}' (${LAYERS[own]!.name} → ${LAYERS[theirs]!.name})`);
      else if (theirs === own && LAYERS[own]!.peers && unitOf(from) !== unitOf(e.target)) {
        out.push(
          `src/${from} imports '${e.specifier}' (${unitOf(from)} and ${unitOf(e.target)} are peers in ${LAYERS[own]!.name})`,
        );
      }
    }
  }
  return out;
}

/** One cycle per strongly connected component of more than one node (or a self-loop), as a path. */
function cycles(edges: ReadonlyMap<string, ReadonlySet<string>>): string[][] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  let next = 0;
  const visit = (v: string): void => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of edges.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) !== index.get(v)) return;
    const component: string[] = [];
    let w: string;
    do {
      w = stack.pop()!;
      onStack.delete(w);
      component.push(w);
    } while (w !== v);
    if (component.length > 1 || edges.get(v)?.has(v)) found.push(pathWithin(edges, new Set(component), v));
  };
  for (const v of edges.keys()) if (!index.has(v)) visit(v);
  return found;
}

/** A concrete cycle through `start` inside one strongly connected component (breadth first). */
function pathWithin(
  edges: ReadonlyMap<string, ReadonlySet<string>>,
  component: ReadonlySet<string>,
  start: string,
): string[] {
  const parent = new Map<string, string>();
  const queue = [start];
  while (queue.length > 0) {
    const v = queue.shift()!;
    for (const w of edges.get(v) ?? []) {
      if (!component.has(w)) continue;
      if (w === start) {
        const path = [start];
        for (let x = v; x !== start; x = parent.get(x)!) path.splice(1, 0, x);
        return [...path, start];
      }
      if (!parent.has(w)) {
        parent.set(w, v);
        queue.push(w);
      }
    }
  }
  return [start, start];
}

/** The graph between `key`s of modules; with `inner` false, edges inside one key are left out. */
function edgesBy(graph: Graph, key: (module: string) => string, inner = false): Map<string, Set<string>> {
  const out = new Map<string, Set<string>>();
  for (const [from, list] of graph) {
    const a = key(from);
    if (!out.has(a)) out.set(a, new Set());
    for (const e of list) {
      const b = key(e.target);
      if (inner || a !== b) out.get(a)!.add(b);
    }
  }
  return out;
}

/** A folder cycle, with the imports that make each of its edges. */
function describeFolderCycle(graph: Graph, cycle: readonly string[]): string {
  const steps = cycle.slice(1).map((to, i) => {
    const from = cycle[i]!;
    const why = [...graph].flatMap(([file, list]) =>
      unitOf(file) === from
        ? list.filter((e) => unitOf(e.target) === to).map((e) => `src/${file} imports '${e.specifier}'`)
        : [],
    );
    return `${from} → ${to} (${why.join('; ')})`;
  });
  return steps.join(', ');
}

const graph = readGraph();

test('every module of src/ has a layer', () => {
  const unplaced = [...graph.keys()].filter((m) => layerOf(m) === null);
  assert.deepEqual(
    unplaced,
    [],
    `give these modules a layer in test/architecture.test.ts and docs/architecture.md: ${unplaced.join(', ')}`,
  );
});

test('no module imports from a layer above its own, nor from a peer folder', () => {
  const upward = upwardImports(graph);
  assert.deepEqual(upward, [], `upward imports:\n${upward.join('\n')}`);
});

test('no folder imports itself back through another folder', () => {
  const found = cycles(edgesBy(graph, unitOf)).map((c) => describeFolderCycle(graph, c));
  assert.deepEqual(found, [], `folder cycles:\n${found.join('\n')}`);
});

test('no file imports itself back through other files', () => {
  const found = cycles(edgesBy(graph, (m) => m, true)).map((c) => c.map((m) => `src/${m}`).join(' → '));
  assert.deepEqual(found, [], `file cycles:\n${found.join('\n')}`);
});

test('the browser client reaches outside its folder only for wire.ts, which holds types only', async () => {
  // The client is type-checked without Node (tsconfig.client.json), and the bundles' staleness
  // check hashes src/dashboard/client alone (client-hash.ts): what it imports from outside must
  // need no Node and add nothing to the bundle. The API's JSON shapes are the one such module.
  const outside = new Set(
    [...graph].flatMap(([from, edges]) =>
      from.startsWith('dashboard/client/')
        ? edges.filter((e) => !e.target.startsWith('dashboard/client/')).map((e) => e.target)
        : [],
    ),
  );
  assert.deepEqual([...outside], ['dashboard/wire.ts']);
  const wire = readFileSync(join(SRC, 'dashboard', 'wire.ts'), 'utf8');
  assert.doesNotMatch(wire, /^[ \t]*(?:import|export)\b[^'"`;]*\bfrom\s*['"]/m, 'wire.ts imports nothing');
  assert.equal(
    (await transform(wire, { loader: 'ts' })).code,
    '',
    'wire.ts declares types only: it compiles to nothing',
  );
});

test('the check reads imports and catches what it must', () => {
  // The parser: multi-line and type-only imports, re-exports, side-effect and dynamic imports.
  assert.deepEqual(
    relativeImports(
      [
        `import { a,\n  b } from './a.js';`,
        `import type { C } from "../c.js";`,
        `export { d } from './d.js';`,
        `export * from './e.js';`,
        `import './f.js';`,
        `const g = await import('./g.js');`,
        `import pg from 'pg';`,
      ].join('\n'),
    ),
    ['./a.js', '../c.js', './d.js', './e.js', './f.js', './g.js'],
  );
  // The graph holds a known edge, so the checks do not pass on an empty graph.
  assert.ok(
    graph.get('processor/claim.ts')?.some((e) => e.target === 'storage/predicates.ts'),
    'claim.ts imports the shared predicate',
  );
  // An upward edge and a cycle are reported, naming the file and the import.
  const synthetic: Graph = new Map([
    ['storage/x.ts', [{ specifier: '../admin/y.js', target: 'admin/y.ts' }]],
    ['admin/y.ts', [{ specifier: '../storage/x.js', target: 'storage/x.ts' }]],
  ]);
  assert.deepEqual(upwardImports(synthetic), [`src/storage/x.ts imports '../admin/y.js' (storage → roles)`]);
  assert.deepEqual(
    upwardImports(
      new Map([['admin/z.ts', [{ specifier: '../processor/heartbeat.js', target: 'processor/heartbeat.ts' }]]]),
    ),
    [`src/admin/z.ts imports '../processor/heartbeat.js' (admin and processor are peers in roles)`],
  );
  assert.deepEqual(
    cycles(edgesBy(synthetic, unitOf)).map((c) => describeFolderCycle(synthetic, c)),
    [
      `storage → admin (src/storage/x.ts imports '../admin/y.js'), admin → storage (src/admin/y.ts imports '../storage/x.js')`,
    ],
  );
  assert.equal(
    layerOf('process/worker.ts'),
    LAYERS.findIndex((l) => l.name === 'process'),
  );
  assert.ok(
    LAYERS.every((l) => l.paths.every((p) => p.endsWith('/') || !p.includes('/'))),
    'every layer is whole folders (and files at the top of src/): no file sits in a folder of another layer',
  );
});
