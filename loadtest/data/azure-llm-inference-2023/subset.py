#!/usr/bin/env python3
"""Regenerate the shipped subset of the Azure LLM inference trace 2023 from the full upstream files.

    python loadtest/data/azure-llm-inference-2023/subset.py /path/to/full/dir [--minutes 30]

For each of AzureLLMInferenceTrace_code.csv and AzureLLMInferenceTrace_conv.csv in the source
directory, writes next to this script the header and every row whose TIMESTAMP is within the first
--minutes of that file (rows copied byte for byte, in file order), then prints rows and sha256.
The upstream files are already sorted by time; the subset is a prefix, so its burst shape and
token-count distributions are the trace's own, not a resample. Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import pathlib

FILES = ("AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_conv.csv")
HERE = pathlib.Path(__file__).resolve().parent


def _ts(line: str) -> datetime.datetime:
    return datetime.datetime.strptime(line.split(",", 1)[0].split(".", 1)[0], "%Y-%m-%d %H:%M:%S")


def subset(src: pathlib.Path, dst: pathlib.Path, minutes: float) -> int:
    """Write the first ``minutes`` of ``src`` to ``dst``; returns the number of rows written."""
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    header, rows = lines[0], [r for r in lines[1:] if r.strip()]
    t0 = _ts(rows[0])
    end = t0 + datetime.timedelta(minutes=minutes)
    kept = [r for r in rows if _ts(r) < end]
    dst.write_text(header + "".join(kept), encoding="utf-8")
    return len(kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=pathlib.Path, help="directory holding the two full upstream CSV files")
    ap.add_argument("--minutes", type=float, default=30.0, help="minutes of trace kept from each file's start")
    args = ap.parse_args()
    for name in FILES:
        n = subset(args.source / name, HERE / name, args.minutes)
        digest = hashlib.sha256((HERE / name).read_bytes()).hexdigest()
        print(f"{name}: {n} rows, sha256 {digest}")


if __name__ == "__main__":
    main()
