"""Chat's limits at their edges under concurrent load (issue 17 part 5; chat.md 7): many requests for the same limit
sent at once, from several accounts, to one SQLite hub and to two PostgreSQL replicas of one database (alternately,
so the limit is counted cluster-wide, scale.md 3.7). Each limit admits exactly up to its edge, refuses the rest with
its documented code, and every accepted request is stored while no refused one is: the totals a user can count.

The node is registered but never connected, so an accepted turn stays live (``pending``) for the whole test.
The runner limits under load are test_runner_limits_under_load.py's, team tools' test_team_limits_under_load.py's,
slow clients test_slow_clients.py's and test_slow_readers.py's."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria import limits
from talaria.settings import Settings
from tests.backends import BACKENDS, raw_sql
from tests.conftest import add_account, login
from tests.integration.front_back_support import FrontBack, front_and_back
from tests.integration.machine_load_support import THREADS, at_once, codes
from tests.integration.runner_support import wait_until

pytestmark = pytest.mark.usefixtures("fast_argon2")

PER_HUB = 10  # chat.per_hub, small enough to reach with a few accounts
PER_ACCOUNT = Settings().chat_per_account  # 8
PEOPLE = ("uma", "ulf", "ada")


@dataclass
class Load:
    """Signed-in people on both hubs (index 0 the front, 1 the back): ``call`` sends request ``i`` through hub ``i %
    2`` on a connection of its own, so concurrent requests really are concurrent."""

    hubs: FrontBack
    clients: dict[str, tuple[httpx.Client, httpx.Client]] = field(default_factory=dict)

    def client(self, who: str, i: int) -> httpx.Client:
        return self.clients[who][i % 2]

    def call(self, who: str, i: int, method: str, path: str, **kwargs: Any) -> httpx.Response:
        client = self.client(who, i)
        with httpx.Client(base_url=client.base_url, headers=client.headers, cookies=client.cookies, timeout=60) as one:
            return one.request(method, path, **kwargs)

    def listed(self, who: str, path: str, key: str) -> list[dict[str, Any]]:
        """Every item of a paged list of ``who``'s."""
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = self.client(who, 1).get(path, params={"limit": 100} | ({"cursor": cursor} if cursor else {}))
            assert page.status_code == 200, page.text
            found += page.json()[key]
            if not (cursor := page.json()["nextCursor"]):
                return found

    def bot(self, who: str) -> str:
        made = self.client(who, 0).post("/api/bots", json={"name": "Helper", "source": "local", "profile": "default"})
        assert made.status_code == 201, made.text
        bot_id: str = made.json()["bot"]["id"]
        return bot_id

    def conversations(self, who: str, n: int) -> list[str]:
        bot_id = self.bot(who)
        made = [self.client(who, 0).post("/api/conversations", json={"botId": bot_id}) for _ in range(n)]
        assert all(answer.status_code == 201 for answer in made), [answer.text for answer in made]
        return [answer.json()["conversation"]["id"] for answer in made]


@pytest.fixture(params=BACKENDS)
def load(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Load]:
    with front_and_back(request, tmp_path, chat_per_hub=PER_HUB) as hubs:
        made = Load(hubs)
        try:
            for name in ("root", *PEOPLE):
                add_account(hubs.front, name, "admin" if name == "root" else "user",
                            allowed_profiles={"local": ["default"]})  # fmt: skip
                front = login(hubs.front, name)
                made.clients[name] = (front, hubs.moved(front))
            node = {"name": "node", "source": "local", "allowedProfiles": ["default"]}
            registered = made.client("root", 0).post("/api/admin/runners", json=node)
            assert registered.status_code == 201, registered.text
            yield made
        finally:
            for pair in made.clients.values():
                for client in pair:
                    client.close()


def refused_as(answers: list[httpx.Response], allowed: set[tuple[int, str]]) -> None:
    """Every refusal among ``answers`` is one of ``allowed`` (a 429 with ``Retry-After``)."""
    for answer in answers:
        if answer.status_code >= 300:
            assert (answer.status_code, answer.json()["code"]) in allowed, answer.text
            assert answer.status_code != 429 or answer.headers.get("Retry-After"), answer.headers


