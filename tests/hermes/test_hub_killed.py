"""The hub process killed (SIGKILL) in the middle of a job's turn and started again over the same data directory
(the dispatcher issue, hermes.md 11, runner-protocol.md 5.2), with a real ``talaria hub`` process, a real runner
process and a real Hermes.

When the hub goes away, the runner rides its poll failures out for 20 s (``failover-v1``, scale.md 3.5); after
that, or when the restarted hub's new epoch is seen, its local disconnect interrupts every session it still has
marked running. So what the restarted hub can recover depends on where the turn was:

- the hub hung (SIGSTOP) while the turn went on, Hermes finished it, then the hub was killed: nothing was running
  when the runner noticed, the reply is in Hermes' history, and the job's next attempt completes from it;
- the hub killed while the turn still streamed and away past the 20 s: the runner interrupted it, the history holds
  the marked prompt and no reply, and the next attempt fails ``runner_command_uncertain``.

Either way the model sees the prompt exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from talaria.testing.model_server import ModelServer, slow, when
from talaria.testing.real_hermes import RealHermes
from tests.hermes.job_support import approved, finished, wait_job
from tests.hermes.site_support import Site, register_node, stored_reply
from tests.integration.cli_support import talaria
from tests.integration.runner_support import RunnerProcess


def turn_under_way(site: Site, model: ModelServer, keyword: str, prompt: str, text: str) -> dict[str, Any]:
    """An approved job whose prompt (holding ``keyword``) has reached the model, which streams ``text`` slowly."""
    model.script(when(keyword, slow(text, first_byte_delay_s=1.0, chunk_delay_s=0.25)))
    job = approved(site.alice, site.root, prompt)
    model.wait_for(lambda log: any(keyword in (r.last_user or "") for r in log), timeout=60)
    return job


def prompt_seen(model: ModelServer, job: dict[str, Any]) -> int:
    marker = f":{job['id']}]"
    return sum(1 for r in model.chat_requests() if r.tools and marker in (r.last_user or ""))


def test_a_hub_that_hung_and_was_killed_mid_turn_completes_the_job_from_the_history(
    site: Site, hermes: RealHermes, model: ModelServer
) -> None:
    text = "the answer " * 8
    job = turn_under_way(site, model, "hung hub", "finish this while the hung hub waits", text)
    os.kill(site.hub.proc.pid, signal.SIGSTOP)  # the hub stops answering mid-turn; Hermes goes on
    deadline = time.monotonic() + 60
    while stored_reply(hermes, f":{job['id']}]") is None:
        assert time.monotonic() < deadline, "Hermes never stored the reply"
        time.sleep(0.2)
    site.kill_hub()  # while stopped: the runner's requests fail, and nothing of the turn is running any more
    site.restart_hub()
    site.runner.wait_for("runner connected", count=2, timeout=60)
    done = wait_job(site.root, job["id"], finished, timeout=90)
    assert done["state"] == "SUCCEEDED", done
    assert done["attempt"] == 2, done  # attempt 1's lease expired with the hub; attempt 2 read the history
    assert done["result"]["outputs"]["reply"] == text.strip()
    assert prompt_seen(model, job) == 1
    assert site.root.get("/api/audit/verify").json()["ok"] is True


def test_a_hub_killed_while_the_turn_streams_fails_the_job_uncertain_and_never_replays_it(
    site: Site, hermes: RealHermes, model: ModelServer
) -> None:
    # 40 s of streaming: the turn still runs when the runner's 20 s of riding out end
    job = turn_under_way(site, model, "killed hub", "keep writing when the killed hub is gone", "word " * 160)
    site.kill_hub()
    site.runner.wait_for("runner disconnected: transport", timeout=45)
    site.restart_hub()
    done = wait_job(site.root, job["id"], finished, timeout=90)
    assert done["state"] == "FAILED" and done["attempt"] == 2, done
    assert done["result"]["code"] == "runner_command_uncertain", done["result"]
    assert done["result"]["retryable"] is False
    assert stored_reply(hermes, f":{job['id']}]") is None  # the runner interrupted the turn (5.2)
    assert prompt_seen(model, job) == 1


def test_a_node_re_registered_while_the_hub_was_down_fails_the_next_attempt_target_changed(
    site: Site, hermes: RealHermes, model: ModelServer
) -> None:
    job = turn_under_way(site, model, "moving node", "a turn on the moving node", "word " * 60)
    site.kill_hub()
    old_id = json.loads((site.tmp / "node" / "runner.json").read_text())["runnerId"]
    disabled = talaria("admin", "runners", "disable", "--data-dir", str(site.tmp / "data"), old_id, cwd=site.tmp)
    assert disabled.returncode == 0, disabled.stderr
    config = register_node(site.tmp, site.url, hermes, "node-2")
    site.restart_hub()
    assert site.runner.wait(30) == 3  # the old runner is refused for good (runner_unauthorized)
    site.runner.close()
    site.runner = RunnerProcess(config, site.tmp / "logs", name="runner-2")
    site.runner.wait_for("runner connected", timeout=30)
    done = wait_job(site.root, job["id"], finished, timeout=90)
    assert done["state"] == "FAILED" and done["attempt"] == 2, done
    assert done["result"]["code"] == "runner_target_changed", done["result"]
    assert prompt_seen(model, job) == 1
