"""Run the Hermes protocol fixture as its own process (the demo and the dispatch benchmark use it).

    python -m talaria.testing.fixture_process [--profiles default,work]

Prints ``<url> <session token>`` on one line once it serves, then runs until SIGTERM or SIGINT.
The token is for the runner started beside it (``HERMES_DASHBOARD_SESSION_TOKEN``), never for logs.
"""

from __future__ import annotations

import argparse
import signal
import threading

from talaria.testing.hermes_fixture import HermesFixture


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profiles", default="default", help="comma-separated Hermes profile names")
    args = parser.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with HermesFixture(profiles=[p for p in args.profiles.split(",") if p]) as hermes:
        print(hermes.url, hermes.session_token, flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
