"""The OpenAI request body: JSON parsing within bounds, the fields each route takes, and chat rendering.

Pure parsing (no aiohttp): the HTTP endpoint (:mod:`.http`) turns a body into the arguments of
:meth:`RouterService.generate` through these, and every refusal is an ``InvalidArgument`` naming
the field.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from gigacluster.errors import InvalidArgument

# What the POST routes do with each request field. Fields not named here are refused with a 400 naming
# them (OpenAI answers "Unrecognized request argument supplied"), never silently ignored.
COMMON_FIELDS = frozenset({"model", "max_tokens", "stream", "stream_options", "stop", "priority", "request_id",
                           "ignore_eos"})
FIELDS = {"text_completion": COMMON_FIELDS | {"prompt"},
          "chat.completion": COMMON_FIELDS | {"messages", "max_completion_tokens"}}
# Sampling parameters: accepted, no effect (the emulated text is deterministic, seeded by the request id; its
# length comes from max_tokens, the end-of-sequence model and stop).
NO_EFFECT = frozenset({"temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                       "repetition_penalty", "seed", "user", "metadata", "store", "service_tier",
                       "parallel_tool_calls"})
# Features the emulator does not have: accepted only at their "off" value (null or the listed ones).
OFF_ONLY: dict[str, tuple[Any, ...]] = {
    "n": (1,), "best_of": (1,), "logprobs": (False,), "top_logprobs": (0,), "echo": (False,), "suffix": ("",),
    "logit_bias": ({},), "tools": ([],), "tool_choice": ("none", "auto"), "functions": ([],),
    "function_call": ("none", "auto"), "response_format": ({"type": "text"},), "modalities": (["text"],),
    "prediction": (), "audio": (), "reasoning_effort": (), "web_search_options": (), "min_tokens": (0,),
    "guided_json": (), "guided_regex": (), "guided_choice": (), "guided_grammar": (), "structured_outputs": (),
    "prompt_logprobs": (), "include_stop_str_in_output": (False,), "use_beam_search": (False,),
}
STREAM_OPTIONS = frozenset({"include_usage", "continuous_usage_stats"})


def _is_off(value: Any, allowed: tuple[Any, ...]) -> bool:
    return value is None or any(type(value) is type(a) and value == a for a in allowed)


def check_fields(body: dict[str, Any], kind: str) -> None:
    """Refuse (INVALID_ARGUMENT naming it) every field the endpoint cannot honour; see FIELDS, NO_EFFECT, OFF_ONLY."""
    for name in sorted(body, key=str):
        if name in FIELDS[kind] or name in NO_EFFECT:
            continue
        if name in OFF_ONLY:
            allowed = OFF_ONLY[name]
            if not _is_off(body[name], allowed):
                off = " or ".join(["null", *(json.dumps(a) for a in allowed)])
                raise InvalidArgument(name, f"is not supported by this emulated endpoint (only {off}); "
                                            f"got {json.dumps(body[name])[:32]}")
            continue
        supported = sorted(FIELDS[kind] | NO_EFFECT)
        raise InvalidArgument(str(name)[:64], f"unrecognized request argument {str(name)[:64]!r}; "
                                              f"supported: {', '.join(supported)}")
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise InvalidArgument("stream_options", "must be an object")
        for k in opts:
            if k not in STREAM_OPTIONS:
                raise InvalidArgument(f"stream_options.{str(k)[:32]}",
                                      f"unrecognized; supported: {', '.join(sorted(STREAM_OPTIONS))}")


def stop_strings(body: dict[str, Any]) -> list[str]:
    """``stop`` as a list: null, a string or a list of strings (OpenAI's forms)."""
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(x, str) for x in stop):
        raise InvalidArgument("stop", "must be a string or a list of strings")
    return stop


def _refuse_constant(name: str) -> Any:
    raise InvalidArgument("body", f"non-finite number {name} is not allowed")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise InvalidArgument("body", f"number {text[:32]} is out of range (non-finite)")
    return v


def parse_json_body(raw: bytes, max_depth: int) -> dict[str, Any]:
    """A request body as a JSON object; INVALID_ARGUMENT for anything else.

    Undecodable bytes, bad JSON, ``NaN``/``Infinity`` and nesting deeper than ``max_depth`` are all
    refused with a message naming the problem (the depth is checked on the bytes, before parsing,
    so 100,000 nested ``[`` cost one linear scan, not the parser's recursion).
    """
    # The openers (counted in C, strings included) bound the depth: the scan only for a body with many.
    if raw.count(b"[") + raw.count(b"{") > max_depth and json_depth(raw) > max_depth:
        raise InvalidArgument("body", f"JSON nested deeper than {max_depth} levels")
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite_float)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InvalidArgument("body", f"must be a JSON object: {str(exc)[:120]}") from exc
    if not isinstance(body, dict):
        raise InvalidArgument("body", "must be a JSON object")
    return body


_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS = re.compile(rb"[\[\]{}]")


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in ``raw`` (strings skipped; C-speed regex scans)."""
    depth = deepest = 0
    for m in _BRACKETS.finditer(_STRINGS.sub(b'""', raw)):
        if m.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def int_field(body: dict[str, Any], *names: str) -> Any:
    """The first of ``names`` present and not null in ``body`` (None if none): OpenAI treats null as absent."""
    for n in names:
        v = body.get(n)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidArgument(n, f"must be an integer, got {str(v)[:32]}")
            return v
    return None


def render_chat(messages: list[dict[str, Any]]) -> str:
    """Chat messages as one prompt: ``<|role|>\\ncontent\\n`` per message, then ``<|assistant|>\\n``."""
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidArgument(f"messages[{i}]", "must be an object with a string 'role'")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only (the emulated models read no images or audio)
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = str(part.get("type"))[:32] if isinstance(part, dict) else type(part).__name__
                    raise InvalidArgument(f"messages[{i}].content[{j}]", f"only text parts are supported, got {kind}")
            texts = [p.get("text", "") for p in content]
            if not all(isinstance(t, str) for t in texts):
                raise InvalidArgument(f"messages[{i}].content", "text parts must carry a string 'text'")
            content = "".join(texts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise InvalidArgument(f"messages[{i}].content", "must be a string or a list of text parts")
        parts.append(f"<|{m['role']}|>\n{content}\n")
    return "".join(parts) + "<|assistant|>\n"
