"""Leader routing for a replicated cursorlog (``cursorlog serve --node-id … --peers …``).

Pure logic, no network (unit-tested on its own): which member to call after an UNAVAILABLE,
how long to wait first, and whether the failed call may be sent again.

A member that is not the leader answers UNAVAILABLE with the headers (trailing metadata in
grpcio) ``cursorlog-leader: HOST:PORT`` (when it knows the leader) and ``cursorlog-retry:
safe`` (nothing was proposed) or ``outcome-unknown`` (the call may have taken effect). Without
a leader header (an election is under way, the member is down or cut off) the client backs off
(bounded exponential) and tries the next address of its list. Inside an ``AppendBatch``
answer the same refusal is an item ``Failure`` (code UNAVAILABLE) whose message names the
leader ("… the leader is at HOST:PORT …").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Literal

LEADER_HEADER = "cursorlog-leader"
RETRY_HEADER = "cursorlog-retry"

RetryHint = Literal["safe", "outcome-unknown"] | None

_LEADER_IN_MESSAGE = re.compile(r"the leader is at ([^\s)]+)")


def parse_addresses(target: str | Sequence[str]) -> list[str]:
    """The member list of a target: one ``host:port``, a comma-separated list of them, or a
    sequence; trimmed, duplicates dropped, order kept. Raises ``ValueError`` when empty."""
    parts = target.split(",") if isinstance(target, str) else list(target)
    out: list[str] = []
    for part in parts:
        address = part.strip()
        if address and address not in out:
            out.append(address)
    if not out:
        raise ValueError("the cursorlog address list is empty")
    return out


def hints(metadata: Iterable[tuple[str, str | bytes]] | None, details: str = "") -> tuple[str | None, RetryHint]:
    """The leader and the retry hint of a failed call, from its (trailing) metadata.

    A call that failed because no connection was up ("failed to connect to all addresses")
    was never sent, so resending it is safe.
    """
    leader: str | None = None
    retry: RetryHint = None
    for key, value in metadata or ():
        text = value.decode() if isinstance(value, bytes) else value
        if key == LEADER_HEADER and text:
            leader = text
        elif key == RETRY_HEADER and text in ("safe", "outcome-unknown"):
            retry = "safe" if text == "safe" else "outcome-unknown"
    if retry is None and "failed to connect to all addresses" in details:
        retry = "safe"
    return leader, retry


def leader_in_message(message: str) -> str | None:
    """The leader named in a not-leader message, as in ``AppendBatch`` item failures."""
    found = _LEADER_IN_MESSAGE.search(message)
    return found.group(1) if found else None


def may_retry(idempotent: bool, hint: RetryHint) -> bool:
    """Whether a call that failed with UNAVAILABLE may be sent again: anything marked safe, and
    idempotent calls (reads, ``OpenSession``, ``KeepAlive``, appends and completions that carry
    ``expected_next_seq``) whatever the hint. ``OpenStream`` is not idempotent: a resend after
    ``outcome-unknown`` could open a second stream."""
    return hint == "safe" or idempotent


class Router:
    """Which member to call, shared by every call of a client.

    ``current`` is the member believed to lead. ``failed`` moves it (to the named leader, else to
    the next address) and returns the wait before the next attempt: none the first time a hint
    is followed, else ``min_backoff_s * 2**n`` capped at ``max_backoff_s``; a success resets it.
    """

    def __init__(
        self, target: str | Sequence[str], *, min_backoff_s: float = 0.05, max_backoff_s: float = 0.4
    ) -> None:
        self._list = parse_addresses(target)
        self._index = 0
        self._streak = 0
        self._min = min_backoff_s
        self._max = max_backoff_s

    @property
    def addresses(self) -> tuple[str, ...]:
        """The members known: the configured list plus leaders named by hints."""
        return tuple(self._list)

    @property
    def current(self) -> str:
        """The member to call now."""
        return self._list[self._index]

    def succeeded(self, address: str) -> None:
        """A call to ``address`` succeeded: it leads; the backoff starts over."""
        self._streak = 0
        if address in self._list:
            self._index = self._list.index(address)

    def failed(self, address: str, leader: str | None) -> float:
        """A call to ``address`` failed with UNAVAILABLE naming ``leader`` (or none); returns the
        wait in seconds before the next attempt, which goes to ``current``."""
        streak = self._streak
        self._streak += 1
        if leader and leader != address:
            if leader not in self._list:
                self._list.append(leader)
            self._index = self._list.index(leader)
            return 0.0 if streak == 0 else self._backoff(streak)
        # Another call may have moved on already: only advance from the member that failed.
        if address in self._list and self._list.index(address) == self._index:
            self._index = (self._index + 1) % len(self._list)
        return self._backoff(streak)

    def _backoff(self, streak: int) -> float:
        return float(min(self._max, self._min * 2.0 ** min(streak, 16)))
