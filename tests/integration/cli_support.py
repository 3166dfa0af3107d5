"""The ``talaria`` command line as real processes, for tests: one-shot commands and a running ``talaria hub``.

Every command runs as ``python -m talaria`` with every ``TALARIA_*`` variable of the calling environment removed
except those a test sets.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

READY = re.compile(r"^talaria hub listening on (https?://127\.0\.0\.1:(\d+))\n$")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALARIA_")}
    env.update(extra)
    return env


def talaria(
    *args: str,
    cwd: Path,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    umask: int = -1,
) -> subprocess.CompletedProcess[str]:
    """``python -m talaria ARGS``; ``umask`` (when not -1) is the child's umask."""
    return subprocess.run(
        [sys.executable, "-m", "talaria", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env if env is not None else clean_env(),
        timeout=timeout,
        check=False,
        umask=umask,
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class HubProcess:
    """``talaria hub ...`` with stdout read line by line in a thread and stderr in a file."""

    def __init__(self, cwd: Path, args: list[str], env: dict[str, str], *, umask: int = -1) -> None:
        self.stderr_path = cwd / f"hub-{id(self)}.stderr"
        self._stderr = self.stderr_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "talaria", "hub", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=cwd,
            env=env,
            umask=umask,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text()

    def stacks(self, timeout: float = 10) -> str:
        """Ask the hub for every thread's stack (SIGUSR1) and return what it wrote to stderr for it ("" if it
        wrote nothing within ``timeout``): what a test prints before failing on a hub that stopped answering."""
        before = len(self.stderr())
        if self.proc.poll() is not None:
            return ""
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and "Current thread" not in self.stderr()[before:]:
            time.sleep(0.05)
        time.sleep(0.1)  # the signal handler writes the whole dump at once; this only lets the file catch up
        return self.stderr()[before:]

    def ready(self, timeout: float = 30) -> tuple[str, str]:
        """Wait for the ready line; returns (line, url)."""
        line = self.lines.get(timeout=timeout)
        if line is None:
            self.proc.wait(timeout=10)
            pytest.fail(f"the hub exited with {self.proc.returncode} before it was ready:\n{self.stderr()}")
        match = READY.match(line)
        assert match, f"unexpected first line {line!r}"
        return line, match.group(1)

    def stop(self, sig: signal.Signals, timeout: float = 15) -> tuple[int, list[str]]:
        """Send ``sig`` and wait; returns the exit code and the stdout lines after the ready line."""
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        rest: list[str] = []
        while (line := self.lines.get_nowait()) is not None:
            rest.append(line)
        return code, rest

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()
