"""The ``talaria`` command line as real processes (web-api.md 8, lifecycle.md 1.1, 6.1, 8, 9.3).

Every command runs as ``python -m talaria`` in a temporary working directory, with every ``TALARIA_*``
variable of the calling environment removed except those a test sets.
"""

from __future__ import annotations

import re
import signal
import socket
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.accounts.passwords import verify_password
from talaria.accounts.service import Accounts
from talaria.clock import ManualClock, SystemClock
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.binding import Binding
from talaria.lifecycle.engine import Engine
from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.sqlite import SQLiteStore
from tests.integration.cli_support import HubProcess, clean_env, free_port, talaria

PASSWORD = "correct horse battery staple"
NOT_FOUND = b'{"code":"not_found","error":"not found"}'
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def assert_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Nothing is bound to ``port``: binding it ourselves succeeds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, port))


def assert_not_listening(port: int) -> None:
    """Connecting is refused (binding could still fail on the server side's TIME_WAIT connections)."""
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass


@pytest.fixture
def start_hub(tmp_path: Path) -> Iterator[Callable[..., HubProcess]]:
    made: list[HubProcess] = []

    def factory(*args: str, env: dict[str, str] | None = None) -> HubProcess:
        hub = HubProcess(tmp_path, list(args), env if env is not None else clean_env())
        made.append(hub)
        return hub

    yield factory
    for hub in made:
        hub.close()


# ---------------------------------------------------------------- talaria hub


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_hub_prints_one_ready_line_serves_and_stops_cleanly(
    tmp_path: Path, start_hub: Callable[..., HubProcess], sig: signal.Signals
) -> None:
    hub = start_hub("--data-dir", str(tmp_path / "D"), "--port", "0")
    _, url = hub.ready()
    port = int(url.rsplit(":", 1)[1])
    assert port != 0
    with httpx.Client(base_url=url, timeout=10) as client:
        response = client.get("/healthz")
        assert response.status_code == 200
        assert response.json() == {"ok": True}
        # the client keeps its idle keep-alive connection open while the hub stops
        code, rest = hub.stop(sig)
    assert code == 0, hub.stderr()
    assert rest == [], "the ready line is the only line on stdout"
    assert (tmp_path / "D" / "talaria.sqlite3").exists()
    assert_not_listening(port)


def test_hub_writes_every_threads_stack_on_sigusr1_and_goes_on_serving(
    tmp_path: Path, start_hub: Callable[..., HubProcess]
) -> None:
    hub = start_hub("--data-dir", str(tmp_path / "D"), "--port", "0")
    _, url = hub.ready()
    stacks = hub.stacks()
    assert "Current thread" in stacks and "run_hub" in stacks, stacks
    assert "hub/reaper.py" in stacks, stacks  # every thread: the reaper's too
    with httpx.Client(base_url=url, timeout=10) as client:
        assert client.get("/healthz").status_code == 200
    code, _ = hub.stop(signal.SIGTERM)
    assert code == 0, hub.stderr()


def test_hub_settings_precedence_flags_env_file(tmp_path: Path, start_hub: Callable[..., HubProcess]) -> None:
    """The file says a wildcard host and port 1; the environment overrides the host, the flag the port."""
    config = tmp_path / "hub.toml"
    config.write_text('[hub]\nhost = "0.0.0.0"\nport = 1\n')
    env = clean_env(TALARIA_HUB_HOST="127.0.0.1", TALARIA_DATA_DIR=str(tmp_path / "from-env"))
    hub = start_hub("--port", "0", "--config", str(config), env=env)
    _, url = hub.ready()
    assert int(url.rsplit(":", 1)[1]) not in (0, 1)
    assert (tmp_path / "from-env" / "talaria.sqlite3").exists()
    assert not (tmp_path / "talaria-data").exists()
    code, _ = hub.stop(signal.SIGTERM)
    assert code == 0