def live_turns(load: Load, who: str, conversations: list[str]) -> dict[str, int]:
    """Per conversation: its stored user messages, and 1 when it has a live turn (each must equal the other)."""
    found: dict[str, int] = {}
    for conversation_id in conversations:
        page = load.client(who, 1).get(f"/api/conversations/{conversation_id}/messages").json()
        users = sum(1 for message in page["messages"] if message["role"] == "user")
        assert users == (1 if page["liveTurn"] else 0), (conversation_id, users, page["liveTurn"])
        found[conversation_id] = users
    return found


def turns(load: Load, who: str, conversations: list[str], each: int) -> list[Callable[[], httpx.Response]]:
    return [lambda c=c, i=i: load.call(who, i, "POST", f"/api/conversations/{c}/turns", json={"text": f"go {i}"})
            for c in conversations for i in range(each)]  # fmt: skip


def test_live_turns_stop_at_one_per_conversation_the_account_limit_and_the_hub_limit(load: Load) -> None:
    uma, ulf, ada = (load.conversations(who, n) for who, n in (("uma", 10), ("ulf", 4), ("ada", 2)))
    # uma alone: 30 turns into 10 conversations at once; her 8 (chat.per_account) are admitted, one per conversation
    first = at_once(turns(load, "uma", uma, 3))
    refused_as(first, {(409, "turn_in_progress"), (429, "chat_turn_limit")})
    assert codes(first)[(202, "")] == PER_ACCOUNT == sum(live_turns(load, "uma", uma).values())
    # then everyone at once: the hub's 10 (chat.per_hub) fill with 2 of ulf's and ada's; uma stays at her 8
    second = at_once(turns(load, "uma", uma, 2) + turns(load, "ulf", ulf, 3) + turns(load, "ada", ada, 3))
    refused_as(second, {(409, "turn_in_progress"), (429, "chat_turn_limit"), (429, "chat_busy")})
    assert codes(second)[(202, "")] == PER_HUB - PER_ACCOUNT
    assert sum(live_turns(load, "uma", uma).values()) == PER_ACCOUNT
    assert (
        sum(live_turns(load, "ulf", ulf).values()) + sum(live_turns(load, "ada", ada).values()) == PER_HUB - PER_ACCOUNT
    )
    assert codes(second)[(429, "chat_busy")] > 0, "the hub's limit was reached"


def test_bots_stop_at_the_limit_per_account_and_a_name_is_taken_once(load: Load) -> None:
    names = [f"Bot {i:03}" for i in range(limits.MAX_LIVE_BOTS + 4)] + ["Bot 000"] * 3

    def create(who: str, i: int, name: str) -> Callable[[], httpx.Response]:
        return lambda: load.call(who, i, "POST", "/api/bots", json={"name": name, "source": "local",
                                                                    "profile": "default"})  # fmt: skip

    answers = at_once([create("uma", i, name) for i, name in enumerate(names)]
                      + [create("ulf", i, f"Mine {i}") for i in range(10)])  # fmt: skip
    uma, ulf = answers[: len(names)], answers[len(names) :]
    refused_as(uma, {(409, "bot_limit"), (409, "duplicate_bot_name")})
    assert codes(uma)[(201, "")] == limits.MAX_LIVE_BOTS
    assert codes(ulf) == Counter({(201, ""): 10})
    made = {answer.json()["bot"]["id"] for answer in uma if answer.status_code == 201}
    stored = load.listed("uma", "/api/bots", "bots")
    assert {bot["id"] for bot in stored} == made and len({bot["name"] for bot in stored}) == len(stored)
    assert len(load.listed("ulf", "/api/bots", "bots")) == 10


