"""A gigawatt, live: a whole-site preset brought up as ``gigacluster up --preset`` does, then jobs on it.

Measured, on the real processes (the same ``Stack`` as ``up``):

- **up**: wall seconds from start to every service SERVING, and the resident memory of the whole
  process tree (every chip shard, the fabric, broker, scheduler, router and the MQTT broker);
- **one big job**: a Llama 3 405B job of ``--big-chips`` chips (TP 8, PP 16, DP the rest, the
  published Llama 3 setup: 4 virtual stages, selective recompute, half the TP collectives
  overlapped) runs ``--steps`` steps; its live step times against ``estimate train`` for the same
  spec, and the fabric's own time per step (``gigacluster_fabric_*`` is not needed: the fabric's
  CPU seconds over the run, from /proc);
- **a mix** (``--mix``): ``--jobs`` jobs of 1k to ``--big-chips`` chips (Llama 3 8B/70B/405B) from
  four tenants at once, each against its own estimate on an idle cluster (the slowdown a job
  suffers from its neighbours) and against its *modelled contended time*: what the fabric's own
  max-min solve says a job's collectives take beside its neighbours. On the presets' fabric (1:1,
  packet spraying) every flow's bottleneck is its own NIC or scale-up link, which no other job
  shares, so the solve gives each job its solo times (tests/fabric/test_neighbours.py: a 16k-chip
  neighbour's DP burst leaves a 2k-chip job's PP transfers at their solo time): the contended time
  is the idle estimate. With ECMP (hash collisions between jobs) it is not modelled ("-"). The mix
  also samples the fabric's per-tier utilisation as a check that no shared tier runs full.
  ``--trace`` prints each job's per-collective samples (scheduler/step_comm.py) against the
  model's time per call.

    python benchmarks/bench_gigawatt.py                      # 2gw-trainium3, the 100k job, 5 steps
    python benchmarks/bench_gigawatt.py --mix --jobs 20      # and 20 concurrent jobs
    python benchmarks/bench_gigawatt.py --preset 2gw-b200 --markdown
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

from _table import print_rows

from gigacluster.client import DEFAULT_PORTS, Client
from gigacluster.fabric.v1 import fabric_pb2
from gigacluster.model.training import TrainSpec
from gigacluster.planning import estimate_train
from gigacluster.runtime.clock import CLOCK_MODES
from gigacluster.scheduler.v1 import scheduler_pb2
from gigacluster.sites import get_preset
from gigacluster.stack import Stack, StackConfig

J = scheduler_pb2.Job


def llama(preset: str, chip: str, count: int, *, tp: int, pp: int, steps: int, vs: int = 1,
          batch_tokens: int = 0) -> dict[str, Any]:
    """A Llama 3 spec on ``count`` chips: DP takes the rest; 2M tokens per 128 DP replicas as the batch."""
    dp = count // (tp * pp)
    par: dict[str, Any] = {"tp": tp, "pp": pp, "microbatch_size": 1, "recompute": "selective"}
    if vs > 1:
        par.update(virtual_stages=vs, tp_comm_overlap=0.5)
    return {"model": {"preset": preset}, "batch": {"global_batch_tokens": batch_tokens or 8192 * 2 * dp * pp},
            "parallelism": par, "hardware": {"chip": chip, "count": count}, "precision": "bf16", "steps": steps}


def tree_rss_bytes(pids: list[int]) -> int:
    """Resident memory of these processes and all their descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(pathlib.Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    seen, todo, total = set(), list(pids), 0
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo.extend(children.get(p, []))
        try:
            for line in pathlib.Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (and its threads)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_jobs(gc: Client, specs: list[tuple[str, dict[str, Any]]], timeout_s: float,
                   verbose: bool = False) -> list[dict[str, Any]]:
    """Submit every spec at once, wait for all to end, return live vs model per job."""
    names = []
    for label, spec in specs:
        job = await gc.submit_job(spec, name=label, checkpoint_interval_steps=0)
        names.append((label, spec, job.name))
    deadline = time.monotonic() + timeout_s
    done: dict[str, J] = {}
    while len(done) < len(names) and time.monotonic() < deadline:
        for _, _, name in names:
            if name not in done:
                j = await gc.get_job(name)
                if j.state in (J.STATE_SUCCEEDED, J.STATE_FAILED, J.STATE_CANCELLED):
                    done[name] = j
        await asyncio.sleep(2.0)
    rows = []
    for label, spec, name in names:
        j = done.get(name) or await gc.get_job(name)
        trace = await gc.scheduler.GetJobTrace(scheduler_pb2.GetJobTraceRequest(name=name), metadata=gc.md)
        steps = [s.step_time_s for s in trace.steps]
        est = estimate_train(TrainSpec.from_dict(spec))
        model = est.step_time_s
        live = statistics.fmean(steps) if steps else float("nan")
        if trace.steps and verbose:
            last = trace.steps[-1]
            print(f"{label}: live compute {last.compute_s:.3f} exposed comm {last.exposed_comm_s:.3f} bubble "
                  f"{last.bubble_s:.3f}; model {est.breakdown.compute_s:.3f} / {est.breakdown.exposed_comm_s:.3f} / "
                  f"{est.breakdown.bubble_s:.3f}", flush=True)
            for k in sorted(set(last.comm_s) | set(est.comm_s)):
                print(f"  {k:12s} live {last.comm_s.get(k, 0.0):8.4f} s  model {est.comm_s.get(k, 0.0):8.4f} s")
        rows.append({"job": label, "name": name, "chips": spec["hardware"]["count"], "state": J.State.Name(j.state),
                     "steps": len(steps), "model_step_s": model, "live_step_s": live, "err": live / model - 1,
                     "first_step_s": steps[0] if steps else float("nan"),
                     "started_s": j.started_s, "finished_s": j.finished_s})
        if j.state not in (J.STATE_SUCCEEDED, J.STATE_FAILED, J.STATE_CANCELLED):
            await gc.cancel_job(name)
    return rows


SHARED_TIERS = ("leaf-spine", "spine-core")  # tiers whose links jobs on different nodes can share


async def poll_tiers(gc: Client, stop: asyncio.Event, every_s: float = 2.0) -> list[dict[str, float]]:
    """Mean utilisation per tier, sampled from the fabric every ``every_s`` wall seconds until ``stop``."""
    out: list[dict[str, float]] = []
    while not stop.is_set():
        r = await gc.fabric.GetLinkStats(fabric_pb2.GetLinkStatsRequest(), metadata=gc.md, timeout=30)
        out.append({t.tier: t.mean_utilization for t in r.tiers})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
    return out


def contended_step_s(spec: dict[str, Any], routing: str) -> float:
    """The modelled step beside the neighbours: the idle estimate on a sprayed non-blocking fabric (see the
    module docstring), not modelled (nan) with ECMP."""
    return estimate_train(TrainSpec.from_dict(spec)).step_time_s if routing == "spray" else float("nan")


def trace_samples(log_path: pathlib.Path, specs: list[tuple[str, dict[str, Any]]], labels: dict[str, str]) -> None:
    """Per job and multi-sample collective: its samples' seconds per call (mid-window, mean) against the model's."""
    seen: dict[str, list[dict[str, list[list[float]]]]] = {}
    for line in log_path.read_text().splitlines() if log_path.exists() else []:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == "step collective samples":
            seen.setdefault(str(rec["job"]), []).append(rec["samples"])
    by_label = dict(specs)
    for job, steps in sorted(seen.items()):
        label = labels.get(job, job)
        est = estimate_train(TrainSpec.from_dict(by_label[label])) if label in by_label else None
        for step_no, samples in enumerate(steps):
            for name, calls in samples.items():
                durs = sorted(calls)  # (offset, seconds) by offset: sample order
                secs = [d for _, d in durs]
                d = next((x for x in est.plan.collectives if x.name == name), None) if est else None
                model = est.comm_s[name] / d.count if est and d and d.count else float("nan")
                mid = secs[len(secs) // 2]
                print(f"  trace {label} step {step_no} {name}: per call model {model * 1e3:.3f} ms; samples "
                      + " ".join(f"{x * 1e3:.3f}" for x in secs)
                      + f" ms; mid {mid / model:.2f}x, mean {statistics.fmean(secs) / model:.2f}x model"
                      + (f"; {d.bytes_ / 1e6:.1f} MB, mean {d.bytes_ / statistics.fmean(secs) / 1e9:.1f} GB/s"
                         if d else ""), flush=True)


def mix(chip: str, big: int, n: int, steps: int) -> list[tuple[str, dict[str, Any]]]:
    """``n`` jobs from 1k to ``big`` chips: one big 405B, a few 70B, the rest 8B, sizes spread geometrically."""
    out = [("405b-big", llama("llama3-405b", chip, big, tp=8, pp=16, steps=steps, vs=4))]
    sizes = [1024 * 2 ** (k % 5) for k in range(n - 1)]  # 1k, 2k, 4k, 8k, 16k, 1k, ...
    for k, c in enumerate(sizes):
        if k % 3 == 0:
            out.append((f"70b-{k}", llama("llama3-70b", chip, c, tp=8, pp=4, steps=steps)))
        else:
            out.append((f"8b-{k}", llama("llama3-8b", chip, c, tp=1, pp=1, steps=steps)))
    return out


async def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="2gw-trainium3")
    ap.add_argument("--big-chips", type=int, default=102_400)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--speedup", type=float, default=10.0)
    ap.add_argument("--clock", default="wall", choices=CLOCK_MODES,
                    help="wall (at --speedup) or event: virtual time jumps when the mesh is idle, so the fabric's own "
                         "CPU time never leaks into step times")
    ap.add_argument("--mix", action="store_true", help="also run --jobs concurrent jobs of 1k to --big-chips")
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--routing", default="", help="fabric routing mode (ecmp, spray; default: the preset's)")
    ap.add_argument("--backdate-s", type=float, default=0.0, help="fabric backdate window, wall s (default: its own)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--trace", action="store_true", help="print the mix's per-collective samples")
    args = ap.parse_args(argv)
    site = get_preset(args.preset).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = StackConfig(chip=site["chip"], chips=site["chips"], shards=site["shards"], system=site["system"],
                          tiers=site["tiers"], switch=site["switch"], nic=site["nic"], speedup=args.speedup,
                          clock=args.clock, ports={k: 0 for k in DEFAULT_PORTS}, mqtt_port=0,
                          state_dir=pathlib.Path(tmp),
                          restart=False, routing=args.routing or site["routing"],
                          extra_env={"GIGACLUSTER_FABRIC_BACKDATE_S": str(args.backdate_s)} if args.backdate_s else {})
        t0 = time.monotonic()
        async with Stack(cfg) as st:
            up_s = time.monotonic() - t0
            pids = [p.proc.pid for p in st.procs.values() if p.proc is not None]
            rss = tree_rss_bytes(pids)
            print(f"{args.preset}: {site['chips']:,} x {site['chip']} in {site['shards']} shards, "
                  f"{site['tiers']} tiers of {site['switch']}: up and SERVING in {up_s:.1f} s, "
                  f"{rss / 2**30:.2f} GiB RSS over the process tree", flush=True)
            fabric_pid = st.procs["fabric"].proc.pid  # type: ignore[union-attr]
            key = await st.create_tenant("bench")
            async with Client(st.endpoints, key) as gc:
                f0, w0 = cpu_s(fabric_pid), time.monotonic()
                big = [("405b-big", llama("llama3-405b", site["chip"], args.big_chips, tp=8, pp=16,
                                          steps=args.steps, vs=4))]
                rows = await run_jobs(gc, big, args.timeout_s, verbose=True)
                fabric_cpu = cpu_s(fabric_pid) - f0
                print(f"one {args.big_chips:,}-chip job: fabric CPU {fabric_cpu:.1f} s over "
                      f"{time.monotonic() - w0:.1f} s wall, {fabric_cpu / max(rows[0]['steps'], 1):.2f} s per step",
                      flush=True)
                if args.mix:
                    specs = mix(site["chip"], args.big_chips, args.jobs, args.steps)
                    stop = asyncio.Event()
                    poller = asyncio.create_task(poll_tiers(gc, stop))
                    mixed = await run_jobs(gc, specs, args.timeout_s)
                    stop.set()
                    polls = await poller
                    if polls:
                        print(f"mix: {len(polls)} samples of tier utilisation; mean per tier "
                              + ", ".join(f"{t} {statistics.fmean(p.get(t, 0.0) for p in polls) * 100:.2f}%"
                                          for t in SHARED_TIERS), flush=True)
                    together = min(r["finished_s"] for r in mixed) - max(r["started_s"] for r in mixed)
                    print(f"mix: all {len(mixed)} jobs running at once for {together:.1f} virtual s "
                          f"(latest start {max(r['started_s'] for r in mixed):.1f} s, "
                          f"earliest end {min(r['finished_s'] for r in mixed):.1f} s)", flush=True)
                    routing = args.routing or site["routing"]
                    for r, (_, spec) in zip(mixed, specs, strict=True):
                        r["contended_s"] = contended_step_s(spec, routing)
                        r["err_c"] = r["live_step_s"] / r["contended_s"] - 1
                    rows += mixed
                    if args.trace:
                        trace_samples(pathlib.Path(tmp) / "logs" / "scheduler.log", specs,
                                      {r["name"]: r["job"] for r in mixed})
    print_rows(rows, [
        ("job", lambda r: r["job"]), ("chips", lambda r: f"{r['chips']:,}"), ("state", lambda r: r["state"]),
        ("steps", lambda r: str(r["steps"])), ("model step (s)", lambda r: f"{r['model_step_s']:.3f}"),
        ("live step (s)", lambda r: f"{r['live_step_s']:.3f}"), ("error", lambda r: f"{r['err'] * 100:+.2f}%"),
        ("first step (s)", lambda r: f"{r['first_step_s']:.3f}"),
        ("contended model (s)", lambda r: f"{r['contended_s']:.3f}" if "contended_s" in r else "-"),
        ("error vs contended", lambda r: f"{r['err_c'] * 100:+.2f}%" if "err_c" in r else "-")],
        markdown=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
