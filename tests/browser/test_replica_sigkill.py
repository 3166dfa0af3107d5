"""scale.md 6 scenario 7 in full: two ``talaria hub`` processes on one PostgreSQL database behind a round-robin TCP
proxy, three ``talaria runner`` processes in front of one real Hermes (the scripted model), 30 jobs, and a Playwright
browser following a chat turn. The replica driving the chat turn is SIGKILLed while the turn streams and the jobs it
runs are held at the model.

Then: no runner connects twice; the browser's event ids strictly increase and the deltas it got are the whole reply,
each once (the other replica adopts the chat turn's channel and streams on after its frame cursor), the reply shown in
full; every job ends SUCCEEDED (those of the killed replica through the other, which adopts their channels, scale.md
4.4) or ``runner_command_uncertain``, and the model saw each job's marked prompt once; every command row has its one
outcome; a restarted replica joins with a new id; the audit chain verifies."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Page, expect

from talaria.clock import SystemClock
from talaria.settings import Settings
from talaria.testing.hub_server import HubServer
from talaria.testing.model_server import ModelServer, gated, reply, slow, when
from talaria.testing.postgres_server import PostgresServer
from talaria.testing.real_hermes import RealHermes
from tests.backends import postgres_database, raw_sql
from tests.browser.conftest import Browsers, sign_in
from tests.conftest import add_account
from tests.hermes.chat_support import make_bot, start_chat
from tests.integration.cli_support import HubProcess, clean_env
from tests.integration.replicas_support import live_replica_ids, login_at, replica_live, until
from tests.integration.runner_support import RunnerProcess, register_node
from tests.tcp_proxy import TcpProxy

NODES = ("n1", "n2", "n3")
JOBS = 30
ESSAY = " ".join(f"Sentence {n} of a reply that streams while its replica dies." for n in range(1, 41))
# a job's lease runs out 3 s after its replica dies, so the other replica takes its jobs over quickly
# and each replica runs three of the six jobs the runners take at once (dispatcher.per_runner 2, cluster-wide)
LEASE = {"TALARIA_LIFECYCLE_LEASE_TTL_S": "3", "TALARIA_LIFECYCLE_HEARTBEAT_INTERVAL_S": "1",
         "TALARIA_LIFECYCLE_REAPER_INTERVAL_S": "1", "TALARIA_DISPATCHER_PER_HUB": "3"}  # fmt: skip
# every event the page's EventSource hands to chat.js: (id, type, data)
RECORD_EVENTS = """(() => {
  const Native = window.EventSource;
  window.__events = [];
  window.EventSource = class extends Native {
    addEventListener(type, listener, options) {
      super.addEventListener(type, (event) => {
        window.__events.push([event.lastEventId, type, event.data]);
        listener.call(this, event);
      }, options);
    }
  };
})();"""


@dataclass(frozen=True)
class Via:
    url: str


def set_up(url: str, directory: Path, proxy_url: str, hermes: RealHermes) -> list[Path]:
    """Accounts and three registered nodes, made through a hub started for it and stopped again."""
    setup = HubServer(directory, SystemClock(), database_url=url).start()
    try:
        add_account(setup, "root", "admin", allowed_profiles={node: ["default"] for node in NODES})
        add_account(setup, "alice", allowed_profiles={node: ["default"] for node in NODES})
        return [register_node(setup, directory / node, hermes_url=hermes.url, session_token=hermes.session_token,
                              name=node, source=node, serverURL=proxy_url) for node in NODES]  # fmt: skip
    finally:
        setup.stop()


def page_events(page: Page) -> list[tuple[int, str, dict[str, Any]]]:
    recorded = page.evaluate("window.__events")
    return [(int(i), kind, json.loads(data)) for i, kind, data in recorded if i]


def test_a_replica_sigkilled_mid_run_leaves_runners_jobs_and_a_browser_to_the_other(
    postgres_server: PostgresServer, tmp_path: Path, model: ModelServer, hermes_executable: Path, browsers: Browsers
) -> None:
    model.script(when("job number", gated(reply("the job is done"), "jobs")),
                 when("follow me", slow(ESSAY, chunk_delay_s=0.15, chunk_chars=12)))  # fmt: skip

    with RealHermes(tmp_path / "hermes", model.base_url) as hermes, \
            postgres_database(postgres_server, migrated=True) as url:  # fmt: skip
        settings = Settings(database_url=url)
        proxy = TcpProxy([]).start()
        hubs: dict[str, HubProcess] = {}
        ports: dict[str, int] = {}
        runners: list[RunnerProcess] = []
        clients: list[httpx.Client] = []

        def start_hub(name: str) -> str:
            directory = tmp_path / name
            directory.mkdir()
            before = set(live_replica_ids(url))
            env = clean_env(TALARIA_DATABASE_URL=url, TALARIA_DATA_DIR=str(directory / "data"),
                            TALARIA_HUB_PUBLIC_URL=proxy.url, **LEASE)  # fmt: skip
            hubs[name] = HubProcess(directory, ["--port", "0"], env)
            _, hub_url = hubs[name].ready()
            ports[name] = int(hub_url.rsplit(":", 1)[1])
            proxy.backends.append(("127.0.0.1", ports[name]))
            [made] = until(lambda: (set(live_replica_ids(url)) - before) or None, 20, f"{name}'s replica row")
            return made

        try:
            configs = set_up(url, tmp_path / "setup", proxy.url, hermes)
            ids = {name: start_hub(name) for name in ("p", "q")}
            runners = [RunnerProcess(path, tmp_path / "logs", name=path.parent.name) for path in configs]
            for runner in runners:
                runner.wait_for("runner connected")
            alice, root = login_at(proxy.url, "alice"), login_at(proxy.url, "root")
            clients += [alice, root]

            conversation_id = start_chat(alice, make_bot(alice, "Follower", source="n1"))
            watched = browsers.context()
            # the stream the killed replica served ends mid-response: the page reconnects through the other one
            watched.expect_refusal(f"/api/conversations/{conversation_id}/events")
            page = watched.page()
            page.add_init_script(RECORD_EVENTS)
            sign_in(page, Via(proxy.url), "alice")
            page.goto(f"{proxy.url}/chats/{conversation_id}")

            jobs: dict[str, int] = {}
            for index in range(JOBS):
                body = {"title": f"t{index}", "prompt": f"job number {index}", "cell": NODES[index % 3],
                        "profile": "default"}  # fmt: skip
                task = alice.post("/api/tasks", json=body).json()["task"]
                assert alice.post(f"/api/tasks/{task['id']}/submit").status_code == 200
                approved = root.post(f"/api/tasks/{task['id']}/approve")
                assert approved.status_code == 200, approved.text
                jobs[approved.json()["job"]["id"]] = index
            # two jobs of each runner held at the model, three run by each replica
            model.wait_for(lambda got: sum(1 for r in got if r.tools and "job number" in (r.last_user or "")) >= 6,
                           timeout=120)  # fmt: skip

            page.get_by_role("textbox", name="Message").fill("follow me, please")
            page.get_by_role("button", name="Send").click()
            turn_id = until(lambda: next((d["turn"]["id"] for _, k, d in page_events(page) if k == "turn.started"),
                                         None), 60, "the turn to start")  # fmt: skip
            until(lambda: True if sum(k == "message.delta" for _, k, _ in page_events(page)) >= 5 else None, 60,
                  "the browser to receive deltas")  # fmt: skip
            [lease] = raw_sql(settings, "SELECT holder FROM turn_lease WHERE turn_id = ?", turn_id)
            [victim] = [name for name, rid in ids.items() if rid == lease["holder"]]
            held_there = raw_sql(settings, "SELECT count(*) AS n FROM job_turn t JOIN runner_gateway g ON g.id ="
                                 " t.connection_id WHERE g.owner_replica = ?", ids[victim])[0]["n"]  # fmt: skip
            assert held_there == 3, "the replica to be killed runs three jobs"

            hubs[victim].proc.kill()
            hubs[victim].proc.wait(10)
            proxy.backends.remove(("127.0.0.1", ports[victim]))
            model.release("jobs")

            expect(page.locator("article[aria-busy=true]")).to_have_count(0, timeout=120_000)
            shown = page.locator("article .body").last
            expect(shown).to_have_text(ESSAY, timeout=30_000)
            events = page_events(page)
            ids_seen = [event_id for event_id, _, _ in events]
            assert ids_seen == sorted(set(ids_seen)), "the browser's event ids strictly increase"
            deltas = "".join(d["text"] for _, k, d in events if k == "message.delta" and d["turnId"] == turn_id)
            assert deltas == ESSAY, "each delta the browser got once, in order, none missing (the channel adopted)"
            [chat] = raw_sql(settings, "SELECT g.owner_counter FROM chat_turn t JOIN runner_gateway g"
                             " ON g.id = t.connection_id WHERE t.id = ?", turn_id)  # fmt: skip
            assert chat["owner_counter"] == 2, "the chat turn's channel was adopted, once"

            def all_ended() -> dict[str, dict[str, Any]] | None:
                states = {j: root.get(f"/api/jobs/{j}").json()["job"] for j in jobs}
                return states if all(s["terminal"] is not None for s in states.values()) else None

            states = until(all_ended, 180, "every job to end")
            outcomes = {(s["state"], (s["result"] or {}).get("code")) for s in states.values()}
            assert outcomes <= {("SUCCEEDED", None), ("FAILED", "runner_command_uncertain")}, outcomes
            adopted = raw_sql(settings, "SELECT count(*) AS n FROM job_turn t JOIN runner_gateway g"
                              " ON g.id = t.connection_id WHERE g.owner_counter > 1")[0]["n"]  # fmt: skip
            taken_over = [s for s in states.values() if s["attempt"] > 1]
            assert taken_over and adopted >= 1, "the killed replica's jobs were taken over through their channels"
            assert all(s["state"] == "SUCCEEDED" for s in taken_over), [s["result"] for s in taken_over]
            for job_id in jobs:
                marker = f":{job_id}]"
                assert sum(1 for r in model.chat_requests() if r.tools and marker in (r.last_user or "")) == 1
            assert model.turn_starts("follow me, please") == 1
            print(f"jobs {len(states)}: taken over {len(taken_over)}, channels adopted {adopted}; browser events"
                  f" {len(events)} (deltas {len(deltas)} of {len(ESSAY)} characters)")  # fmt: skip

            for runner in runners:
                assert runner.lines.count("runner connected") == 1, runner.stderr
            until(lambda: True if raw_sql(settings, "SELECT count(*) AS n FROM runner_command WHERE outcome IS NULL")
                  [0]["n"] == 0 else None, 120, "every command to have its outcome")  # fmt: skip

            restarted = start_hub(f"{victim}-again")
            assert restarted not in ids.values() and replica_live(url, restarted), "it joins with a new id"
            verified = subprocess.run([sys.executable, "-m", "talaria", "audit", "verify"], capture_output=True,
                                      text=True, env=clean_env(TALARIA_DATABASE_URL=url), timeout=60,
                                      check=False)  # fmt: skip
            assert verified.returncode == 0, verified.stdout + verified.stderr
        finally:
            for client in clients:
                client.close()
            for runner in runners:
                runner.stop()
                runner.close()
            for process in hubs.values():
                process.close()
            proxy.stop()
