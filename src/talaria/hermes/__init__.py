"""The Hermes client used by the runner: authentication negotiation, REST, and the /api/ws channel.

Standard library, httpx and websockets only (the runner stays light). Credentials never leave the
machine: not to the hub, not into logs, errors or receipts.
"""
