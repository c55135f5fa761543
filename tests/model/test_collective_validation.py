"""Collective bus bandwidth against published nccl-tests / rccl-tests results (docs/validation.md section 5).

Every row is one published figure, run through ``gigacluster estimate collective`` (the fabric's flow
model with the default ``library`` policy and adaptive routing). A row the model does not meet within
10% is kept as a strict xfail with its cause, so a change that fixes it shows up as an XPASS.
Nothing here is fitted per row: three constants are calibrated on one row each, the NVLS efficiency
(row ``h100-nvls-8``, catalog ``efficiency.comm.nvls.efficiency``), NVLS's per-chunk synchronisation (row
``h100-curve-nvls-512m``, catalog ``efficiency.comm.nvls.pipeline.slice_s``) and A100's per-step latency (row
``a100-2-32b``, catalog ``efficiency.comm.chips.a100-40gb.step_latency_s``); the others are predictions. The
per-call and per-step costs are otherwise NCCL's own tuning tables (catalog ``efficiency.comm.protocols``), NVLS's
chunks NCCL's own ladder (``efficiency.comm.nvls.pipeline``), and Blackwell's NVLS efficiency is the Hopper one
scaled by NCCL's own Blackwell / Hopper ratio (0.74 / 0.85, catalog ``efficiency.comm.nvls.chip_efficiency``), set
on no row. Families: ``single-node`` and ``multi-node`` (all-reduce, >= 128 MiB), ``curve`` (the size curve, 4 MiB
to 1 GiB), ``ops`` (other operations), ``small-mid`` (latency-bound rows).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import pytest

from gigacluster.fabric.estimate import estimate_collective

GiB = 2**30
MiB = 2**20


@dataclasses.dataclass(frozen=True)
class Row:
    """One published collective measurement."""

    id: str
    family: str  # single-node | multi-node | curve | ops | small-mid
    source: str  # where the figure is published
    op: str
    bytes_: float
    chip: str
    count: int
    published: float  # busbw GB/s, or microseconds when ``metric`` is time_us
    kw: dict[str, Any] = dataclasses.field(default_factory=dict)
    metric: str = "busbw"
    miss: str = ""  # why the model does not meet the row within 10% (empty: it does)
    pinned: float = 0.0  # a missed row's documented error (test_missed_row_stays_at_its_documented_error)


# nccl-tests issue 123 (https://github.com/NVIDIA/nccl-tests/issues/123): ring all-reduce time of 8-128 B on a
# DGX-A100, one channel, 2 to 8 GPUs (2 (n - 1) ring steps each). A least-squares line through the seven points:
# 5.6 us per call + 1.98 us per step (docs/validation.md section 5). They are predictions: A100's step latency
# (1.77 us) is set on the one 2-GPU time of NVIDIA/nccl issue 583 (row a100-2-32b), another source.
A100_RING_LATENCY_US = {2: 10.0, 3: 13.76, 4: 16.88, 5: 20.8, 6: 25.2, 7: 29.5, 8: 33.7}


ROWS = [
    Row("h100-ring-2", "single-node", "NVIDIA/nccl issue 1455: 8x H100 SXM, NCCL_ALGO=RING, 2-4 GiB: busbw "
        "365-370 GB/s from 2 to 8 GPUs", "all_reduce", 2 * GiB, "h100-sxm", 2, 367.5, {"algo": "ring"}),
    Row("h100-ring-4", "single-node", "NVIDIA/nccl issue 1455 (as above), 4 GPUs", "all_reduce", 2 * GiB,
        "h100-sxm", 4, 367.5, {"algo": "ring"}),
    Row("h100-ring-8", "single-node", "NVIDIA/nccl issue 1455 and nccl-tests issue 212 (NVIDIA: ~370 GB/s with "
        "NCCL_ALGO=RING on 8x H100)", "all_reduce", 2 * GiB, "h100-sxm", 8, 367.5, {"algo": "ring"}),
    Row("h100-nvls-5", "single-node", "NVIDIA/nccl issue 1455: NCCL_ALGO=NVLS on 5 H100: busbw 420 GB/s",
        "all_reduce", 2 * GiB, "h100-sxm", 5, 420.0),
    Row("h100-nvls-6", "single-node", "NVIDIA/nccl issue 1455: NVLS on 6 H100: 440 GB/s", "all_reduce", 2 * GiB,
        "h100-sxm", 6, 440.0),
    Row("h100-nvls-7", "single-node", "NVIDIA/nccl issue 1455: NVLS on 7 H100: 460 GB/s", "all_reduce", 2 * GiB,
        "h100-sxm", 7, 460.0),
    Row("h100-nvls-8", "single-node", "nccl-tests issue 212 (NVIDIA, S. Jeaugey): NVLS on 8x H100 peaks at ~480 "
        "GB/s busbw; the NVLS efficiency is calibrated on this row", "all_reduce", 4 * GiB, "h100-sxm", 8, 480.0),
    Row("h100-default-8", "single-node", "nccl-tests issue 290 (NVIDIA, D. Addison): 476 GB/s on one 8x H100 node "
        "'in the expected range'", "all_reduce", 8 * GiB, "h100-sxm", 8, 476.0),
    Row("h200-8", "single-node", "nccl-tests issue 272: 8x H200, one node, 475 GB/s", "all_reduce", 8 * GiB,
        "h200", 8, 475.0),
    Row("h800-8", "single-node", "NVIDIA/nccl issue 1374: 8x H800 NVLS all-reduce busbw 215 GB/s", "all_reduce",
        8 * GiB, "h800", 8, 215.0),
    Row("a100-8", "single-node", "NVIDIA/nccl issue 527: one p4dn.24xlarge (8x A100 NVSwitch), 1 GiB: 230.77 GB/s",
        "all_reduce", 1 * GiB, "a100-40gb", 8, 230.77),
    Row("a100-16-4nic", "multi-node", "nccl-tests issue 100: two HGX A100 with four 200 Gb/s ConnectX-6 each, "
        "1-8 GiB: 91 GB/s", "all_reduce", 1 * GiB, "a100-80gb", 16, 91.0, {"nics_per_node": 4}),
    Row("a100-24-4nic", "multi-node", "nccl-tests issue 119: three 8x A100 servers with four HDR 200 Gb/s NICs, "
        "up to 128 MB: peak ~96 GB/s (average 84.8)", "all_reduce", 128 * MiB, "a100-40gb", 24, 96.0,
        {"nics_per_node": 4}),
    Row("h100-16-ring", "multi-node", "nccl-tests issue 290 (NVIDIA): two 8x H100 nodes, NDR 400 Gb/s, "
        "NCCL_ALGO=RING: 46-48 GB/s per NIC, 8 NICs = 376 GB/s busbw at the midpoint", "all_reduce", 8 * GiB,
        "h100-sxm", 16, 376.0, {"algo": "rail_rings"}),
    # hisohara/ai-scripts, training/01_rccl-smoketest/README.md (rccl-tests on AMD Accelerator Cloud clusters;
    # https://github.com/hisohara/ai-scripts/blob/main/training/01_rccl-smoketest/README.md): out-of-place busbw.
    Row("mi300x-8-1g", "single-node", "hisohara/ai-scripts rccl-smoketest README, AAC8 (rccl-tests develop:a7809b3, "
        "8x AMD Instinct MI300X, one node): 1073741824 B all-reduce 5990.7 us, busbw 313.66 GB/s (8 GiB: 315.69)",
        "all_reduce", 1 * GiB, "mi300x", 8, 313.66),
    Row("mi325x-8-ring", "single-node", "hisohara/ai-scripts rccl-smoketest README, AAC11 MI325X, 1-node run with "
        "NCCL_ALGO=Ring: 8589934592 B all-reduce 47217 us, busbw 318.37 GB/s; RCCL's Ring lays its channels over "
        "every xGMI link (the model's mesh_rings)", "all_reduce", 8 * GiB, "mi325x", 8, 318.37,
        {"algo": "mesh_rings"}),
    Row("gb200-4-ring", "single-node", "Azure/AI-benchmarking-guide Azure_Results/ND_GB200_v6_results.md: NCCL "
        "2.25.1 AllReduce, Ring algorithm, in-place busbw on one ND GB200 v6 host (4 GB200, Azure/AI-benchmarking-"
        "guide issue 7: 'autodetect number of GPUs on current host (4 for GB200)'), 8G: 679.61 GB/s",
        "all_reduce", 8 * GiB, "gb200", 4, 679.61, {"algo": "ring"}),
    Row("gb200-72-nvls", "single-node", "coreweave/nccl-tests PR 43 (GB200 NVL72 Slurm example), one full NVL72 "
        "rack, 72 ranks: 8589934592 B all-reduce 20299 us, out-of-place busbw 834.57 GB/s (4 GiB: 839.16); NCCL's "
        "chunk ladder over 16 channels x 72 heads keeps NVLS on 64 KiB chunks at 8 GiB (catalog "
        "efficiency.comm.nvls.pipeline)", "all_reduce", 8 * GiB, "gb200", 72, 834.57),
    Row("mi300x-16-8nic", "multi-node", "hisohara/ai-scripts rccl-smoketest README, AAC10 (RCCL 2.22.3, "
        "rccl-tests develop:448c4c7): 2 x 8 MI300X, eight mlx5 RoCE NICs per node (NIC speed not stated; the "
        "catalog's 400 Gb/s per GPU): 8589934592 B 45224 us, busbw 356.14 GB/s (16 GiB: 357.46)",
        "all_reduce", 8 * GiB, "mi300x", 16, 356.14, {"nics_per_node": 8}),
    *[Row(f"mi325x-{8 * k}-ring", "multi-node", f"hisohara/ai-scripts rccl-smoketest README, AAC11: {k} x 8 "
          f"MI325X, eight Broadcom bnxt_re NICs per node (speed not stated; the catalog's 400 Gb/s), "
          f"NCCL_ALGO=Ring: 8589934592 B busbw {bw} GB/s", "all_reduce", 8 * GiB, "mi325x", 8 * k, bw,
          {"algo": "rail_rings", "nics_per_node": 8})
      for k, bw in ((2, 349.20), (4, 349.92), (8, 349.98))],
    Row("mi355x-16-pollara", "multi-node", "hisohara/ai-scripts rccl-smoketest README, AAC14 MI355X with Pollara 400 "
        "(RCCL 2.26.6 with AMD's ANP plugin, eight AINICs per node in NCCL_IB_HCA): 2 x 8 MI355X, 8589934592 B "
        "43643 us, busbw 369.04 GB/s", "all_reduce", 8 * GiB, "mi355x", 16, 369.04, {"nics_per_node": 8}),
    # NCCL's default here is NVLSTree (NVLS inside each node, a tree between the two; NVIDIA/nccl issue 1244: 16 H20
    # 'works well using NCCL_ALGO=NVLSTree'): each NIC carries S/8 each way, and NCCL's per-channel ceiling
    # (perChMaxNVLSTreeBws, 57.7 GB/s Hopper / 96 Blackwell on two nodes, catalog efficiency.comm.nvls_tree) holds
    # H100 below its NICs' rate. Predictions: no constant is set on these rows.
    *[Row(f"{chip.split('-')[0]}-16-default", "multi-node", f"coreweave/nccl-tests PR 92 test plan: {chip} 8-GPU x "
          f"2-node base MPIJob (no SHARP), '{bw} GB/s busbw @ 8G allreduce' (NICs not stated; the catalog's one "
          "400 Gb/s NIC per GPU)", "all_reduce", 8 * GiB, chip, 16, bw)
      for chip, bw in (("b200", 690.07), ("h100-sxm", 440.58))],
    Row("mi300x-8-8mib", "small-mid", "crickett-hpe/hpc-ai-envs PR 30 (rccl-tests develop 83d38d9): 8x MI300X, "
        "8 MiB all-reduce, busbw 161.14 GB/s (91.1 us); RCCL's rings over all seven links pay 14 steps",
        "all_reduce", 8 * MiB, "mi300x", 8, 161.14),
    Row("a100-2-32b", "small-mid", "NVIDIA/nccl issue 583: 2x A100-SXM4-40GB, 32-byte all-reduce 10.14 us; "
        "A100's per-step latency is calibrated on this row", "all_reduce", 32, "a100-40gb", 2, 10.14,
        metric="time_us"),
    *[Row(f"a100-ring-{n}-64b", "small-mid", f"nccl-tests issue 123: DGX-A100, NCCL_ALGO=Ring, "
          f"NCCL_MAX_NCHANNELS=1, 8-128 B all-reduce on {n} GPUs: {t} us", "all_reduce", 64, "a100-40gb", n, t,
          {"algo": "ring"}, metric="time_us")
      for n, t in A100_RING_LATENCY_US.items()],
]


# Azure/AI-benchmarking-guide (https://github.com/Azure/AI-benchmarking-guide), 'Azure Results/ND_H100_v5_results.md'
# (NCCL 2.18.5) and 'Azure_Results/ND_H200_v5_results.md' (NCCL 2.20.5): Benchmarks/NVIDIA/NCCLBandwidth.py runs
# `NCCL_ALGO=NVLS ./build/all_reduce_perf -b 8 -e 8G -f 2 -g 8 -n 40` on one 8-GPU VM and reports the in-place busbw.
# The 512 MiB H100 figure sets the NVLS chunk synchronisation (catalog efficiency.comm.nvls.pipeline.slice_s).
AZURE_NVLS = {
    "h100-sxm": ("ND H100 v5, NCCL 2.18.5",
                 {4: 128.73, 16: 234.45, 64: 361.78, 256: 423.38, 512: 438.46, 1024: 466.35}),
    "h200": ("ND H200 v5, NCCL 2.20.5", {4: 138.44, 16: 240.41, 64: 368.11, 256: 432.24, 1024: 467.58}),
}
# Azure/AI-benchmarking-guide Azure_Results/ND_GB200_v6_results.md (NCCL 2.25.1, NCCL_ALGO=Ring, 4 GB200 of one host,
# in-place busbw), with the cause the four mid-size rows miss.
RING_FILL_MISS = ("the ring's mid-size pipeline: the model prices a ring as steps x step cost + bytes / rate, so its "
                  "busbw is within 2% of its asymptote from 256 MiB; the measured curve still rises 15% from 256 MiB "
                  "to 8 GiB (593 -> 680 GB/s). NCCL's own pipeline model (src/tuning/pipeline_model/ring.cc) charges a "
                  "fill of 2(n-1) slices of up to NCCL's Simple chunk per channel; not modelled for rings yet")
GB200_RING = {16: (331.09, 0.23), 64: (550.73, 0.106), 256: (593.53, 0.181), 1024: (646.87, 0.126)}
# hisohara/ai-scripts training/01_rccl-smoketest/README.md: AAC8 (8x MI300X, rccl-tests develop:a7809b3), out-of-place.
AAC8_MI300X = {4: 138.60, 16: 195.85, 64: 271.51, 256: 304.96}
RAIL_FILL_MISS = ("mid-size rings across nodes: the model's rail rings reach 93-95% of their asymptote at 256 MiB, "
                  "the RCCL runs {pub} GB/s ({frac} of their own 8-16 GiB figure); the same unmodelled ring pipeline "
                  "fill as the GB200 rows, over RoCE with 40-220 us of small-message latency (the sweeps' 8-byte rows)")

MID_ROWS = [
    *[Row(f"{chip.split('-')[0]}-curve-nvls-{mb}m", "curve", f"Azure/AI-benchmarking-guide {setup}, NCCL_ALGO=NVLS, "
          f"8 GPUs, {mb} MiB in-place busbw {bw} GB/s" + (" (calibration row of the NVLS chunk synchronisation)"
                                                          if (chip, mb) == ("h100-sxm", 512) else ""),
          "all_reduce", mb * MiB, chip, 8, bw, {"algo": "nvls"})
      for chip, (setup, curve) in AZURE_NVLS.items() for mb, bw in curve.items()],
    *[Row(f"gb200-ring-4-{mb}m", "curve", f"Azure/AI-benchmarking-guide ND_GB200_v6_results.md: NCCL 2.25.1, Ring, "
          f"4 GB200 of one host, {mb} MiB in-place busbw {bw} GB/s", "all_reduce", mb * MiB, "gb200", 4, bw,
          {"algo": "ring"}, miss=RING_FILL_MISS, pinned=pin)
      for mb, (bw, pin) in GB200_RING.items()],
    *[Row(f"mi300x-8-{mb}m", "curve", f"hisohara/ai-scripts rccl-smoketest README, AAC8 (8x MI300X, rccl-tests "
          f"develop:a7809b3): {mb * MiB} B all-reduce, out-of-place busbw {bw} GB/s", "all_reduce", mb * MiB,
          "mi300x", 8, bw) for mb, bw in AAC8_MI300X.items()],
    Row("mi355x-16-1g", "curve", "hisohara/ai-scripts rccl-smoketest README, AAC14: 2 x 8 MI355X, Pollara 400 (RCCL "
        "2.26.6, ANP), 1073741824 B in 5525.0 us, busbw 364.39 GB/s", "all_reduce", 1 * GiB, "mi355x", 16, 364.39,
        {"nics_per_node": 8}),
    Row("mi355x-16-256m", "curve", "hisohara/ai-scripts rccl-smoketest README, AAC14: 2 x 8 MI355X, 268435456 B in "
        "1652.0 us, busbw 304.67 GB/s", "all_reduce", 256 * MiB, "mi355x", 16, 304.67, {"nics_per_node": 8},
        miss=RAIL_FILL_MISS.format(pub=304.67, frac="83%"), pinned=0.118),
    Row("mi355x-16-64m", "curve", "hisohara/ai-scripts rccl-smoketest README, AAC14: 2 x 8 MI355X, 67108864 B in "
        "614.3 us, busbw 204.84 GB/s", "all_reduce", 64 * MiB, "mi355x", 16, 204.84, {"nics_per_node": 8},
        miss=RAIL_FILL_MISS.format(pub=204.84, frac="56%"), pinned=0.358),
    Row("mi300x-16-1g", "curve", "hisohara/ai-scripts rccl-smoketest README, AAC10: 2 x 8 MI300X, eight mlx5 RoCE "
        "NICs per node (RCCL 2.22.3): 1073741824 B in 5908.3 us, busbw 340.75 GB/s", "all_reduce", 1 * GiB, "mi300x",
        16, 340.75, {"nics_per_node": 8}),
    Row("mi300x-16-256m", "curve", "hisohara/ai-scripts rccl-smoketest README, AAC10: 2 x 8 MI300X, 268435456 B in "
        "1713.4 us, busbw 293.75 GB/s", "all_reduce", 256 * MiB, "mi300x", 16, 293.75, {"nics_per_node": 8},
        miss=RAIL_FILL_MISS.format(pub=293.75, frac="82%"), pinned=0.159),
    # NVIDIA/nccl-tests issue 309 (https://github.com/NVIDIA/nccl-tests/issues/309): H100 80GB HBM3 HGX VMs, eight
    # mlx5 NICs per node (speed not stated; the catalog's 400 Gb/s), default algorithms, all_reduce_perf -b 8 -e 16g:
    # 'each single node with 8 pairs still get 480 GB/s', '2 nodes with 16 pairs can still get 470 GB/s', '4 nodes on
    # 32 GPU-NIC pairs ... max busbw can get 365.84 GB/s' (the maximum of the sweep: taken at its 16 GiB end).
    Row("h100-16-default-309", "multi-node", "nccl-tests issue 309: 2 x 8 H100 (HGX VMs, 8 NICs), default, max busbw "
        "470 GB/s", "all_reduce", 16 * GiB, "h100-sxm", 16, 470.0),
    Row("h100-32-default", "multi-node", "nccl-tests issue 309: 4 x 8 H100 (HGX VMs, 8 NICs), default, max busbw "
        "365.84 GB/s (NVLSTree's 45.5 GB/s per head on more than two nodes: the rail rings win)", "all_reduce",
        16 * GiB, "h100-sxm", 32, 365.84),
    # Other operations. nccl-tests issue 326 (https://github.com/NVIDIA/nccl-tests/issues/326): all_gather_perf -b 128M
    # -e 16384M -g 8 on 8 H100 saturates at ~360 GB/s busbw; NVIDIA's S. Jeaugey: '360 GB/s is exactly what we'd expect
    # on H100'. nccl-tests issue 212 (S. Jeaugey): the 370 GB/s effective NVLink bandwidth 'you can observe as "BusBw"
    # when running non-allreduce operations'.
    Row("h100-ag-8", "ops", "nccl-tests issue 326: all_gather_perf on 8 H100, busbw ~360 GB/s at 16 GiB (NVIDIA: "
        "'exactly what we'd expect')", "all_gather", 16 * GiB, "h100-sxm", 8, 360.0),
    Row("h100-rs-8", "ops", "nccl-tests issue 212 (NVIDIA): 370 GB/s busbw on 8 H100 for non-allreduce operations "
        "(reduce-scatter, large message)", "reduce_scatter", 8 * GiB, "h100-sxm", 8, 370.0),
    # NVIDIA/nccl issue 2169 (https://github.com/NVIDIA/nccl/issues/2169), its second run: nccl-tests 2.17.8 on NCCL
    # 2.30.4, `alltoall_perf -b 500M` on 4 H100 80GB HBM3 of one node (NCCL_PROTO=Simple), 524,288,000 B out of place
    # in 1,174.14 us, algbw 446.53, busbw 334.90 GB/s. Below the 512 MiB step the issue reports (12-15% lower above
    # it), which is the question, not the model's.
    Row("h100-a2a-4", "ops", "NVIDIA/nccl issue 2169: alltoall_perf on 4 H100 of one node, 500 MiB, busbw 334.90 GB/s "
        "(NCCL 2.30.4)", "all_to_all", 524288000, "h100-sxm", 4, 334.90),
]
ROWS += MID_ROWS


def predict(row: Row) -> float:
    """The model's figure for ``row`` (busbw GB/s or time in us)."""
    kw = dict(row.kw)
    algo = kw.pop("algo", None)
    est = estimate_collective(row.op, row.bytes_, row.chip, row.count, algo=algo, **kw)
    return est.time_s * 1e6 if row.metric == "time_us" else est.busbw_GBps


