"""Storage: the small backend interface the engine uses, named SQL queries and migrations.

The engine sees only ``Store`` and ``Tx`` (``talaria.store.interface``); each backend lives in its
own module and is the only place its driver is imported.
"""
