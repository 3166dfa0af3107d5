"""Fifty jobs across three profiles on two runners in front of one real Hermes: all finish, none twice."""

from __future__ import annotations

import time
from pathlib import Path

from talaria.clock import SystemClock
from talaria.testing.hub_server import HubServer
from talaria.testing.model_server import ModelServer
from talaria.testing.real_hermes import RealHermes
from tests.conftest import add_account, login
from tests.integration.runner_support import RunnerProcess, register_node

PROFILES = ["default", "work", "research"]


def test_fifty_jobs_three_profiles_two_runners_all_finish_once(
    tmp_path: Path, model: ModelServer, hermes_executable: Path
) -> None:
    with RealHermes(tmp_path / "hermes", model.base_url, profiles=("work", "research")) as hermes:
        server = HubServer(tmp_path / "data", SystemClock()).start()
        runners: list[RunnerProcess] = []
        clients = []
        try:
            add_account(server, "alice", allowed_profiles={"local": PROFILES, "lab": PROFILES})
            add_account(server, "root", "admin", allowed_profiles={})
            for source in ("local", "lab"):
                path = register_node(server, tmp_path / source, hermes_url=hermes.url,
                                     session_token=hermes.session_token, name=source, source=source,
                                     allowedProfiles=PROFILES)  # fmt: skip
                runners.append(RunnerProcess(path, tmp_path / "logs", name=source))
            for runner in runners:
                runner.wait_for("runner connected")
            alice, root = login(server, "alice"), login(server, "root")
            clients = [alice, root]
            jobs = {}
            for index in range(50):
                body = {"title": f"t{index}", "prompt": f"job number {index}", "cell": ("local", "lab")[index % 2],
                        "profile": PROFILES[index % 3]}  # fmt: skip
                task = alice.post("/api/tasks", json=body).json()["task"]
                assert alice.post(f"/api/tasks/{task['id']}/submit").status_code == 200
                jobs[root.post(f"/api/tasks/{task['id']}/approve").json()["job"]["id"]] = index
            deadline = time.monotonic() + 240
            while True:
                states = {j: root.get(f"/api/jobs/{j}").json()["job"] for j in jobs}
                if all(s["terminal"] is not None for s in states.values()):
                    break
                assert time.monotonic() < deadline, sorted(s["state"] for s in states.values())
                time.sleep(0.5)
            assert all(s["state"] == "SUCCEEDED" and s["attempt"] == 1 for s in states.values()), [
                (s["state"], s["result"]) for s in states.values() if s["state"] != "SUCCEEDED"
            ]
            for job_id, index in jobs.items():
                reply = states[job_id]["result"]["outputs"]["reply"]
                assert reply.startswith(f"Scripted reply to: job number {index}\n")
                marker = f":{job_id}]"
                assert sum(1 for r in model.chat_requests() if r.tools and marker in (r.last_user or "")) == 1
        finally:
            for client in clients:
                client.close()
            for runner in runners:
                runner.stop()
                runner.close()
            server.stop()
