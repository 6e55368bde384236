// Build step after tsc: copy every .sql file under src/ to the same place under dist/ (tsc copies
// only what it compiles). The migrations are read at run time next to their loader
// (src/schema/migrations.ts reads ./migrations/*.sql), so dist/schema/migrations/ needs them.
import { chmodSync, cpSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const files = readdirSync(join(root, 'src'), { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('.sql'));
if (files.length === 0)
  throw new Error('copy-sql: no .sql file under src/ (the migrations are src/schema/migrations/*.sql)');
for (const f of files) cpSync(join(root, 'src', f), join(root, 'dist', f));

// The package's bin: tsc writes dist/cli.js without the executable bit, and npm sets it only at
// install, so in a clone `npx berth` failed with "Permission denied" after every rebuild.
chmodSync(join(root, 'dist', 'cli.js'), 0o755);
