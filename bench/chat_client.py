"""The measuring client of ``bench/chat.py`` (chat.md 10), run by it in a process of its own so that the hub's
process holds only the hub: it reads one JSON object on stdin, prints progress on stderr and one JSON object of raw
samples (seconds) as the last line of stdout.

- **direct**: turns in one Hermes session over Hermes' own ``/api/ws`` (``talaria.hermes.ws.HermesChannel``), timed
  from sending ``prompt.submit`` to the session's first non-empty ``message.delta`` and to its ``message.complete``;
- **hub**: turns in one conversation through the hub's JSON API and live stream, timed from sending ``POST
  …/turns`` to the turn's first non-empty ``message.delta`` event and to its ``turn.completed``, on a stream opened
  before the turn. Direct and hub turns alternate (which goes first alternates too), so drift moves both alike;
- **concurrent**: one turn in each of ``concurrent`` new conversations of ten accounts at once (bots on both
  sources), each timed from its ``POST`` to its terminal event; ``wall_s`` from the first ``POST`` to the last end.

Every reply is checked against the scripted text; a turn that does not complete stops the sequential phases. In the
concurrent phase it is reported with what the hub says of it: Hermes 0.19.0 sends no ``message.complete`` after an
``error`` event such as ``agent initialization timed out`` (its agent build waits at most 30 s), so a turn whose
``Hermes reported an error`` message came is given ``ERROR_GRACE_S`` more to end, others ``TURN_TIMEOUT_S`` in all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from typing import Any

import httpx

from talaria.hermes.ws import HermesChannel

TERMINAL = ("turn.completed", "turn.failed", "turn.interrupted", "turn.uncertain")
TURN_TIMEOUT_S = 300.0
HERMES_ERROR = "Hermes reported an error: "  # the system message of Hermes' error event (chat.md 4.3)
ERROR_GRACE_S = 10.0  # how long a turn may still take to end after Hermes' error event
SETTLE_S = 0.1  # untimed, before every sequential turn: the previous turn's after-work (either kind) is over


def progress(text: str) -> None:
    print(f"[chat] {text}", file=sys.stderr, flush=True)


def phase(name: str) -> None:
    """Tell ``bench/chat.py`` (a line on stdout) that a phase begins, so that it can read the processes' CPU time."""
    print(f"phase {name}", flush=True)


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


class Log:
    """Events in arrival order, each ``(perf_counter, kind, data)``; ``wait`` for one after an index."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self._changed = asyncio.Event()
        self.failure: BaseException | None = None

    def add(self, kind: str, data: dict[str, Any]) -> None:
        self.events.append((time.perf_counter(), kind, data))
        self._changed.set()

    def fail(self, exc: BaseException) -> None:
        self.failure = exc
        self._changed.set()

    def find(self, start: int, match: Any) -> tuple[int, float, str, Any] | None:
        """The first event at index >= ``start`` for which ``match(kind, data)`` is true: (index, time, kind, data)."""
        for index in range(start, len(self.events)):
            at, kind, data = self.events[index]
            if match(kind, data):
                return index, at, kind, data
        return None

    def found(self, start: int, match: Any, what: str) -> tuple[int, float, str, Any]:
        hit = self.find(start, match)
        if hit is None:
            raise RuntimeError(f"no {what} among the turn's events")
        return hit

    async def wait(self, start: int, match: Any, timeout: float = TURN_TIMEOUT_S) -> tuple[int, float, str, Any]:
        """``find``, waiting at most ``timeout`` seconds for the event to arrive (``TimeoutError``)."""
        async with asyncio.timeout(timeout):
            while True:
                hit = self.find(start, match)
                if hit is not None:
                    return hit
                start = len(self.events)
                if self.failure is not None:
                    raise RuntimeError(f"the event source ended: {self.failure!r}")
                self._changed.clear()  # no await since the scan: no event can slip in between
                await self._changed.wait()


class Direct:
    """One Hermes session on Hermes' own ``/api/ws``."""

    def __init__(self, channel: HermesChannel, log: Log, session_id: str) -> None:
        self.channel, self.log, self.session_id = channel, log, session_id

    @classmethod
    async def open(cls, url: str, token: str) -> Direct:
        log = Log()

        def on_event(params: dict[str, Any]) -> None:
            payload = params.get("payload")
            log.add(str(params.get("type")), {"session_id": params.get("session_id"),
                                              "payload": payload if isinstance(payload, dict) else {}})  # fmt: skip

        def on_lost() -> None:
            log.fail(ConnectionError("Hermes closed /api/ws"))

        channel = await HermesChannel.connect(url, ("token", token), on_event=on_event, on_lost=on_lost)
        created = await channel.request("session.create", {"close_on_disconnect": True})
        return cls(channel, log, str(created["session_id"]))

    def _mine(self, kind: str, data: dict[str, Any], *kinds: str) -> bool:
        return kind in kinds and data["session_id"] == self.session_id

    async def turn(self, text: str, expected: str) -> tuple[float, float]:
        """(first token s, turn s); then waits, untimed, for the end-of-turn ``session.info`` (at most 1 s)."""
        start = len(self.log.events)
        started = time.perf_counter()
        await self.channel.request("prompt.submit", {"session_id": self.session_id, "text": text})
        ending = await self.log.wait(start, lambda k, d: self._mine(k, d, "message.complete", "error"))
        end, finished, kind, data = ending
        payload = data["payload"]
        if kind == "error":
            raise RuntimeError(f"Hermes reported an error in a direct turn: {payload.get('message')}")
        if payload.get("status", "complete") != "complete" or payload.get("text") != expected:
            raise RuntimeError(f"a direct turn ended {payload.get('status')!r} or with another text")
        _, first, _, _ = self.log.found(
            start, lambda k, d: self._mine(k, d, "message.delta") and bool(d["payload"].get("text")), "delta"
        )
        with contextlib.suppress(TimeoutError):
            await self.log.wait(end, lambda k, d: self._mine(k, d, "session.info"), timeout=1.0)
        return first - started, finished - started

    async def close(self) -> None:
        await self.channel.close()


