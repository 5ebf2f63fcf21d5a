/** Leader routing without a network: address lists, hints, backoff, what may be resent. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { isIdempotent, mayRetry, parseAddresses, Router } from '../src/router.js';

describe('parseAddresses', () => {
  it('takes one address, a comma-separated list, or an array; trims, dedups, refuses empty', () => {
    assert.deepEqual(parseAddresses('127.0.0.1:7001'), ['127.0.0.1:7001']);
    assert.deepEqual(parseAddresses(' a:1, b:2 ,a:1,'), ['a:1', 'b:2']);
    assert.deepEqual(parseAddresses(['a:1', 'c:3']), ['a:1', 'c:3']);
    assert.throws(() => parseAddresses(' , '), RangeError);
  });
});

describe('Router', () => {
  it('follows a leader hint at once, then backs off when hints keep failing', () => {
    const r = new Router('a:1,b:2,c:3');
    assert.equal(r.current, 'a:1');
    assert.equal(r.failed('a:1', 'c:3'), 0);
    assert.equal(r.current, 'c:3');
    // The named leader is down too (the hint was stale): next address, with a backoff.
    assert.equal(r.failed('c:3', undefined), 100);
    assert.equal(r.current, 'a:1');
  });

  it('without hints: next address each time, 50·2^n ms capped at 400, reset by a success', () => {
    const r = new Router(['a:1', 'b:2', 'c:3']);
    const waits: number[] = [];
    const seen: string[] = [];
    for (let i = 0; i < 6; i += 1) {
      const at = r.current;
      waits.push(r.failed(at, undefined));
      seen.push(r.current);
    }
    assert.deepEqual(waits, [50, 100, 200, 400, 400, 400]);
    assert.deepEqual(seen, ['b:2', 'c:3', 'a:1', 'b:2', 'c:3', 'a:1']);
    r.succeeded('b:2');
    assert.equal(r.current, 'b:2');
    assert.equal(r.failed('b:2', undefined), 50);
  });

  it('a hint naming an address outside the list is added; a hint naming the failed member is ignored', () => {
    const r = new Router('a:1', { minBackoffMs: 10, maxBackoffMs: 20 });
    assert.equal(r.failed('a:1', 'z:9'), 0);
    assert.equal(r.current, 'z:9');
    assert.deepEqual(r.addresses, ['a:1', 'z:9']);
    assert.equal(r.failed('z:9', 'z:9'), 20);
    assert.equal(r.current, 'a:1');
  });

  it('a failure reported by a call that went to an old member does not move the router off the new one', () => {
    const r = new Router('a:1,b:2,c:3');
    r.succeeded('b:2');
    r.failed('a:1', undefined);
    assert.equal(r.current, 'b:2');
  });
});

describe('what may be resent after UNAVAILABLE', () => {
  it('anything marked safe; reads, OpenSession and KeepAlive always', () => {
    assert.ok(mayRetry('OpenStream', { session: 's', epoch: '1' }, 'safe'));
    assert.ok(mayRetry('Abort', {}, 'safe'));
    for (const rpc of ['Resolve', 'Read', 'GetOutcome', 'GetSession', 'OpenSession', 'KeepAlive']) {
      assert.ok(mayRetry(rpc, {}, 'outcome-unknown'), rpc);
      assert.ok(mayRetry(rpc, {}, undefined), rpc);
    }
  });

  it('appends and completions only with expected_next_seq; OpenStream, Abort and ExpireSession never when the outcome is unknown', () => {
    assert.ok(isIdempotent('Append', { expectedNextSeq: '3', events: [] }));
    assert.ok(!isIdempotent('Append', { events: [] }));
    assert.ok(isIdempotent('Complete', { expectedNextSeq: '4' }));
    assert.ok(!isIdempotent('Complete', {}));
    assert.ok(!mayRetry('OpenStream', { session: 's', epoch: '1' }, 'outcome-unknown'));
    assert.ok(!mayRetry('Abort', {}, 'outcome-unknown'));
    assert.ok(!mayRetry('ExpireSession', {}, undefined));
  });

  it('an AppendBatch when every item carries expected_next_seq and none opens a stream', () => {
    const append = { append: { session: 's', stream: '1', expectedNextSeq: '2', events: [] } };
    const complete = { complete: { session: 's', stream: '1', expectedNextSeq: '3' } };
    assert.ok(isIdempotent('AppendBatch', { items: [append, complete] }));
    assert.ok(!isIdempotent('AppendBatch', { items: [append, { open: { session: 's', epoch: '1' } }] }));
    assert.ok(!isIdempotent('AppendBatch', { items: [{ append: { session: 's', stream: '1', events: [] } }] }));
    assert.ok(mayRetry('AppendBatch', { items: [{ open: {} }] }, 'safe'));
  });
});
