"""``talaria db restore`` and what a restore means at the next start (operations.md 7.1-7.2; scenario 9.17): a
``talaria hub`` process over SQLite, a runner process and the Hermes fixture. Work goes on after a backup; the restore
is refused while the hub runs and without ``--yes``; restored, the hub starts with the backup's data and audit chain,
sessions ended, the unfinished jobs cancelled and the waiting chat turn ``uncertain`` (reason
``restored_from_backup``), the runner back with a new epoch, nothing sent to Hermes twice, and a new task runs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sqlite3
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.store import migrations
from talaria.testing.hermes_fixture import HermesFixture
from tests.hermes.chat_support import assert_text_kept_out, make_bot, send, start_chat, turn_of, wait_turn
from tests.hermes.site_support import PASSWORD, create_user, register_node, sign_in
from tests.integration.cli_support import HubProcess, clean_env, free_port, talaria
from tests.integration.runner_support import RunnerProcess, wait_until

# a 3 s lease (a cancelled running job ends at its expiry, row 12); one job turn and one chat turn per runner, so the
# next job stays QUEUED and the next chat turn pending while the first ones run
HUB_ENV = {"TALARIA_LIFECYCLE_LEASE_TTL_S": "3", "TALARIA_LIFECYCLE_HEARTBEAT_INTERVAL_S": "1",
           "TALARIA_LIFECYCLE_REAPER_INTERVAL_S": "1", "TALARIA_DISPATCHER_PER_RUNNER": "1",
           "TALARIA_CHAT_PER_RUNNER": "1"}  # fmt: skip
CHAIN = re.compile(r"^audit chain OK: (\d+) events, head ([0-9a-f]{64})$")


@dataclass
class Hub:
    tmp: Path
    url: str
    hermes: HermesFixture
    config: Path
    process: HubProcess
    runner: RunnerProcess
    clients: list[httpx.Client] = field(default_factory=list)

    def sign_in(self, username: str) -> httpx.Client:
        client = sign_in(self.url, username)
        self.clients.append(client)
        return client

    @property
    def data(self) -> Path:
        return self.tmp / "data"

    def start(self) -> None:
        self.process.close()
        args = ["--data-dir", str(self.data), "--port", self.url.rsplit(":", 1)[1]]
        self.process = HubProcess(self.tmp, args, clean_env(**HUB_ENV))
        self.process.ready()

    def stop(self) -> None:
        self.process.close()

    def epochs(self) -> list[str]:
        records = [json.loads(line) for line in self.runner.lines if line.startswith("{")]
        return [r["epoch"] for r in records if r.get("message") == "runner connected"]

    def db(self, *args: str) -> Any:
        return talaria("db", *args, "--data-dir", str(self.data), cwd=self.tmp, env=clean_env())


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    with HermesFixture() as hermes:
        data = tmp_path / "data"
        url = f"http://127.0.0.1:{free_port()}"
        create_user(data, "alice", "user", ("local:default",))
        create_user(data, "root", "admin", ("local:default",))
        config = register_node(tmp_path, url, hermes, "node")
        process = HubProcess(tmp_path, ["--data-dir", str(data), "--port", url.rsplit(":", 1)[1]], clean_env(**HUB_ENV))
        process.ready()
        argv = [sys.executable, "-m", "talaria", "runner", "--config", str(config), "--log-format", "json"]
        runner = RunnerProcess(config, tmp_path / "logs", argv=argv)
        made = Hub(tmp_path, url, hermes, config, process, runner)
        try:
            wait_until(lambda: len(made.epochs()) == 1, timeout=30, what="the runner to connect")
            yield made
        finally:
            for client in made.clients:
                client.close()
            runner.close()
            made.process.close()


def approved_job(alice: httpx.Client, root: httpx.Client, prompt: str) -> str:
    body = {"title": "a task", "prompt": prompt, "cell": "local", "profile": "default"}
    task = alice.post("/api/tasks", json=body).json()["task"]
    assert alice.post(f"/api/tasks/{task['id']}/submit").status_code == 200
    approved = root.post(f"/api/tasks/{task['id']}/approve")
    assert approved.status_code == 200, approved.text
    job_id: str = approved.json()["job"]["id"]
    return job_id


def job_of(root: httpx.Client, job_id: str) -> dict[str, Any]:
    answer = root.get(f"/api/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()["job"]
    return found


def ended(root: httpx.Client, job_id: str, timeout: float = 60) -> dict[str, Any]:
    wait_until(lambda: job_of(root, job_id)["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"), timeout=timeout,
               what=f"job {job_id} to end")  # fmt: skip
    return job_of(root, job_id)


def digest_of(directory: Path) -> dict[str, str]:
    """Every file's content but the lock's (which any offline command creates empty)."""
    files = [p for p in sorted(directory.iterdir()) if p.is_file() and p.name != "hub.lock"]
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def chain_of(hub: Hub) -> tuple[int, str]:
    verified = talaria("audit", "verify", "--data-dir", str(hub.data), cwd=hub.tmp, env=clean_env())
    assert verified.returncode == 0, verified.stderr
    match = CHAIN.match(verified.stdout.strip())
    assert match, verified.stdout
    return int(match[1]), match[2]


def test_the_restore_drill(hub: Hub) -> None:
    alice, root = hub.sign_in("alice"), hub.sign_in("root")
    done_before = approved_job(alice, root, "done before the backup")
    assert ended(root, done_before)["state"] == "SUCCEEDED"
    hub.hermes.delta_delay_for("running at the backup", 60)
    running = approved_job(alice, root, "running at the backup")
    wait_until(lambda: hub.hermes.prompt_count("running at the backup") == 1, timeout=30, what="the running job")
    queued = approved_job(alice, root, "queued at the backup")
    bot = make_bot(alice)
    streaming = start_chat(alice, bot)
    hub.hermes.delta_delay_for("a chat streaming at the backup", 60)
    chat_running = send(alice, streaming, "a chat streaming at the backup").json()["turn"]["id"]
    wait_until(lambda: hub.hermes.prompt_count("a chat streaming at the backup") == 1, timeout=30, what="the chat turn")
    waiting = start_chat(alice, bot)
    pending = send(alice, waiting, "a chat pending at the backup").json()["turn"]
    assert pending["state"] == "pending", pending
    assert job_of(root, queued)["state"] == "QUEUED"

    backup = hub.tmp / "backups" / "hub.sqlite3"
    backup.parent.mkdir()
    made = hub.db("backup", "--to", str(backup))
    assert made.returncode == 0, made.stderr
    written = re.search(r"audit chain OK: (\d+) events, head ([0-9a-f]{64})", made.stdout)
    assert written, made.stdout
    backup_count, backup_head = int(written[1]), written[2]

    # work goes on after the backup point: everything finishes, a new job runs, an account is added
    hub.hermes.delta_delay_for("running at the backup", 0)
    hub.hermes.delta_delay_for("a chat streaming at the backup", 0)
    for job_id in (running, queued):
        assert ended(root, job_id)["state"] == "SUCCEEDED"
    after = approved_job(alice, root, "a job approved later")
    assert ended(root, after)["state"] == "SUCCEEDED"
    assert wait_turn(alice, waiting, pending["id"])["state"] == "completed"
    created = root.post("/api/admin/accounts", json={"username": "bob", "password": "a long enough password here",
                                                      "role": "user"})  # fmt: skip
    assert created.status_code == 201, created.text

    refused = hub.db("restore", "--from", str(backup), "--yes")
    assert (refused.returncode, refused.stderr.strip()) == (
        1, "talaria db restore: the hub is running; stop it first; nothing was changed"), refused.stderr  # fmt: skip
    hub.stop()
    before = digest_of(hub.data)
    unconfirmed = hub.db("restore", "--from", str(backup))
    assert unconfirmed.returncode == 1 and "add --yes" in unconfirmed.stderr, unconfirmed.stderr
    assert digest_of(hub.data) == before, "nothing changed without --yes"

    restored = hub.db("restore", "--from", str(backup), "--yes")
    assert restored.returncode == 0, restored.stderr
    lines = restored.stdout.splitlines()
    assert f"restored {backup} into {hub.data / 'talaria.sqlite3'}" in lines
    assert ("at its next start the hub ends every web session; gives every runner a new epoch; cancels 2 unfinished "
            "job(s), ends 1 queued or pending chat turn(s) uncertain and stops 0 team goal(s), each with the reason "
            "restored_from_backup") in lines, lines  # fmt: skip
    assert any(line.startswith("review accounts and runners") for line in lines)
    aside = [p.name for p in hub.data.iterdir() if ".before-restore-" in p.name]
    assert sorted(re.sub(r"-\d+$", "", name) for name in aside) == [
        "audit.key.before-restore",
        "talaria.sqlite3.before-restore",
    ], aside
    kept = next(hub.data / n for n in aside if n.startswith("talaria"))
    with sqlite3.connect(f"file:{kept}?mode=ro", uri=True) as old:
        assert old.execute("SELECT COUNT(*) FROM account WHERE username = 'bob'").fetchone() == (1,), "kept aside"
    assert (hub.data / "audit.key").read_bytes() == backup.with_name("hub.sqlite3.audit.key").read_bytes()
    assert chain_of(hub) == (backup_count, backup_head), "the backup's chain, before the start adds to it"

    hub.start()
    assert alice.get("/api/auth/me").status_code == 401, "every web session ended"
    alice, root = hub.sign_in("alice"), hub.sign_in("root")
    assert job_of(root, done_before)["state"] == "SUCCEEDED"
    assert root.get(f"/api/jobs/{after}").status_code == 404, "the work after the backup point is gone"
    users = [u["username"] for u in root.get("/api/admin/accounts").json()["accounts"]]
    assert "bob" not in users
    for job_id in (queued, running):
        job = ended(root, job_id, timeout=30)
        assert job["state"] == "CANCELLED", job
    turn = turn_of(alice, waiting, pending["id"])
    assert (turn["state"], turn["code"]) == ("uncertain", "restored_from_backup"), turn
    recovered = wait_turn(alice, streaming, chat_running)
    assert recovered["state"] in ("completed", "uncertain"), recovered  # from the session's history, never resent
    wait_until(lambda: len(hub.epochs()) == 2, timeout=30, what="the runner to connect again")
    first, second = hub.epochs()
    assert first != second
    new = approved_job(alice, root, "a new task after the restore")
    assert ended(root, new)["state"] == "SUCCEEDED"
    for prompt in ("running at the backup", "queued at the backup", "a chat streaming at the backup",
                   "a chat pending at the backup"):  # fmt: skip
        assert hub.hermes.prompt_count(prompt) == 1, prompt
    events = root.get("/api/audit", params={"job": queued}).json()["events"]
    cancels = [e for e in events if e["toState"] == "CANCELLED"]
    assert cancels and cancels[0]["actor"]["via"] == "recovery", events
    hub.stop()
    count, _ = chain_of(hub)
    assert count > backup_count
    with sqlite3.connect(f"file:{hub.data / 'talaria.sqlite3'}?mode=ro", uri=True) as db:
        row = db.execute("SELECT hash FROM audit_event WHERE seq = ?", (backup_count,)).fetchone()
        assert row == (backup_head,), "the chain goes on from the backup's head"
        assert db.execute("SELECT COUNT(*) FROM restore_marker").fetchone() == (0,), "the marker went last"
    db.close()
    outputs = [made.stdout, made.stderr, restored.stdout, restored.stderr, hub.runner.stdout, hub.runner.stderr]
    outputs += [path.read_text() for path in hub.tmp.glob("hub-*.stderr")]  # both hub processes' logs
    token = json.loads(hub.config.read_text())["token"]
    said = ["running at the backup", "queued at the backup", "a chat streaming at the backup",
            "a chat pending at the backup", "a job approved later", "a new task after the restore"]  # fmt: skip
    assert_text_kept_out(said, hub.data, *outputs)
    for secret in (token, PASSWORD, "a long enough password here"):
        assert not [text for text in outputs if secret in text], "a secret in a log or an output"


@dataclass
class Offline:
    tmp: Path
    data: Path
    backup: Path

    def restore(self, *args: str, data: Path | None = None) -> Any:
        return talaria("db", "restore", *args, "--data-dir", str(data or self.data), cwd=self.tmp, env=clean_env())

    def variant(self, name: str, sql: str) -> Path:
        """A copy of the backup (and its key) changed by ``sql``."""
        made = self.tmp / "variants" / name
        made.parent.mkdir(exist_ok=True)
        made.write_bytes(self.backup.read_bytes())
        made.with_name(f"{name}.audit.key").write_bytes(self.backup.with_name("hub.sqlite3.audit.key").read_bytes())
        with sqlite3.connect(made) as db:
            db.executescript(sql)
        db.close()
        return made


@pytest.fixture
def offline(tmp_path: Path) -> Offline:
    """A stopped hub's data directory and a backup of it (taken after one more account was made)."""
    data = tmp_path / "data"
    create_user(data, "alice", "user", ("local:default",))
    key = data / "audit.key"  # what the hub's first start makes
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    backup = tmp_path / "backups" / "hub.sqlite3"
    backup.parent.mkdir()
    made = talaria("db", "backup", "--to", str(backup), "--data-dir", str(data), cwd=tmp_path, env=clean_env())
    assert made.returncode == 0, made.stderr
    create_user(data, "bob", "user", ("local:default",))
    return Offline(tmp_path, data, backup)


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("no --from", "talaria db restore: --from FILE names the backup to restore"),
        ("not a database", "talaria db restore: cannot copy {backup}: file is not a database; nothing was changed"),
        ("no key", "talaria db restore: the backup's audit key {backup}.audit.key is missing; nothing was changed"),
        ("no file", "talaria db restore: {backup} is not a file; nothing was changed"),
        ("newer", "talaria db restore: the backup was made by a newer release (core 999 > {core}); restore it with "
                  "that release; nothing was changed"),
        ("broken chain", "talaria db restore: the backup's audit chain BROKEN at seq 1: hash_mismatch; nothing was "
                         "changed"),
    ],
)  # fmt: skip
def test_a_refused_restore_is_one_line_and_changes_nothing(offline: Offline, case: str, error: str) -> None:
    backup = offline.backup
    if case == "not a database":
        backup = offline.tmp / "junk.sqlite3"
        backup.write_bytes(b"not a database" * 100)
        backup.with_name("junk.sqlite3.audit.key").write_bytes(b"k" * 32)
    elif case == "no key":
        backup = offline.tmp / "keyless.sqlite3"
        backup.write_bytes(offline.backup.read_bytes())
    elif case == "no file":
        backup = offline.tmp / "missing.sqlite3"
    elif case == "newer":
        backup = offline.variant(
            "newer.sqlite3", "UPDATE schema_version SET version = 999 WHERE migration_set = 'core'"
        )
    elif case == "broken chain":
        forged = ("INSERT INTO audit_event (seq, event_id, occurred_at, type, body, prev_hash, hash) "
                  f"VALUES (1, 'forged', 0, 'task.created', '{{}}', '{'0' * 64}', '{'f' * 64}')")  # fmt: skip
        backup = offline.variant("broken.sqlite3", forged)
    before = digest_of(offline.data)
    args = ["--yes"] if case == "no --from" else ["--from", str(backup), "--yes"]
    done = offline.restore(*args)
    core = len(migrations.available("sqlite", "core"))
    assert (done.returncode, done.stderr.strip()) == (1, error.format(backup=backup, core=core)), done.stderr
    assert "Traceback" not in done.stderr
    assert digest_of(offline.data) == before
    assert not [p for p in offline.data.iterdir() if "restor" in p.name]


