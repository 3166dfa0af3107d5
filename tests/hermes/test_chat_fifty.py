"""Fifty chat turns at once (chat.md 9, scenario 14): ten accounts x five conversations on two sources, ``local`` and
``lab``, each with its own real ``hermes serve`` and registered ``talaria runner`` process, behind a ``talaria hub``
process; every account may use ``local:default`` and ``lab:default`` and has a bot on each. After one warm-up turn
on each Hermes, all 50 ``POST …/turns`` go at once, each conversation's stream open before: 50 ``turn.completed``,
every reply the scripted one, each turn's run marker in exactly one of the model's turn requests. The hub runs at
most ``chat.per_runner`` (here 8) turns per runner and the others wait ``busy`` (chat.md 5.3 step 2), which also
keeps each Hermes from building 25 agents at once on a shared machine. Then ``audit verify`` passes and no message
text is in the audit table or the logs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.testing.model_server import ModelServer, reply, when
from talaria.testing.real_hermes import RealHermes
from tests.hermes.chat_support import (
    Stream,
    assert_text_kept_out,
    audit_verifies,
    ended,
    make_bot,
    send,
    start_chat,
    wait_turn,
)
from tests.hermes.site_support import create_user, register_node, sign_in
from tests.integration.cli_support import HubProcess, clean_env, free_port
from tests.integration.runner_support import RunnerProcess

SOURCES = ("local", "lab")
ACCOUNTS = tuple(f"user{index:02d}" for index in range(10))
PER_ACCOUNT = 5
PER_RUNNER = 8
REPLY = "".join(f"[fifty chunk {i:02d}]" for i in range(12))
# Hermes' background memory and skill reviews (more model calls after every 10th user turn) are turned off
QUIET_HERMES = "memory:\n  nudge_interval: 0\nskills:\n  creation_nudge_interval: 0\n"
TURN_TIMEOUT_S = 240
TERMINAL = ("turn.completed", "turn.failed", "turn.interrupted", "turn.uncertain")


@dataclass
class Fifty:
    """The hub process, its data directory, one runner process per source, and the signed-in accounts."""

    data: Path
    url: str
    hub: HubProcess
    runners: dict[str, RunnerProcess]
    accounts: dict[str, httpx.Client]

    def logs(self) -> list[str]:
        return [self.hub.stderr()] + [text for r in self.runners.values() for text in (r.stdout, r.stderr)]


@pytest.fixture
def fifty(tmp_path: Path, model: ModelServer, hermes_executable: Path) -> Iterator[Fifty]:
    with ExitStack() as stack:
        hermes = {source: RealHermes(tmp_path / f"hermes-{source}", model.base_url, config_extra=QUIET_HERMES)
                  for source in SOURCES}  # fmt: skip
        for process in hermes.values():
            stack.callback(process.stop)
        data, url = tmp_path / "data", f"http://127.0.0.1:{free_port()}"
        allowed = tuple(f"{source}:default" for source in SOURCES)
        create_user(data, ACCOUNTS[0], "user", allowed)  # makes the data directory
        with ThreadPoolExecutor(4) as pool:  # the other accounts only add rows, side by side
            starting = [pool.submit(process.start) for process in hermes.values()]
            for done in [*starting, *(pool.submit(create_user, data, name, "user", allowed) for name in ACCOUNTS[1:])]:
                done.result()
        configs = {source: register_node(tmp_path, url, hermes[source], f"{source}-node", source=source)
                   for source in SOURCES}  # fmt: skip
        env = clean_env(TALARIA_CHAT_PER_RUNNER=str(PER_RUNNER))
        hub = HubProcess(tmp_path, ["--data-dir", str(data), "--port", url.rsplit(":", 1)[1]], env)
        stack.callback(hub.close)
        hub.ready()
        runners = {}
        for source, config in configs.items():
            runners[source] = RunnerProcess(config, tmp_path / "logs", name=f"runner-{source}")
            stack.callback(runners[source].close)
        with ThreadPoolExecutor(len(ACCOUNTS)) as pool:  # argon2 checks while the runners connect
            signing_in = {name: pool.submit(sign_in, url, name) for name in ACCOUNTS}
            for runner in runners.values():
                runner.wait_for("runner connected", timeout=30)
            accounts = {name: future.result() for name, future in signing_in.items()}
        for client in accounts.values():
            stack.callback(client.close)
        yield Fifty(data, url, hub, runners, accounts)


def _overlap(turns: list[dict[str, Any]]) -> int:
    """The most turns between their submit record and their end at one moment (an end before a start at the same
    millisecond: the slot was given back first)."""
    points = sorted([(t["finishedAt"], -1) for t in turns] + [(t["submittedAt"], 1) for t in turns])
    most = live = 0
    for _, step in points:
        live += step
        most = max(most, live)
    return most


def test_fifty_turns_at_once_on_two_runners_all_complete_and_the_model_sees_each_prompt_once(
    fifty: Fifty, model: ModelServer
) -> None:
    model.script(when(None, reply(REPLY, first_byte_delay_s=0.02, chunk_delay_s=0.01, chunk_chars=16)))
    bots = {name: {source: make_bot(fifty.accounts[name], f"Helper {source}", source=source) for source in SOURCES}
            for name in ACCOUNTS}  # fmt: skip
    # one turn on each Hermes first: a fresh hermes serve whose first model calls run at once may fail some of them
    # inside Hermes (PydanticUserError while it builds its response classes) and retry them, a model request more
    warm_up = {source: start_chat(fifty.accounts[ACCOUNTS[0]], bots[ACCOUNTS[0]][source]) for source in SOURCES}
    warm_turns = {source: send(fifty.accounts[ACCOUNTS[0]], conversation_id, f"warm-up on {source}").json()["turn"]
                  for source, conversation_id in warm_up.items()}  # fmt: skip
    for source, turn in warm_turns.items():
        assert wait_turn(fifty.accounts[ACCOUNTS[0]], warm_up[source], turn["id"], timeout=120)["state"] == "completed"
    # conversation k of account j on source (j + k) mod 2: every account on both, each runner 25 turns
    places: list[tuple[str, str, str]] = []  # (account, source, conversation id)
    for j, name in enumerate(ACCOUNTS):
        for k in range(PER_ACCOUNT):
            source = SOURCES[(j + k) % len(SOURCES)]
            places.append((name, source, start_chat(fifty.accounts[name], bots[name][source])))
    assert sorted(source for _, source, _ in places).count("local") == 25
    streams = [Stream(fifty.accounts[name], conversation_id) for name, _, conversation_id in places]
    assert all(stream.status == 200 for stream in streams)
    texts = [f"question {index:02d} of {name} on {source}" for index, (name, source, _) in enumerate(places)]
    answers: list[httpx.Response | None] = [None] * len(places)
    barrier = threading.Barrier(len(places))

    def post(index: int) -> None:
        """As a careful client does: a send that meets a kept-alive connection the hub has just closed (idle past its
        keep-alive) is sent again with the same Idempotency-Key; the model still sees each prompt once."""
        name, _, conversation_id = places[index]
        key = {"Idempotency-Key": f"fifty-{index}"}
        barrier.wait()
        try:
            answers[index] = send(fifty.accounts[name], conversation_id, texts[index], **key)
        except httpx.RemoteProtocolError:
            answers[index] = send(fifty.accounts[name], conversation_id, texts[index], **key)

    senders = [threading.Thread(target=post, args=(index,)) for index in range(len(places))]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(60)
    assert [a.status_code if a is not None else None for a in answers] == [202] * len(places)
    turns = [a.json()["turn"] for a in answers if a is not None]
    ends: list[dict[str, Any]] = []
    try:
        for stream, turn in zip(streams, turns, strict=True):
            events = stream.wait_for(ended(turn["id"]), timeout=TURN_TIMEOUT_S)
            ends.append(next(d["turn"] for _, k, d in events if k in TERMINAL and d["turn"]["id"] == turn["id"]))
    except BaseException:
        print("the hub's threads when a turn did not end in time:\n" + fifty.hub.stacks())  # shown on failure
        raise
    for stream in streams:
        stream.close()
    assert [(t["state"], t["code"]) for t in ends] == [("completed", None)] * len(places), ends
    for stream, turn in zip(streams, turns, strict=True):
        kinds = [k for _, k, _ in stream.of_turn(turn["id"])]
        assert kinds[0] == "turn.started" and kinds[-1] == "turn.completed", kinds
        finals = [d["message"]["content"] for _, k, d in stream.of_turn(turn["id"])
                  if k == "message.complete" and d["message"]["final"]]  # fmt: skip
        assert finals == [REPLY]
    for text, turn in zip(texts, turns, strict=True):
        marker = f"[talaria-run:{turn['id']}:{turn['triggerMessageId']}]"
        assert model.turn_starts(marker) == 1, marker
        assert model.turn_starts(text) == 1, text
    # the hub's admission (chat.md 5.3 step 2): never more than chat.per_runner turns of one runner, the rest waited
    for source in SOURCES:
        of_source = [end for end, (_, s, _) in zip(ends, places, strict=True) if s == source]
        assert _overlap(of_source) <= PER_RUNNER, source
    reasons = {d["waitingReason"] for stream in streams for _, k, d in stream.events if k == "turn.waiting"}
    assert reasons <= {f"waiting for node {source}-node: busy" for source in SOURCES}, reasons
    assert reasons, "no turn waited for a busy runner"
    assert audit_verifies(fifty.data)
    said = [*texts, *(f"warm-up on {source}" for source in SOURCES), REPLY]
    assert_text_kept_out(said, fifty.data, *fifty.logs())
