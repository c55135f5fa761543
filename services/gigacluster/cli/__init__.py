"""The ``gigacluster`` command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Protocol


class Main(Protocol):
    def __call__(self, argv: Sequence[str] | None = None) -> int: ...


def standalone(prog: str, doc: str | None, add_args: Callable[[argparse.ArgumentParser], None],
               run: Callable[[argparse.Namespace], int]) -> Main:
    """The ``main`` of a command module run as ``python -m gigacluster.cli.<module>``: a parser of its own
    with the same arguments and handler as the ``gigacluster`` subcommand."""

    def main(argv: Sequence[str] | None = None) -> int:
        p = argparse.ArgumentParser(prog=prog, description=(doc or "").splitlines()[0])
        add_args(p)
        return run(p.parse_args(argv))

    return main
