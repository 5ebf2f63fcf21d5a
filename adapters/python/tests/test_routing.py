"""Leader routing without a network: address lists, hints, backoff, what may be resent."""

from __future__ import annotations

import asyncio

import pytest

from cursorlog_mcp._proto import cursorlog_pb2 as pb
from cursorlog_mcp.batcher import _Item, _resend
from cursorlog_mcp.client import CursorlogClient
from cursorlog_mcp.routing import Router, hints, leader_in_message, may_retry, parse_addresses


def test_addresses_one_a_comma_list_or_a_sequence() -> None:
    assert parse_addresses("127.0.0.1:7001") == ["127.0.0.1:7001"]
    assert parse_addresses(" a:1, b:2 ,a:1,") == ["a:1", "b:2"]
    assert parse_addresses(["a:1", "c:3"]) == ["a:1", "c:3"]
    with pytest.raises(ValueError):
        parse_addresses(" , ")
    # The client keeps the single-address form as it was.
    assert CursorlogClient("127.0.0.1:7001").target == "127.0.0.1:7001"
    assert not CursorlogClient("127.0.0.1:7001").clustered
    assert CursorlogClient("a:1,b:2").clustered


def test_a_leader_hint_is_followed_at_once_then_failures_back_off() -> None:
    r = Router("a:1,b:2,c:3")
    assert r.current == "a:1"
    assert r.failed("a:1", "c:3") == 0
    assert r.current == "c:3"
    # The named leader is down too (a stale hint): the next address, after a backoff.
    assert r.failed("c:3", None) == pytest.approx(0.1)
    assert r.current == "a:1"


def test_without_hints_round_robin_with_bounded_exponential_backoff() -> None:
    r = Router(["a:1", "b:2", "c:3"])
    waits, seen = [], []
    for _ in range(6):
        waits.append(r.failed(r.current, None))
        seen.append(r.current)
    assert waits == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.4, 0.4])
    assert seen == ["b:2", "c:3", "a:1", "b:2", "c:3", "a:1"]
    r.succeeded("b:2")
    assert r.current == "b:2"
    assert r.failed("b:2", None) == pytest.approx(0.05)


def test_hints_outside_the_list_are_added_and_a_stale_failure_does_not_move_the_router() -> None:
    r = Router("a:1")
    assert r.failed("a:1", "z:9") == 0
    assert r.addresses == ("a:1", "z:9") and r.current == "z:9"
    r = Router("a:1,b:2,c:3")
    r.succeeded("b:2")
    r.failed("a:1", None)  # a call that still went to the old member
    assert r.current == "b:2"


def test_headers_and_messages() -> None:
    assert hints([("cursorlog-leader", "h:2"), ("cursorlog-retry", "safe")]) == ("h:2", "safe")
    assert hints([("cursorlog-retry", b"outcome-unknown")]) == (None, "outcome-unknown")
    assert hints([], "failed to connect to all addresses; last error: ...") == (None, "safe")
    assert hints(None, "Socket closed") == (None, None)
    message = "this node is not the leader (the leader is at 127.0.0.1:7002): send writes to the leader"
    assert leader_in_message(message) == "127.0.0.1:7002"
    assert leader_in_message("no leader known") is None


def test_what_may_be_resent() -> None:
    assert may_retry(False, "safe")  # OpenStream, Abort…: only when nothing was proposed
    assert not may_retry(False, "outcome-unknown")
    assert not may_retry(False, None)
    assert may_retry(True, "outcome-unknown")  # reads, OpenSession, appends with expected_next_seq
    assert may_retry(True, None)


@pytest.mark.anyio
async def test_batch_items_refused_by_a_follower_are_resent_only_with_an_expected_seq() -> None:
    loop = asyncio.get_running_loop()

    def item(seq: int | None) -> _Item:
        return _Item("s", 1, "n", b"x", None, False, seq, loop.create_future())

    refused = pb.BatchResult(failure=pb.Failure(code=14, message="not the leader"))
    conflict = pb.BatchResult(failure=pb.Failure(code=10, message="expected seq 3"))
    assert _resend(item(3), refused, budget=5)
    assert not _resend(item(None), refused, budget=5)
    assert not _resend(item(3), conflict, budget=5)
    spent = item(3)
    spent.attempts = 5
    assert not _resend(spent, refused, budget=5)
