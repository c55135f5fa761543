"""MLPerf Training closed-division LLM pre-training: measured step times, 8 to 11,616 GPUs, H100 / B200 / GB200 /
MI350X / MI355X / MI325X / GB300, 2023-2026 software, 61 rows (never used to set a constant).

Each row is one system's measured seconds per optimizer step, read from the MLLOG result files and the configs of
the submission (docs/validation.md section 1c gives every source line):

* mlcommons/training_results_v3.0, v3.1, v4.0 (and the v4.1 submission as forked in swsok/training_results_v4.1),
  ``NVIDIA/results/<system>/gpt3/result_N.txt``: GPT-3 175B (96 layers, hidden 12,288, 96 heads, GELU MLP of 4h,
  sequence 2,048; ``conf/megatron_gpt_config.yaml`` / ``conf/custom.yaml``). v3.x and v4.1 logs print
  ``train_step_timing`` for every step; v4.0 logs only blocks, so its rows are block time / steps per block
  (eval runs outside the blocks).
* prishajain1/training_results_v5.0 (a fork of mlcommons/training_results_v5.0), ``llama31_405b``: Llama 3.1 405B,
  sequence 8,192; per-step ``train_step_time`` (the median of a run's steps where a few outliers of about twice the
  step sit in it) and the block summaries' mean.
* mlcommons/training_results_v5.1 (Nov 2025), ``llama31_8b``: Llama 3.1 8B, sequence 8,192, TP 1 / PP 1 everywhere.
  AMD's MI355X and MI350X submissions and their partners' (Dell, Supermicro; Cisco) log ``tracked_stats``
  throughput in samples/s per 12,288-sample block (``config_MI355X_1x8x1_8b.sh``: global batch 32, micro-batch 2,
  ``FP8_PARAMS=1``, no recompute set); a row is global batch / the median throughput of the blocks after the first
  (warm-up). NVIDIA's
  NeMo implementation as run on B200 by the University of Florida (FP8: no FP4 config is sourced) and by Nebius and
  Oracle (NVFP4: the logs print the resolved config, ``fp4_recipe='nvfp4'`` with every layer in it
  (``first_last_layers_bf16: false``), FP8 attention, no recompute), Dell,
  Supermicro and NVIDIA's own GB200 NVL72 (``tyche_ngpu8`` in NVFP4, ``tyche_ngpu72`` in FP8, by their configs'
  names) and GB300 NVL72 (``theia_ngpu72``, ``config_GB300_18x4x1xtp1pp1cp2_8b.sh``: CP 2, FP8) logs a block-mean
  ``train_step_time``.
* Richardyu114/training_results_v6.0 (a fork of mlcommons/training_results_v6.0, June 2026), ``llama31_8b``, ten
  rows: Cisco's 2 x 8 H200 SXM (``Cisco/results/2xC885A_M8-8xH200-SXM-141GB``: FP8, batch 32 x 1, the block means
  1.18104-1.18235 s), Dell's and HPE's one-node B200 in NVFP4 (``Dell/results/1xXE9780x8B200-SXM-180GB``, printed
  config: fp4 e2m1, recipe nvfp4, no BF16 layers, BF16 parameter gather; HPE's ``XD685-B200..._n1_25.09``, config
  tag ``B200_1node_fp4_Nebius``), NVIDIA's GB300 ``theia_ngpu8`` and ``theia_ngpu72`` (NVFP4 by their configs'
  names ``config_GB300_2x4x2xtp1pp1cp1_8b_fp4.sh`` and ``..._18x4x1xtp1pp1cp1_8b_fp4.sh``; the logs print no
  config), AMD's one-node MI355X and MI350X (``AMD/results/MI*_EPYC_9575F_primus``: ``lowest_numerical_precision_
  linear: mxfp4``, the config's ``FP4_RECIPE=mxfp4`` with ``NVTE_MXFP4_USE_HADAMARD=1``, batch 32 x 2, gradients
  reduced in bf16 by the recipe's yaml), Cisco's 2 x 8 MI350X and MiTAC's MI350X (MXFP4, the same recipe) and
  MiTAC's MI325X (FP8, ``FP4=false``); a second pass, nine more: Cisco's 8 x 8 H100 (``Zeus_8xH100_SXM_80GB``,
  batch 32 x 1; the log prints no config, and the one 8-node config stored, ``config_DGXH100_8x8x36xtp8pp8cp2.sh``,
  sets TP 2 with FP8 and ``BUCKET_CAP_MB=125``, consistent with the log's batch), SCITIX's 8 x 8 B200
  (``scitix.b200x8.n8``, printed config: FP8 tensorwise, CP 2, batch 32 x 1, no recompute), CoreWeave's 8 x 8 B200
  (``CoreWeave_B200_8x8``, NVFP4 by its config's name ``config_DGXB200_8x8x1xtp1pp1cp1_8b_fp4.sh``, batch 64 x 1),
  Supermicro's one-node B200 (``AS-4126GS-NBR-LCC``) and HPE's GB200 tray pair (``HPE-GB200-ngpu8_ngc25.09``), both
  NVFP4 by their printed configs, and HPE's GB300 on 8, 16, 32 and 72 GPUs (``HPE-GB300-ngpu{8,16,32,72}_ngc26.04``,
  printed config: NVFP4 linear layers, FP8 attention, no recompute, no BF16 layers, batch 2 a GPU, 1 on 72). Where a
  log's block stamps run ahead of the GPU (Megatron-Bridge's ``callback_logging.py``: the CoreWeave, Supermicro and
  HPE GB300 logs, and NVIDIA's own 72-GPU GB300 one) the row takes the rate between the block's per-interval lines
  (1-6% above the block mean). Not used: NVIDIA's GB200 1,024 and GB300 512 (no precision in the index), the H200 NVL
  systems (not in the catalog), the rows whose precision or batch was not read, and v6.0's Llama 3.1 405B runs
  (below).

Layouts are the configs' (``config_<system>_<nodes>x<gpus>x<minibs>x<tp>x<pp>...sh``): TP, PP, the interleaved
stages (``INTERLEAVED_PIPELINE``; ``custom.yaml`` defaults it to 12 where a config sets none, as the v3.1 ones do:
without interleaving their 10,752-GPU step would need a bubble of 7/8 that the measured 0.93 s has no room for),
micro-batch, and the global batch the log prints. Recompute: the v3.0 yaml's ``selective``; v3.1 and later set
none (``ACT_CKPT_GRANULARITY`` null) and the row runs ``none`` where our memory model holds it, else ``selective``.
Gradients are reduced in bf16 (``distributed_fused_adam.yaml``: ``grad_sync_dtype: bf16``) for GPT-3; the Llama
rows keep the model's default as the NeMo family does (their common config is not in the index). FP8 with
Transformer Engine, sequence parallelism, and the same TP / PP overlap as the NeMo rows (``TP_COMM_OVERLAP=True``;
``overlap_p2p_comm`` with interleaving).
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from gigacluster.model import DoesNotFitError
from gigacluster.model.training import TrainSpec
from gigacluster.planning import estimate_train

GPT3 = {"preset": "gpt3-175b", "vocab": 51200}
L405 = {"preset": "llama3-405b", "seq_len": 8192}
L8 = {"preset": "llama3-8b", "seq_len": 8192}
TP_OVERLAP = 1.0 - 2 * (1 / 4) / 10  # as tests/model/test_validation_nemo.py: userbuffers hide 0.95

# (id, model, chip, GPUs, global batch, micro-batch, layout, recompute, grad dtype, published s/step)
ROWS: list[tuple[str, dict[str, Any], str, int, int, int, dict[str, int], str, str, float]] = [
    ("v3.0-gpt3-h100-512", GPT3, "h100-sxm", 512, 2048, 1, {"tp": 4, "pp": 8}, "selective", "bf16", 12.08),
    ("v3.0-gpt3-h100-768", GPT3, "h100-sxm", 768, 3072, 1, {"tp": 4, "pp": 8}, "selective", "bf16", 12.13),
    ("v3.1-gpt3-h100-512", GPT3, "h100-sxm", 512, 2048, 1, {"tp": 4, "pp": 8, "virtual_stages": 12}, "none", "bf16",
     11.045),
    ("v3.1-gpt3-h100-4096", GPT3, "h100-sxm", 4096, 2048, 1, {"tp": 4, "pp": 8, "virtual_stages": 12}, "none",
     "bf16", 1.609),
    ("v3.1-gpt3-h100-6144", GPT3, "h100-sxm", 6144, 3072, 1, {"tp": 4, "pp": 8, "virtual_stages": 12}, "none",
     "bf16", 1.6168),
    ("v3.1-gpt3-h100-8192", GPT3, "h100-sxm", 8192, 4096, 1, {"tp": 4, "pp": 8, "virtual_stages": 12}, "none",
     "bf16", 1.6204),
    ("v3.1-gpt3-h100-10240", GPT3, "h100-sxm", 10240, 2560, 1, {"tp": 4, "pp": 8, "virtual_stages": 12}, "none",
     "bf16", 0.92585),
    ("v3.1-gpt3-h100-10752", GPT3, "h100-sxm", 10752, 2688, 1, {"tp": 4, "pp": 8, "virtual_stages": 12}, "none",
     "bf16", 0.930),
    ("v4.0-gpt3-h100-512", GPT3, "h100-sxm", 512, 2304, 2, {"tp": 4, "pp": 8, "virtual_stages": 4}, "none", "bf16",
     10.90),
    ("v4.0-gpt3-h100-10752", GPT3, "h100-sxm", 10752, 2688, 1, {"tp": 4, "pp": 6, "virtual_stages": 8}, "none",
     "bf16", 0.9207),
    ("v4.0-gpt3-h100-11616", GPT3, "h100-sxm", 11616, 2904, 1, {"tp": 4, "pp": 6, "virtual_stages": 8}, "none",
     "bf16", 0.9224),
    ("v4.1-gpt3-b200-64", GPT3, "b200", 64, 2048, 2, {"tp": 4, "pp": 8, "virtual_stages": 6}, "none", "bf16", 36.04),
    ("v4.1-gpt3-h100-256", GPT3, "h100-sxm", 256, 2048, 2, {"tp": 4, "pp": 8, "virtual_stages": 6}, "none", "bf16",
     18.37),
    ("v4.1-gpt3-h100-512", GPT3, "h100-sxm", 512, 2048, 2, {"tp": 4, "pp": 8, "virtual_stages": 6}, "none", "bf16",
     9.4957),
    ("v5.0-llama31-405b-gb200-256", L405, "gb200", 256, 448, 1, {"tp": 4, "pp": 8, "cp": 2, "virtual_stages": 8},
     "selective", "fp32", 19.17),
    ("v5.0-llama31-405b-gb200-512", L405, "gb200", 512, 896, 1, {"tp": 4, "pp": 8, "cp": 2, "virtual_stages": 8},
     "selective", "fp32", 19.22),
    ("v5.0-llama31-405b-h100-512", L405, "h100-sxm", 512, 1152, 1, {"tp": 8, "pp": 8, "cp": 2, "virtual_stages": 8},
     "selective", "fp32", 55.18),
    ("v5.0-llama31-405b-h100-2048", L405, "h100-sxm", 2048, 1152, 1, {"tp": 8, "pp": 8, "cp": 2, "virtual_stages": 8},
     "selective", "fp32", 14.24),
    ("v5.0-llama31-405b-h100-2432", L405, "h100-sxm", 2432, 1216, 1, {"tp": 8, "pp": 8, "cp": 2, "virtual_stages": 8},
     "selective", "fp32", 12.74),
    ("v5.0-llama31-405b-h100-2560", L405, "h100-sxm", 2560, 1120, 1, {"tp": 8, "pp": 8, "cp": 2, "virtual_stages": 8},
     "selective", "fp32", 11.20),
    ("v5.0-llama31-405b-h100-8192", L405, "h100-sxm", 8192, 1536, 1, {"tp": 8, "pp": 8, "cp": 2, "virtual_stages": 8},
     "selective", "fp32", 5.273),
    # v5.1 Llama 3.1 8B: s/step = global batch / samples a second (AMD-style logs) or the logged block mean (NeMo)
    ("v5.1-llama31-8b-mi355x-8-amd", L8, "mi355x", 8, 32, 2, {}, "none", "fp32", 32 / 30.70),
    ("v5.1-llama31-8b-mi355x-8-dell", L8, "mi355x", 8, 32, 2, {}, "none", "fp32", 32 / 29.30),
    ("v5.1-llama31-8b-mi355x-8-supermicro", L8, "mi355x", 8, 32, 2, {}, "none", "fp32", 32 / 29.70),
    ("v5.1-llama31-8b-mi350x-8-amd", L8, "mi350x", 8, 32, 2, {}, "none", "fp32", 32 / 24.96),
    ("v5.1-llama31-8b-mi350x-8-cisco", L8, "mi350x", 8, 32, 2, {}, "none", "fp32", 32 / 24.14),
    ("v5.1-llama31-8b-b200-8-uf", L8, "b200", 8, 16, 2, {}, "none", "fp32", 0.5389),
    ("v5.1-llama31-8b-b200-64-uf", L8, "b200", 64, 32, 1, {"cp": 2}, "none", "fp32", 0.18710),
    ("v5.1-llama31-8b-b200-256-uf", L8, "b200", 256, 128, 1, {"cp": 2}, "none", "fp32", 0.22002),
    ("v5.1-llama31-8b-b200-8-nebius-nvfp4", L8, "b200", 8, 16, 2, {}, "none", "fp32", 0.45271),
    ("v5.1-llama31-8b-b200-16-nebius-nvfp4", L8, "b200", 16, 32, 2, {}, "none", "fp32", 0.49299),
    ("v5.1-llama31-8b-b200-8-oracle-nvfp4", L8, "b200", 8, 16, 2, {}, "none", "fp32", 0.45163),
    ("v5.1-llama31-8b-b200-8-supermicro-nvfp4", L8, "b200", 8, 16, 2, {}, "none", "fp32", 0.44877),
    ("v5.1-llama31-8b-b200-16-uf", L8, "b200", 16, 32, 2, {}, "none", "fp32", 0.56576),
    ("v5.1-llama31-8b-b200-16-dell", L8, "b200", 16, 32, 2, {}, "none", "fp32", 0.58812),
    ("v5.1-llama31-8b-b200-32-uf", L8, "b200", 32, 16, 1, {"cp": 2}, "none", "fp32", 0.18777),
    ("v5.1-llama31-8b-b200-32-nebius-nvfp4", L8, "b200", 32, 32, 1, {}, "none", "fp32", 0.26698),
    ("v5.1-llama31-8b-b200-64-oracle", L8, "b200", 64, 32, 1, {"cp": 2}, "none", "fp32", 0.18794),
    ("v5.1-llama31-8b-b200-128-uf", L8, "b200", 128, 64, 1, {"cp": 2}, "none", "fp32", 0.19073),
    ("v5.1-llama31-8b-gb200-8-nvidia-nvfp4", L8, "gb200", 8, 16, 2, {}, "none", "fp32", 0.40506),
    ("v5.1-llama31-8b-gb200-72-nvidia", L8, "gb200", 72, 36, 1, {"cp": 2}, "none", "fp32", 0.16769),
    ("v5.1-llama31-8b-gb300-72-nvidia", L8, "gb300", 72, 36, 1, {"cp": 2}, "none", "fp32", 0.14616),
    # v6.0 Llama 3.1 8B (June 2026; module docstring): NeMo block means (NVIDIA and partners), AMD Primus block
    # wall-clock / 384 steps; precision as each log's printed config or its config's name states it
    ("v6.0-llama31-8b-h200-16-cisco", L8, "h200", 16, 32, 1, {}, "none", "fp32", 1.1817),
    ("v6.0-llama31-8b-b200-8-dell-nvfp4", L8, "b200", 8, 16, 2, {}, "none", "fp32", 0.43810),
    ("v6.0-llama31-8b-b200-8-hpe-nvfp4", L8, "b200", 8, 16, 2, {}, "none", "fp32", 0.43656),
    ("v6.0-llama31-8b-gb300-8-nvidia-nvfp4", L8, "gb300", 8, 16, 2, {}, "none", "fp32", 0.34261),
    ("v6.0-llama31-8b-gb300-72-nvidia-nvfp4", L8, "gb300", 72, 72, 1, {}, "none", "fp32", 0.199),
    ("v6.0-llama31-8b-mi355x-8-amd-mxfp4", L8, "mi355x", 8, 32, 2, {}, "none", "bf16", 0.8725),
    ("v6.0-llama31-8b-mi350x-8-amd-mxfp4", L8, "mi350x", 8, 32, 2, {}, "none", "bf16", 1.0872),
    ("v6.0-llama31-8b-mi350x-16-cisco-mxfp4", L8, "mi350x", 16, 32, 2, {}, "none", "bf16", 0.5916),
    ("v6.0-llama31-8b-mi350x-8-mitac-mxfp4", L8, "mi350x", 8, 32, 2, {}, "none", "bf16", 1.0907),
    ("v6.0-llama31-8b-mi325x-8-mitac", L8, "mi325x", 8, 32, 2, {}, "none", "bf16", 2.512),
    ("v6.0-llama31-8b-h100-64-cisco", L8, "h100-sxm", 64, 32, 1, {"tp": 2}, "none", "fp32", 0.3497),
    ("v6.0-llama31-8b-b200-64-scitix", L8, "b200", 64, 32, 1, {"cp": 2}, "none", "fp32", 0.1927),
    ("v6.0-llama31-8b-b200-64-coreweave-nvfp4", L8, "b200", 64, 64, 1, {}, "none", "fp32", 0.258),
    ("v6.0-llama31-8b-b200-8-supermicro-nvfp4", L8, "b200", 8, 16, 2, {}, "none", "fp32", 0.4324),
    ("v6.0-llama31-8b-gb200-8-hpe-nvfp4", L8, "gb200", 8, 16, 2, {}, "none", "fp32", 0.4088),
    ("v6.0-llama31-8b-gb300-8-hpe-nvfp4", L8, "gb300", 8, 16, 2, {}, "none", "fp32", 0.3427),
    ("v6.0-llama31-8b-gb300-16-hpe-nvfp4", L8, "gb300", 16, 32, 2, {}, "none", "fp32", 0.3364),
    ("v6.0-llama31-8b-gb300-32-hpe-nvfp4", L8, "gb300", 32, 64, 2, {}, "none", "fp32", 0.3360),
    ("v6.0-llama31-8b-gb300-72-hpe-nvfp4", L8, "gb300", 72, 72, 1, {}, "none", "fp32", 0.1988),
]
# Rows not in FP8 (the NVFP4 runs' resolved config: linear layers in NVFP4, attention in FP8; AMD's v6.0 recipe:
# linear layers in MXFP4 with a Hadamard transform, `lowest_numerical_precision_linear: mxfp4`)
PRECISION = {r[0]: r[0].rsplit("-", 1)[1] for r in ROWS if r[0].endswith(("-nvfp4", "-mxfp4"))}
# The DP reduction's bucket where a run states it: v5.1's NeMo Llama 3.1 8B (``BUCKET_SIZE=768000000`` in its
# ``config_common_8b.sh``; the Nebius and Oracle logs print ``ddp_bucket_size`` 768000000 in the resolved config);
# elsewhere Megatron core's default
BUCKET = {r[0]: 768_000_000 for r in ROWS
          if r[0].startswith(("v5.1-llama31-8b-b200", "v5.1-llama31-8b-gb200", "v5.1-llama31-8b-gb300",
                              "v6.0-llama31-8b-h200", "v6.0-llama31-8b-b200", "v6.0-llama31-8b-gb200",
                              "v6.0-llama31-8b-gb300"))}
# (AMD's MI355X and MI350X implementation states no bucket: Megatron core's default.)
# docs/validation.md 1c, the "error" column
DOCUMENTED = {
    "v3.0-gpt3-h100-512": 0.107, "v3.0-gpt3-h100-768": 0.112, "v3.1-gpt3-h100-512": 0.071,
    "v3.1-gpt3-h100-4096": 0.12, "v3.1-gpt3-h100-6144": 0.123, "v3.1-gpt3-h100-8192": 0.124,
    "v3.1-gpt3-h100-10240": 0.145, "v3.1-gpt3-h100-10752": 0.149, "v4.0-gpt3-h100-512": -0.064,
    "v4.0-gpt3-h100-10752": 0.068, "v4.0-gpt3-h100-11616": 0.069, "v4.1-gpt3-b200-64": -0.063,
    "v4.1-gpt3-h100-256": -0.098, "v4.1-gpt3-h100-512": -0.077, "v5.0-llama31-405b-gb200-256": 0.059,
    "v5.0-llama31-405b-gb200-512": 0.062, "v5.0-llama31-405b-h100-512": -0.026, "v5.0-llama31-405b-h100-2048": -0.028,
    "v5.0-llama31-405b-h100-2432": -0.027, "v5.0-llama31-405b-h100-2560": -0.029,
    "v5.0-llama31-405b-h100-8192": -0.009, "v5.1-llama31-8b-mi355x-8-amd": -0.092,
    "v5.1-llama31-8b-mi355x-8-dell": -0.048, "v5.1-llama31-8b-mi355x-8-supermicro": -0.061,
    "v5.1-llama31-8b-mi350x-8-amd": 0.042, "v5.1-llama31-8b-mi350x-8-cisco": 0.077,
    "v5.1-llama31-8b-b200-8-uf": -0.04, "v5.1-llama31-8b-b200-64-uf": 0.086, "v5.1-llama31-8b-b200-256-uf": 0.276,
    "v5.1-llama31-8b-b200-8-nebius-nvfp4": 0.082, "v5.1-llama31-8b-b200-16-nebius-nvfp4": 0.142,
    "v5.1-llama31-8b-b200-8-oracle-nvfp4": 0.079, "v5.1-llama31-8b-b200-8-supermicro-nvfp4": 0.072,
    "v5.1-llama31-8b-b200-16-uf": -0.015, "v5.1-llama31-8b-b200-16-dell": 0.024, "v5.1-llama31-8b-b200-32-uf": 0.09,
    "v5.1-llama31-8b-b200-32-nebius-nvfp4": 0.149, "v5.1-llama31-8b-b200-64-oracle": 0.091,
    "v5.1-llama31-8b-b200-128-uf": 0.107, "v5.1-llama31-8b-gb200-8-nvidia-nvfp4": 0.046,
    "v5.1-llama31-8b-gb200-72-nvidia": 0.151, "v5.1-llama31-8b-gb300-72-nvidia": 0.031,
    "v6.0-llama31-8b-h200-16-cisco": 0.042, "v6.0-llama31-8b-b200-8-dell-nvfp4": 0.047,
    "v6.0-llama31-8b-b200-8-hpe-nvfp4": 0.043, "v6.0-llama31-8b-gb300-8-nvidia-nvfp4": 0.115,
    "v6.0-llama31-8b-gb300-72-nvidia-nvfp4": 0.231, "v6.0-llama31-8b-mi355x-8-amd-mxfp4": 0.083,
    "v6.0-llama31-8b-mi350x-8-amd-mxfp4": 0.265, "v6.0-llama31-8b-mi350x-16-cisco-mxfp4": 0.354,
    "v6.0-llama31-8b-mi350x-8-mitac-mxfp4": 0.269, "v6.0-llama31-8b-mi325x-8-mitac": 0.089,
    "v6.0-llama31-8b-h100-64-cisco": 0.091, "v6.0-llama31-8b-b200-64-scitix": 0.118,
    "v6.0-llama31-8b-b200-64-coreweave-nvfp4": 0.110, "v6.0-llama31-8b-b200-8-supermicro-nvfp4": 0.033,
    "v6.0-llama31-8b-gb200-8-hpe-nvfp4": 0.056, "v6.0-llama31-8b-gb300-8-hpe-nvfp4": 0.115,
    "v6.0-llama31-8b-gb300-16-hpe-nvfp4": 0.099, "v6.0-llama31-8b-gb300-32-hpe-nvfp4": 0.1001,
    "v6.0-llama31-8b-gb300-72-hpe-nvfp4": 0.230,
}
MISSED = ("outside 10%: the software era, too little loss with the data-parallel size (NVFP4 on two and four B200 "
          "nodes included), GB300 NVFP4, the 1 kW MI350X (docs/validation.md 1c)")


def _spec(row: tuple, recompute: str) -> TrainSpec:
    _, model, chip, gpus, gbs, mbs, par, _, gdt, _ = row
    overlap: dict[str, float] = {}
    if par.get("tp", 1) > 1:
        overlap["tp_comm_overlap"] = TP_OVERLAP
    if par.get("virtual_stages", 1) > 1:
        overlap["pp_comm_overlap"] = 1.0
    return TrainSpec.from_dict({
        "model": model, "batch": {"global_batch": gbs},
        "parallelism": {"microbatch_size": mbs, "recompute": recompute, "grad_reduce_dtype": gdt,
                        "dp_bucket_params": BUCKET.get(row[0], 0), **par, **overlap},
        "hardware": {"chip": chip, "count": gpus}, "precision": PRECISION.get(row[0], "fp8"),
    })


def mlperf_error(row: tuple) -> float:
    """Predicted / published throughput - 1 (= published / predicted step time - 1), the recompute the row
    states or, where our memory model does not hold it, ``selective``."""
    try:
        est = estimate_train(_spec(row, row[7]))
    except DoesNotFitError:
        est = estimate_train(_spec(row, "selective"))
    return row[9] / est.step_time_s - 1.0


@pytest.mark.parametrize("row", [pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=MISSED))
                                 if abs(DOCUMENTED[r[0]]) > 0.10 else r for r in ROWS], ids=[r[0] for r in ROWS])
def test_mlperf_row_within_10_percent(row: tuple) -> None:
    """MLPerf Training step time (module docstring) within 10% (strict xfail where missed)."""
    assert abs(mlperf_error(row)) <= 0.10


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_mlperf_row_at_its_documented_error(row: tuple) -> None:
    """Every row sits at the error docs/validation.md 1c gives it, +- 3 points, so a change that moves one shows."""
    documented = DOCUMENTED[row[0]]
    assert mlperf_error(row) == pytest.approx(documented, abs=0.03)


def test_mlperf_family_figures() -> None:
    """Median and max |error| over the 61 rows as docs/validation.md 1c states them, 39 within 10% (the issue's
    5% / 10% are not met by this family: it is kept as found)."""
    errs = sorted(abs(mlperf_error(r)) for r in ROWS)
    assert len(errs) == 61
    assert statistics.median(errs) == pytest.approx(0.083, abs=0.01)
    assert max(errs) == pytest.approx(0.354, abs=0.03)
    assert sum(e <= 0.10 for e in errs) == 39


def _row(key: str) -> tuple:
    return next(r for r in ROWS if r[0] == key)


def test_nvfp4_saved_16_percent_where_its_measured_gemm_rate_gives_25() -> None:
    """The NVFP4 rows, in the published figures alone: the same 8 B200, batch 16 x micro-batch 2, no recompute, took
    0.5389 s a step in FP8 (University of Florida) and 0.4516-0.4527 s in NVFP4 (Oracle, Nebius), 16% less. The
    model's NVFP4 GEMMs run at the share of the FP4 peak vLLM's B200 benchmark measured (catalog
    ``fp4_matmul_factor``: 0.718 of the BF16 share, where FP8's is 0.84) and its casts cost what FP8's do: it takes
    25% off (36% when a 4-bit GEMM reached the 16-bit share of its peak, which left these rows 24-25% fast). What
    NVIDIA's NVFP4 recipe adds beyond its GEMMs (random Hadamard transforms of the weight-gradient operands, 2D
    weight scaling, stochastic rounding of the gradients) is not priced, and no published per-kernel time was found
    to price it with; the 8-GPU rows are now within 10% (+7% to +8%)."""
    fp8, fp4 = _row("v5.1-llama31-8b-b200-8-uf"), _row("v5.1-llama31-8b-b200-8-oracle-nvfp4")
    assert 1.0 - fp4[9] / fp8[9] == pytest.approx(0.162, abs=0.01)
    model = 1.0 - estimate_train(_spec(fp4, "none")).step_time_s / estimate_train(_spec(fp8, "none")).step_time_s
    assert model == pytest.approx(0.254, abs=0.02)
    assert abs(mlperf_error(fp8)) < 0.05 < mlperf_error(fp4) < 0.10


def test_b200_steps_at_one_sequence_per_cp_pair_miss_by_a_constant_then_grow() -> None:
    """The scale misses, in the published figures alone: at one sequence per context-parallel pair (CP 2) each B200
    does the same work at every size, and the step held within 2% from 32 to 128 GPUs (0.1878, 0.1871, 0.1907 s;
    Oracle's 64: 0.1879) and grew 15% to 256 (0.2200); per token the 64-GPU run is 39% slower than one node at two
    sequences a GPU. The model's step is the same at every size (0.172 s), 9-11% short up to 128 GPUs and 28% at
    256: its data-parallel reduce-scatter and all-gather (0.13 s) hide behind 0.14 s of compute but for their last
    and first buckets (768M of the 8B parameters, 12 ms) and the compute their kernels' share of the SMs costs while
    they run (18 ms; 21-24% short without it), and it prices no time a step loses to a short step's fixed costs or
    to its slowest of 256 GPUs (section 1c's drift at 10k H100, here at 64-256 B200)."""
    n1, n4, n8, n16, n32 = (_row(f"v5.1-llama31-8b-b200-{n}-uf") for n in (8, 32, 64, 128, 256))
    assert max(r[9] for r in (n4, n8, n16)) / min(r[9] for r in (n4, n8, n16)) - 1.0 < 0.02
    assert n32[9] / n16[9] - 1.0 == pytest.approx(0.153, abs=0.01)
    assert (n8[9] * 4) / n1[9] - 1.0 == pytest.approx(0.389, abs=0.01)
    steps = [estimate_train(_spec(r, "none")).step_time_s for r in (n4, n8, n16, n32)]
    assert max(steps) / min(steps) - 1.0 < 0.01
    assert all(0.08 < mlperf_error(r) < 0.11 for r in (n4, n8, n16)) and mlperf_error(n32) > 0.25


def test_three_submitters_of_the_same_mi355x_node_spread_by_5_percent() -> None:
    """AMD, Dell and Supermicro ran AMD's MI355X recipe (8 GPUs, batch 32, micro-batch 2, FP8): 30.70, 29.70 and
    29.30 samples a second, a spread of 4.8% the one set of constants cannot follow; all three within 10%."""
    rows = [_row(f"v5.1-llama31-8b-mi355x-8-{s}") for s in ("amd", "dell", "supermicro")]
    assert max(r[9] for r in rows) / min(r[9] for r in rows) - 1.0 == pytest.approx(0.048, abs=0.002)
    assert all(-0.10 <= mlperf_error(r) < 0 for r in rows)


def test_the_same_h100s_ran_14_percent_faster_per_sequence_a_year_later() -> None:
    """The era, in the published figures alone: 512 H100, GPT-3 175B, TP 4 x PP 8 in both rounds; v3.1 (2023)
    11.045 s for 2,048 sequences, v4.0 (2024) 10.90 s for 2,304. The model, one set of constants, sits between."""
    v31, v40 = (next(r for r in ROWS if r[0] == k) for k in ("v3.1-gpt3-h100-512", "v4.0-gpt3-h100-512"))
    per_seq_31, per_seq_40 = v31[9] / v31[4], v40[9] / v40[4]
    assert per_seq_31 / per_seq_40 - 1.0 == pytest.approx(0.14, abs=0.01)
    assert mlperf_error(v31) > 0 > mlperf_error(v40)


def test_the_1_kw_mi350x_ran_23_percent_slower_than_the_mi355x_where_the_model_gives_7() -> None:
    """AMD's one recipe on both 8-GPU nodes: 24.96 samples a second on MI350X (1,000 W, air, 2.2 GHz) against 30.70 on
    MI355X (1,400 W, liquid, 2.4 GHz), 23% slower for 8% less peak. The model, whose MI350X draws about 810 W in this
    step (below its 1,000 W, so its clocks hold), gives 7%: both within 10% of their rows, from opposite sides."""
    mi350, mi355 = _row("v5.1-llama31-8b-mi350x-8-amd"), _row("v5.1-llama31-8b-mi355x-8-amd")
    assert mi350[9] / mi355[9] - 1.0 == pytest.approx(0.230, abs=0.005)
    e350, e355 = (estimate_train(_spec(r, "none")) for r in (mi350, mi355))
    assert e350.step_time_s / e355.step_time_s - 1.0 == pytest.approx(0.073, abs=0.01)
    assert e350.clock_factor == 1.0 and e350.chip_power_w < 1000
    assert mlperf_error(mi350) > 0 > mlperf_error(mi355)


def test_the_gb300_rack_ran_13_percent_faster_than_the_gb200_rack_where_the_model_gives_3() -> None:
    """One NVL72 rack of each at the same shape (72 GPUs, batch 36 x 1, CP 2, FP8, NVIDIA's configs): GB200
    (``tyche_ngpu72``) 0.1677 s a step, GB300 (``theia_ngpu72``) 0.1462 s (block means of two runs each: 0.14619 and
    0.14613). Blackwell Ultra has GB200's FP8 and BF16 tensor peaks (GB300 NVL72 datasheet: 360 PF FP8 dense per rack)
    but twice its attention exponent rate (SFU EX2, 10.7 against 5 TeraExponentials/s), 1,400 W against 1,200 and
    800 Gb/s NICs. The model prices the exponent rate in attention (catalog ``tensor_flops_per_exp``, GB300's
    attention ceiling derived from GB200's) and gives the GB300 step 2.8% shorter: its GB300 row is +3.1% where its
    GB200 row at the same shape is +15% (docs/validation.md 1c)."""
    gb200, gb300 = _row("v5.1-llama31-8b-gb200-72-nvidia"), _row("v5.1-llama31-8b-gb300-72-nvidia")
    assert gb200[9] / gb300[9] - 1.0 == pytest.approx(0.147, abs=0.005)
    e200, e300 = (estimate_train(_spec(r, "none")) for r in (gb200, gb300))
    assert e200.step_time_s / e300.step_time_s - 1.0 == pytest.approx(0.028, abs=0.005)
    assert abs(mlperf_error(gb300)) < 0.05 < 0.10 < mlperf_error(gb200)


def test_v6_0_mxfp4_mi350x_ran_25_percent_slower_than_the_mi355x_as_in_v5_1() -> None:
    """MLPerf v6.0, AMD's MXFP4 recipe on both 8-GPU nodes: 1.0872 s a step on MI350X against 0.8725 on MI355X, 24.6%
    slower, the gap v5.1's FP8 runs showed (23.0%) for 8% less peak; the model gives 6.7%. A second, independent
    measurement of what the model's power and clock terms do not reach on the air-cooled 1 kW part (its MI350X draws
    below its 1,000 W in the step, so its clock holds); the MI355X row is within 10%, the MI350X rows are not."""
    mi350, mi355 = _row("v6.0-llama31-8b-mi350x-8-amd-mxfp4"), _row("v6.0-llama31-8b-mi355x-8-amd-mxfp4")
    assert mi350[9] / mi355[9] - 1.0 == pytest.approx(0.246, abs=0.005)
    e350, e355 = (estimate_train(_spec(r, "none")) for r in (mi350, mi355))
    assert e350.step_time_s / e355.step_time_s - 1.0 == pytest.approx(0.067, abs=0.01)
    assert e350.clock_factor == 1.0
    assert abs(mlperf_error(mi355)) < 0.10 < mlperf_error(mi350)
