"""runtime/allocator.py: glibc's thresholds, read as what the kernel sees (minor page faults), in fresh processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from gigacluster.runtime import allocator

# 200 times: make three 2 MiB arrays, then drop them together (as a planning step's temporaries go), and count the
# minor faults of the loop alone.
_PROBE = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    from gigacluster.runtime import allocator
    tuned = allocator.tune() if sys.argv[1] == "tune" else {}
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    def step():
        a, b, c = np.ones(1 << 18), np.ones(1 << 18), np.ones(1 << 18)  # 2 MiB each, every page written
        del a, b, c
    for _ in range(5):  # warm: the first blocks fault in any case
        step()
    f0 = faults()
    for _ in range(200):
        step()
    print(json.dumps({"tuned": tuned, "faults": faults() - f0}))
""")


def _run(mode: str, **env: str) -> dict[str, object]:
    e = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                                            "GLIBC_TUNABLES")}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, env=e, timeout=60,
                         check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION"),
                           reason="glibc's mallopt: Linux with glibc only")


@glibc
def test_tuned_process_reuses_heap_pages_instead_of_faulting_fresh_ones() -> None:
    tuned = _run("tune")
    assert tuned["tuned"]["trim_threshold"] == allocator.TRIM_THRESHOLD, tuned  # type: ignore[index]
    assert tuned["tuned"]["mmap_threshold"] in (allocator.MMAP_THRESHOLD, allocator.MMAP_THRESHOLD_FALLBACK)  # type: ignore[index]
    # 600 arrays of 512 pages each: 307,200 faults if each came from fresh pages; reused pages do not fault again
    assert tuned["faults"] < 3_000, tuned


@glibc
def test_default_glibc_faults_fresh_pages_for_the_same_loop() -> None:
    """The cost the tuning removes exists: on glibc's defaults the same loop faults on most of its pages. Its dynamic
    mmap threshold rises to 2 MiB once such a block is freed, so the arrays come from the heap; but the trim
    threshold rises only to twice that, and three freed arrays at the heap's top (6 MiB) go back to the kernel."""
    plain = _run("plain")
    assert plain["tuned"] == {}
    assert plain["faults"] > 100_000, plain


@glibc
def test_settings_of_the_deployment_win() -> None:
    assert _run("tune", MALLOC_TRIM_THRESHOLD_="1048576")["tuned"] == {}
    assert _run("tune", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536")["tuned"] == {}
