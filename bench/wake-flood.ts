/**
 * `npm run bench:wake-flood`: what a flood of forged wake notifications costs an idle worker.
 *
 * Anyone who can connect may NOTIFY a worker's wake channel: NOTIFY needs no privilege. A
 * notification names a lane (`<lane id>`) or a cancel (`cancel:<lane>:<position>`), and every one
 * that named a lane made the worker claim from it, and discover when that came back empty. On a
 * dedicated stock cluster, an idle worker (4 slots, maintenance and heartbeat off, eight lanes
 * with nothing in them) is measured for 10 s without notifications, then for 10 s while a
 * session sends them as fast as the server takes them (transactions of one notification naming
 * each of the eight lanes and one cancel per lane, in a server-side loop). Reported: the worker
 * process's CPU (this process runs nothing else meanwhile) and the database's transactions
 * (the flooding session's own subtracted).
 *
 * BENCH_BERTH_BASE=<another build's dist/index.js> measures that build too, in the same run.
 * BENCH_FLOOD_S (default 10).
 */
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';
import pg from 'pg';
import { pino } from 'pino';
import { intEnv } from './config.js';
import { openBenchServer, recreateDatabase } from './db.js';
import { log } from './util.js';

type Berth = typeof import('../src/index.js');
const builds: { label: string; berth: Berth; schema: string }[] = [
  { label: 'this checkout', berth: (await import('../src/index.js')) as Berth, schema: 'wake_flood' },
];
if (process.env.BENCH_BERTH_BASE) {
  const path = resolve(process.env.BENCH_BERTH_BASE);
  builds.push({
    label: `base (${path})`,
    berth: (await import(pathToFileURL(path).href)) as Berth,
    schema: 'wake_flood_base',
  });
}
const seconds = intEnv('BENCH_FLOOD_S', 10);
const LANES = 8;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function commits(db: pg.Client): Promise<number> {
  const r = await db.query<{ n: string }>(
    `SELECT pg_stat_force_next_flush(), (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database())::text AS n`,
  );
  return Number(r.rows[0]!.n);
}

/** CPU of this process (ms) and the database's transactions over `ms`, with `during` running. */
async function measure(
  monitor: pg.Client,
  ms: number,
  during?: () => Promise<number>,
): Promise<{ cpuMs: number; xacts: number; own: number }> {
  await sleep(600); // the stats of the moment before settle
  const c0 = await commits(monitor);
  const u0 = process.cpuUsage();
  let own = 0;
  if (during) own = await during();
  else await sleep(ms);
  const u1 = process.cpuUsage(u0);
  await sleep(600);
  const c1 = await commits(monitor);
  // The monitor's own two reads, the flooder's transactions.
  return { cpuMs: (u1.user + u1.system) / 1000, xacts: c1 - c0 - 2 - own, own };
}

const server = await openBenchServer();
try {
  const url = new URL(server.adminUrl);
  url.pathname = '/wake_flood';
  await recreateDatabase(server.adminUrl, 'wake_flood');
  const connectionString = url.toString();
  const monitor = new pg.Client({ connectionString });
  await monitor.connect();
  const flooder = new pg.Client({ connectionString });
  await flooder.connect();
  const rows: string[] = [];
  for (const b of builds) {
    await b.berth.migrate({ connectionString, schema: b.schema });
    const noop = b.berth.defineTask<{ i: number }>({ type: 'noop', ceilingMs: 60_000, handler: async () => {} });
    // Eight lanes, drained: they exist, and hold nothing.
    const pool = new pg.Pool({ connectionString, max: 2 });
    await b.berth.enqueueMany(
      pool,
      Array.from({ length: LANES }, (_, i) => ({ type: 'noop', payload: { i }, shard: i })),
      { schema: b.schema },
    );
    const worker = new b.berth.Worker({
      connectionString,
      schema: b.schema,
      tasks: [noop],
      slots: 4,
      logger: pino({ level: 'silent' }),
      maintenance: false,
      heartbeatIntervalMs: false,
    });
    await worker.start();
    for (;;) {
      const left = await pool.query<{ n: number }>(
        `SELECT ((SELECT count(*) FROM "${b.schema}".ready) - (SELECT coalesce(sum(n), 0) FROM "${b.schema}".range_settlements))::int AS n`,
      );
      if (left.rows[0]!.n === 0) break;
      await sleep(50);
    }
    await sleep(1000);
    const idle = await measure(monitor, seconds * 1000);
    const channel = `${b.schema}.wake`;
    const flood = await measure(monitor, seconds * 1000, async () => {
      // One transaction per round, each round one notice per lane and a cancel per lane (its
      // position going round 1-200).
      await flooder.query(
        `CREATE OR REPLACE PROCEDURE pg_temp.flood(p_channel text, p_until timestamptz, INOUT rounds integer)
         LANGUAGE plpgsql AS $$
         BEGIN
           rounds := 0;
           WHILE clock_timestamp() < p_until LOOP
             PERFORM pg_notify(p_channel, l::text) FROM generate_series(1, ${LANES}) l;
             PERFORM pg_notify(p_channel, 'cancel:' || l || ':' || (rounds % 200 + 1)) FROM generate_series(1, ${LANES}) l;
             COMMIT;
             rounds := rounds + 1;
           END LOOP;
         END $$`,
      );
      const r = await flooder.query<{ rounds: number }>(
        'CALL pg_temp.flood($1, clock_timestamp() + make_interval(secs => $2), NULL)',
        [channel, seconds],
      );
      return r.rows[0]?.rounds ?? 0;
    });
    await worker.stop();
    await pool.end();
    log(`${b.label}: idle ${JSON.stringify(idle)}; flood ${JSON.stringify(flood)}`);
    rows.push(
      `| ${b.label} | ${idle.cpuMs.toFixed(0)} | ${idle.xacts} | ${flood.own.toLocaleString('en')} | ` +
        `${(flood.own * LANES * 2).toLocaleString('en')} | ${flood.cpuMs.toFixed(0)} | ${flood.xacts.toLocaleString('en')} |`,
    );
  }
  await flooder.end();
  await monitor.end();
  process.stdout.write(
    [
      `An idle worker for ${seconds} s without notifications, then ${seconds} s under a flood of forged ones (${server.description}):`,
      '',
      '| build | idle: worker CPU ms | idle: transactions | flood: rounds | flood: notifications | flood: worker CPU ms | flood: worker transactions |',
      '| --- | ---: | ---: | ---: | ---: | ---: | ---: |',
      ...rows,
      '',
    ].join('\n'),
  );
} finally {
  await server.stop();
}
