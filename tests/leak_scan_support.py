"""The after-test leak scan (issue 17 part 4; DESIGN.md: secrets and message text never appear in logs, audit or
errors). After every test, the secrets and message texts the test made are looked for where they must not be.

What is looked for:
- every value ``secrets.token_urlsafe`` made in this process during the test (runner tokens, web sessions, CSRF
  tokens, grant bearers, Hermes session tokens, passwords of the demo), anywhere in the text; and every one made
  earlier in the session (by a module-scoped fixture, say) where it stands whole between other characters;
- the ``token`` of every ``runner.json`` under the test's ``tmp_path`` (a runner process's rotated tokens stay in its
  own files), the bearer of every bind a Hermes fixture received, the Runtime API proxy secret of every ``Settings``
  made, and the tests' password;
- message texts: every line (12 characters or more, markers aside) of a prompt a Hermes fixture or the scripted model
  received, and of a reply the Hermes fixture streamed.

Where: the test's captured log records (setup, call and the other fixtures' teardown); under its ``tmp_path``, every
log file (``*.log``, ``*.stdout``, ``*.stderr``, ``*.jsonl``), the raw bytes of every runner's receipts
(``runner-commands.sqlite3`` and its WAL; secrets only: a receipt may hold a reply that quotes a message) and every
row of the audit table of every hub database. Directories made with ``tmp_path_factory`` are not looked at.

The product's outputs meant to carry a secret are not scanned: the stdout of ``talaria runner register`` (a
``runner.json``), ``runner.json`` and token files themselves, and the hub's tables other than the audit table (hashes,
and the CSRF token the browser is given)."""

from __future__ import annotations

import json
import logging
import re
import secrets
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIN_TEXT_CHARS = 12
LOG_SUFFIXES = (".log", ".stdout", ".stderr", ".jsonl")
RECEIPTS = "runner-commands.sqlite3"
HUB_DATABASE = "talaria.sqlite3"
_MARKER = re.compile(r"\[/?talaria-[a-z-]+")
_URLSAFE_RUN = re.compile(r"[A-Za-z0-9_-]{16,}")


@dataclass
class Made:
    """What the running test made: filled by the recorders, emptied before each test."""

    tokens: set[str] = field(default_factory=set)
    every_token: set[str] = field(default_factory=set)  # of the whole session: module-scoped fixtures make some
    hermes: list[Any] = field(default_factory=list)  # HermesFixture instances started
    models: list[Any] = field(default_factory=list)  # ModelServer instances started
    real_hermes: list[Any] = field(default_factory=list)  # RealHermes instances started: their files are Hermes'

    def clear(self) -> None:
        self.tokens.clear()
        self.hermes.clear()
        self.models.clear()
        self.real_hermes.clear()


MADE = Made()


def install_recorders() -> None:
    """Wrap ``secrets.token_urlsafe``, ``Settings`` and the fixtures' start so that what a test makes is known."""
    from talaria import settings
    from talaria.testing.hermes_fixture import HermesFixture
    from talaria.testing.model_server import ModelServer
    from talaria.testing.real_hermes import RealHermes

    made_token = secrets.token_urlsafe

    def token_urlsafe(nbytes: int | None = None) -> str:
        value = made_token(nbytes)
        MADE.tokens.add(value)
        MADE.every_token.add(value)
        return value

    secrets.token_urlsafe = token_urlsafe
    settings_init = settings.Settings.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        settings_init(self, *args, **kwargs)
        if self.runtime_api_proxy_secret:
            MADE.tokens.add(self.runtime_api_proxy_secret)

    settings.Settings.__init__ = init  # type: ignore[method-assign]
    _record_instances(HermesFixture, "start", MADE.hermes)
    _record_instances(ModelServer, "start", MADE.models)
    _record_instances(RealHermes, "start", MADE.real_hermes)


def _record_instances(cls: type, method: str, into: list[Any]) -> None:
    original = getattr(cls, method)

    def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not any(seen is self for seen in into):
            into.append(self)
        return original(self, *args, **kwargs)

    setattr(cls, method, recorded)


