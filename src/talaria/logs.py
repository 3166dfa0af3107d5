"""Structured logs: JSON lines on standard error, one event per line, never secrets.

structlog events and standard-library records (uvicorn's) go through one JSON formatter, so
every line of the hub's log has the same shape.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

_SHARED: list[structlog.types.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def configure_logging(level: str | None = None, *, to_stderr: bool = True) -> None:
    """JSON lines on standard error; ``to_stderr=False`` leaves the root handlers alone (tests let
    pytest capture the records)."""
    name = (level or os.environ.get("TALARIA_LOG_LEVEL") or "INFO").upper()
    numeric = logging.getLevelNamesMapping().get(name, logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    root = logging.getLogger()
    if to_stderr:
        root.handlers = [handler]
    root.setLevel(numeric)
    for noisy in ("httpx", "httpcore"):  # request lines would repeat what the access log says
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
    for uvicorn_logger in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(uvicorn_logger).handlers = []
        logging.getLogger(uvicorn_logger).propagate = True
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        cache_logger_on_first_use=True,
    )
