"""The after-test leak scan finds what it is meant to find (tests/leak_scan_support.py): a secret in a log record,
a log file or a receipts file, message text in a log or an audit row; and it leaves alone what is not Talaria's
(receipts quoting message text, a real Hermes' own logs, the Hermes fixture's records)."""

from __future__ import annotations

import logging
import secrets
import sqlite3
from pathlib import Path

import pytest

from tests.leak_scan_support import MADE, message_texts, scan, scanned_records, secrets_of, talaria_files

SECRET = "s3cret-value-for-the-scan-self-test"  # a literal: not made by token_urlsafe, so the real scan ignores it
TEXT = "a message text that must not be logged"


@pytest.fixture
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory the scan is pointed at explicitly (the autouse scan only looks under ``tmp_path``)."""
    return tmp_path_factory.mktemp("scanned")


def found(place: Path, log_text: str = "") -> list[str]:
    return [
        str(leak) for leak in scan(log_text=log_text, files=talaria_files(place), secret_values={SECRET}, texts={TEXT})
    ]


def test_a_secret_or_a_text_in_a_log_record_is_found_and_shown_by_its_first_characters(place: Path) -> None:
    assert found(place, f"runner connected with {SECRET}") == ["secret s3cret… in captured log"]
    assert found(place, f"prompt was: {TEXT}!") == ["message text a mess… in captured log"]
    assert found(place, "runner connected") == []


def test_log_files_receipts_and_audit_rows_are_scanned(place: Path) -> None:
    (place / "hub.stderr").write_text(f"{{'event': 'x', 'token': '{SECRET}'}}\n")
    (place / "state").mkdir()
    (place / "state" / "runner-commands.sqlite3").write_bytes(b"SQLite format 3\x00" + TEXT.encode() + SECRET.encode())
    with sqlite3.connect(place / "talaria.sqlite3") as db:
        db.execute("CREATE TABLE audit_event(seq INTEGER, data TEXT)")
        db.execute("INSERT INTO audit_event VALUES (1, ?)", (f"said {TEXT}",))
        db.execute("CREATE TABLE chat_message(content TEXT)")
        db.execute("INSERT INTO chat_message VALUES (?)", (f"{TEXT} {SECRET}",))  # stored messages are fine
    db.close()
    where = sorted(found(place))
    assert where == sorted([
        f"secret s3cret… in {place / 'hub.stderr'}",
        f"secret s3cret… in {place / 'state' / 'runner-commands.sqlite3'}",  # not its message text: replies quote it
        f"message text a mess… in {place / 'talaria.sqlite3'} audit_event",
    ])  # fmt: skip


def test_runner_json_tokens_are_looked_for_and_a_broken_runner_json_is_skipped(place: Path) -> None:
    (place / "a").mkdir()
    (place / "a" / "runner.json").write_text('{"token": "tok-' + "x" * 40 + '"}')
    (place / "b").mkdir()
    (place / "b" / "runner.json").write_text("[" * 100_000)
    assert "tok-" + "x" * 40 in secrets_of(talaria_files(place), [], "correct horse battery staple")


def test_tokens_made_in_the_test_are_recorded(place: Path) -> None:
    made = secrets.token_urlsafe(32)
    assert made in MADE.tokens
    MADE.tokens.discard(made)  # nothing of it is written anywhere here; keep the real scan's set to the test's own


def test_records_of_the_fixtures_and_uvicorn_debug_are_not_talarias(place: Path) -> None:
    def record(name: str, level: int, message: str) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, message, None, None)

    kept = scanned_records([
        record("talaria.testing.hermes_fixture", logging.INFO, "fixture " + SECRET),
        record("uvicorn.error", logging.DEBUG, "< GET /api/ws?token=" + SECRET),
        record("uvicorn.error", logging.INFO, "started"),
        record("talaria.hub", logging.INFO, "hub line"),
    ])  # fmt: skip
    assert kept == "started\nhub line"


def test_message_texts_are_lines_of_prompts_without_talarias_markers() -> None:
    class Turn:
        text = f"{TEXT}\n[talaria-run:trn_1:abc]\nok"
        reply = "echo: " + TEXT

    class Fixture:
        def turns(self) -> list[Turn]:
            return [Turn()]

    assert message_texts([Fixture()], []) == {TEXT, "echo: " + TEXT}
