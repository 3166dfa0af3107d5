"""A real ``hermes serve`` (hermes-agent 0.19.0) on 127.0.0.1 with a private home (hermes.md 7).

``RealHermes(workdir, model_url).start()`` writes ``<workdir>/home/config.yaml`` (the scripted model,
Tool Search off, the Talaria plugin enabled), installs Talaria's plugin into that home, and starts
``hermes serve --host 127.0.0.1 --port 0`` with a scrubbed environment: ``HERMES_HOME`` and ``HOME``
inside ``workdir``, a random ``HERMES_DASHBOARD_SESSION_TOKEN``, no inherited ``HERMES_*``,
``OPENAI_*``, ``CUSTOM_BASE_URL`` or proxy variables. It waits for ``HERMES_BACKEND_READY port=N``
and stops Hermes by PID. Named profiles are extra homes under ``home/profiles/<name>/``.

Hermes is found through ``TALARIA_HERMES_BIN``, else ``.venv-hermes/bin/hermes`` in the project
(``make hermes`` creates it). When it cannot be found, ``HermesNotInstalled`` says how to install it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import talaria

HERMES_VERSION = "0.19.0"
READY_TIMEOUT_S = 60.0
_SCRUBBED_PREFIXES = ("HERMES_", "OPENAI_", "ANTHROPIC_", "OPENROUTER_", "TALARIA_")
_SCRUBBED = {"CUSTOM_BASE_URL", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"}


class HermesNotInstalled(RuntimeError):
    pass


def project_root() -> Path:
    return Path(talaria.__file__).resolve().parents[2]


def hermes_bin() -> Path:
    """The ``hermes`` executable: ``TALARIA_HERMES_BIN``, else the project's ``.venv-hermes``."""
    configured = os.environ.get("TALARIA_HERMES_BIN")
    candidate = Path(configured) if configured else project_root() / ".venv-hermes" / "bin" / "hermes"
    if not candidate.is_file() or not os.access(candidate, os.X_OK):
        raise HermesNotInstalled(
            f"hermes-agent=={HERMES_VERSION} is not installed at {candidate}: run `make hermes` (it creates "
            f".venv-hermes), or set TALARIA_HERMES_BIN to a hermes executable of version {HERMES_VERSION}"
        )
    return candidate


def hermes_python() -> Path:
    """The Python interpreter of Hermes' environment (beside the ``hermes`` script)."""
    return hermes_bin().parent / "python"


def scrubbed_environment(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.upper().startswith(_SCRUBBED_PREFIXES) and key.upper() not in _SCRUBBED
    }
    env.update(extra)
    return env


def model_config(model_url: str, *, plugin: bool = True, extra: str = "") -> str:
    lines = [
        "model:",
        "  provider: custom",
        "  default: scripted",
        f'  base_url: "{model_url}"',
        "  api_key: test-key",
        "  supports_vision: true",  # an attached image goes to the model as an image part, not a description
        "tools:",
        "  tool_search:",
        '    enabled: "off"',
        "security:",
        "  allow_lazy_installs: false",
    ]
    if plugin:
        lines += ["plugins:", "  enabled: [talaria]"]
    return "\n".join(lines) + "\n" + extra


class RealHermes:
    def __init__(
        self,
        workdir: Path,
        model_url: str,
        *,
        profiles: tuple[str, ...] = (),
        plugin: bool = True,
        host: str = "127.0.0.1",
        config_extra: str = "",
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.home = workdir / "home"
        self.user_home = workdir / "user"
        self.model_url = model_url
        self.profiles = profiles
        self.plugin = plugin
        self.host = host
        self.config_extra = config_extra
        self.extra_env = dict(env or {})
        self.session_token = secrets.token_urlsafe(32)
        self.port = 0
        self.process: subprocess.Popen[str] | None = None
        self.output: deque[str] = deque(maxlen=400)
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def prepare(self) -> None:
        """Write the homes and install the plugin; idempotent, and done again by ``start``."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.user_home.mkdir(parents=True, exist_ok=True)
        config = model_config(self.model_url, plugin=self.plugin, extra=self.config_extra)
        (self.home / "config.yaml").write_text(config)
        for name in self.profiles:
            profile_home = self.home / "profiles" / name
            profile_home.mkdir(parents=True, exist_ok=True)
            (profile_home / "config.yaml").write_text(model_config(self.model_url, plugin=False))
        if self.plugin:
            from talaria.hermes_plugin.install import install_plugin

            install_plugin(self.home)

    def start(self) -> RealHermes:
        binary = hermes_bin()
        self.prepare()
        env = scrubbed_environment(
            HERMES_HOME=str(self.home),
            HOME=str(self.user_home),
            HERMES_DASHBOARD_SESSION_TOKEN=self.session_token,
            HERMES_DISABLE_LAZY_INSTALLS="1",  # no pip install during the first agent build
            **self.extra_env,
        )
        self.process = subprocess.Popen(  # noqa: S603 - our own hermes executable, fixed arguments
            [str(binary), "serve", "--host", self.host, "--port", "0"],
            env=env,
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        ready = threading.Event()
        self._reader = threading.Thread(target=self._read_output, args=(ready,), name="hermes-output", daemon=True)
        self._reader.start()
        if not ready.wait(READY_TIMEOUT_S) or not self.port:
            tail = "\n".join(list(self.output)[-30:])
            self.stop()
            raise RuntimeError(f"hermes serve did not report ready within {READY_TIMEOUT_S:g} s; its output:\n{tail}")
        return self

    def _read_output(self, ready: threading.Event) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line.rstrip("\n"))
            if line.startswith("HERMES_BACKEND_READY") and "port=" in line:
                self.port = int(line.split("port=", 1)[1].split()[0])
                ready.set()
        ready.set()  # the process ended before (or after) it was ready

    def stop(self) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        if self._reader is not None:
            self._reader.join(5)
        if process.stdout is not None:
            process.stdout.close()
        self.process = None

    def kill(self) -> None:
        """Stop Hermes at once (SIGKILL), as a crash would."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def restart(self) -> RealHermes:
        self.stop()
        self.port = 0
        return self.start()

    def __enter__(self) -> RealHermes:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def wait_gone(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.process is not None and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