def error(row: Row) -> float:
    """Signed relative error of the model on ``row``."""
    return predict(row) / row.published - 1.0


def _param(row: Row) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=row.miss)] if row.miss else []
    return pytest.param(row, id=row.id, marks=marks)


@pytest.mark.parametrize("row", [_param(r) for r in ROWS])
def test_collective_row_within_10_percent(row: Row) -> None:
    """Each published nccl-tests / rccl-tests row (source in ROWS) comes out within 10% of its figure."""
    assert abs(error(row)) <= 0.10, f"{row.id}: predicted {predict(row):.1f}, published {row.published}"


def test_families_within_target() -> None:
    """Per family, over the rows the model meets: max |error| <= 10% (the issue's collective target), and
    median <= 5% for the families of large messages (docs/validation.md section 5)."""
    for family in sorted({r.family for r in ROWS}):
        errs = [abs(error(r)) for r in ROWS if r.family == family and not r.miss]
        if not errs:
            continue
        assert max(errs) <= 0.10, family
        if family != "small-mid":
            assert statistics.median(errs) <= 0.05, family


def test_nvls_scales_with_gpus_as_published() -> None:
    """NVLS busbw rises from 5 to 8 GPUs (nccl issue 1455: 420, 440, 460, 480) while the ring stays flat."""
    nvls = [predict(r) for r in ROWS if r.id.startswith("h100-nvls-")]
    ring = [predict(r) for r in ROWS if r.id.startswith("h100-ring-")]
    assert nvls == sorted(nvls) and nvls[-1] - nvls[0] > 50
    assert max(ring) - min(ring) < 5