def test_mark_restored_is_for_postgresql(offline: Offline) -> None:
    done = talaria("db", "mark-restored", "--yes", "--data-dir", str(offline.data), cwd=offline.tmp, env=clean_env())
    assert (done.returncode, done.stderr.strip()) == (1, "talaria db mark-restored: marks a PostgreSQL database; on "
                                                      "SQLite use talaria db restore --from FILE")  # fmt: skip


def test_a_restore_into_a_new_directory_and_with_resume_unfinished(offline: Offline) -> None:
    """A new computer: the data directory does not exist yet; nothing is set aside. The backup file is only read."""
    new = offline.tmp / "new" / "data"
    kept = hashlib.sha256(offline.backup.read_bytes()).hexdigest()
    done = offline.restore("--from", str(offline.backup), "--yes", "--resume-unfinished", data=new)
    assert done.returncode == 0, done.stderr
    assert ("at its next start the hub ends every web session; gives every runner a new epoch; leaves 0 unfinished "
            "job(s), 0 queued or pending chat turn(s) and 0 team goal(s) to go on (any of them that ran after the "
            "backup point may run again)") in done.stdout.splitlines(), done.stdout  # fmt: skip
    assert sorted(p.name for p in new.iterdir()) == ["audit.key", "hub.lock", "talaria.sqlite3"]
    assert stat.S_IMODE(new.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in new.iterdir())
    assert hashlib.sha256(offline.backup.read_bytes()).hexdigest() == kept
    with sqlite3.connect(f"file:{new / 'talaria.sqlite3'}?mode=ro", uri=True) as db:
        assert db.execute("SELECT username FROM account").fetchall() == [("alice",)]
        assert db.execute("SELECT source, resume_unfinished FROM restore_marker").fetchall() == [("hub.sqlite3", 1)]
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    db.close()
    again = offline.restore("--from", str(offline.backup), "--yes", data=new)  # over a restored, never started hub
    assert again.returncode == 0, again.stderr
    assert len([p for p in new.iterdir() if ".before-restore-" in p.name]) == 2