def test_conversations_stop_at_the_limit_per_account(load: Load) -> None:
    uma_bot, ulf_bot = load.bot("uma"), load.bot("ulf")

    def create(who: str, i: int, bot_id: str) -> Callable[[], httpx.Response]:
        return lambda: load.call(who, i, "POST", "/api/conversations", json={"botId": bot_id})

    over = limits.MAX_LIVE_CONVERSATIONS + 5
    answers = at_once([create("uma", i, uma_bot) for i in range(over)]
                      + [create("ulf", i, ulf_bot) for i in range(5)])  # fmt: skip
    uma, ulf = answers[:over], answers[over:]
    refused_as(uma, {(409, "conversation_limit")})
    assert codes(uma) == Counter({(201, ""): limits.MAX_LIVE_CONVERSATIONS, (409, "conversation_limit"): 5})
    assert codes(ulf) == Counter({(201, ""): 5})
    made = {answer.json()["conversation"]["id"] for answer in uma if answer.status_code == 201}
    assert {c["id"] for c in load.listed("uma", "/api/conversations", "conversations")} == made


def test_unsent_attachments_stop_at_the_limit_per_conversation(load: Load) -> None:
    conversations = load.conversations("uma", 2) + load.conversations("ulf", 1)
    owners = ["uma", "uma", "ulf"]

    def upload(who: str, conversation_id: str, i: int) -> Callable[[], httpx.Response]:
        return lambda: load.call(who, i, "POST", f"/api/conversations/{conversation_id}/attachments",
                                 params={"name": f"note-{i}.txt"}, content=b"note %d" % i,
                                 headers={"Content-Type": "text/plain"})  # fmt: skip

    over = limits.MAX_UNSENT_ATTACHMENTS + 4
    answers = at_once([upload(who, c, i) for who, c in zip(owners, conversations, strict=True)
                       for i in range(over)])  # fmt: skip
    stored = raw_sql(load.hubs.back.settings, "SELECT id, conversation_id FROM chat_attachment")
    for n, conversation_id in enumerate(conversations):
        mine = answers[n * over : (n + 1) * over]
        assert codes(mine) == Counter({(201, ""): limits.MAX_UNSENT_ATTACHMENTS, (409, "attachment_limit"): 4})
        made = {answer.json()["attachment"]["id"] for answer in mine if answer.status_code == 201}
        assert {row["id"] for row in stored if row["conversation_id"] == conversation_id} == made


class OpenStream:
    """A conversation's event stream held open on a connection of its own, until ``close`` drops the connection."""

    def __init__(self, client: httpx.Client, conversation_id: str) -> None:
        self._client = httpx.Client(base_url=client.base_url, headers=client.headers, cookies=client.cookies,
                                    timeout=httpx.Timeout(10, read=60))  # fmt: skip
        request = self._client.build_request("GET", f"/api/conversations/{conversation_id}/events")
        self._response = self._client.send(request, stream=True)
        self.status = self._response.status_code
        self.code = "" if self.status == 200 else str(json.loads(self._response.read())["code"])

    def close(self) -> None:
        self._response.close()
        self._client.close()


def test_event_streams_stop_at_the_limit_per_account_and_free_their_slots(load: Load) -> None:
    [uma], [ulf] = load.conversations("uma", 1), load.conversations("ulf", 1)
    top = limits.MAX_CHAT_STREAMS_PER_ACCOUNT
    wanted = [("uma", i, uma) for i in range(top + 3)] + [("ulf", i, ulf) for i in range(top)]
    with ThreadPoolExecutor(THREADS) as pool:
        opening = [pool.submit(OpenStream, load.client(who, i), conversation) for who, i, conversation in wanted]
    streams = [future.result() for future in opening if future.exception() is None]
    try:
        assert len(streams) == len(wanted), [future.exception() for future in opening]
        assert Counter((s.status, s.code) for s in streams[: top + 3]) == Counter(
            {(200, ""): top, (429, "chat_stream_limit"): 3}
        )
        assert [s.status for s in streams[top + 3 :]] == [200] * top
    finally:
        for stream in streams:
            stream.close()

    def reopened() -> bool:  # a dropped connection gives its slot back: uma opens her 8 again, on both hubs
        again = [OpenStream(load.client("uma", i), uma) for i in range(top)]
        for stream in again:
            stream.close()
        return all(s.status == 200 for s in again)

    wait_until(reopened, timeout=30, what="uma's stream slots to be free again")