def _line(steps: list[int], times: list[float]) -> tuple[float, float]:
    """(per-step slope, intercept) of the least-squares line of ``times`` over ``steps``."""
    mx, my = statistics.fmean(steps), statistics.fmean(times)
    slope = sum((x - mx) * (y - my) for x, y in zip(steps, times, strict=True)) / sum((x - mx) ** 2 for x in steps)
    return slope, my - slope * mx


def test_small_message_cost_is_per_step_as_published() -> None:
    """nccl-tests issue 123 (2-8 A100, ring): the model's per-step cost (A100's step latency, 1.77 us, set on
    another source's 2-GPU time) is within 15% of the published line's 1.98 us, over twice NCCL's LL hwLat
    (0.6 us), and the per-call intercepts agree (NCCL's baseLat 6.6 us against 5.6 us published)."""
    rows = [r for r in ROWS if r.id.startswith("a100-ring-")]
    steps = [2 * (r.count - 1) for r in rows]
    pub_slope, pub_icpt = _line(steps, [r.published for r in rows])
    mod_slope, mod_icpt = _line(steps, [predict(r) for r in rows])
    assert pub_slope == pytest.approx(1.98, abs=0.01)
    assert mod_slope == pytest.approx(pub_slope, rel=0.15) and mod_slope > 2 * 0.6
    assert abs(pub_icpt - mod_icpt) < 1.5


