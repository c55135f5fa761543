"""A small deterministic tokenizer for the OpenAI endpoint: text <-> token ids.

The vocabulary is fixed in this file, so ids are the same in every process and version of
Python (no ``hash()``, no training, no files):

* ids 0-255 are the 256 byte values (byte fallback: any UTF-8 text encodes);
* then a word table: common English words, each with and without a leading space, followed by
  every lower-case letter pair and triple with a leading space and without.

``encode`` is greedy longest match over the table (at most :data:`MAX_PIECE_CHARS` characters),
falling back to the UTF-8 bytes of one character. ``decode(encode(t)) == t`` for every string.
``decode`` also accepts any id below the model's vocabulary (the engine samples ids up to it):
ids past the table wrap onto the word part, so synthetic output reads as words.
Typical English runs at about 3-4 characters per token, as BPE tokenizers do.
"""

from __future__ import annotations

import itertools
import string

from gigacluster.model import SpecError

_WORDS_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there been one all we their has would when if so no will more can "
    "out other about what up some into them than its only time new could these two may first then do "
    "any like my now over such our man me even most made after also did many before must through "
    "back years where much your way well down should because each just those people how too little "
    "state good very make world still own see men work long get here between both life being under "
    "never day same another know while last might us great old year off come since against go came "
    "right used take three model data token tokens chip chips cluster compute memory network request "
    "response system user assistant hello question answer please thank thanks yes today would help "
    "need want think said say number value time second seconds minute hour power energy cost price "
    "fast slow high low large small batch cache "
)
_WORDS = tuple(_WORDS_TEXT.split())
_LETTERS = string.ascii_lowercase


def _build_table() -> tuple[str, ...]:
    pieces: list[str] = []
    seen: set[str] = set()

    def add(p: str) -> None:
        if p not in seen:
            seen.add(p)
            pieces.append(p)

    for w in _WORDS:
        add(" " + w)
        add(w)
        add(" " + w.capitalize())
        add(w.capitalize())
    for a, b in itertools.product(_LETTERS, repeat=2):
        add(" " + a + b)
        add(a + b)
    for a, b, c in itertools.product(_LETTERS, repeat=3):
        add(" " + a + b + c)
        add(a + b + c)
    for ch in (".", ",", "!", "?", ";", ":", "'", '"', "(", ")", "-", "\n", " ", "\n\n", "  "):
        add(ch)
    return tuple(pieces)


_TABLE: tuple[str, ...] = _build_table()
BYTE_TOKENS = 256
TABLE_SIZE = BYTE_TOKENS + len(_TABLE)
MAX_PIECE_CHARS = max(len(p) for p in _TABLE)


def _lookup(vocab: int) -> dict[str, int]:
    n = max(0, min(vocab, TABLE_SIZE) - BYTE_TOKENS)
    return {p: BYTE_TOKENS + i for i, p in enumerate(_TABLE[:n])}


def _check_vocab(vocab: int) -> None:
    if not isinstance(vocab, int) or vocab < BYTE_TOKENS:
        raise SpecError("vocab", f"must be an integer >= {BYTE_TOKENS} (the byte tokens), got {vocab!r}")


class Tokenizer:
    """The table restricted to ids below ``vocab`` (a model's vocabulary size)."""

    def __init__(self, vocab: int) -> None:
        _check_vocab(vocab)
        self.vocab = vocab
        self._ids = _lookup(vocab)
        self._max = max((len(p) for p in self._ids), default=1)
        self._words = min(vocab, TABLE_SIZE) - BYTE_TOKENS

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise SpecError("text", f"must be a string, got {type(text).__name__}")
        ids, out = self._ids, []
        i, n = 0, len(text)
        while i < n:
            for size in range(min(self._max, n - i), 0, -1):
                tid = ids.get(text[i : i + size])
                if tid is not None:
                    out.append(tid)
                    i += size
                    break
            else:
                out.extend(text[i].encode("utf-8", "surrogatepass"))
                i += 1
        return out

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        buf = bytearray()
        for t in ids:
            if not isinstance(t, int) or not 0 <= t < self.vocab:
                raise SpecError("token_ids", f"ids must be integers in [0, {self.vocab}), got {t!r}")
            if t < BYTE_TOKENS:
                buf.append(t)
            elif self._words > 0:
                buf += _TABLE[(t - BYTE_TOKENS) % self._words].encode()
        return buf.decode("utf-8", "replace")


def encode(text: str, vocab: int = 128256) -> list[int]:
    """Token ids of ``text`` using only ids below ``vocab``."""
    return Tokenizer(vocab).encode(text)


def decode(ids: list[int] | tuple[int, ...], vocab: int = 128256) -> str:
    """Text of token ids below ``vocab``."""
    return Tokenizer(vocab).decode(ids)
