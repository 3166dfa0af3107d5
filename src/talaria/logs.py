"""Structured logs: JSON lines on standard error, one event per line, never secrets."""

from __future__ import annotations

import logging
import os
import sys

import structlog


def configure_logging(level: str | None = None) -> None:
    name = (level or os.environ.get("TALARIA_LOG_LEVEL") or "INFO").upper()
    numeric = logging.getLevelNamesMapping().get(name, logging.INFO)
    logging.basicConfig(stream=sys.stderr, level=numeric, format="%(message)s")
    for noisy in ("httpx", "httpcore"):  # request lines would repeat what the access log says
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