def test_missed_row_stays_at_its_documented_error() -> None:
    """Each strict-xfail row's error stays within 3 points of the figure documented beside its cause (docs/validation.md
    section 5), so a change that moves a miss shows even when it does not fix it."""
    for row in ROWS:
        if row.miss and row.pinned:
            assert error(row) == pytest.approx(row.pinned, abs=0.03), row.id


def test_an_estimate_sizes_its_tree_as_up_does() -> None:
    """Without tiers or a switch, a collective estimate builds the smallest tree that holds its chips
    (fabric.sizing.choose_scaleout, the sizing `up` uses): 8,320 H100 need three tiers of Tomahawk 5, where
    the estimate used to refuse them with "use tiers=3"; 800 Gb/s GB300 past three Tomahawk 5 tiers get
    Tomahawk 6 the same way. A tree given explicitly is kept."""
    from gigacluster.fabric.estimate import _topology_for
    from gigacluster.fabric.sizing import choose_scaleout
    from gigacluster.model import SpecError

    topo, _ = _topology_for("h100-sxm", 8320, None)
    assert (topo.config.tiers, topo.config.switch) == (3, "tomahawk5")
    assert choose_scaleout("gb300", 74808) == choose_scaleout("gb300", 74808, tiers=3, switch="tomahawk6")
    with pytest.raises(SpecError) as err:
        _topology_for("h100-sxm", 8320, None, tiers=2)
    assert err.value.field == "tiers"
