"""Printing a benchmark's rows: a markdown table for docs/performance.md, or one dict per line."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Column = tuple[str, Callable[[dict[str, Any]], str]]


def print_rows(rows: Sequence[dict[str, Any]], columns: Sequence[Column], *, markdown: bool) -> None:
    """Rows as a markdown table (first column left-aligned, the rest right-aligned) or as dicts."""
    if not markdown:
        for r in rows:
            print(r)
        return
    print("| " + " | ".join(h for h, _ in columns) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|")
    for r in rows:
        print("| " + " | ".join(fn(r) for _, fn in columns) + " |")