@dataclass(frozen=True)
class Leak:
    kind: str  # "secret" or "message text"
    where: str
    sample: str  # the first 6 characters only: a finding must not print the secret

    def __str__(self) -> str:
        return f"{self.kind} {self.sample}… in {self.where}"


def message_texts(hermes: Iterable[Any], models: Iterable[Any]) -> set[str]:
    """Lines of prompts and replies the fixtures saw, without Talaria's markers, of 12 characters or more."""
    texts: list[str] = []
    for fixture in hermes:
        for turn in fixture.turns():
            texts += [turn.text, turn.reply]
    for model in models:
        texts += [request.last_user or "" for request in model.chat_requests()]
    lines = {line.strip() for text in texts for line in text.splitlines()}
    return {line for line in lines if len(line) >= MIN_TEXT_CHARS and not _MARKER.search(line)}


def secrets_of(files: list[Path], hermes: Iterable[Any], password: str) -> set[str]:
    found = set(MADE.tokens) | {password}
    for fixture in hermes:
        found |= {str(b["bearer"]) for b in fixture.binds() if isinstance(b.get("bearer"), str)}
    for config in (p for p in files if p.name == "runner.json"):
        try:
            token = json.loads(config.read_text(encoding="utf-8")).get("token")
        except (OSError, ValueError, AttributeError, RecursionError):  # the fuzzers write any file there
            continue
        if isinstance(token, str):
            found.add(token)
    return {value for value in found if len(value) >= MIN_TEXT_CHARS}


def scan(
    *, log_text: str, files: list[Path], secret_values: set[str], texts: set[str]
) -> list[Leak]:  # fmt: skip
    leaks: list[Leak] = []
    both = [("secret", secret_values), ("message text", texts)]
    leaks += _look("captured log", log_text, both)
    for path in files:
        if path.name.endswith(LOG_SUFFIXES):
            leaks += _look(str(path), _read(path), both)
        elif path.name.startswith(RECEIPTS):
            leaks += _look(str(path), _read(path), [("secret", secret_values)])
        elif path.name == HUB_DATABASE:
            leaks += _look(f"{path} audit_event", _audit(path), both)
    return leaks


def _look(where: str, text: str, kinds: list[tuple[str, set[str]]]) -> Iterator[Leak]:
    if not text:
        return
    for kind, values in kinds:
        for value in values:
            if value in text:
                yield Leak(kind, where, value[:6])
    if kinds[0][0] == "secret":  # a token any earlier fixture of the session made, written whole
        for run in _URLSAFE_RUN.findall(text):
            if run in MADE.every_token and run not in kinds[0][1]:
                yield Leak("secret", where, run[:6])


def talaria_files(tmp: Path | None) -> list[Path]:
    """Talaria's files under ``tmp``, walked once per test: a real Hermes' work directory holds Hermes' own logs (its
    agent log quotes every prompt), which are Hermes' business, not Talaria's."""
    if tmp is None or not tmp.is_dir():
        return []
    hermes_dirs = [Path(h.workdir) for h in MADE.real_hermes]
    return [
        p for p in tmp.rglob("*")
        if p.is_file() and not p.is_symlink() and not any(p.is_relative_to(d) for d in hermes_dirs)
    ]  # fmt: skip


def scanned_records(records: Iterable[logging.LogRecord]) -> str:
    """The text of the captured records Talaria wrote: the Hermes fixture and the model server stand in for Hermes
    (``talaria.testing``), and uvicorn's DEBUG trace of their requests quotes the URL Hermes was asked."""
    kept = [
        r for r in records
        if not r.name.startswith("talaria.testing") and not (r.name.startswith("uvicorn") and r.levelno < logging.INFO)
    ]  # fmt: skip
    return "\n".join(_logged(r) for r in kept)


def _logged(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a record whose arguments do not format is scanned as its parts
        return f"{record.msg!r} {record.args!r}"


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _audit(path: Path) -> str:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
    except sqlite3.Error:
        return ""
    try:
        return "\n".join(str(row) for row in conn.execute("SELECT * FROM audit_event"))
    except sqlite3.Error:
        return ""
    finally:
        conn.close()
