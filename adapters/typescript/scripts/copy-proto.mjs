// Copies cursorlog's gRPC contract into the package (proto/cursorlog.proto and the tasks
// service, proto/tasks.proto), so an installed
// package finds it next to its code. Run by `npm run build` (and so by `npm pack`).
import { copyFileSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const sourceDir = join(here, '..', '..', '..', 'proto', 'proto', 'cursorlog', 'v1');
for (const file of ['cursorlog.proto', 'tasks.proto']) {
  const source = join(sourceDir, file);
  const target = join(here, '..', 'proto', file);
  mkdirSync(dirname(target), { recursive: true });
  copyFileSync(source, target);
  console.log(`copied ${source} -> ${target}`);
}