def test_runtime_api_off_answers_like_an_unknown_path(tmp_path: Path, start_hub: Callable[..., HubProcess]) -> None:
    hub = start_hub("--data-dir", str(tmp_path / "D"), "--port", "0")
    _, url = hub.ready()
    with httpx.Client(base_url=url, timeout=10) as client:
        methods = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
        unknown = {method: client.request(method, "/no/such/path") for method in methods}
        for method, response in unknown.items():
            assert response.status_code == 404, method
            assert response.content == NOT_FOUND, method
            assert response.headers["content-type"] == "application/json"
        probes = [
            ("GET", "/internal/runtime/v1/hermes/jobs", {}),
            ("GET", "/internal/runtime/v1/hermes/jobs?tenant=default&cell=local&profile=default&state=QUEUED", {}),
            ("POST", "/internal/runtime/v1/hermes/jobs/x/claim", {"json": {"binding": {}, "worker_instance": "w"}}),
            ("POST", "/internal/runtime/v1/hermes/jobs/x/complete", {}),
            ("GET", "/internal/runtime/v1/hermes/jobs/x", {}),
            ("PUT", "/internal/runtime/v1/hermes/jobs/x/claim", {}),
            ("DELETE", "/internal/runtime/anything", {}),
            ("PATCH", "/internal/runtime/v1/hermes/jobs/x", {}),
            ("OPTIONS", "/internal/runtime/v1/hermes/jobs", {}),
        ]
        for method, path, kwargs in probes:
            response = client.request(method, path, **kwargs)
            assert response.status_code == 404, (method, path)
            assert response.content == NOT_FOUND, (method, path)
            assert response.headers["content-type"] == unknown[method].headers["content-type"], (method, path)
        head_unknown = client.head("/no/such/path")
        head_runtime = client.head("/internal/runtime/v1/hermes/jobs")
        assert head_runtime.status_code == head_unknown.status_code == 404
        assert head_runtime.headers.get("content-type") == head_unknown.headers.get("content-type")
    code, _ = hub.stop(signal.SIGTERM)
    assert code == 0


def _refused_start(result: subprocess.CompletedProcess[str], key: str) -> None:
    assert result.returncode != 0
    assert key in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"one line naming the key, got: {result.stderr!r}"
    assert "talaria hub listening" not in result.stdout


def test_hub_refuses_a_31_byte_proxy_secret(tmp_path: Path) -> None:
    port = free_port()
    secret = "s" * 31
    env = clean_env(TALARIA_RUNTIME_API_ENABLED="true", TALARIA_RUNTIME_API_PROXY_SECRET=secret)
    result = talaria("hub", "--data-dir", str(tmp_path / "D"), "--port", str(port), cwd=tmp_path, env=env)
    _refused_start(result, "runtime_api.proxy_secret")
    assert secret not in result.stderr + result.stdout
    assert_port_free(port)