@pytest.mark.parametrize("case", ["damaged", "stray wal"])
def test_a_current_database_that_cannot_stay_whole_is_refused(offline: Offline, case: str) -> None:
    """A damaged database cannot be checkpointed into one file, and a -wal without its database would be applied by
    SQLite to the restored file: both are refused, nothing changed, with what to do."""
    current = offline.data / "talaria.sqlite3"
    if case == "damaged":
        current.write_bytes(b"damaged" * 1000)
    else:
        current.unlink()
        (offline.data / "talaria.sqlite3-wal").write_bytes(b"left behind" * 100)
    before = digest_of(offline.data)
    done = offline.restore("--from", str(offline.backup), "--yes")
    assert done.returncode == 1, done.stderr
    move_out = f"move talaria.sqlite3 and its -wal and -shm files out of {offline.data}, then restore again"
    line = done.stderr.strip().splitlines()[-1]  # after the data directory's mode_tightened lines
    if case == "damaged":
        assert line.startswith("talaria db restore: the current database cannot be checkpointed ("), line
    else:
        assert line.startswith("talaria db restore: talaria.sqlite3-wal is left without its database; "), line
    assert line.endswith(f"; {move_out}; nothing was changed"), line
    assert digest_of(offline.data) == before
    assert not [p for p in offline.data.iterdir() if "restor" in p.name]


def test_a_start_finishes_the_key_rename_of_an_interrupted_restore(offline: Offline) -> None:
    """Interrupted between the database's rename and the key's: the restored database beside the old key and the
    backup's key still in flight. The first start puts the backup's key in place (its sha256 is in the marker)."""
    old_key = os.urandom(32)  # another hub's key, so the two can be told apart
    (offline.data / "audit.key").write_bytes(old_key)
    done = offline.restore("--from", str(offline.backup), "--yes")
    assert done.returncode == 0, done.stderr
    backup_key = (offline.data / "audit.key").read_bytes()
    assert backup_key != old_key
    (offline.data / "audit.key").rename(offline.data / "audit.key.restoring")
    (offline.data / "audit.key").write_bytes(old_key)
    hub = HubProcess(offline.tmp, ["--data-dir", str(offline.data), "--port", "0"], clean_env())
    try:
        hub.ready()
        assert hub.stop(signal.SIGTERM)[0] == 0
    finally:
        hub.close()
    assert (offline.data / "audit.key").read_bytes() == backup_key
    assert not (offline.data / "audit.key.restoring").exists()
    assert '"restore_audit_key_put_in_place"' in hub.stderr_path.read_text()
