// Summarise a Quint ITF trace of spec/berth_protocol.qnt: one line per step (what it did, the
// ring, the ready entries). Usage: node spec/trace-summary.mjs <trace.itf.json>
import { readFileSync } from 'node:fs';

const file = process.argv[2];
if (!file) {
  console.error('usage: node spec/trace-summary.mjs <trace.itf.json>');
  process.exit(2);
}
const itf = JSON.parse(readFileSync(file, 'utf8'));

/** ITF values to plain JS: bigints to numbers, sets to arrays, maps to Map. */
function plain(v) {
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) return v.map(plain);
  if ('#bigint' in v) return Number(v['#bigint']);
  if ('#set' in v) return v['#set'].map(plain);
  if ('#map' in v) return new Map(v['#map'].map(([k, x]) => [plain(k), plain(x)]));
  if ('#tup' in v) return v['#tup'].map(plain);
  return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, plain(x)]));
}

const field = (state, name) => {
  const key = Object.keys(state).find((k) => k === name || k.endsWith(`::${name}`));
  return key ? plain(state[key]) : undefined;
};

const none = (x) => (x === -1 || x === undefined ? '' : String(x));
const entry = (e) =>
  `${e.lane}:${e.seq}@s${e.seg}/e${e.ep}#t${e.task}${e.owner === -1 ? '' : `(p${e.owner})`}`;
console.log(`status: ${itf['#meta']?.status ?? '?'}; ${itf.states.length} states`);
for (const s of itf.states) {
  const last = field(s, 'last');
  const ring = field(s, 'ring');
  const db = field(s, 'db');
  const what = [last.act, last.actor === -1 ? '' : `by ${last.actor}`, last.lane === -1 ? '' : `lane ${last.lane}`]
    .concat([last.seg === -1 ? '' : `seg ${last.seg}`, last.seq === -1 ? '' : `seq ${last.seq}`])
    .concat([last.task === -1 ? '' : `task ${last.task}`, none(last.detail)])
    .filter(Boolean)
    .join(' ');
  const ready = [...db.ready].sort((a, b) => a.lane - b.lane || a.seq - b.seq).map(entry).join(' ');
  const leases = db.leases.map((l) => `${l.lane}:[${l.from}..${l.to}]@s${l.seg}${l.expired ? '!' : ''}`).join(' ');
  console.log(
    `${String(s['#meta'].index).padStart(3)} ${what.padEnd(44)} epoch ${ring.epoch} row ${ring.row.ep}/g${ring.row.gen}` +
      `${ring.rotating ? ' rotating' : ''} | ready ${ready || '-'} | leases ${leases || '-'}`,
  );
}