class Account:
    """A signed-in account of the JSON API (Origin and CSRF token sent), with its conversations' streams."""

    def __init__(self, client: httpx.AsyncClient, username: str) -> None:
        self.client, self.username = client, username
        self.bots: dict[str, str] = {}  # source -> bot id
        self.streams: dict[str, Stream] = {}

    @classmethod
    async def login(cls, hub_url: str, username: str, password: str) -> Account:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        client = httpx.AsyncClient(base_url=hub_url, headers={"Origin": hub_url}, timeout=30, limits=limits)
        answer = await client.post("/api/auth/login", json={"username": username, "password": password})
        answer.raise_for_status()
        client.headers["X-CSRF-Token"] = answer.json()["csrfToken"]
        return cls(client, username)

    async def bot(self, source: str) -> str:
        if source not in self.bots:
            answer = await self.client.post("/api/bots", json={"name": f"Bench {source}", "source": source,
                                                               "profile": "default"})  # fmt: skip
            if answer.status_code != 201:
                raise RuntimeError(f"POST /api/bots answered {answer.status_code}: {answer.text}")
            self.bots[source] = answer.json()["bot"]["id"]
        return self.bots[source]

    async def conversation(self, source: str) -> str:
        """A new conversation with this account's bot on ``source``, its live stream open."""
        answer = await self.client.post("/api/conversations", json={"botId": await self.bot(source)})
        if answer.status_code != 201:
            raise RuntimeError(f"POST /api/conversations answered {answer.status_code}: {answer.text}")
        conversation_id: str = answer.json()["conversation"]["id"]
        stream = self.streams[conversation_id] = Stream(self.client, conversation_id)
        await asyncio.wait_for(stream.opened.wait(), 30)
        return conversation_id

    async def turn(self, conversation_id: str, text: str, expected: str) -> dict[str, Any]:
        """One turn: ``{turnId, triggerMessageId, state, first_s, turn_s, started, ended}`` (perf_counter times)."""
        log = self.streams[conversation_id].log
        start = len(log.events)
        started = time.perf_counter()
        answer = await self.client.post(f"/api/conversations/{conversation_id}/turns", json={"text": text})
        if answer.status_code != 202:
            raise RuntimeError(f"POST …/turns answered {answer.status_code}: {answer.text}")
        turn = answer.json()["turn"]
        turn_id: str = turn["id"]
        outcome: dict[str, Any] = {"turnId": turn_id, "triggerMessageId": turn["triggerMessageId"], "first_s": None,
                                   "turn_s": None, "started": started, "ended": None, "hub_ms": None}  # fmt: skip

        def of_turn(kind: str, data: dict[str, Any]) -> bool:
            return data.get("turnId") == turn_id or (data.get("turn") or {}).get("id") == turn_id

        def terminal(kind: str, data: dict[str, Any]) -> bool:
            return kind in TERMINAL and of_turn(kind, data)

        def hermes_error(kind: str, data: dict[str, Any]) -> bool:
            message = data.get("message") or {}
            return (
                kind == "message.complete"
                and of_turn(kind, data)
                and message.get("role") == "system"
                and str(message.get("content")).startswith(HERMES_ERROR)
            )

        error = ""
        try:
            _, ended, kind, data = await log.wait(start, lambda k, d: terminal(k, d) or hermes_error(k, d))
            if kind == "message.complete":  # Hermes may send no message.complete after its error event
                error = f"; {data['message']['content']}"
                _, ended, kind, data = await log.wait(start, terminal, timeout=ERROR_GRACE_S)
        except TimeoutError:
            stored = (await self.client.get(f"/api/conversations/{conversation_id}/turns/{turn_id}")).json()["turn"]
            return outcome | {"state": f"no end event (the hub: {stored['state']}{error})"}
        stored = data["turn"]  # the hub's own times (ms): accepted, submit record, end
        outcome |= {"state": kind.split(".")[1], "turn_s": ended - started, "ended": ended,
                    "hub_ms": [stored["createdAt"], stored["submittedAt"], stored["finishedAt"]]}  # fmt: skip
        if kind != "turn.completed":
            return outcome
        _, _, _, final = log.found(
            start, lambda k, d: k == "message.complete" and of_turn(k, d) and d["message"]["final"], "final reply"
        )
        if final["message"]["content"] != expected:
            outcome["state"] = "wrong_reply"
        _, first, _, _ = log.found(
            start, lambda k, d: k == "message.delta" and of_turn(k, d) and bool(d.get("text")), "delta"
        )
        outcome["first_s"] = first - started
        return outcome

    async def close_streams(self) -> None:
        for stream in self.streams.values():
            stream.task.cancel()
        await asyncio.gather(*(s.task for s in self.streams.values()), return_exceptions=True)
        self.streams.clear()

    async def close(self) -> None:
        await self.close_streams()
        await self.client.aclose()


