"""Tokenizer: round trip, bounded vocabulary, determinism across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gigacluster.inference.tokenizer import BYTE_TOKENS, Tokenizer, decode, encode
from gigacluster.model import SpecError

TEXTS = ["", "Hello, world!", "the cluster answers the question\n\nthanks", "Ünïcödé ✓ 🎉 中文", "a  b\tc\r\n"]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(text: str) -> None:
    """decode(encode(text)) returns the text exactly, for any UTF-8 input."""
    assert decode(encode(text)) == text


def test_compresses_english() -> None:
    """English text takes fewer tokens than characters (about 3-4 characters per token)."""
    text = "the model would need more memory when the batch is large and the cache is full"
    assert len(encode(text)) * 2.5 < len(text)


@pytest.mark.parametrize("vocab", [256, 300, 32000, 128256])
def test_ids_bounded_by_vocab(vocab: int) -> None:
    """Every id is below the model's vocabulary, and the round trip still holds at small vocabularies."""
    tok = Tokenizer(vocab)
    ids = tok.encode(TEXTS[2] + TEXTS[3])
    assert max(ids) < vocab
    assert tok.decode(ids) == TEXTS[2] + TEXTS[3]


def test_decode_accepts_every_id_and_rejects_out_of_range() -> None:
    """Any id in [0, vocab) decodes (sampled output); an id >= vocab is a SpecError on token_ids."""
    tok = Tokenizer(128256)
    assert tok.decode([BYTE_TOKENS, 100_000, 128255])
    with pytest.raises(SpecError) as ei:
        tok.decode([128256])
    assert ei.value.field == "token_ids"
    with pytest.raises(SpecError):
        Tokenizer(100)


def test_deterministic_across_processes() -> None:
    """Two interpreters with different hash seeds produce identical ids."""
    code = "import json,sys; from gigacluster.inference.tokenizer import encode; print(json.dumps(encode(sys.argv[1])))"
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        r = subprocess.run([sys.executable, "-c", code, TEXTS[2]], capture_output=True, text=True, env=env, check=True)
        outs.append(json.loads(r.stdout))
    assert outs[0] == outs[1] == encode(TEXTS[2])
