"""The Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA 2024; CC-BY 4.0): read its CSV and
turn it into an open-loop arrival timeline, time-scaled and rate-scaled.

The CSV has one row per request: ``TIMESTAMP`` (``2023-11-16 18:17:03.9799600``, 100 ns digits),
``ContextTokens`` and ``GeneratedTokens``. :func:`read` validates every row and refuses a bad one
naming its line; :func:`replay` selects a window of trace time, compresses it by ``speed`` and
thins or replicates arrivals by ``rate_scale`` without randomness (the same file and settings give
the same timeline on every machine).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import io
import math
import pathlib

import numpy as np

from gigacluster.errors import InvalidArgument

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MAX_BYTES = 64 << 20  # the two full upstream files are 1 MB; a bound so a wrong path cannot eat the memory
_QUOTE = 40  # characters of a bad cell quoted back


@dataclasses.dataclass(frozen=True)
class Trace:
    """Rows in time order: seconds since the first row, context (prompt) and generated token counts."""

    t_s: np.ndarray
    context_tokens: np.ndarray
    generated_tokens: np.ndarray

    def __len__(self) -> int:
        return int(self.t_s.size)

    @property
    def span_s(self) -> float:
        return float(self.t_s[-1]) if self.t_s.size else 0.0


def _timestamp(cell: str, where: str) -> float:
    """POSIX seconds of ``YYYY-MM-DD HH:MM:SS[.fffffff]`` (any number of fraction digits, read as UTC)."""
    whole, _, frac = cell.strip().partition(".")
    try:
        t = datetime.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.UTC)
        if frac and not frac.isdigit():
            raise ValueError(frac)
        return t.timestamp() + (float("0." + frac) if frac else 0.0)
    except ValueError:
        raise InvalidArgument("TIMESTAMP",
                              f"{where}: {cell[:_QUOTE]!r} is not YYYY-MM-DD HH:MM:SS[.fraction]") from None


def _count(cell: str, column: str, where: str) -> int:
    try:
        n = int(cell.strip())
    except ValueError:
        raise InvalidArgument(column, f"{where}: {cell[:_QUOTE]!r} is not a whole number of tokens") from None
    if n < 0:
        raise InvalidArgument(column, f"{where}: {n} tokens; counts must be >= 0")
    return n


def parse(text: str, *, source: str = "<csv>") -> Trace:
    """A :class:`Trace` from CSV text with the three columns (any order, extra columns ignored)."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise InvalidArgument("arrival.path", f"{source[:200]} is empty; expected a header {','.join(COLUMNS)}")
    names = [h.strip().lstrip("\ufeff") for h in header]
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise InvalidArgument(missing[0], f"{source[:200]} has no {missing[0]} column (header: "
                                          f"{','.join(names)[:120]!r}); expected {','.join(COLUMNS)}")
    it, ic, ig = (names.index(c) for c in COLUMNS)
    width = max(it, ic, ig) + 1
    t: list[float] = []
    ctx: list[int] = []
    gen: list[int] = []
    for row in reader:
        if not row or all(not c.strip() for c in row):
            continue
        where = f"{source[:200]} line {reader.line_num}"
        if len(row) < width:
            raise InvalidArgument("arrival.path", f"{where}: {len(row)} fields, expected {len(names)} "
                                                  f"({','.join(row)[:_QUOTE]!r})")
        t.append(_timestamp(row[it], where))
        ctx.append(_count(row[ic], "ContextTokens", where))
        gen.append(_count(row[ig], "GeneratedTokens", where))
    ts = np.asarray(t, np.float64)
    order = np.argsort(ts, kind="stable")
    ts = ts[order]
    if ts.size:
        ts = ts - ts[0]
    return Trace(ts, np.asarray(ctx, np.int64)[order], np.asarray(gen, np.int64)[order])


def read(path: pathlib.Path, *, max_bytes: int = MAX_BYTES) -> Trace:
    """Read and validate a trace CSV of at most ``max_bytes``."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise InvalidArgument("arrival.path", f"{str(path)[:200]} is {size} bytes; at most {max_bytes}")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidArgument("arrival.path", f"cannot read {str(path)[:200]}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidArgument("arrival.path", f"{str(path)[:200]} is not UTF-8 text (byte {exc.start})") from None
    return parse(text, source=str(path))


def copies(n: int, rate_scale: float) -> np.ndarray:
    """How many times each of ``n`` rows is sent at ``rate_scale``: ``floor(k*s) - floor((k-1)*s)`` for row k
    (1-based), an even Bresenham spread with no randomness, so the total is exactly ``floor(n*s)``;
    at 0.5 every second row is kept, at 2.0 every row is sent twice."""
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise InvalidArgument("arrival.rate_scale", f"must be a finite number > 0, got {rate_scale}")
    k = np.arange(n + 1, dtype=np.float64)
    # A tiny epsilon keeps exact products (3 x 1/3) from flooring one short through rounding.
    cum = np.floor(k * rate_scale + 1e-9).astype(np.int64)
    return np.diff(cum)


def replay(trace: Trace, *, speed: float = 1.0, start_s: float = 0.0, window_s: float = math.inf,
           duration_s: float = math.inf, rate_scale: float = 1.0,
           target_qps: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(wall times, context tokens, generated tokens) of the rows in trace time [start_s, start_s + window_s),
    sent at ``(t - start_s) / speed`` wall seconds and cut at ``duration_s``, thinned or replicated by
    ``rate_scale`` (or by the scale that makes the window's mean rate ``target_qps`` per wall second).
    Replicas of a row are spread evenly over the gap to the next row, keeping the trace's burst shape."""
    for name, v in (("speed", speed), ("window_s", window_s), ("duration_s", duration_s)):
        if not v > 0:
            raise InvalidArgument(f"arrival.{name}", f"must be > 0, got {v}")
    if not (math.isfinite(start_s) and start_s >= 0):
        raise InvalidArgument("arrival.start_s", f"must be a finite number >= 0, got {start_s}")
    end_s = start_s + min(window_s, duration_s * speed)
    sel = (trace.t_s >= start_s) & (trace.t_s < end_s)
    t = (trace.t_s[sel] - start_s) / speed
    ctx, gen = trace.context_tokens[sel], trace.generated_tokens[sel]
    if target_qps:
        if not (math.isfinite(target_qps) and target_qps > 0):
            raise InvalidArgument("arrival.target_qps", f"must be a finite number > 0, got {target_qps}")
        if t.size == 0:
            raise InvalidArgument("arrival.target_qps", "the window holds no trace rows to scale")
        # The window's length: as asked for, or (when neither window nor duration bounds it) the trace's rest.
        length_s = end_s - start_s if math.isfinite(end_s) else max(trace.span_s - start_s, 1e-9)
        rate_scale = target_qps * length_s / speed / t.size
    c = copies(t.size, rate_scale)
    nxt = np.append(t[1:], t[-1]) if t.size else t
    rep = np.repeat(np.arange(t.size), c)
    # Position of each replica within its row: 0, 1, ..., c-1 (a cumulative count restarted per row).
    j = np.arange(rep.size) - np.repeat(np.cumsum(c) - c, c)
    out_t = t[rep] + (nxt - t)[rep] * j / np.maximum(c[rep], 1)
    return out_t, ctx[rep], gen[rep]