class Stream:
    """A conversation's live stream (chat.md 4), read by a task into a ``Log``."""

    def __init__(self, client: httpx.AsyncClient, conversation_id: str) -> None:
        self.log = Log()
        self.opened = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._read(client, f"/api/conversations/{conversation_id}"))

    async def _read(self, client: httpx.AsyncClient, url: str) -> None:
        try:
            async with client.stream("GET", url + "/events", timeout=httpx.Timeout(30, read=None)) as answer:
                if answer.status_code != 200:
                    raise RuntimeError(f"GET …/events answered {answer.status_code}")
                self.opened.set()
                kind = ""
                async for line in answer.aiter_lines():
                    if line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: "):
                        self.log.add(kind, json.loads(line[6:]))
                        kind = ""
            raise ConnectionError("the live stream ended")
        except Exception as exc:
            self.log.fail(exc)
            raise


async def sequential(config: dict[str, Any], direct: Direct, owner: Account, conversation_id: str) -> dict[str, Any]:
    expected = config["reply"]
    samples: dict[str, dict[str, list[Any]]] = {
        "direct": {"first": [], "turn": []},
        "hub": {"first": [], "turn": [], "at": []},
    }

    async def one_direct(index: int) -> None:
        await asyncio.sleep(SETTLE_S)
        first, turn = await direct.turn(f"direct turn {index}\n[bench-direct:{index}]", expected)
        samples["direct"]["first"].append(first)
        samples["direct"]["turn"].append(turn)

    async def one_hub(index: int) -> None:
        await asyncio.sleep(SETTLE_S)
        outcome = await owner.turn(conversation_id, f"hub turn {index}", expected)
        if outcome["state"] != "completed" or None in outcome["hub_ms"]:
            raise RuntimeError(f"a hub turn ended {outcome['state']}")
        samples["hub"]["first"].append(outcome["first_s"])
        samples["hub"]["turn"].append(outcome["turn_s"])
        samples["hub"]["at"].append(outcome["hub_ms"])

    for index in range(config["turns"]):
        order = (one_direct, one_hub) if index % 2 == 0 else (one_hub, one_direct)
        for step in order:
            await step(index)
        d, h = samples["direct"], samples["hub"]
        progress(f"turn {index + 1}/{config['turns']}: direct {d['first'][-1]:.3f}/{d['turn'][-1]:.3f} s, "
                 f"hub {h['first'][-1]:.3f}/{h['turn'][-1]:.3f} s (first token/turn)")  # fmt: skip
    marks = samples["hub"].pop("at")
    progress(f"hub turns, the hub's own times: accepted to submit record p50 "
             f"{median([b - a for a, b, _ in marks]):.0f} ms, submit record to end p50 "
             f"{median([c - b for _, b, c in marks]):.0f} ms")  # fmt: skip
    return samples


