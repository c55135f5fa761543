"""YAML for files a user or operator hands us (job files, specs, configs), loaded safely.

``yaml.safe_load`` refuses arbitrary objects but not a file that is cheap to write and expensive
to read: a billion-laughs document (nine levels of ten aliases expand to 10^9 nodes for whoever
walks the result), a deeply nested document (the composer recurses once per level) or a huge
file. :func:`load` bounds all three, with the limits in :class:`Limits`, and turns every failure
into one :class:`YamlError` (an ``InvalidArgument``) whose message is a single line that names the
file and the position, never a traceback and never more than a short prefix of the input.

Exceptions::

    DomainError
     └── InvalidArgument
          └── YamlError   (size, aliases, expanded size, depth, syntax, encoding)
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import yaml

from gigacluster.errors import InvalidArgument


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds on one document: file bytes, alias uses, nodes after expanding aliases, nesting."""

    max_bytes: int = 1 << 20
    max_aliases: int = 100
    max_nodes: int = 100_000
    max_depth: int = 64

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 1:
                raise ValueError(f"safeyaml.Limits.{f.name} must be >= 1")


DEFAULT = Limits()


class YamlError(InvalidArgument):
    """A YAML document that is malformed or exceeds a :class:`Limits` bound."""

    def __init__(self, source: str, message: str) -> None:
        super().__init__(source, message)


class _Loader(yaml.SafeLoader):
    """SafeLoader that counts alias uses and nesting while it composes the node graph."""

    def __init__(self, stream: str, limits: Limits, source: str) -> None:
        super().__init__(stream)
        self._limits = limits
        self._source = source
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > self._limits.max_aliases:
                raise YamlError(self._source, f"more than {self._limits.max_aliases} alias references "
                                              "(anchors reused with *name); expand them or split the file")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > self._limits.max_depth:
            mark = self.peek_event().start_mark
            raise YamlError(self._source, f"nested deeper than {self._limits.max_depth} levels "
                                          f"(line {mark.line + 1})")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_nodes(root: yaml.Node, limits: Limits, source: str) -> int:
    """Nodes the document has once every alias is expanded (what a reader walks), bounded."""
    memo: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    active: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            active.discard(key)
            children = _children(node)
            memo[key] = 1 + sum(memo[id(c)] for c in children)
            if memo[key] > limits.max_nodes:
                raise YamlError(source, f"expands to more than {limits.max_nodes} values through aliases")
            continue
        if key in memo:
            continue
        if key in active:
            raise YamlError(source, "an alias refers to a node that contains it (recursive document)")
        active.add(key)
        stack.append((node, True))
        for c in _children(node):
            if id(c) in active:
                raise YamlError(source, "an alias refers to a node that contains it (recursive document)")
            if id(c) not in memo:
                stack.append((c, False))
    return memo[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for kv in node.value for n in kv]
    return []


def loads(text: str, *, source: str = "<yaml>", limits: Limits = DEFAULT) -> Any:
    """Parse one YAML document from ``text`` within ``limits``; an empty document is None."""
    if len(text) > limits.max_bytes:
        raise YamlError(source, f"larger than {limits.max_bytes} bytes")
    loader = _Loader(text, limits, source)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_nodes(node, limits, source)
        return loader.construct_document(node)
    except YamlError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
        problem = " ".join(str(exc.problem or exc.context or "syntax error").split())[:120]
        raise YamlError(source, f"not valid YAML: {where}{problem}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise YamlError(source, f"not valid YAML: {' '.join(str(exc).split())[:120]}") from None
    finally:
        loader.dispose()


def load_file(path: str | os.PathLike[str], *, limits: Limits = DEFAULT) -> Any:
    """Read and parse a YAML file within ``limits`` (size checked before reading it all)."""
    p = pathlib.Path(path)
    source = str(p)[:200]
    try:
        size = p.stat().st_size
        if size > limits.max_bytes:
            raise YamlError(source, f"file is {size} bytes; at most {limits.max_bytes}")
        with p.open("rb") as f:
            raw = f.read(limits.max_bytes + 1)
    except OSError as exc:
        raise YamlError(source, f"cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlError(source, f"not UTF-8 text (byte {exc.start}); a job file is YAML text") from None
    if "\x00" in text:
        raise YamlError(source, "contains NUL bytes; a job file is YAML text")
    return loads(text, source=source, limits=limits)
