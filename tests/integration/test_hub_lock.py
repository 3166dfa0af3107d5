"""One SQLite directory, one hub (scale.md 1): ``talaria hub`` holds ``<data_dir>/hub.lock``; a second hub on the
same directory exits 1 with one line and changes nothing; the lock ends with the hub, even a SIGKILLed one."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from talaria.errors import StoreUnavailable
from talaria.store import hub_lock
from tests.integration.cli_support import HubProcess, clean_env, talaria


def test_a_second_hub_on_the_data_directory_exits_1_and_the_lock_ends_with_a_killed_hub(tmp_path: Path) -> None:
    env = clean_env(TALARIA_DATA_DIR=str(tmp_path / "data"))
    hub = HubProcess(tmp_path, ["--port", "0"], env)
    try:
        _line, url = hub.ready()
        second = talaria("hub", "--port", "0", cwd=tmp_path, env=env)
        assert second.returncode == 1
        assert second.stderr.strip().splitlines() == ["talaria hub: another hub uses this data directory"]
        assert "listening" not in second.stdout
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200  # the first one serves on
        hub.proc.send_signal(signal.SIGKILL)
        hub.proc.wait(30)
    finally:
        hub.close()
    assert oct((tmp_path / "data" / "hub.lock").stat().st_mode & 0o777) == "0o600"
    again = HubProcess(tmp_path, ["--port", "0"], env)
    try:
        again.ready()  # the kernel let go of the killed hub's lock
        code, _ = again.stop(signal.SIGTERM)
        assert code == 0
    finally:
        again.close()


def test_the_lock_excludes_a_second_holder_in_the_same_process_until_released(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    first = hub_lock.hold(tmp_path)
    with pytest.raises(StoreUnavailable, match=r"^another hub uses this data directory$"):
        hub_lock.hold(tmp_path)
    first.release()
    first.release()  # idempotent
    hub_lock.hold(tmp_path).release()
