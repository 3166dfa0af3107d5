"""The single-file runner (operations.md 1; scenarios 9.1 and 9.2): ``make runner-bundle``'s archive is
reproducible, pure Python, small and free of hub packages, and a Python with nothing installed runs it against a
real hub and the Hermes fixture.

The builds read their wheels from the checkout's ``build/wheels`` cache (``pip download`` fills it once).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from talaria.bundle import build as bundle
from talaria.bundle.wheels import BundleError, check_tag
from talaria.clock import SystemClock
from talaria.hub.runners.connection_state import AccountRef, Gateway
from talaria.release import describe, runner_version
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from tests.conftest import add_account
from tests.integration.runner_support import RunnerProcess, outcome, register_node, send

CHECKOUT = Path(__file__).resolve().parents[2]
WHEELS = CHECKOUT / "build" / "wheels"
VERSION_LINE = re.compile(r"talaria-runner 0\.1\.0(\+[0-9a-f]{12}(\.dirty)?|\+dirty)? \(protocol 1\)")


def make_bundle(out: Path, **environ: str) -> subprocess.CompletedProcess[str]:
    """``python -m talaria.bundle`` (what ``make runner-bundle`` runs) into ``out``."""
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"} | environ
    command = [sys.executable, "-m", "talaria.bundle", "--out", str(out), "--wheels", str(WHEELS)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = make_bundle(out)
    assert done.returncode == 0, done.stderr
    return out / bundle.NAME


def test_two_builds_are_byte_identical_pure_python_small_and_free_of_hub_packages(built: Path, tmp_path: Path) -> None:
    again = make_bundle(tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"wrote {tmp_path / bundle.NAME} (" in again.stdout
    first, second = built.read_bytes(), (tmp_path / bundle.NAME).read_bytes()
    digest = hashlib.sha256(first).hexdigest()
    assert hashlib.sha256(second).hexdigest() == digest, "two builds of one commit are byte-identical"
    assert (built.parent / f"{bundle.NAME}.sha256").read_text() == f"{digest}  {bundle.NAME}\n"
    assert f"sha256 {digest}" in again.stdout

    assert first.startswith(b"#!/usr/bin/env python3\n")
    assert stat.S_IMODE(built.stat().st_mode) == 0o755
    assert len(first) <= 5 * 1024 * 1024
    with zipfile.ZipFile(built) as archive:
        infos = archive.infolist()
        names = [info.filename for info in infos]
        build_txt = archive.read("talaria/build.txt").decode()
    assert names == sorted(names), "entries sorted"
    assert len({info.date_time for info in infos}) == 1, "one fixed timestamp"
    assert not [n for n in names if n.endswith((".so", ".pyd", ".dylib"))]
    tops = {n.split("/", 1)[0] for n in names}
    assert not tops & {"fastapi", "starlette", "uvicorn", "pydantic", "argon2", "psycopg", "structlog"}
    assert not [n for n in names if n.startswith(("talaria/hub/", "talaria/store/", "talaria/lifecycle/"))]
    expected = ["__main__.py", "talaria/runner/agent.py", "talaria/hermes/ws.py", "httpx/__init__.py"]
    expected += ["websockets/__init__.py", "h11/__init__.py", "certifi/cacert.pem", "typing_extensions.py"]
    assert [module for module in expected if module not in names] == []
    licences = [n for n in names if ".dist-info/" in n and "LICEN" in n.upper()]
    assert {n.split("-", 1)[0] for n in licences} >= {"httpx", "websockets", "idna", "certifi"}, "licences kept"
    assert build_txt == f"{describe(CHECKOUT)}\n"


def test_source_date_epoch_sets_every_timestamp(tmp_path: Path) -> None:
    done = make_bundle(tmp_path, SOURCE_DATE_EPOCH="1700000000")
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(tmp_path / bundle.NAME) as archive:
        assert {info.date_time for info in archive.infolist()} == {(2023, 11, 14, 22, 13, 20)}
    refused = make_bundle(tmp_path / "bad", SOURCE_DATE_EPOCH="yesterday")
    assert refused.returncode == 1
    assert (
        refused.stderr.strip()
        == "runner bundle refused: SOURCE_DATE_EPOCH must be a number of seconds, not 'yesterday'"
    )
    assert not (tmp_path / "bad").exists(), "nothing written"


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["websockets/speedups.cpython-311-x86_64-linux-gnu.so"], "a native file"),
        (["lib/helper.pyd"], "a native file"),
        (["lib/helper.dylib"], "a native file"),
        (["fastapi/__init__.py"], "a hub package"),
        (["pydantic/main.py"], "a hub package"),
        (["talaria/hub/app.py"], "a hub package"),
        (["talaria/store/sqlite.py"], "a hub package"),
        (["talaria/lifecycle/engine.py"], "a hub package"),
    ],
)
def test_the_build_refuses_a_native_file_or_a_hub_package_naming_it(names: list[str], message: str) -> None:
    with pytest.raises(BundleError) as info:
        bundle.check_entries(["__main__.py", *names])
    assert str(info.value) == f"{names[0]}: {message} cannot be in the single-file runner"


def test_only_pure_python_wheels_are_vendored() -> None:
    check_tag("httpx-0.28.1-py3-none-any.whl")
    check_tag("six-1.17.0-py2.py3-none-any.whl")
    with pytest.raises(BundleError, match=r"^websockets: only py3-none-any wheels may be vendored, got cp311-cp311-"):
        check_tag("websockets-17.4-cp311-cp311-manylinux_2_17_x86_64.whl")
    with pytest.raises(BundleError, match=r"^anyio: only py3-none-any"):
        check_tag("anyio-4.16.0-py2-none-any.whl")


def test_the_size_limit_is_5_mib(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sizes: list[int] = []
    real = bundle.archive_bytes

    def padded(entries: dict[str, bytes], epoch: int) -> bytes:
        data = real(entries, epoch)
        return data + b"\0" * (bundle.MAX_BYTES + len(sizes) - len(data))  # the limit, then one byte over

    monkeypatch.setattr(bundle, "archive_bytes", padded)
    say: list[str] = []
    made = bundle.build(CHECKOUT, tmp_path / "edge", WHEELS, say.append, {})
    assert made.size == bundle.MAX_BYTES
    sizes.append(1)
    with pytest.raises(BundleError, match=f"would be {bundle.MAX_BYTES + 1} bytes, more than the limit"):
        bundle.build(CHECKOUT, tmp_path / "over", WHEELS, say.append, {})
    assert not (tmp_path / "over").exists()


def test_version_is_the_same_from_the_bundle_and_from_talaria_runner(built: Path) -> None:
    from_bundle = subprocess.run(
        [sys.executable, "-I", str(built), "--version"], capture_output=True, text=True, check=False
    )
    from_cli = subprocess.run(
        [sys.executable, "-m", "talaria", "runner", "--version"], capture_output=True, text=True, check=False
    )
    assert (from_bundle.returncode, from_cli.returncode) == (0, 0)
    assert from_bundle.stdout == from_cli.stdout == f"talaria-runner {runner_version()} (protocol 1)\n"
    assert VERSION_LINE.fullmatch(from_bundle.stdout.strip()), from_bundle.stdout


def test_main_parses_under_python_3_6_and_an_older_python_exits_2_saying_so(built: Path) -> None:
    ast.parse(bundle.MAIN, feature_version=(3, 6))
    # An interpreter older than 3.11, injected: run_path runs the archive's __main__ with version_info replaced.
    code = (
        "import runpy, sys\n"
        "sys.version_info = (3, 10, 14, 'final', 0)\n"
        f"runpy.run_path({str(built)!r}, run_name='__main__')\n"
    )
    old = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert old.returncode == 2
    assert old.stderr == "talaria-runner needs Python 3.11 or newer (found 3.10.14)\n"
    assert old.stdout == ""


def tree(root: Path, *, skip: tuple[Path, ...] = ()) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` (but ``skip``) with its size and modification time."""
    found: dict[str, tuple[int, int]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not any(path == s or s in path.parents for s in skip):
            info = path.stat()
            found[str(path.relative_to(root))] = (info.st_size, info.st_mtime_ns)
    return found


@pytest.fixture
def clean_python(tmp_path: Path) -> Iterator[Path]:
    """A venv made ``--without-pip``: a Python 3.11+ with nothing installed."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    bare = subprocess.run([python, "-I", "-c", "import httpx"], capture_output=True, check=False)
    assert bare.returncode == 1, "nothing installed"
    yield python


def test_a_clean_python_runs_the_bundle_against_a_hub_and_hermes_then_stops_on_sigterm(
    built: Path, clean_python: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with HermesFixture() as hermes:
        server = HubServer(tmp_path / "data", SystemClock()).start()
        try:
            add_account(server, "alice", allowed_profiles={"local": ["default"]})
            node = tmp_path / "node"
            config = register_node(server, node, hermes_url=hermes.url, session_token=hermes.session_token)
            runner_id = json.loads(config.read_text())["runnerId"]
            logs = tmp_path / "logs"
            before = {"node": tree(node), "venv": tree(clean_python.parents[1]), "dist": tree(built.parent)}
            argv = ["env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin", str(clean_python), "-I", str(built),
                    "--config", str(config)]  # fmt: skip
            runner = RunnerProcess(config, logs, "bundle", argv=argv)
            try:
                runner.wait_for("runner connected", timeout=30)
                admin = server.hub.runners.summary(runner_id)
                assert admin["runnerVersion"] == runner_version(), "the User-Agent names the bundle's build"

                config_get = {"path": "/api/config", "method": "GET", "search": "?profile=default"}
                reply = outcome(server, send(server, runner_id, config_get), timeout=30)
                assert isinstance(reply, dict) and reply["status"] == 200, reply
                found = server.hub.accounts.get("alice")
                assert found is not None
                channels = server.hub.channels
                gateway: Gateway = server.call(
                    channels.open_gateway(runner_id, AccountRef(found.username, found.tenant, found.auth_version))
                )
                created = server.call(channels.rpc(gateway, "session.create", {"close_on_disconnect": False}))
                session = created["session_id"]
                submitted = server.call(channels.rpc(gateway, "prompt.submit", {"session_id": session, "text": "hi"}))
                assert submitted == {"status": "streaming"}
                assert complete_text(server, gateway, session) == "echo: hi"
                assert hermes.prompt_count("hi") == 1
                server.call(channels.close_gateway(gateway))

                assert runner.stop(signal.SIGTERM) == 0, runner.stderr
                assert runner.lines[-1] == "runner stopped", runner.stderr
                assert "Traceback" not in runner.stderr
            finally:
                runner.close()
            runner.assert_silent_about(hermes.session_token)
        finally:
            server.stop()
    state = node / "state"
    assert state.is_dir()
    after = {"node": tree(node, skip=(state,)), "venv": tree(clean_python.parents[1]), "dist": tree(built.parent)}
    assert after == before, "nothing written outside the state directory"
    assert list(home.iterdir()) == []
    assert sorted(p.name for p in logs.iterdir()) == ["bundle.stderr", "bundle.stdout"], "nothing in the cwd"


def complete_text(server: HubServer, gateway: Gateway, session: str) -> str:
    """The text of the session's ``message.complete`` frame, read from the hub-side gateway."""
    import asyncio

    async def read() -> str:
        async with asyncio.timeout(20):
            while True:
                frame = await gateway.events.get()
                assert frame is not None, "the channel closed before the reply"
                if frame["type"] == "message.complete" and frame.get("session_id") == session:
                    return str(frame["payload"]["text"])

    text: str = server.call(read(), 25)
    return text


def test_install_service_from_the_bundle_starts_the_bundle_with_its_interpreter(built: Path, tmp_path: Path) -> None:
    server = HubServer(tmp_path / "data", SystemClock()).start()
    try:
        config = register_node(server, tmp_path / "node", hermes_url="http://127.0.0.1:9119", session_token="x")
    finally:
        server.stop()
    python = os.path.abspath(sys.executable)
    done = subprocess.run(
        [python, "-I", str(built), "install-service", "--config", str(config), "--user", "--print"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"\nExecStart={python} {built} --config {config}\n" in done.stdout
