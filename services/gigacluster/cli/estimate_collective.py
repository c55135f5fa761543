"""``gigacluster estimate collective``: time one collective on an idle fabric, nccl-tests style.

Runs :func:`gigacluster.fabric.estimate.estimate_collective` (the same FlowSim the live fabric
service runs) and prints time, algbw and busbw (GB/s = 1e9 B/s). Bad input exits with code 2 and
a message naming the field.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from gigacluster.fabric.collectives import ALGORITHMS
from gigacluster.fabric.estimate import estimate_collective
from gigacluster.model import SpecError
from gigacluster.model.network_spec import DEFAULT_ROUTING, ROUTINGS

_UNITS = {
    "": 1, "b": 1,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
_BYTES_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str) -> float:
    """Parse ``1GiB``, ``512MiB``, ``64KiB`` (powers of 2), ``1GB`` (powers of 10) or a plain integer."""
    m = _BYTES_RE.match(str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise SpecError(
            "bytes", f"cannot read {text!r}; use a number with an optional unit: KiB, MiB, GiB, TiB, KB, MB, GB, TB"
        )
    value = float(m.group(1)) * _UNITS[unit]
    if value < 0:
        raise SpecError("bytes", f"must be >= 0, got {text!r}")
    return value


def algo_help() -> str:
    """``--algo`` help built from the algorithm registry: each name with the ops it runs."""
    seen: dict[int, list[str]] = {}
    for name, algo in ALGORITHMS.items():
        seen.setdefault(id(algo), []).append(name)
    parts = []
    for names in seen.values():
        algo = ALGORITHMS[names[0]]
        alias = f" (= {', '.join(names[1:])})" if len(names) > 1 else ""
        parts.append(f"{names[0]}{alias}: {', '.join(algo.ops)}")
    return ("force an algorithm (default: the fastest of those NCCL/RCCL/Neuron ship for the op, size and "
            "topology); "
            + "; ".join(parts) + ". one_shot, mesh_rings, and direct for reduce_scatter, all_gather and all_reduce, "
            "need all ranks in one full-mesh domain (MI300X-class); torus_rings the chips of exactly one 2D torus "
            "(Trainium); nvls one NVSwitch-3+ domain (H100 and later); "
            "rail_rings and hierarchical >= 2 domains holding equal shares; halving_doubling a power-of-two "
            "count. An algorithm that cannot run the request is refused with the ones that can")


def register(subparsers: Any) -> None:
    """Add the ``collective`` command under ``gigacluster estimate``."""
    p = subparsers.add_parser(
        "collective",
        help="time a collective (all_reduce, all_gather, ...) on an idle fabric",
        description="Time one collective over COUNT chips with the fabric model; algbw and busbw as nccl-tests.",
    )
    p.add_argument("--op", required=True,
                   help="all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, send_recv")
    p.add_argument("--bytes", required=True, dest="bytes_", help="message size: 1GiB, 256MiB, 1GB, 1048576")
    p.add_argument("--chip", required=True, help="chip type from the catalog, e.g. h100-sxm, trainium2")
    p.add_argument("--count", required=True, type=int, help="number of ranks (one per chip)")
    p.add_argument("--system", default=None, help="scale-up system (default: the chip's default system)")
    p.add_argument("--algo", default=None, help=algo_help())
    p.add_argument("--nic", default=None, help="NIC part (nic400, thor-ultra); default: the chip's own NIC rate")
    p.add_argument("--switch", default=None, help="fat-tree switch (tomahawk5, tomahawk6, tomahawk-ultra; default: "
                   "the smallest tree that holds the chips, as `up` sizes its own)")
    p.add_argument("--tiers", type=int, default=None, help="fat-tree tiers, 2 or 3 (default: 2, or 3 if needed)")
    p.add_argument("--oversubscription", type=float, default=1.0, help="leaf down:up port ratio (default 1)")
    p.add_argument("--routing", default=DEFAULT_ROUTING,
                   help=f"{', '.join(ROUTINGS)} (default {DEFAULT_ROUTING}, as clusters at scale run)")
    p.add_argument("--nics-per-node", type=int, default=0, dest="nics_per_node",
                   help="NICs per scale-up domain (default: one per chip)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the estimate; exit code 2 with the field's message on bad input."""
    try:
        size = parse_bytes(args.bytes_)
        kw: dict[str, Any] = {"nic": args.nic, "nics_per_node": args.nics_per_node,
                              "oversubscription": args.oversubscription, "routing": args.routing}
        if args.switch is not None or args.tiers is not None or args.nics_per_node:
            kw["switch"] = args.switch or "tomahawk5"
        try:
            est = estimate_collective(args.op, size, args.chip, args.count, system=args.system, algo=args.algo,
                                      tiers=args.tiers or (2 if "switch" in kw else None), **kw)
        except SpecError as exc:
            if args.tiers is None and exc.field == "tiers":
                est = estimate_collective(args.op, size, args.chip, args.count, system=args.system,
                                          algo=args.algo, tiers=3, **kw)
            else:
                raise
    except SpecError as exc:
        print(f"gigacluster estimate collective: error: {exc}", file=sys.stderr)
        return 2
    d = est.to_dict()
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        print(f"{d['op']} of {size:.6g} bytes over {d['ranks']} x {d['chip']} ({d['system']}), "
              f"algorithm {d['algorithm']}")
        print(f"  time   {d['time_s'] * 1e6:12.2f} us")
        print(f"  algbw  {d['algbw_GBps']:12.2f} GB/s")
        print(f"  busbw  {d['busbw_GBps']:12.2f} GB/s")
    return 0
