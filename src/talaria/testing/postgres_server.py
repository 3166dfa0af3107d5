"""A throwaway PostgreSQL server for tests and benchmarks (scale.md 2.6): ``initdb`` in a new directory, started on a
unix socket only (no TCP), as the current user or, under root (which PostgreSQL refuses), as ``postgres`` through
``runuser``. No containers. ``find_binaries`` says why when there is no server to start."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

ENV_BINDIR = "TALARIA_PG_BINDIR"
REQUIRE_ENV = "TALARIA_REQUIRE_POSTGRES"
SERVICE_USER = "postgres"
START_TIMEOUT_S = 60


class PostgresMissing(RuntimeError):
    """No PostgreSQL server binaries (or no way to run them as a non-root user) on this machine."""


def required() -> bool:
    """True when PostgreSQL tests must fail instead of skipping (CI sets ``TALARIA_REQUIRE_POSTGRES=1``)."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def find_binaries() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres`` (newest major release ≥ 15 under
    /usr/lib/postgresql, or ``$TALARIA_PG_BINDIR``); raises ``PostgresMissing`` saying what is missing."""
    candidates: list[Path] = []
    if os.environ.get(ENV_BINDIR):
        candidates.append(Path(os.environ[ENV_BINDIR]))
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        majors = sorted((p for p in root.iterdir() if p.name.isdigit() and int(p.name) >= 15),
                        key=lambda p: int(p.name), reverse=True)  # fmt: skip
        candidates.extend(p / "bin" for p in majors)
    for bindir in candidates:
        if all((bindir / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            if os.geteuid() == 0 and (shutil.which("runuser") is None or not _user_exists(SERVICE_USER)):
                raise PostgresMissing("running as root needs `runuser` and a `postgres` user to start PostgreSQL")
            return bindir
    raise PostgresMissing("no PostgreSQL 15+ server binaries (apt-get install postgresql-15, or set TALARIA_PG_BINDIR)")


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@dataclass
class PostgresServer:
    """One server in its own directory. ``durable=False`` turns fsync off for test speed; benchmarks keep it on."""

    bindir: Path
    root: Path
    durable: bool = False
    started: bool = False

    @classmethod
    def create(cls, *, durable: bool = False, parent: Path | None = None) -> PostgresServer:
        bindir = find_binaries()
        # a short path: a unix socket's path is limited to about 100 bytes
        root = Path(tempfile.mkdtemp(prefix="tpg", dir=parent or "/tmp"))  # noqa: S108 - a private new directory
        server = cls(bindir, root, durable)
        server._start()
        return server

    @property
    def socket_dir(self) -> Path:
        return self.root

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    def _as_service(self, argv: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", SERVICE_USER, "--", *argv]
        return argv

    def _run(self, argv: list[str], timeout: float = START_TIMEOUT_S) -> None:
        command = self._as_service(argv)
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603
        if done.returncode != 0:
            raise RuntimeError(f"{Path(argv[0]).name} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")

    def _start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, SERVICE_USER)
        self.root.chmod(0o700)
        self._run([str(self.bindir / "initdb"), "-D", str(self.data_dir), "-A", "trust", "-U", SERVICE_USER,
                   "-E", "UTF8", "--locale=C", "--no-sync"])  # fmt: skip
        options = [f"-k {self.socket_dir}", "-c listen_addresses=''", "-c max_connections=200",
                   "-c shared_buffers=64MB"]  # fmt: skip
        if not self.durable:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file), "-w",
                   "-t", str(START_TIMEOUT_S), "-o", " ".join(options), "start"])  # fmt: skip
        self.started = True

    def url(self, database: str = "postgres") -> str:
        """A libpq URL reaching ``database`` through the unix socket (no password: trust on the socket)."""
        return f"postgresql://{SERVICE_USER}@/{quote(database)}?host={quote(str(self.socket_dir), safe='')}"

    def stop(self) -> None:
        if self.started:
            self.started = False
            self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w", "stop"])
        shutil.rmtree(self.root, ignore_errors=True)
