"""One structlog setup for every service: JSON lines (or console on a terminal), with the
service name bound into every line and request/job ids bound through contextvars."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(service: str, *, fmt: str = "json", level: str = "info") -> structlog.stdlib.BoundLogger:
    lvl = getattr(logging, level.upper(), logging.INFO)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service)
    return structlog.get_logger()


def get_logger(**bind: object) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger().bind(**bind)
