/** The pure verdict → action table and the error/gap shapes shared with the other adapters. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Resolution } from '../src/proto.js';
import { ANSWERED_SUFFIX, discontinuityError, gapMarker, plan, requestIdOf, resolutionFacts } from '../src/resume.js';

const r = (verdict: Resolution['verdict'], extra: Partial<Resolution> = {}): Resolution => ({ verdict, ...extra });

describe('verdict table', () => {
  it('maps every verdict as DESIGN.md says for a resume of the own stream', () => {
    assert.deepEqual(plan(r('RESUMABLE')), { action: 'replay' });
    assert.deepEqual(plan(r('CURSOR_EVICTED')), { action: 'replay' });
    assert.deepEqual(plan(r('STREAM_TERMINATED', { missedTerminalFrame: true, streamState: 'STREAM_STATE_COMPLETED' })), { action: 'replay' });
    assert.deepEqual(plan(r('STREAM_TERMINATED', { streamState: 'STREAM_STATE_COMPLETED' })), { action: 'end' });
    assert.deepEqual(plan(r('STREAM_TERMINATED', { streamState: 'STREAM_STATE_ABORTED' })), { action: 'check_outcome' });
    assert.deepEqual(plan(r('CURSOR_AHEAD')), { action: 'fail', reason: 'cursor_ahead' });
    assert.deepEqual(plan(r('UNKNOWN_CURSOR')), { action: 'fail', reason: 'unknown_cursor' });
    assert.deepEqual(plan(r('MALFORMED_CURSOR')), { action: 'fail', reason: 'malformed_cursor' });
    assert.deepEqual(plan(r('UNKNOWN_SESSION')), { action: 'fail', reason: 'unknown_session' });
    assert.deepEqual(plan(r('STREAM_MISMATCH')), { action: 'fail', reason: 'stream_mismatch' });
    assert.deepEqual(plan(r('EPOCH_MISMATCH')), { action: 'fail', reason: 'stream_superseded' });
    assert.throws(() => plan(r('VERDICT_UNSPECIFIED')), /unknown verdict/);
  });

  it('builds the shared error shape: code, reason and only the revealed facts', () => {
    const facts = resolutionFacts(r('CURSOR_AHEAD', { currentEpoch: '1', streamState: 'STREAM_STATE_OPEN', head: '5', watermark: '1' }), '1-4-9');
    assert.deepEqual(facts, { verdict: 'CURSOR_AHEAD', cursor: '1-4-9', current_epoch: 1, state: 'OPEN', head: 5, watermark: 1 });
    const e = discontinuityError(requestIdOf("3"), "cursor_ahead", facts) as unknown as { id: unknown; error: { code: number; message: string; data: Record<string, unknown> } };
    assert.equal(e.id, 3);
    assert.equal(e.error.code, -32011);
    assert.equal(e.error.data['reason'], 'cursor_ahead');
    assert.equal(e.error.data['head'], 5);
    assert.match(e.error.message, /request 3: Last-Event-ID 1-4-9 is beyond/);
    const aborted = discontinuityError(requestIdOf("abc"), "producer_aborted", { detail: "producer lease expired" }) as unknown as { id: unknown; error: { code: number; message: string } };
    assert.equal(aborted.id, 'abc');
    assert.equal(aborted.error.code, -32012);
    assert.match(aborted.error.message, /producer lease expired/);
    assert.equal(requestIdOf(undefined), null);
  });

  it('marks a gap as a warning notification naming the evicted seqs', () => {
    const g = gapMarker({ verdict: "CURSOR_EVICTED" }, 3, 6) as unknown as { method: string; params: { level: string; logger: string; data: Record<string, unknown> } };
    assert.equal(g.method, 'notifications/message');
    assert.equal(g.params.level, 'warning');
    assert.equal(g.params.logger, 'cursorlog');
    assert.equal(g.params.data['evicted_first_seq'], 3);
    assert.equal(g.params.data['evicted_last_seq'], 6);
    assert.equal(g.params.data['reason'], 'cursor_evicted');
    assert.equal(ANSWERED_SUFFIX, '.answered');
  });
});
