import assert from 'node:assert/strict';
import { main } from '../../src/cli.js';

/**
 * Run the `berth` CLI in this process with `args` (and `env` set for the call); its exit code,
 * what it printed with console.log (`out`), and what went to stderr (`err`: console.error and
 * commander's own messages, which it writes to process.stderr directly). stdout is the test
 * runner's, so only console.log is captured there.
 */
export async function runCli(
  args: readonly string[],
  env: Record<string, string> = {},
): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const log = console.log;
  const error = console.error;
  const stderrWrite = process.stderr.write.bind(process.stderr);
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  Object.assign(process.env, env);
  console.log = (...a: unknown[]) => void out.push(a.join(' '));
  console.error = (...a: unknown[]) => void err.push(a.join(' '));
  process.stderr.write = ((chunk: string) => {
    err.push(String(chunk));
    return true;
  }) as typeof process.stderr.write;
  try {
    const code = await main(['node', 'berth', ...args]);
    return { code, out: out.join('\n'), err: err.join('\n') };
  } finally {
    console.log = log;
    console.error = error;
    process.stderr.write = stderrWrite;
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

/**
 * `runCli` on one test file's schema and the test database (`berth`), and the same for a
 * command's `--json` output (`berthJson`: a non-zero exit fails with what it printed to stderr,
 * not with a JSON parse error).
 */
export function cliOn(schema: string, databaseUrl: string) {
  const berth = (...args: string[]) => runCli([...args, '--schema', schema, '--database-url', databaseUrl]);
  const berthJson = async <T>(...args: string[]): Promise<T> => {
    const r = await berth(...args);
    assert.equal(r.code, 0, `berth ${args.join(' ')}: exit ${r.code}: ${r.err}`);
    return JSON.parse(r.out) as T;
  };
  return { berth, berthJson };
}
