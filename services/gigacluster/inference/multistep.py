"""vLLM v0's multi-step scheduling (``--num-scheduler-steps``), as the engine's option ``num_scheduler_steps``.

With ``k`` steps the scheduler runs once per ``k`` decode iterations: the batch chosen at the start of
a group decodes ``k`` tokens back to back, new prompts wait for the group's end, and outputs reach the
API server in chunks of ``k`` tokens at the end of each group (vLLM v0.6.0 release blog, 2024-09-05,
"multi-step scheduling"; a run with ``k = 10`` streams 10 tokens per chunk, as LambdaLabsML's
vllm-benchmark results show). So a request that stops inside a group is seen finished at the group's
end. A prefill iteration is one step and its first tokens go out at once. ``k = 1`` (vLLM's default)
is plain iteration-level scheduling. The host cost per iteration is unchanged (catalog
``serving.iteration_overhead_s`` is already the cost left on the critical path by v0.6's overlap).
"""

from __future__ import annotations

from gigacluster.inference.request import RequestSummary, Seq


class StepGroups:
    """Tracks the current group of decode iterations and the requests finished inside it."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.pos = 0  # decode iterations scheduled in the current group
        self._held: list[tuple[Seq, str]] = []

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

    def close(self, end_s: float, *, idle: bool) -> list[RequestSummary]:
        """After an iteration ending at ``end_s``: the summaries due (all held ones when the group ends,
        i.e. after its ``steps``-th iteration, a prefill iteration, or when no sequence is left)."""
        if self.pos % self.steps and not idle:
            return []
        self.pos = 0
        out = [seq.summary(end_s, reason) for seq, reason in self._held]
        self._held = []
        return out