async def concurrent(config: dict[str, Any], accounts: list[Account]) -> dict[str, Any]:
    count, sources, expected = config["concurrent"], config["sources"], config["reply"]
    # round r gives account j a bot on source (j + r) mod 2: every account on both, the runners evenly loaded
    places = [(accounts[k % len(accounts)], sources[(k + k // len(accounts)) % len(sources)]) for k in range(count)]
    for account, source in places:  # one bot per account and source, made one at a time (names are unique)
        await account.bot(source)
    conversations = await asyncio.gather(*(account.conversation(source) for account, source in places))
    progress(f"{count} conversations of {len(accounts)} accounts on {len(sources)} runners, streams open; all at once")
    phase("concurrent")
    done = 0

    async def one(k: int) -> dict[str, Any]:
        nonlocal done
        account, source = places[k]
        text = f"concurrent turn {k} of {account.username} on {source}"
        try:
            outcome = await account.turn(conversations[k], text, expected)
        except Exception as exc:  # reported as not completed, with the others still measured
            outcome = {"state": f"error: {exc!r}"[:200], "turn_s": None, "started": None, "ended": None}
        outcome |= {"text": text, "source": source}
        done += 1
        if done % max(1, count // 5) == 0 or done == count:
            progress(f"concurrent: {done}/{count} turns ended")
        return outcome

    turns = await asyncio.gather(*(one(k) for k in range(count)))
    phase("end")
    for turn in turns:
        if turn["state"] != "completed":
            progress(f"concurrent turn {turn.get('turnId')} on {turn['source']}: {turn['state']}")
    marks = [t["hub_ms"] for t in turns if t.get("hub_ms") and None not in t["hub_ms"]]
    if marks:
        to_submit = [b - a for a, b, _ in marks]
        submitted = [c - b for _, b, c in marks]
        progress(f"concurrent, the hub's own times: accepted to submit record p50 {median(to_submit):.0f} ms "
                 f"(max {max(to_submit)}), submit record to end p50 {median(submitted):.0f} ms "
                 f"(max {max(submitted)})")  # fmt: skip
    starts = [t["started"] for t in turns if t["started"] is not None]
    ends = [t["ended"] for t in turns if t["ended"] is not None]
    wall = max(ends) - min(starts) if starts and ends else None
    return {"turns": turns, "wall_s": wall}


async def run(config: dict[str, Any]) -> dict[str, Any]:
    logins = (Account.login(config["hub_url"], name, config["password"]) for name in config["accounts"])
    accounts = list(await asyncio.gather(*logins))
    direct = await Direct.open(config["hermes_url"], config["hermes_token"])
    try:
        owner = accounts[0]
        sources = config["sources"]
        conversations = [await owner.conversation(source) for source in sources]
        conversation_id = conversations[0]
        progress("warm-up, at once: one direct turn, one hub turn on each runner (each new session builds its agent)")

        async def warm_up(target: str, source: str) -> None:
            outcome = await owner.turn(target, f"warm-up on {source}", config["reply"])
            if outcome["state"] != "completed":
                raise RuntimeError(f"the warm-up turn on {source} ended {outcome['state']}")

        await asyncio.gather(direct.turn("warm-up\n[bench-direct:warm-up]", config["reply"]),
                             *(warm_up(c, s) for c, s in zip(conversations, sources, strict=True)))  # fmt: skip
        phase("sequential")
        samples = await sequential(config, direct, owner, conversation_id)
        phase("setup")
        for account in accounts:  # the sequential streams are not needed any more (8 per account at most)
            await account.close_streams()
        samples["concurrent"] = await concurrent(config, accounts)
    finally:
        await direct.close()
        for account in accounts:
            await account.close()
    return samples


def main() -> int:
    config = json.loads(sys.stdin.readline())
    print(json.dumps(asyncio.run(run(config))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
