"""Many runners in one process, for the benchmarks and load tests (``bench/dispatch.py``; scale.md 6 scenario 13):
each long-polls ``BASE/api/runner/v1/<id>/poll`` as one instance and answers every command at once with an empty
200 ``http`` result (no ``admit``, no Hermes; a failed post is tried three times, 30 s each). A failed poll (a
reset, a replica gone) is tried again after a short pause with the same instance, as a runner does. Each runner
has its own HTTP client (at most two connections), as a runner process has: one ``httpx`` pool of 1,000 long-polls
costs O(connections) on every request's start and end in ``httpcore``'s bookkeeping (O(idle x connections) once
answers wait to be read), which took the whole load's CPU on a busy machine, so answers were read and results
posted many seconds late (past a command's 30 s deadline).

    python -m talaria.testing.runner_load BASE_URL

Standard input: first one line, a JSON list of ``[runner id, token]``; then commands, one a line:

- ``report N``: wait until N commands arrived (at most 60 s), then print one JSON object: ``{marker: first
  arrival, ns since the epoch}``, a command's marker being its payload's ``search`` or, when that is empty, its
  runner's id (its first command only);
- end of input: stop.

Standard output: ``ready <runner id>`` after each runner's first answered poll, then the reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import sys
import time
import uuid
from typing import Any

import httpx

RETRY_S = 0.2
RESULT_ATTEMPTS = 3
REPORT_WAIT_S = 60.0


class Load:
    def __init__(self, base: str, runners: list[tuple[str, str]]) -> None:
        self.base = base.rstrip("/")
        self.runners = runners
        self.arrivals: dict[str, int] = {}
        self.arrived = asyncio.Event()
        self.tls = ssl.create_default_context()  # shared: httpx would load the CA bundle again for every client

    async def run_one(self, runner_id: str, token: str) -> None:
        limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)  # a poll, a result post
        async with httpx.AsyncClient(limits=limits, verify=self.tls) as client:
            await self.serve(client, runner_id, token)

    async def serve(self, client: httpx.AsyncClient, runner_id: str, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}", "X-Runner-Instance": str(uuid.uuid4()),
                   "X-Runner-Protocol": "1"}  # fmt: skip
        url = f"{self.base}/api/runner/v1/{runner_id}"
        epoch: str | None = None
        while True:
            try:
                answer = await client.get(url + "/poll", headers=headers, timeout=30)
                body: dict[str, Any] = answer.json() if answer.status_code == 200 else {}
            except (httpx.HTTPError, ValueError):
                body = {}
            if "epoch" not in body:
                await asyncio.sleep(RETRY_S)
                continue
            now = time.time_ns()
            if epoch is None:
                print(f"ready {runner_id}", flush=True)
            epoch = body["epoch"]
            for command in body.get("commands", []):
                marker = command.get("payload", {}).get("search") or runner_id
                self.arrivals.setdefault(marker, now)
                self.arrived.set()
                result = {"id": command["id"], "result": {"status": 200, "headers": {}, "body": ""}}
                for _ in range(RESULT_ATTEMPTS):  # as a runner retries its result; else it is delivered again
                    with contextlib.suppress(httpx.HTTPError):
                        await client.post(url + "/result", headers=headers | {"X-Runner-Epoch": epoch}, json=result,
                                          timeout=30)  # fmt: skip
                        break

    async def report(self, wanted: int) -> None:
        deadline = time.monotonic() + REPORT_WAIT_S
        while len(self.arrivals) < wanted and time.monotonic() < deadline:
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
        print(json.dumps(self.arrivals), flush=True)

    async def main(self) -> None:
        tasks = [asyncio.create_task(self.run_one(r, t)) for r, t in self.runners]
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            words = line.split()
            if words[:1] == ["report"]:
                await self.report(int(words[1]))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main() -> int:
    base = sys.argv[1]
    runners = [(str(r), str(t)) for r, t in json.loads(sys.stdin.readline())]
    asyncio.run(Load(base, runners).main())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
