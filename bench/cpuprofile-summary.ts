/**
 * Where a V8 CPU profile's time (or a sampling heap profile's bytes) went, as text (for docs and reviews, where DevTools is not at hand).
 *
 *   npx tsx bench/cpuprofile-summary.ts FILE.cpuprofile [--top 40] [--focus NAME,...]
 *   npx tsx bench/cpuprofile-summary.ts FILE.heapprofile [--top 40]
 *
 * Prints the share of samples by category (idle, garbage collection, berth's source, node_modules
 * packages, Node's own code), the top functions by self time, and, for each `--focus` function
 * name, its inclusive time (itself and everything it called, each sample counted once).
 * Times are sample counts × the mean sampling interval.
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
}
interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  children?: number[];
}
interface Profile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples: number[];
}

interface HeapNode {
  callFrame: CallFrame;
  selfSize: number;
  children: HeapNode[];
}
interface HeapProfile {
  head: HeapNode;
}

/** A sampling heap profile: bytes allocated by category and by allocating function. */
function summariseHeap(h: HeapProfile): void {
  const cats = new Map<string, number>();
  const fns = new Map<string, number>();
  let total = 0;
  const visit = (n: HeapNode) => {
    if (n.selfSize > 0) {
      total += n.selfSize;
      const cf = n.callFrame;
      cats.set(category(cf), (cats.get(category(cf)) ?? 0) + n.selfSize);
      const key = `${cf.functionName || '(anonymous)'} ${where(cf)}${cf.url ? `:${cf.lineNumber + 1}` : ''}`;
      fns.set(key, (fns.get(key) ?? 0) + n.selfSize);
    }
    for (const c of n.children) visit(c);
  };
  visit(h.head);
  const mb = (n: number) => `${(n / 1e6).toFixed(1)} MB`;
  const share = (n: number) => `${((n * 100) / total).toFixed(1)} %`;
  console.log(`${file}: ${mb(total)} allocated (sampled)\n`);
  console.log('| category | allocated | share |\n| --- | ---: | ---: |');
  for (const [c, n] of [...cats].sort((a, b) => b[1] - a[1]).slice(0, 20))
    console.log(`| ${c} | ${mb(n)} | ${share(n)} |`);
  console.log('\n| function (allocating) | allocated | share |\n| --- | ---: | ---: |');
  for (const [f, n] of [...fns].sort((a, b) => b[1] - a[1]).slice(0, Number(args.top)))
    console.log(`| \`${f}\` | ${mb(n)} | ${share(n)} |`);
}

const { values: args, positionals } = parseArgs({
  allowPositionals: true,
  options: { top: { type: 'string', default: '40' }, focus: { type: 'string', default: '' } },
});
const file = positionals[0];
if (!file) {
  console.error('usage: npx tsx bench/cpuprofile-summary.ts FILE.cpuprofile [--top 40] [--focus a,b]');
  process.exit(2);
}
if (file.endsWith('.heapprofile')) {
  summariseHeap(JSON.parse(readFileSync(file, 'utf8')) as HeapProfile);
  process.exit(0);
}
const p = JSON.parse(readFileSync(file, 'utf8')) as Profile;
const byId = new Map(p.nodes.map((n) => [n.id, n]));
const parent = new Map<number, number>();
for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
const total = p.samples.length;
const msPerSample = (p.endTime - p.startTime) / 1000 / total;

function where(cf: CallFrame): string {
  const u = cf.url.replace(/^file:\/\//, '');
  const nm = u.lastIndexOf('node_modules/');
  if (nm >= 0) {
    const rest = u.slice(nm + 'node_modules/'.length).split('/');
    return rest[0]!.startsWith('@') ? `${rest[0]}/${rest[1]}` : rest[0]!;
  }
  const src = u.indexOf('/src/');
  if (src >= 0) return u.slice(src + 1);
  if (u.startsWith('node:') || u === '') return cf.functionName.startsWith('(') ? cf.functionName : 'node';
  return u;
}

function category(cf: CallFrame): string {
  const w = where(cf);
  if (w === '(idle)' || w === '(garbage collector)' || w === '(program)') return w;
  if (w.startsWith('src/')) return 'berth src/';
  if (w === 'node') return 'node internals';
  return w;
}

const selfCount = new Map<number, number>();
for (const s of p.samples) selfCount.set(s, (selfCount.get(s) ?? 0) + 1);

const cats = new Map<string, number>();
const fns = new Map<string, number>();
for (const [id, count] of selfCount) {
  const cf = byId.get(id)!.callFrame;
  cats.set(category(cf), (cats.get(category(cf)) ?? 0) + count);
  const key = `${cf.functionName || '(anonymous)'} ${where(cf)}${cf.url ? `:${cf.lineNumber + 1}` : ''}`;
  fns.set(key, (fns.get(key) ?? 0) + count);
}
const idle = cats.get('(idle)') ?? 0;
const pct = (n: number, of = total) => `${((n * 100) / of).toFixed(1)} %`;
const ms = (n: number) => `${(n * msPerSample).toFixed(0)} ms`;

console.log(`${file}: ${total} samples, ${ms(total)}; busy ${ms(total - idle)} (${pct(total - idle)})\n`);
console.log('| category | self | of busy |\n| --- | ---: | ---: |');
for (const [c, n] of [...cats].sort((a, b) => b[1] - a[1]).slice(0, 25))
  console.log(`| ${c} | ${ms(n)} | ${c === '(idle)' ? '' : pct(n, total - idle)} |`);
console.log(`\n| function (self time) | self | of busy |\n| --- | ---: | ---: |`);
for (const [f, n] of [...fns].sort((a, b) => b[1] - a[1]).slice(0, Number(args.top))) {
  if (f.startsWith('(idle)')) continue;
  console.log(`| \`${f}\` | ${ms(n)} | ${pct(n, total - idle)} |`);
}

if (args.focus) {
  console.log(`\n| function (inclusive) | total | of busy |\n| --- | ---: | ---: |`);
  for (const name of args.focus.split(',')) {
    let n = 0;
    for (const [id, count] of selfCount) {
      for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
        if (byId.get(cur)!.callFrame.functionName === name) {
          n += count;
          break;
        }
      }
    }
    console.log(`| \`${name}\` | ${ms(n)} | ${pct(n, total - idle)} |`);
  }
}
