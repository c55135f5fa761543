"""Deterministic, vectorised hashes for prefix-cache blocks and synthetic output tokens.

Both must agree across processes (the router's approximate prefix index and the replica's cache
compare hashes), so nothing here uses Python's ``hash()`` of str/bytes, which is salted per
process. Block hashes are chained: the hash of block ``b`` covers every token before the end of
block ``b`` (and the tenant salt), so equal hashes mean equal prefixes, as in vLLM's prefix cache.

The chain is a polynomial hash modulo 2**64 followed by a splitmix64 finaliser. It is fast (numpy,
no per-block Python loop) and well mixed, but it is NOT collision resistant against an adversary
choosing tokens; a real deployment would use SHA-256 (vLLM's option). The tenant salt keeps one
tenant's cached blocks invisible to another.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

import numpy as np

_U64 = np.uint64
_MASK64 = (1 << 64) - 1
# Odd multipliers (invertible mod 2**64); the token and block-position multipliers differ.
_P_TOKEN = 0x9E3779B97F4A7C15
_Q_BLOCK = 0xC2B2AE3D27D4EB4F
_Q_INV = pow(_Q_BLOCK, -1, 1 << 64)
_MAX_BLOCKS = 1 << 16  # 1M tokens at block size 16; longer prompts are refused by seq_len first


def _pow_table(base: int, n: int) -> np.ndarray:
    out = np.empty(n, dtype=_U64)
    acc = 1
    for i in range(n):
        out[i] = acc
        acc = (acc * base) & _MASK64
    return out


_Q_POW = _pow_table(_Q_BLOCK, _MAX_BLOCKS)
_Q_INV_POW = _pow_table(_Q_INV, _MAX_BLOCKS)
_Q_POW.flags.writeable = False
_Q_INV_POW.flags.writeable = False


def _splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, elementwise on a uint64 ARRAY (at least one dimension: numpy wraps array
    arithmetic silently, so no ``errstate``, which costs more than the arithmetic on a short array)."""
    x = x ^ (x >> _U64(30))
    x = x * _U64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> _U64(27))
    x = x * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


@functools.lru_cache(maxsize=64)
def stable_u64(text: str) -> int:
    """A process-independent 64-bit hash of a string (BLAKE2b)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@functools.lru_cache(maxsize=16)
def _token_weights(block_size: int) -> np.ndarray:
    w = _pow_table(_P_TOKEN, block_size)
    w.flags.writeable = False
    return w


@functools.lru_cache(maxsize=1024)
def _salt_term(salt: str) -> np.ndarray:
    """``salt * Q`` mod 2**64 as a one-element uint64 array (the chain's start for ``salt``)."""
    seed = stable_u64(salt) if salt else 0
    out = np.array([(seed * _Q_BLOCK) & _MASK64], dtype=_U64)
    out.flags.writeable = False
    return out


def block_hashes(tokens: np.ndarray | Sequence[int], block_size: int, *, salt: str = "") -> list[int]:
    """Chained hashes of every FULL block of ``tokens`` (a trailing partial block is not hashed)."""
    arr = np.asarray(tokens, dtype=np.int64)
    n_blocks = arr.size // block_size
    if n_blocks == 0:
        return []
    if n_blocks > _MAX_BLOCKS:
        raise ValueError(f"prompt of {arr.size} tokens exceeds {_MAX_BLOCKS} blocks")
    # Array arithmetic only (it wraps mod 2**64 silently); the salt's product is taken in Python ints.
    toks = _splitmix(arr[: n_blocks * block_size].astype(_U64) + _U64(1))
    per_block = (toks.reshape(n_blocks, block_size) * _token_weights(block_size)).sum(axis=1, dtype=_U64)
    per_block = _splitmix(per_block)
    # H_b = salt * Q^(b+1) + sum_{k<=b} h_k Q^(b-k)  ==  Q^b * (salt*Q + cumsum(h_k Q^-k))
    scaled = np.cumsum(per_block * _Q_INV_POW[:n_blocks], dtype=_U64)
    chain = _Q_POW[:n_blocks] * (scaled + _salt_term(salt))
    return _splitmix(chain).tolist()  # type: ignore[no-any-return]


def token_ids(seeds: np.ndarray, indices: np.ndarray, *, low: int, high: int) -> np.ndarray:
    """Deterministic synthetic output token ids in ``[low, high)`` from per-request seeds and indices."""
    x = np.atleast_1d(seeds).astype(_U64) ^ (np.atleast_1d(indices).astype(_U64) * _U64(_P_TOKEN))
    h = _splitmix(x)
    return (h % _U64(high - low)).astype(np.int64) + low
