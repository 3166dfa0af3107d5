"""The Talaria runner: the execution transport on the Hermes computer (runner-protocol.md).

The runner stays light (DESIGN.md section 6): this package and what it imports use only the standard
library and pure-Python packages (httpx, websockets), never pydantic, FastAPI or a hub module.

- ``config``: runner.json and the per-field checks the hub reuses at registration;
- ``state_dir``: the state directory and its single-instance lock;
- ``receipts``: the local record of commands begun (dedupe, "uncertain") and of owned sessions;
- ``limits``: the runner's numeric limits.
"""
