"""The waiting queue of a replica engine: sequences by priority, oldest first within one, with the
prompt and output tokens they still need (for retry-after estimates and load reports).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator

from gigacluster.inference.request import Seq


class WaitingQueue:
    """Sequences waiting for a batch slot: highest priority first, FIFO within a priority."""

    def __init__(self) -> None:
        self._by_prio: dict[int, deque[Seq]] = {}
        self.count = 0
        self.prompt_tokens = 0  # tokens to (re)compute for everything queued
        self.out_tokens = 0  # output tokens still owed to everything queued

    def __bool__(self) -> bool:
        return bool(self._by_prio)

    def __iter__(self) -> Iterator[Seq]:
        for dq in self._by_prio.values():
            yield from dq

    def shed_candidate(self, priority: int) -> Seq | None:
        """The lowest-priority, newest sequence below ``priority`` that has done no work yet (or None)."""
        for prio in sorted(self._by_prio):
            if prio >= priority:
                return None
            dq = self._by_prio[prio]
            for seq in reversed(dq):
                if seq.gen == 0:  # never shed work already done (preempted sequences)
                    return seq
        return None

    def push(self, seq: Seq, *, front: bool) -> None:
        dq = self._by_prio.get(seq.req.priority)
        if dq is None:
            dq = self._by_prio[seq.req.priority] = deque()
        if front:
            dq.appendleft(seq)
        else:
            dq.append(seq)
        self.count += 1
        self.prompt_tokens += seq.prefill_tokens()
        self.out_tokens += seq.out_tokens()

    def remove(self, seq: Seq) -> None:
        dq = self._by_prio[seq.req.priority]
        dq.remove(seq)
        if not dq:
            del self._by_prio[seq.req.priority]
        self.count -= 1
        self.prompt_tokens -= seq.prefill_tokens()
        self.out_tokens -= seq.out_tokens()

    def pop(self) -> Seq | None:
        if not self._by_prio:
            return None
        prio = max(self._by_prio)
        seq = self._by_prio[prio][0]
        self.remove(seq)
        return seq

    def peek(self) -> Seq | None:
        if not self._by_prio:
            return None
        return self._by_prio[max(self._by_prio)][0]

    def latest_ready_s(self) -> float:
        """The latest arrival among the queued (for a handed-off one, when its KV landed); -inf if empty."""
        t = -math.inf
        for seq in self:
            t = max(t, seq.first_tok_s if seq.kv_ready else float(seq.req.arrival_s))
        return t
