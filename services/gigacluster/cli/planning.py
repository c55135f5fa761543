"""Placeholder: filled in by the owning work package."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    """Register no command yet."""
    del subparsers


def run(args: argparse.Namespace) -> int:
    return 0
