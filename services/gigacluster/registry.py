"""One registry for every pluggable policy family, with one error for an unknown name (no gRPC).

Families (each a :class:`Registry` defined next to its base class):

==========================  ==========================================  ============================
family (entry-point group)  registry                                    chosen by
==========================  ==========================================  ============================
``gigacluster.placement``   ``scheduler.placement.PLACEMENTS``          scheduler config ``placement``
``gigacluster.failures``    ``faults.table.TABLES``                     fault injector ``table``
``gigacluster.routing``     ``inference.policies.POLICIES``             a deployment's ``policy``
``gigacluster.collectives`` ``fabric.collectives.ALGORITHMS``           a collective's ``algo``
``gigacluster.collective_policies``  ``fabric.collectives.POLICIES``    ``plan_collective(policy=)``
``gigacluster.fabric_routing``  ``fabric.routing.ROUTING_MODES``        fabric config ``routing``
==========================  ==========================================  ============================

A policy gets in one of three ways, all ending in :meth:`Registry.register`:

* our code registers it where it is defined (``@PLACEMENTS.register("topology")``);
* a user's installed package declares an entry point in the family's group, named by the policy
  name, value ``mypkg.module:MyPolicy``; it is loaded the first time that name is asked for;
* a service config names it by import path, ``mypkg.module:MyPolicy``: the config loader imports
  it (:meth:`Registry.check` with ``allow_import=True``) and registers it under that path.

Only the config path may import by path: a name in a request (a deployment's routing policy, a
collective's algorithm) is looked up among registered and installed names only, so a caller can
never make a service import a module of its choice. See docs/extending.md.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar, overload

from gigacluster.errors import InvalidArgument
from gigacluster.model import SpecError

T = TypeVar("T")
MAX_NAME_CHARS = 64  # of an unknown name quoted back in an error


class UnknownName(SpecError):
    """A name no policy of the family is registered under; the message lists the allowed names.

    One class for every family. A model ``SpecError``, so an ``InvalidArgument`` (INVALID_ARGUMENT
    on the wire, the field named): code that catches either keeps working.
    """

    def __init__(self, field: str, family: str, name: str, allowed: list[str]) -> None:
        quoted = name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS] + "..."
        message = f"unknown {family} {quoted!r}; allowed: {', '.join(allowed)}"
        # both bases take (field, message); initialise them explicitly (their chains differ)
        Exception.__init__(self, f"{field}: {message}")
        self.message = f"{field}: {message}"
        self.reason = "INVALID_FIELD"
        self.metadata = {"field": field}
        self.field = field
        self.family = family
        self.allowed = allowed


class Registry(Mapping[str, T], Generic[T]):
    """Named objects of one family: built-ins, installed entry points, and config import paths.

    A read-only mapping (``name in reg``, ``reg[name]``, iteration over the allowed names) plus
    :meth:`register`, :meth:`lookup` (raises :class:`UnknownName`) and :meth:`check`.
    """

    def __init__(self, family: str, *, field: str, group: str, accepts: Callable[[Any], bool] = callable) -> None:
        self.family = family
        self.field = field
        self.group = group
        self.accepts = accepts  # what a policy loaded from outside must be (e.g. a subclass of the base)
        self._items: dict[str, T] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, obj: T) -> T: ...

    def register(self, name: str, obj: Any = None) -> Any:
        """Register ``obj`` under ``name`` (or, without ``obj``, return a decorator that does)."""
        if not name:
            raise ValueError(f"a {self.family} needs a non-empty name")

        def add(o: T) -> T:
            self._items[name] = o
            return o

        return add if obj is None else add(obj)

    def unregister(self, name: str) -> None:
        """Forget ``name`` (tests that register a temporary policy clean up with this)."""
        self._items.pop(name, None)

    def _entry_points(self) -> dict[str, importlib.metadata.EntryPoint]:
        return {ep.name: ep for ep in importlib.metadata.entry_points(group=self.group)}

    def _from_entry_point(self, name: str) -> T | None:
        ep = self._entry_points().get(name)
        if ep is None:
            return None
        obj: T = self._accepted(name, ep.load())
        self._items[name] = obj
        return obj

    def _accepted(self, name: str, obj: Any) -> T:
        if not self.accepts(obj):
            raise InvalidArgument(self.field, f"{name[:MAX_NAME_CHARS]!r} is not a {self.family} "
                                  f"(got {type(obj).__name__})")
        return obj  # type: ignore[no-any-return]

    def lookup(self, name: str) -> T:
        """The object registered (or installed as an entry point) under ``name``; else UnknownName."""
        obj = self._items.get(name)
        if obj is None and isinstance(name, str):
            obj = self._from_entry_point(name)
        if obj is None:
            raise UnknownName(self.field, self.family, str(name), self.names())
        return obj

    def check(self, name: str, *, allow_import: bool = False) -> str:
        """Validate ``name`` (loading an entry point, or with ``allow_import`` an import path
        ``pkg.module:Object``, which is then registered under that path); returns it."""
        if allow_import and ":" in name and name not in self._items:
            self.register(name, self._accepted(name, load_path(name, field=self.field, family=self.family)))
        self.lookup(name)
        return name

    def names(self) -> list[str]:
        """Every allowed name: registered ones, then installed entry points not loaded yet."""
        return sorted(self._items) + sorted(set(self._entry_points()) - set(self._items))

    def __getitem__(self, name: str) -> T:
        try:
            return self.lookup(name)
        except UnknownName as exc:
            raise KeyError(name) from exc

    def __contains__(self, name: object) -> bool:
        if name in self._items:
            return True
        return isinstance(name, str) and self._from_entry_point(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, {self.names()!r})"


FAMILIES: dict[str, str] = {
    "placement": "gigacluster.scheduler.placement:PLACEMENTS",
    "failures": "gigacluster.faults.table:TABLES",
    "routing": "gigacluster.inference.policies:POLICIES",
    "collectives": "gigacluster.fabric.collectives:ALGORITHMS",
    "collective_policies": "gigacluster.fabric.collectives:POLICIES",
    "fabric_routing": "gigacluster.fabric.routing_modes:ROUTING_MODES",
}
"""Every family: key (its entry-point group is ``gigacluster.<key>``) -> where its registry lives.
Imported on demand, so a service that checks its config pays only for the families it uses."""


def family(key: str) -> Registry[Any]:
    """The registry of family ``key`` (a key of :data:`FAMILIES`)."""
    reg: Registry[Any] = load_path(FAMILIES[key], field="family", family="registry")
    return reg


def check(key: str, name: str, *, allow_import: bool = True) -> str:
    """Validate ``name`` in family ``key`` at config load (an import path is imported and registered)."""
    return family(key).check(name, allow_import=allow_import)


def load_path(path: str, *, field: str, family: str) -> Any:
    """Import ``pkg.module:Object`` (``Object`` may be dotted); UnknownName-style errors name ``field``."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise InvalidArgument(field, f"a {family} import path is pkg.module:Object, got {path[:MAX_NAME_CHARS]!r}")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, SyntaxError, ValueError) as exc:
        raise InvalidArgument(field, f"cannot import {family} {path[:MAX_NAME_CHARS]!r}: {exc}") from exc
    return obj


__all__ = ["FAMILIES", "Registry", "UnknownName", "check", "family", "load_path"]
