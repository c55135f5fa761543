"""Prefill-only and decode-only engine roles (disaggregated serving)."""

from __future__ import annotations

import dataclasses

import pytest

from gigacluster.inference.engine import Handoff, ReplicaConfig, ReplicaEngine, Request
from gigacluster.model import SpecError
from gigacluster.model.arch import preset

from .conftest import make_req, run_until_idle


def _cfgs() -> tuple[ReplicaConfig, ReplicaConfig, ReplicaConfig]:
    base = ReplicaConfig(preset("llama3-8b"), "h100-sxm")
    return base, dataclasses.replace(base, role="prefill"), dataclasses.replace(base, role="decode")


def _handoff(req: Request, ev, transfer_s: float) -> Request:  # type: ignore[no-untyped-def]
    s = ev.summary
    h = Handoff(first_token_id=ev.token_id, first_scheduled_s=s.first_scheduled_s,
                first_token_s=ev.time_s + transfer_s, cached_tokens=s.cached_tokens, kv_transfer_s=transfer_s)
    return dataclasses.replace(req, handoff=h, _hash_cache={})


def test_prefill_role_stops_after_first_token_and_holds_kv_until_released() -> None:
    """A prefill replica samples one token, finishes as 'prefilled' and keeps the prompt's KV until release_kv."""
    _, pcfg, _ = _cfgs()
    eng = ReplicaEngine(pcfg)
    eng.admit(make_req("a", 1000, 64), 0.0)
    _, events = run_until_idle(eng)
    assert [(e.index, e.finished, e.finish_reason) for e in events] == [(0, True, "prefilled")]
    held = eng.stats().kv_blocks_used
    assert held == -(-1000 // pcfg.block_size)  # the whole prompt, 63 blocks
    assert eng.held_kv_requests == 1
    assert eng.release_kv("a") and eng.stats().kv_blocks_used == 0 and eng.held_kv_requests == 0
    assert not eng.release_kv("a")


def test_prefill_role_one_token_request_finishes_without_handoff() -> None:
    """max_tokens=1 needs no decode replica: the prefill replica finishes it ('length') and frees its KV."""
    _, pcfg, _ = _cfgs()
    eng = ReplicaEngine(pcfg)
    eng.admit(make_req("a", 100, 1), 0.0)
    _, events = run_until_idle(eng)
    assert events[-1].finish_reason == "length" and eng.stats().kv_blocks_used == 0


def test_disaggregated_tokens_equal_monolithic_and_decode_runs_no_prefill() -> None:
    """Prefill then decode on two engines yields the same tokens as one engine; the decode side never prefills."""
    both, pcfg, dcfg = _cfgs()
    req = make_req("r1", 700, 20)
    mono = ReplicaEngine(both)
    mono.admit(dataclasses.replace(req, _hash_cache={}), 0.0)
    _, mono_ev = run_until_idle(mono)

    pre, dec = ReplicaEngine(pcfg), ReplicaEngine(dcfg)
    pre.admit(req, 0.0)
    t_pre, pre_ev = run_until_idle(pre)
    transfer_s = 0.004
    dec.admit(_handoff(req, pre_ev[0], transfer_s), t_pre + transfer_s)
    t = t_pre + transfer_s
    dec_ev = []
    while (it := dec.next_iteration(t)) is not None:
        assert it.prefill_tokens == 0 and it.decode_tokens == 1
        t += it.predicted_s
        dec_ev.extend(dec.complete(it, t))
    toks = [pre_ev[0].token_id] + [e.token_id for e in dec_ev]
    assert toks == [e.token_id for e in mono_ev]
    assert [e.index for e in dec_ev] == list(range(1, 20))
    s = dec_ev[-1].summary
    assert s is not None and s.output_tokens == 20 and s.prompt_tokens == 700
    assert s.ttft_s == pytest.approx(pre_ev[0].time_s + transfer_s)  # TTFT includes the KV transfer
    assert s.kv_transfer_s == transfer_s
    assert dec.stats().kv_blocks_used == 0


def test_roles_refuse_the_wrong_kind_of_request() -> None:
    """A decode replica takes only handed-off requests; the others take none."""
    both, pcfg, dcfg = _cfgs()
    plain = make_req("x", 10, 5)
    with pytest.raises(SpecError, match="handoff"):
        ReplicaEngine(dcfg).admit(plain, 0.0)
    h = dataclasses.replace(plain, handoff=Handoff(300, 0.0, 0.01))
    for cfg in (both, pcfg):
        with pytest.raises(SpecError, match="handoff"):
            ReplicaEngine(cfg).admit(h, 0.0)
    with pytest.raises(SpecError, match="role"):
        dataclasses.replace(both, role="sideways")


def test_decode_role_queue_never_refuses_handed_off_work() -> None:
    """Handed-off requests are admitted past max_queue (their prefill is done); they all finish."""
    _, _, dcfg = _cfgs()
    eng = ReplicaEngine(dataclasses.replace(dcfg, max_queue=2, max_batch=2))
    for i in range(6):
        r = make_req(f"h{i}", 50, 4, seed=i)
        eng.admit(dataclasses.replace(r, handoff=Handoff(300, 0.0, 0.01)), 0.01)
    assert eng.stats().queue_depth == 6
    _, events = run_until_idle(eng, 0.01)
    assert sum(e.finished for e in events) == 6 and len(events) == 6 * 3


def test_cancel_releases_held_kv() -> None:
    """Cancelling a prefilled request whose KV was never sent frees its blocks."""
    _, pcfg, _ = _cfgs()
    eng = ReplicaEngine(pcfg)
    eng.admit(make_req("a", 300, 8), 0.0)
    run_until_idle(eng)
    assert eng.stats().kv_blocks_used > 0
    assert eng.cancel("a") and eng.stats().kv_blocks_used == 0
