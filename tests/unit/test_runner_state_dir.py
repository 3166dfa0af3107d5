"""The runner's state directory: mode 0700 and the single-instance lock (runner-protocol.md section 3)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from talaria.runner.state_dir import StateDir, StateDirBusy, StateDirError

RUNNER_ID = "0b6f1b9e-7c55-4f0c-9a53-3f1de1c7a2b4"

HOLDER = """
import sys
from pathlib import Path
from talaria.runner.state_dir import StateDir
held = StateDir.open(Path(sys.argv[1]), sys.argv[2])
print("locked", flush=True)
sys.stdin.readline()
held.close()
print("released", flush=True)
"""


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "runner.json"
    path.write_text("{}")
    path.chmod(0o600)
    return path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def holder(config_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the lock; it releases when a line arrives on its stdin."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(config_path), RUNNER_ID],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def test_open_creates_the_directory_with_mode_0700(config_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with StateDir.open(config_path, RUNNER_ID) as state:
            assert state.path == config_path.parent / "state" / RUNNER_ID
            assert mode(state.path) == 0o700
            assert mode(state.path.parent) == 0o700
            assert state.receipts_path == state.path / "runner-commands.sqlite3"
            assert state.lock_path == state.path / "runner.lock"
            assert mode(state.lock_path) == 0o600
            assert state.lock_path.read_text().strip() == str(os.getpid())
    finally:
        os.umask(old)


def test_open_reuses_an_existing_private_directory(config_path: Path) -> None:
    with StateDir.open(config_path, RUNNER_ID) as state:
        (state.path / "keep").write_text("x")
    with StateDir.open(config_path, RUNNER_ID) as state:
        assert (state.path / "keep").read_text() == "x"


def test_a_relative_config_path_works(config_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(config_path.parent)
    with StateDir.open(Path("runner.json"), RUNNER_ID) as state:
        assert state.path == config_path.parent / "state" / RUNNER_ID


def test_a_second_open_in_the_same_process_is_busy(config_path: Path) -> None:
    first = StateDir.open(config_path, RUNNER_ID)
    try:
        with pytest.raises(StateDirBusy) as info:
            StateDir.open(config_path, RUNNER_ID)
        assert "another runner uses the state directory" in str(info.value)
        assert str(os.getpid()) in str(info.value)
        assert isinstance(info.value, StateDirError)
    finally:
        first.close()
    StateDir.open(config_path, RUNNER_ID).close()


def test_close_is_idempotent(config_path: Path) -> None:
    state = StateDir.open(config_path, RUNNER_ID)
    was_closed = state.closed
    assert not was_closed
    state.close()
    state.close()
    assert state.closed
    assert "closed" in repr(state)


def test_another_runner_id_is_another_directory(config_path: Path) -> None:
    with StateDir.open(config_path, RUNNER_ID), StateDir.open(config_path, RUNNER_ID[:-1] + "5") as other:
        assert other.path.name.endswith("5")


def test_another_process_holding_the_lock_makes_it_busy(config_path: Path, holder: subprocess.Popen[str]) -> None:
    with pytest.raises(StateDirBusy, match="another runner uses the state directory") as info:
        StateDir.open(config_path, RUNNER_ID)
    assert str(holder.pid) in str(info.value)
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.write("go\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "released"
    StateDir.open(config_path, RUNNER_ID).close()


def test_a_killed_holder_leaves_no_stale_lock(config_path: Path, holder: subprocess.Popen[str]) -> None:
    with pytest.raises(StateDirBusy):
        StateDir.open(config_path, RUNNER_ID)
    holder.kill()
    holder.wait(timeout=30)
    with StateDir.open(config_path, RUNNER_ID) as state:
        assert state.lock_path.exists()


@pytest.mark.parametrize("loose", [0o750, 0o705, 0o755, 0o701, 0o710])
def test_a_directory_open_to_group_or_other_is_refused(config_path: Path, loose: int) -> None:
    StateDir.open(config_path, RUNNER_ID).close()
    path = config_path.parent / "state" / RUNNER_ID
    path.chmod(loose)
    with pytest.raises(StateDirError, match="chmod 700") as info:
        StateDir.open(config_path, RUNNER_ID)
    assert not isinstance(info.value, StateDirBusy)
    assert mode(path) == loose  # refused, not repaired


def test_a_symbolic_link_is_refused(config_path: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (config_path.parent / "state").mkdir(mode=0o700)
    (config_path.parent / "state" / RUNNER_ID).symlink_to(target)
    with pytest.raises(StateDirError, match="symbolic link"):
        StateDir.open(config_path, RUNNER_ID)


def test_a_file_in_place_of_the_directory_is_refused(config_path: Path) -> None:
    (config_path.parent / "state").mkdir(mode=0o700)
    (config_path.parent / "state" / RUNNER_ID).write_text("")
    with pytest.raises(StateDirError):
        StateDir.open(config_path, RUNNER_ID)


def test_a_state_folder_writable_by_others_is_refused(config_path: Path) -> None:
    state = config_path.parent / "state"
    state.mkdir()
    state.chmod(0o777)
    with pytest.raises(StateDirError, match="writable by group or other"):
        StateDir.open(config_path, RUNNER_ID)


def test_a_readable_state_folder_is_accepted(config_path: Path) -> None:
    state = config_path.parent / "state"
    state.mkdir()
    state.chmod(0o755)
    StateDir.open(config_path, RUNNER_ID).close()


def test_a_symlinked_lock_file_is_refused(config_path: Path, tmp_path: Path) -> None:
    StateDir.open(config_path, RUNNER_ID).close()
    lock = config_path.parent / "state" / RUNNER_ID / "runner.lock"
    lock.unlink()
    lock.symlink_to(tmp_path / "victim")
    with pytest.raises(StateDirError, match="cannot use"):
        StateDir.open(config_path, RUNNER_ID)
    assert not (tmp_path / "victim").exists()


@pytest.mark.parametrize("bad", ["../escape", "0B6F1B9E-7C55-4F0C-9A53-3F1DE1C7A2B4", "", "x"])
def test_the_runner_id_must_be_a_uuid(config_path: Path, bad: str) -> None:
    with pytest.raises(StateDirError):
        StateDir.open(config_path, bad)
    assert not (config_path.parent / "state").exists()
