/**
 * The packed package (what `npm install` gets) carries the proto file and finds it next to
 * its code, not in the repository.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { PACKAGE_DIR } from './harness.js';

describe('the npm package', () => {
  it('ships proto/cursorlog.proto and proto/tasks.proto and loads them from there', async () => {
    // Unpacked under the package dir, so its imports resolve through our node_modules.
    const dir = mkdtempSync(join(PACKAGE_DIR, 'dist', 'pack-'));
    try {
      const out = execFileSync('npm', ['pack', '--ignore-scripts', '--silent', '--pack-destination', dir], { cwd: PACKAGE_DIR, encoding: 'utf8' });
      const tarball = join(dir, out.trim().split('\n').at(-1)!);
      execFileSync('tar', ['xzf', tarball, '-C', dir]);
      const proto = (await import(join(dir, 'package', 'dist', 'src', 'proto.js'))) as typeof import('../src/proto.js');
      assert.equal(proto.protoPath(), join(dir, 'package', 'proto', 'cursorlog.proto'));
      assert.equal(typeof proto.loadClientConstructor(), 'function');
      // The tasks service too (CursorlogTaskStore, CursorlogTaskMessageQueue).
      assert.equal(proto.tasksProtoPath(), join(dir, 'package', 'proto', 'tasks.proto'));
      assert.equal(typeof proto.loadTasksConstructor(), 'function');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
