// Copies cursorlog's gRPC contract into the package (proto/cursorlog.proto), so an installed
// package finds it next to its code. Run by `npm run build` (and so by `npm pack`).
import { copyFileSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const source = join(here, '..', '..', '..', 'proto', 'proto', 'cursorlog', 'v1', 'cursorlog.proto');
const target = join(here, '..', 'proto', 'cursorlog.proto');
mkdirSync(dirname(target), { recursive: true });
copyFileSync(source, target);
console.log(`copied ${source} -> ${target}`);
