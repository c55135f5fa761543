"""vLLM v0's multi-step scheduling (``--num-scheduler-steps``), as the engine's option ``num_scheduler_steps``.

With ``k`` steps the scheduler runs once per ``k`` decode iterations: the batch chosen at the start of
a group decodes ``k`` tokens back to back, new prompts wait for the group's end, and outputs reach the
API server in chunks of ``k`` tokens at the end of each group (vLLM v0.6.0 release blog, 2024-09-05,
"multi-step scheduling"; a run with ``k = 10`` streams 10 tokens per chunk, as LambdaLabsML's
vllm-benchmark results show). So a request that stops inside a group is seen finished at the group's
end. A prefill iteration is one step and its first tokens go out at once. ``k = 1`` (vLLM's default)
is plain iteration-level scheduling. Every iteration still pays the fixed host cost (catalog
``serving.iteration_overhead_s``); a scheduler call (every iteration with one step; the iteration that
opens a group, or a prefill iteration, with ``k`` > 1) also pays v0's per-sequence host work between two
steps, catalog ``serving.v0_schedule_seq_s`` per sequence in it: multi-step pays it once per group, which
is what it was built to amortise (:func:`.cost.iteration_host_s`).
"""

from __future__ import annotations

import dataclasses

from gigacluster.inference.request import RequestSummary, Seq


class StepGroups:
    """Tracks the current group of decode iterations and the requests finished inside it.

    With ``lag`` (vLLM v0.6's asynchronous output processor, engine option ``async_output``), the outputs
    of an iteration are processed while the next one runs (vllm-project/vllm PR 7049: the output
    processing of a step runs as a callback inside the next step, before its sampler; PR 8050, in v0.6.0:
    for every step of a multi-step group and for prompt steps too), so a client sees an iteration's first
    tokens and finished requests when the next iteration ends; an iteration after which the engine is
    left with nothing to run delivers its own at once.
    """

    def __init__(self, steps: int, *, lag: bool = False) -> None:
        self.steps = steps
        self.lag = lag
        self.pos = 0  # decode iterations scheduled in the current group
        self._held: list[tuple[Seq, str]] = []
        self._new: list[Seq] = []  # first tokens of the iteration being completed
        self._seen: list[Seq] = []  # first tokens of the previous iteration, visible at the next end
        self._late: list[RequestSummary] = []  # summaries of the previous iteration (lag)
        self._late_first: set[str] = set()  # of those, the requests whose first token came with them

    def first_token(self, seq: Seq, end_s: float) -> None:
        """``seq``'s first token was produced by the iteration ending at ``end_s``."""
        seq.first_tok_s = end_s
        if self.lag:
            self._new.append(seq)

    @property
    def at_boundary(self) -> bool:
        """True when the scheduler may start new requests (between groups)."""
        return self.pos == 0

    def scheduled(self, *, decode_only: bool) -> None:
        """Count an iteration just scheduled: a decode iteration is one step of the group."""
        if self.steps > 1:
            self.pos = self.pos + 1 if decode_only else 0

    def finish(self, seq: Seq, reason: str) -> None:
        """A request stopped in the iteration being completed; it is reported when its group ends."""
        self._held.append((seq, reason))

    def close(self, end_s: float, *, idle: bool, queued: int = 0) -> list[RequestSummary]:
        """After an iteration ending at ``end_s``: the summaries the client sees now (all held ones when the
        group ends, i.e. after its ``steps``-th iteration, a prefill iteration, or when no sequence is left;
        with ``lag``, those of the previous iteration, and this one's too when the engine is left idle with
        nothing ``queued``)."""
        if not self.lag:
            return self._due(end_s, idle)
        for seq in self._seen:
            seq.first_tok_s = end_s  # the previous iteration's first tokens reach the client now
        first, self._seen, self._new = {seq.req.id for seq in self._new}, self._new, []
        out = [dataclasses.replace(s, finish_s=end_s, first_token_s=end_s if s.request_id in self._late_first
                                   else s.first_token_s) for s in self._late]
        self._late, self._late_first = self._due(end_s, idle), first
        if idle and not queued:
            out += self._late
            self._late, self._late_first, self._seen = [], set(), []
        return out

    def _due(self, end_s: float, idle: bool) -> list[RequestSummary]:
        if self.pos % self.steps and not idle:
            return []
        self.pos = 0
        out = [seq.summary(end_s, reason) for seq, reason in self._held]
        self._held = []
        return out
