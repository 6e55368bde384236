import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

/**
 * Where a typed `enqueue` / `enqueueMany` mistake is reported, under both compilers the package
 * is used with: TypeScript 7 (the repo's `typescript`) and 5.x (`typescript5`, an npm alias).
 * Each fixture under test/types/diagnostics/ holds one mistake; its diagnostic must sit at the
 * mistaken field (or argument) and name it. ok.ts (correct calls) and tasks.ts (the registry and
 * definitions) must compile cleanly. One compiler run per compiler over the whole folder (its own
 * program: tasks.ts augments the TaskRegistry).
 */
const root = fileURLToPath(new URL('..', import.meta.url));
const dir = 'test/types/diagnostics';

const COMPILERS = {
  'TypeScript 7': join(root, 'node_modules/typescript/bin/tsc'),
  'TypeScript 5': join(root, 'node_modules/typescript5/bin/tsc'),
};

// [fixture, line, column, a fragment of the message (its first line or a line of its chain)].
// Positions are 1-based, as tsc prints them: at the field, or, for a missing field or a misspelt
// name, at the argument that lacks it. A wrong field's type is reported at the field with
// TypeScript's own words ("Type 'string' is not assignable to type 'number'"); the field's name
// is in the related information, which --pretty false does not print.
const PINNED: readonly (readonly [string, number, number, string])[] = [
  ['def-payload-wrong-type.ts', 4, 39, "Type 'string' is not assignable to type 'number'"],
  ['def-payload-missing-field.ts', 4, 27, "Property 'width' is missing"],
  ['def-payload-extra-field.ts', 4, 49, "'height' does not exist in type"],
  ['def-option-queu.ts', 4, 53, "'queu' does not exist in type 'EnqueueOptions'. Did you mean to write 'queue'?"],
  ['handler-def-option-priorty.ts', 4, 45, "'priorty' does not exist in type 'EnqueueOptions'. Did you mean"],
  ['name-payload-wrong-type.ts', 4, 35, "Type 'number' is not assignable to type 'string'"],
  ['name-payload-missing-field.ts', 4, 33, "Property 'orderId' is missing"],
  ['name-option-priorty.ts', 4, 53, "'priorty' does not exist in type 'EnqueueOptions'. Did you mean"],
  ['name-misspelt.ts', 4, 19, `'"send_emial"' is not assignable to parameter of type '"send_email" | `],
  ['many-payload-wrong-type.ts', 6, 40, "Type 'string' is not assignable to type 'number'"],
  ['many-payload-missing-field.ts', 6, 25, "Property 'orderId' is missing"],
  ['many-option-queu.ts', 4, 65, "'queu' does not exist in type 'CheckedTaskSpec<"],
  ['many-option-priorty.ts', 6, 52, "'priorty' does not exist in type 'CheckedTaskSpec<"],
  ['many-misspelt.ts', 4, 26, `Type '"send_emial"' is not assignable to type '"send_email" | `],
];
const EXPECTED = new Map(PINNED.map(([file, line, column, message]) => [file, { line, column, message }]));
const CLEAN = ['ok.ts', 'tasks.ts'];

interface Diagnostic {
  file: string;
  line: number;
  column: number;
  /** The first line and the indented lines of its chain, joined. */
  message: string;
}

/** tsc's `--pretty false` output: `path(line,col): error TSnnnn: message`, chain lines indented. */
function parse(output: string): Diagnostic[] {
  const found: Diagnostic[] = [];
  for (const line of output.split('\n')) {
    const m = /^(.+?)\((\d+),(\d+)\): error TS\d+: (.*)$/.exec(line);
    if (m) {
      found.push({ file: m[1]!.replaceAll('\\', '/'), line: Number(m[2]), column: Number(m[3]), message: m[4]! });
    } else if (line.startsWith(' ') && found.length > 0) found.at(-1)!.message += `\n${line.trim()}`;
    else if (line.trim() !== '') found.push({ file: '', line: 0, column: 0, message: line });
  }
  return found;
}

function compile(tsc: string): Promise<Diagnostic[]> {
  return new Promise((resolve, reject) => {
    execFile(
      process.execPath,
      [tsc, '-p', dir, '--noEmit', '--pretty', 'false'],
      { cwd: root, maxBuffer: 16 * 1024 * 1024 },
      (err, stdout, stderr) => {
        // tsc exits 2 when it reports errors, which every mistake fixture does.
        if (err && typeof err.code !== 'number') reject(err);
        else if (stderr.trim() !== '') reject(new Error(`tsc wrote to stderr: ${stderr}`));
        else resolve(parse(stdout));
      },
    );
  });
}

test('every fixture is pinned: one mistake each, or a clean file', () => {
  const files = readdirSync(join(root, dir)).filter((f) => f.endsWith('.ts'));
  assert.deepEqual(files.sort(), [...EXPECTED.keys(), ...CLEAN].sort());
});

// Both compilers start at once (each is mostly waiting on the other's core otherwise); a failure
// is reported by its own test.
const runs = Object.entries(COMPILERS).map(([compiler, tsc]) => {
  const run = compile(tsc);
  run.catch(() => {});
  return [compiler, run] as const;
});

for (const [compiler, run] of runs) {
  test(`${compiler}: each typed enqueue mistake is reported at the field, naming it; correct calls compile`, async () => {
    const diagnostics = await run;
    const byFile = new Map<string, Diagnostic[]>();
    for (const d of diagnostics) {
      const name = d.file.startsWith(`${dir}/`) ? d.file.slice(dir.length + 1) : `(elsewhere) ${d.file}`;
      byFile.set(name, [...(byFile.get(name) ?? []), d]);
    }
    const show = (ds: Diagnostic[] | undefined) =>
      (ds ?? []).map((d) => `${d.file}(${d.line},${d.column}): ${d.message}`).join('\n') || '(none)';
    for (const f of [...CLEAN, ...[...byFile.keys()].filter((k) => !EXPECTED.has(k) && !CLEAN.includes(k))]) {
      assert.equal(byFile.get(f), undefined, `${f} must compile cleanly; got:\n${show(byFile.get(f))}`);
    }
    for (const [file, want] of EXPECTED) {
      const got = byFile.get(file);
      assert.equal(got?.length, 1, `${file}: one diagnostic expected; got:\n${show(got)}`);
      const d = got![0]!;
      assert.deepEqual(
        { line: d.line, column: d.column },
        { line: want.line, column: want.column },
        `${file}: reported at the wrong place:\n${show(got)}`,
      );
      assert.ok(d.message.includes(want.message), `${file}: message lacks "${want.message}":\n${show(got)}`);
    }
  });
}
