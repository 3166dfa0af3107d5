"""How long each store transaction took, and whether the store was unavailable (operations.md 5.1): the hub's
metrics observe every ``read()`` and ``write()`` of either backend through ``Store.observe``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from talaria.errors import StoreUnavailable

# (mode: "read" or "write", seconds from asking to the end, whether it ended in StoreUnavailable)
TransactionObserver = Callable[[str, float, bool], None]


@contextmanager
def timed(observe: TransactionObserver | None, mode: str) -> Iterator[None]:
    if observe is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    except StoreUnavailable:
        observe(mode, time.perf_counter() - started, True)
        raise
    observe(mode, time.perf_counter() - started, False)
