"""``talaria db backup`` while the hub serves (operations.md 7.1; scenario 9.16): lifecycles on four threads and a
runner's job turns go on during the backup, and the copy passes ``integrity_check`` and ``audit verify``; bad
input is one line, exit 1, nothing written."""

from __future__ import annotations

import re
import shutil
import sqlite3
import stat
import threading
from pathlib import Path

import pytest

from talaria.testing import lifecycles
from talaria.testing.lifecycles import lifecycle, prepare_tasks
from tests.integration.cli_support import clean_env, talaria
from tests.integration.dispatch_support import hub_env

LINE = re.compile(r"^backup written: (/\S+) \((\d+) bytes, audit chain OK: (\d+) events, head ([0-9a-f]{64})\)$")


def test_a_backup_taken_while_jobs_run_is_consistent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycles, "CELL", "elsewhere")  # a cell without a runner: the dispatcher leaves them be
    with hub_env(tmp_path) as env:
        env.start_runner()
        engine = env.server.hub.engine
        tasks = prepare_tasks(engine, 2000)
        failures: list[BaseException] = []
        completed: list[str] = []
        stop = threading.Event()

        def work(mine: list[str]) -> None:
            try:
                for task_id in mine:
                    if stop.is_set():
                        return
                    lifecycle(engine, task_id)
                    completed.append(task_id)
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(tasks[n::4],)) for n in range(4)]
        for thread in threads:
            thread.start()
        jobs = [env.approved_job(f"during the backup {n}") for n in range(3)]
        target = tmp_path / "backups" / "hub.sqlite3"
        target.parent.mkdir()
        before = len(completed)
        done = talaria("db", "backup", "--to", str(target), "--data-dir", str(env.server.data_dir), cwd=tmp_path,
                       env=clean_env())  # fmt: skip
        during = len(completed) - before
        stop.set()
        for thread in threads:
            thread.join(60)
        for job in jobs:
            env.wait_job(job["id"], lambda j: j["state"] == "SUCCEEDED", timeout=60)
    assert not failures, failures
    assert done.returncode == 0, done.stderr
    assert during > 0 and len(completed) < len(tasks), "lifecycles went on during the backup"
    match = LINE.match(done.stdout.strip().splitlines()[-1])
    assert match, done.stdout
    assert (Path(match[1]), int(match[2])) == (target, target.stat().st_size)
    assert int(match[3]) > 0
    assert sorted(p.name for p in target.parent.iterdir()) == ["hub.sqlite3", "hub.sqlite3.audit.key"]
    for path in target.parent.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    key = (tmp_path / "data" / "audit.key").read_bytes()
    assert (target.parent / "hub.sqlite3.audit.key").read_bytes() == key
    with sqlite3.connect(f"file:{target}?mode=ro", uri=True) as copy:
        assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert copy.execute("PRAGMA journal_mode").fetchone() == ("delete",), "one self-contained file"
    restored = tmp_path / "restored"
    restored.mkdir(mode=0o700)
    shutil.copy(target, restored / "talaria.sqlite3")
    shutil.copy(target.parent / "hub.sqlite3.audit.key", restored / "audit.key")
    verified = talaria("audit", "verify", "--data-dir", str(restored), cwd=tmp_path, env=clean_env())
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.strip() == f"audit chain OK: {match[3]} events, head {match[4]}"


def test_bad_targets_and_postgresql_are_refused_and_write_nothing(tmp_path: Path) -> None:
    with hub_env(tmp_path) as env:
        data = str(env.server.data_dir)
        existing = tmp_path / "existing.sqlite3"
        existing.write_text("keep me")
        cases = [
            (["--to", str(existing)], f"{existing} exists; remove it or choose another file"),
            (["--to", str(tmp_path / "missing" / "b.sqlite3")], "cannot write"),
            ([], "--to FILE names the backup to write"),
        ]
        for args, message in cases:
            done = talaria("db", "backup", *args, "--data-dir", data, cwd=tmp_path, env=clean_env())
            assert done.returncode == 1, (args, done.stdout)
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("talaria db backup: ") and message in lines[0], lines
        assert existing.read_text() == "keep me"
        key_taken = tmp_path / "k.sqlite3"
        (tmp_path / "k.sqlite3.audit.key").write_text("someone's")
        done = talaria("db", "backup", "--to", str(key_taken), "--data-dir", data, cwd=tmp_path, env=clean_env())
        assert done.returncode == 1 and "k.sqlite3.audit.key exists" in done.stderr
        assert not key_taken.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if "sqlite3" in p.name) == [
        "existing.sqlite3", "k.sqlite3.audit.key"
    ]  # fmt: skip
    postgres = talaria("db", "backup", "--to", str(tmp_path / "pg.sqlite3"), cwd=tmp_path,
                       env=clean_env(TALARIA_DATABASE_URL="postgresql://talaria@127.0.0.1:1/talaria"))  # fmt: skip
    assert postgres.returncode == 1
    assert "operations.md 7.3" in postgres.stderr and not (tmp_path / "pg.sqlite3").exists()


def test_a_file_that_is_not_a_database_is_one_line_and_odd_characters_in_paths_are_kept(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir(mode=0o700)
    (broken / "talaria.sqlite3").write_bytes(b"not a database, " * 100)
    target = tmp_path / "b.sqlite3"
    done = talaria("db", "backup", "--to", str(target), "--data-dir", str(broken), cwd=tmp_path, env=clean_env())
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("talaria db backup: ") and "Traceback" not in done.stderr, lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken"], "nothing written"

    odd = tmp_path / "d?x#y%z"  # characters a hand-made SQLite URI would misread
    with hub_env(odd):
        pass
    made = talaria("db", "backup", "--to", str(tmp_path / "odd?.sqlite3"), "--data-dir", str(odd / "data"),
                   cwd=tmp_path, env=clean_env())  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "broken", "d?x#y%z", "odd?.sqlite3", "odd?.sqlite3.audit.key"
    ], "no stray file"  # fmt: skip