def test_hub_refuses_a_missing_proxy_secret(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(TALARIA_RUNTIME_API_ENABLED="on")
    result = talaria("hub", "--data-dir", str(tmp_path / "D"), "--port", str(port), cwd=tmp_path, env=env)
    _refused_start(result, "runtime_api.proxy_secret")
    assert_port_free(port)


def test_hub_refuses_a_wildcard_host_without_public_url(tmp_path: Path) -> None:
    port = free_port("0.0.0.0")
    result = talaria("hub", "--data-dir", str(tmp_path / "D"), "--host", "0.0.0.0", "--port", str(port), cwd=tmp_path)
    _refused_start(result, "hub.public_url")
    assert_port_free(port, "0.0.0.0")


def test_hub_refuses_a_settings_file_breaking_a_rule(tmp_path: Path) -> None:
    config = tmp_path / "hub.toml"
    config.write_text("[lifecycle]\nlease_ttl_s = 5\nheartbeat_interval_s = 10\n")
    port = free_port()
    result = talaria(
        "hub", "--data-dir", str(tmp_path / "D"), "--port", str(port), "--config", str(config), cwd=tmp_path
    )
    _refused_start(result, "lifecycle.heartbeat_interval_s")
    assert_port_free(port)


def test_hub_refuses_an_unknown_key_in_the_settings_file(tmp_path: Path) -> None:
    config = tmp_path / "hub.toml"
    config.write_text("[lifecycle]\nlease_ttl = 5\n")
    port = free_port()
    result = talaria(
        "hub", "--data-dir", str(tmp_path / "D"), "--port", str(port), "--config", str(config), cwd=tmp_path
    )
    _refused_start(result, "lifecycle.lease_ttl")
    assert_port_free(port)


# ---------------------------------------------------------------- talaria admin create-user


def create_user(
    tmp_path: Path, data_dir: Path, *args: str, password: str = PASSWORD
) -> subprocess.CompletedProcess[str]:
    return talaria("admin", "create-user", "--data-dir", str(data_dir), *args, cwd=tmp_path, stdin=password + "\n")


def read_account(data_dir: Path, username: str) -> tuple[Any, str | None]:
    store = SQLiteStore(data_dir / "talaria.sqlite3")
    try:
        accounts = Accounts(store, SystemClock())
        return accounts.get(username), accounts.password_hash(username)
    finally:
        store.close()


def test_create_user(tmp_path: Path) -> None:
    data = tmp_path / "D"
    outputs: list[str] = []

    done = create_user(
        tmp_path, data, "--username", "alice", "--role", "user", "--allow", "local:default",
        "--allow", "local:research", "--team",
    )  # fmt: skip
    outputs += [done.stdout, done.stderr]
    assert done.returncode == 0, done.stderr
    account, stored_hash = read_account(data, "alice")
    assert account is not None
    assert account.role == "user"
    assert account.tenant == "default"
    assert account.enabled is True
    assert account.allowed_profiles == {"local": ["default", "research"]}
    assert account.can_manage_team is True
    assert stored_hash is not None and PASSWORD not in stored_hash
    assert verify_password(stored_hash, PASSWORD)

    again = create_user(tmp_path, data, "--username", "alice", "--role", "admin", password="another long password")
    outputs += [again.stdout, again.stderr]
    assert again.returncode == 1
    assert again.stderr.strip(), "the reason is on stderr"
    assert "alice" in again.stderr
    unchanged, _ = read_account(data, "alice")
    assert unchanged == account

    short = "Zq9short"
    weak = create_user(tmp_path, data, "--username", "carol", "--role", "user", password=short)
    outputs += [weak.stdout, weak.stderr]
    assert weak.returncode == 1
    assert "password" in weak.stderr
    assert short not in weak.stdout + weak.stderr
    assert read_account(data, "carol")[0] is None

    usage = create_user(tmp_path, data, "--username", "dave")
    outputs += [usage.stdout, usage.stderr]
    assert usage.returncode == 2
    assert "--role" in usage.stderr
    assert read_account(data, "dave")[0] is None

    bad_role = create_user(tmp_path, data, "--username", "erin", "--role", "root")
    outputs += [bad_role.stdout, bad_role.stderr]
    assert bad_role.returncode == 2

    admin = create_user(tmp_path, data, "--username", "bob", "--role", "admin", "--tenant", "acme")
    outputs += [admin.stdout, admin.stderr]
    assert admin.returncode == 0, admin.stderr
    bob, _ = read_account(data, "bob")
    assert bob is not None
    assert (bob.role, bob.tenant, bob.allowed_profiles, bob.can_manage_team) == ("admin", "acme", {}, False)

    for text in outputs:
        assert PASSWORD not in text
        assert "another long password" not in text


def test_set_user_enables_disables_changes_the_role_and_the_password_and_keeps_the_last_admin(tmp_path: Path) -> None:
    data = tmp_path / "D"
    assert create_user(tmp_path, data, "--username", "root", "--role", "admin").returncode == 0
    assert create_user(tmp_path, data, "--username", "ann", "--role", "user").returncode == 0

    def set_user(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return talaria("admin", "set-user", "--data-dir", str(data), *args, cwd=tmp_path, stdin=stdin)

    last = set_user("root", "--disable")
    assert last.returncode == 1 and "last enabled admin" in last.stderr, last.stderr
    demote = set_user("root", "--role", "user")
    assert demote.returncode == 1 and "last enabled admin" in demote.stderr, demote.stderr
    assert read_account(data, "root")[0].enabled is True

    done = set_user("ann", "--role", "admin")
    assert done.returncode == 0, done.stderr
    assert "ann" in done.stdout and "admin" in done.stdout
    before, _ = read_account(data, "ann")
    assert before.role == "admin" and before.auth_version == 2
    assert set_user("root", "--disable").returncode == 0  # ann is an enabled admin now
    assert read_account(data, "root")[0].enabled is False
    assert set_user("root", "--enable").returncode == 0
    assert read_account(data, "root")[0].enabled is True

    new_password = "a brand new long password"
    changed = set_user("ann", "--password-stdin", stdin=new_password + "\n")
    assert changed.returncode == 0, changed.stderr
    assert verify_password(read_account(data, "ann")[1] or "", new_password)
    assert new_password not in changed.stdout + changed.stderr
    weak = set_user("ann", "--password-stdin", stdin="short\n")
    assert weak.returncode == 1 and "password" in weak.stderr

    unknown = set_user("nobody", "--enable")
    assert unknown.returncode == 1 and "nobody" in unknown.stderr
    nothing = set_user("ann")
    assert nothing.returncode == 2, "say what to change"
    both = set_user("ann", "--enable", "--disable")
    assert both.returncode == 2


def test_create_user_reads_only_the_first_line_without_its_ending(tmp_path: Path) -> None:
    data = tmp_path / "D"
    password = "  spaces kept at both ends  "
    done = talaria(
        "admin", "create-user", "--data-dir", str(data), "--username", "frank", "--role", "user",
        cwd=tmp_path, stdin=password + "\nsecond line is not the password\n",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    _, stored_hash = read_account(data, "frank")
    assert verify_password(stored_hash, password)
    assert not verify_password(stored_hash, password.strip())


def test_only_the_hub_validates_hub_settings(tmp_path: Path) -> None:
    """web-api.md 8 / lifecycle.md 1.1: other commands ignore the settings they do not use."""
    data = tmp_path / "D"
    env = clean_env(
        TALARIA_RUNTIME_API_ENABLED="true",
        TALARIA_RUNTIME_API_PROXY_SECRET="short",
        TALARIA_LIFECYCLE_LEASE_TTL_S="not-a-number",
    )
    done = talaria(
        "admin", "create-user", "--data-dir", str(data), "--username", "hana", "--role", "user",
        cwd=tmp_path, stdin=PASSWORD + "\n", env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert talaria("db", "status", "--data-dir", str(data), cwd=tmp_path, env=env).returncode == 0
    assert talaria("audit", "verify", "--data-dir", str(data), cwd=tmp_path, env=env).returncode == 0


def test_create_user_uses_the_data_dir_from_the_environment(tmp_path: Path) -> None:
    env_dir = tmp_path / "from-env"
    done = talaria(
        "admin", "create-user", "--username", "gina", "--role", "user",
        cwd=tmp_path, stdin=PASSWORD + "\n", env=clean_env(TALARIA_DATA_DIR=str(env_dir)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert read_account(env_dir, "gina")[0] is not None
    assert not (tmp_path / "talaria-data").exists()

    default = talaria("admin", "create-user", "--username", "ivan", "--role", "user", cwd=tmp_path, stdin=PASSWORD)
    assert default.returncode == 0, default.stderr
    assert read_account(tmp_path / "talaria-data", "ivan")[0] is not None


# ---------------------------------------------------------------- talaria audit verify


def build_events(data_dir: Path) -> dict[str, Any]:
    """A task through its whole life via the engine, in-process: returns ids and the chain head."""
    data_dir.mkdir(parents=True, exist_ok=True)
    store = SQLiteStore(data_dir / "talaria.sqlite3")
    try:
        migrations.upgrade(store)
        clock = ManualClock()
        engine = Engine(store, clock, Settings(data_dir=data_dir))
        with store.write() as tx:
            tx.run("tenant_ensure", name="default", now=clock.now_ms())
        alice = Actor("acct:default/alice", frozenset(), "web", "default")
        bob = Actor("acct:default/bob", frozenset({"platform_admin"}), "web", "default")
        task = engine.create_task(
            alice, tenant="default", title="x", spec={"prompt": "hi"}, cell="local", profile="default", trace="a" * 32
        )
        engine.submit_task(alice, tenant="default", task_id=task.id)
        task, dispatch, job = engine.approve_and_dispatch(bob, tenant="default", task_id=task.id)
        worker = Actor("worker-1", frozenset({"runtime"}), "trusted_proxy", "default")
        binding = Binding(
            "default", task.id, task.trace, "worker-1", dispatch.provenance, dispatch.run_id,
            dispatch.id, job.id, "local", "default",
        )  # fmt: skip
        held = engine.claim(worker, job_id=job.id, binding=binding, worker_instance="w1").answer.lease.ref
        engine.start(worker, job_id=job.id, binding=binding, lease=held)
        clock.advance(10)
        engine.heartbeat(worker, job_id=job.id, binding=binding, progress={"p": 1}, lease=held)
        result = {"outputs": {}, "artifacts": [], "summary": "ok"}
        engine.complete(worker, job_id=job.id, binding=binding, result=result, lease=held)
        with store.read() as tx:
            head = tx.one("audit_head_get")
            events = tx.all("audit_scan", after_seq=0, limit=1000)
            evidence = tx.all("evidence_for_events", job_id=job.id)
    finally:
        store.close()
    assert head is not None
    return {
        "task": task,
        "dispatch": dispatch,
        "job": job,
        "events": events,
        "evidence": evidence,
        "head_seq": head["seq"],
        "head_hash": head["hash"],
    }


def tamper(data_dir: Path, *statements: tuple[str, tuple[Any, ...]]) -> None:
    conn = sqlite3.connect(data_dir / "talaria.sqlite3")
    try:
        for sql, params in statements:
            conn.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


def verify_output(result: subprocess.CompletedProcess[str]) -> str:
    """The report, without the JSON log lines on stderr (``build_events`` writes the database from this process,
    with its umask, so the command first logs ``mode_tightened`` for it)."""
    lines = (result.stdout + result.stderr).strip().splitlines()
    return "\n".join(line for line in lines if not line.startswith("{"))


def test_audit_verify_ok(tmp_path: Path) -> None:
    data = tmp_path / "D"
    built = build_events(data)
    count = len(built["events"])
    assert count >= 8 and built["head_seq"] == count
    result = talaria("audit", "verify", "--data-dir", str(data), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"audit chain OK: {count} events, head {built['head_hash']}\n"
    assert HEX64.match(built["head_hash"])


def test_engine_ids_carry_their_prefixes(tmp_path: Path) -> None:
    """lifecycle.md 1.2: the hub mints prefixed ULIDs (tsk_, dsp_, run_, job_, evt_, evd_)."""
    built = build_events(tmp_path / "D")
    ulid = r"[0-9A-HJKMNP-TV-Z]{26}"
    assert re.fullmatch(rf"tsk_{ulid}", built["task"].id)
    assert re.fullmatch(rf"dsp_{ulid}", built["dispatch"].id)
    assert re.fullmatch(rf"run_{ulid}", built["dispatch"].run_id)
    assert re.fullmatch(rf"job_{ulid}", built["job"].id)
    assert all(re.fullmatch(rf"evt_{ulid}", e["event_id"]) for e in built["events"])
    conn = sqlite3.connect(tmp_path / "D" / "talaria.sqlite3")
    try:
        evidence_ids = [row[0] for row in conn.execute("SELECT evidence_id FROM execution_evidence")]
    finally:
        conn.close()
    assert evidence_ids and all(re.fullmatch(rf"evd_{ulid}", e) for e in evidence_ids)


def test_audit_verify_detects_a_changed_body(tmp_path: Path) -> None:
    data = tmp_path / "D"
    built = build_events(data)
    body = next(e["body"] for e in built["events"] if e["seq"] == 2)
    forged = body.replace('"outcome":"applied"', '"outcome":"forged"')
    assert forged != body
    tamper(
        data,
        ("DROP TRIGGER audit_event_no_update", ()),
        ("UPDATE audit_event SET body = ? WHERE seq = 2", (forged,)),
    )
    result = talaria("audit", "verify", "--data-dir", str(data), cwd=tmp_path)
    assert result.returncode == 1
    assert verify_output(result) == "audit chain BROKEN at seq 2: hash_mismatch"


def test_audit_verify_detects_a_column_that_disagrees_with_the_body(tmp_path: Path) -> None:
    data = tmp_path / "D"
    build_events(data)
    tamper(
        data,
        ("DROP TRIGGER audit_event_no_update", ()),
        ("UPDATE audit_event SET to_state = 'APPROVED' WHERE seq = 2", ()),
    )
    result = talaria("audit", "verify", "--data-dir", str(data), cwd=tmp_path)
    assert result.returncode == 1
    assert re.fullmatch(r"audit chain BROKEN at seq 2: \w+", verify_output(result))


def test_audit_verify_detects_a_deleted_row(tmp_path: Path) -> None:
    data = tmp_path / "D"
    build_events(data)
    tamper(data, ("DROP TRIGGER audit_event_no_delete", ()), ("DELETE FROM audit_event WHERE seq = 3", ()))
    result = talaria("audit", "verify", "--data-dir", str(data), cwd=tmp_path)
    assert result.returncode == 1
    assert re.fullmatch(r"audit chain BROKEN at seq [34]: seq_gap", verify_output(result))


def test_audit_verify_detects_a_changed_prev_hash(tmp_path: Path) -> None:
    data = tmp_path / "D"
    build_events(data)
    tamper(
        data,
        ("DROP TRIGGER audit_event_no_update", ()),
        ("UPDATE audit_event SET prev_hash = ? WHERE seq = 3", ("f" * 64,)),
    )
    result = talaria("audit", "verify", "--data-dir", str(data), cwd=tmp_path)
    assert result.returncode == 1
    assert verify_output(result) == "audit chain BROKEN at seq 3: prev_hash_mismatch"


def test_audit_verify_on_an_empty_database(tmp_path: Path) -> None:
    data = tmp_path / "D"
    assert talaria("db", "upgrade", "--data-dir", str(data), cwd=tmp_path).returncode == 0
    result = talaria("audit", "verify", "--data-dir", str(data), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"audit chain OK: 0 events, head {'0' * 64}\n"


# ---------------------------------------------------------------- talaria db


def tables(data_dir: Path) -> set[str]:
    conn = sqlite3.connect(data_dir / "talaria.sqlite3")
    try:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()


def set_lines(output: str) -> dict[str, str]:
    found = {}
    for line in output.splitlines():
        for name in ("core", "lifecycle", "team"):
            if line.startswith(name):
                found[name] = line
    return found


def test_db_upgrade_status_downgrade(tmp_path: Path) -> None:
    data = tmp_path / "D"

    status = talaria("db", "status", "--data-dir", str(data), cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert set(set_lines(status.stdout)) == {"core", "lifecycle", "team"}

    upgrade = talaria("db", "upgrade", "--data-dir", str(data), cwd=tmp_path)
    assert upgrade.returncode == 0, upgrade.stderr
    assert "core" in upgrade.stdout and "lifecycle" in upgrade.stdout and "team" in upgrade.stdout
    assert {"task", "dispatch", "audit_event", "hermes_job", "idempotency_key", "goal"} <= tables(data)

    again = talaria("db", "upgrade", "--data-dir", str(data), cwd=tmp_path)
    assert again.returncode == 0
    assert "0001" not in again.stdout, "nothing left to apply"

    up_to_date = talaria("db", "status", "--data-dir", str(data), cwd=tmp_path)
    assert up_to_date.returncode == 0
    lines = set_lines(up_to_date.stdout)
    assert set(lines) == {"core", "lifecycle", "team"}
    assert lines != set_lines(status.stdout), "status reflects the applied migrations"

    conn = sqlite3.connect(data / "talaria.sqlite3")
    try:
        conn.execute(
            "INSERT INTO task (id, tenant, title, spec, cell, profile, trace, state, revision, created_by, created_at)"
            " VALUES ('tsk_keep', 'default', 't', '{}', 'local', 'default', ?, 'DRAFT', 1, 'acct:default/a', 0)",
            ("a" * 32,),
        )
        conn.commit()
    finally:
        conn.close()

    team_down = talaria("db", "downgrade", "--set", "team", "--to", "0", "--yes", "--data-dir", str(data), cwd=tmp_path)
    assert team_down.returncode == 0, team_down.stderr
    assert not {"goal", "bot_team", "assignment"} & tables(data)
    assert {"bot", "chat_turn", "hermes_job", "task"} <= tables(data)

    refused = talaria("db", "downgrade", "--set", "lifecycle", "--to", "0", "--data-dir", str(data), cwd=tmp_path)
    assert refused.returncode == 1
    assert "--yes" in refused.stderr
    assert "hermes_job" in tables(data)

    down = talaria("db", "downgrade", "--set", "lifecycle", "--to", "0", "--yes", "--data-dir", str(data), cwd=tmp_path)
    assert down.returncode == 0, down.stderr
    remaining = tables(data)
    assert "hermes_job" not in remaining
    assert {"task", "dispatch", "audit_event", "account"} <= remaining
    conn = sqlite3.connect(data / "talaria.sqlite3")
    try:
        assert conn.execute("SELECT id FROM task").fetchall() == [("tsk_keep",)]
    finally:
        conn.close()
    after_down = set_lines(talaria("db", "status", "--data-dir", str(data), cwd=tmp_path).stdout)
    assert after_down["core"] == lines["core"]
    assert after_down["lifecycle"] != lines["lifecycle"]
    assert after_down["team"] != lines["team"]

    back = talaria("db", "upgrade", "--data-dir", str(data), cwd=tmp_path)
    assert back.returncode == 0, back.stderr
    assert "lifecycle" in back.stdout and "team" in back.stdout
    assert {"hermes_job", "goal"} <= tables(data)
    assert set_lines(talaria("db", "status", "--data-dir", str(data), cwd=tmp_path).stdout) == lines


def test_db_downgrade_needs_a_set_and_a_version(tmp_path: Path) -> None:
    result = talaria("db", "downgrade", "--yes", "--data-dir", str(tmp_path / "D"), cwd=tmp_path)
    assert result.returncode == 2


def test_db_downgrade_of_core_before_lifecycle_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "D"
    assert talaria("db", "upgrade", "--data-dir", str(data), cwd=tmp_path).returncode == 0
    result = talaria("db", "downgrade", "--set", "core", "--to", "0", "--yes", "--data-dir", str(data), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip()
    assert {"task", "hermes_job"} <= tables(data)


# ---------------------------------------------------------------- talaria demo


@pytest.mark.slow
def test_demo_runs_to_completion_on_real_hermes(tmp_path: Path) -> None:
    result = talaria("demo", "--exit", cwd=tmp_path, env=clean_env(TMPDIR=str(tmp_path)), timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Hermes here is real hermes-agent 0.19.0 with the scripted model" in result.stdout
    assert "team tools ready: True []" in result.stdout
    reply = next(line for line in result.stdout.splitlines() if "Talaria says this conversation acts for:" in line)
    assert '"account":"bob"' in reply and '"workId":"test-turn:' in reply
    assert "turn complete" in result.stdout
    assert "the hub's dispatcher ran it on the node: job SUCCEEDED in attempt 1" in result.stdout
    assert "job.claimed by talaria-hub" in result.stdout and "job.completed by talaria-hub" in result.stdout
    assert "alice made bot Helper (default on local)" in result.stdout
    assert "    I am Helper, running in this node's Hermes." in result.stdout  # the streamed chat reply
    assert "    Continue this chat in your browser; I will remember it." in result.stdout
    assert re.search(r"continue alice's chat at http://127\.0\.0\.1:\d+/chats/cnv_\w+", result.stdout)
    assert "    Writer is drafting the launch note; I will report back here." in result.stdout  # the team goal
    assert "approved by Lead's team permission; goal complete" in result.stdout
    assert 'Talaria in alice\'s chat: Goal "Launch note" of team "Launch crew" is complete.' in result.stdout
    assert "audit chain OK" in result.stdout
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith("talaria-demo-")]
    assert left == [], "the demo's data directory (passwords, secret.key, a runner token) is removed at the end"
    assert "removed the data directory" in result.stdout.splitlines()[-1]


@pytest.mark.slow
def test_demo_falls_back_to_the_fixture_and_says_so(tmp_path: Path) -> None:
    env = clean_env(TMPDIR=str(tmp_path), TALARIA_HERMES_BIN=str(tmp_path / "no-hermes-here"))
    result = talaria("demo", "--exit", "--keep", cwd=tmp_path, env=env, timeout=180)
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("talaria-demo-")]
    assert len(kept) == 1 and (kept[0] / "demo-passwords.txt").exists(), "--keep keeps the data directory"
    assert f"kept the data directory {kept[0]}" in result.stdout.splitlines()[-1]
    assert result.returncode == 0, result.stdout + result.stderr
    assert "real Hermes is not available" in result.stdout and "make hermes" in result.stdout
    assert "Hermes here is Talaria's Hermes protocol fixture" in result.stdout
    assert "turn complete" in result.stdout and "audit chain OK" in result.stdout
    assert "the team goal needs a real Hermes (a model that calls the tools): skipped" in result.stdout
