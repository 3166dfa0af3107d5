"""Escapes out of the artifact roots through the runner's ``http`` export (runner-protocol.md 11; issue 17 part 4;
ADR 0065): ``..``, encoded slashes and dots, symbolic links inside a root pointing out, hard links, a FIFO, and a
directory or file swapped between the runner's check and Hermes' read. Each is refused with
``runner_artifact_forbidden`` (or ``runner_http_forbidden`` for the route itself), and the outside file's bytes are
in no answer. The runner's rule is exercised as the runner runs it: ``run_http`` against the Hermes fixture over real
HTTP on 127.0.0.1, with real files."""

from __future__ import annotations

import asyncio
import base64
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from talaria.clock import SystemClock
from talaria.hermes.rest import HermesRest
from talaria.runner.errors import CommandError
from talaria.runner.http_kind import run_http
from talaria.testing.hermes_fixture import HermesFixture

SECRET = b"the outside file: never exported\n"
REPORT = b"the report\n"


@dataclass
class Node:
    hermes: HermesFixture
    token_file: Path
    root: Path
    outside: Path

    def export(self, search: str, *, path: str = "/api/files/download") -> dict[str, Any] | CommandError:
        """The runner's answer to an ``http`` export command, or the error it refused with."""

        async def run() -> dict[str, Any]:
            rest = HermesRest(self.hermes.url, token_file=str(self.token_file), clock=SystemClock())
            try:
                return await run_http(
                    {"path": path, "method": "GET", "search": search},
                    rest=rest, allowed_profiles=("default",), artifact_roots=(str(self.root),),
                    session_profile=lambda stored: None,
                )  # fmt: skip
            finally:
                await rest.close()

        try:
            return asyncio.run(run())
        except CommandError as exc:
            return exc

    def downloads(self) -> int:
        return len(self.hermes.requests("/api/files/download"))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    root, outside = tmp_path / "artifacts", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    (root / "report.txt").write_bytes(REPORT)
    token_file = tmp_path / "hermes-token"
    with HermesFixture(profiles=["default"]) as hermes:
        token_file.write_text(hermes.session_token)
        yield Node(hermes, token_file, root, outside)
        assert hermes.internal_errors() == []


def query(path: Path | str) -> str:
    return "?path=" + quote(str(path), safe="/")


def body_of(answer: dict[str, Any] | CommandError) -> bytes:
    assert isinstance(answer, dict), answer
    assert answer["status"] == 200, answer
    return base64.b64decode(answer["body"])


def refused(answer: dict[str, Any] | CommandError, code: str = "runner_artifact_forbidden") -> bool:
    """True when the answer is the refusal ``code``; an answer never carries the outside file's bytes."""
    if isinstance(answer, dict):
        assert SECRET not in base64.b64decode(answer["body"]), "the outside file was exported"
    else:
        assert SECRET.decode() not in str(answer)
    return isinstance(answer, CommandError) and answer.code == code


def test_a_file_inside_the_root_is_exported_by_its_real_path(node: Node) -> None:
    (node.root / "link-to-report").symlink_to(node.root / "report.txt")
    assert body_of(node.export(query(node.root / "report.txt"))) == REPORT
    assert body_of(node.export(query(node.root / "link-to-report"))) == REPORT
    forwarded = [record.query["path"] for record in node.hermes.requests("/api/files/download")]
    assert forwarded == [str((node.root / "report.txt").resolve())] * 2, "Hermes is given the real path only"


def test_a_root_that_is_a_file_is_exported(tmp_path: Path, node: Node) -> None:
    node.root = node.root / "report.txt"
    assert body_of(node.export(query(node.root))) == REPORT


@pytest.mark.parametrize(
    "search",
    [
        "{root}/../outside/secret.txt",
        "{root}/report.txt/../../outside/secret.txt",
        "{root}%2F..%2Foutside%2Fsecret.txt",
        "{root}/%2e%2e/outside/secret.txt",
        "{root}/%2E%2E%2Foutside/secret.txt",
        "{root}/%252e%252e/outside/secret.txt",
        "{root}/..%5Coutside%5Csecret.txt",
        "{root}/report.txt%00/../../outside/secret.txt",
        "..%2F..%2F{outside}/secret.txt",
        "{outside}/secret.txt",
        "{root}/missing.txt",
        "",
    ],
)
def test_dot_dot_and_encoded_paths_out_of_the_root_are_refused(node: Node, search: str) -> None:
    text = search.format(root=quote(str(node.root)), outside=quote(str(node.outside)))
    answer = node.export(f"?path={text}" if text else "")
    assert refused(answer), answer
    assert node.downloads() == 0, "refused before Hermes was asked"


@pytest.mark.parametrize(
    "path", ["/api/files/../files/download", "/api/files%2Fdownload", "/api/files/%2e%2e/download", "/api//download"]
)
def test_an_encoded_or_dotted_route_is_off_the_allow_list(node: Node, path: str) -> None:
    assert refused(node.export(query(node.root / "report.txt"), path=path), "runner_http_forbidden")
    assert node.hermes.requests() == []


def test_symbolic_links_inside_the_root_pointing_out_are_refused(node: Node) -> None:
    (node.root / "secret-link").symlink_to(node.outside / "secret.txt")
    (node.root / "outside-dir").symlink_to(node.outside, target_is_directory=True)
    (node.root / "chain").symlink_to(node.root / "secret-link")
    for name in ("secret-link", "outside-dir/secret.txt", "chain"):
        assert refused(node.export(query(node.root / name))), name
    assert node.downloads() == 0


def test_a_hard_link_inside_the_root_to_an_outside_file_is_refused(node: Node) -> None:
    os.link(node.outside / "secret.txt", node.root / "hard-link.txt")
    answer = node.export(query(node.root / "hard-link.txt"))
    assert refused(answer), answer
    assert "hard link" in str(answer)
    assert node.downloads() == 0


def test_a_fifo_inside_the_root_is_refused_without_being_opened(node: Node) -> None:
    os.mkfifo(node.root / "pipe")
    answer = node.export(query(node.root / "pipe"))
    assert refused(answer) and "regular file" in str(answer), answer
    assert node.downloads() == 0


def swap_during_the_read(node: Node, search: str, swap: Any) -> dict[str, Any] | CommandError:
    """Export ``search`` while Hermes is held; ``swap()`` runs after the runner's check, before Hermes reads."""
    gate = node.hermes.hold_route("/api/files/download")
    answers: list[dict[str, Any] | CommandError] = []
    exporting = threading.Thread(target=lambda: answers.append(node.export(search)))
    exporting.start()
    try:
        assert gate.reached.wait(10), "the export reached Hermes"
        swap()
    finally:
        gate.release()
        exporting.join(30)
    assert not exporting.is_alive() and len(answers) == 1
    return answers[0]


def test_a_directory_swapped_for_a_link_out_between_check_and_read_is_refused(node: Node) -> None:
    inner = node.root / "build"
    inner.mkdir()
    (inner / "secret.txt").write_bytes(REPORT)  # the same name as the outside file

    def swap() -> None:
        inner.rename(node.root / "build.old")
        inner.symlink_to(node.outside, target_is_directory=True)

    answer = swap_during_the_read(node, query(inner / "secret.txt"), swap)
    assert refused(answer), answer
    assert node.hermes.requests("/api/files/download")[0].status == 200, "Hermes did read the outside file"


def test_a_file_swapped_for_a_link_out_between_check_and_read_is_refused(node: Node) -> None:
    report = node.root / "report.txt"

    def swap() -> None:
        report.unlink()
        report.symlink_to(node.outside / "secret.txt")

    assert refused(swap_during_the_read(node, query(report), swap))


def test_a_file_replaced_between_check_and_read_is_refused(node: Node) -> None:
    report = node.root / "report.txt"

    def swap() -> None:
        (node.root / "next.txt").write_bytes(b"another file\n")
        (node.root / "next.txt").replace(report)

    answer = swap_during_the_read(node, query(report), swap)
    assert refused(answer) and "changed" in str(answer), answer


def test_a_file_written_in_place_during_the_read_is_still_the_checked_file(node: Node) -> None:
    report = node.root / "report.txt"
    answer = swap_during_the_read(node, query(report), lambda: report.write_bytes(REPORT + b"appended\n"))
    assert body_of(answer) == REPORT + b"appended\n", "the same file, inside the root: no escape"


def test_the_held_file_is_closed_after_every_answer(node: Node) -> None:
    os.link(node.outside / "secret.txt", node.root / "hard-link.txt")
    os.mkfifo(node.root / "pipe")
    report = node.root / "report.txt"

    def held() -> list[str]:
        """The descriptors of this process open on a file under the root."""
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith(str(node.root)):
                found.append(target)
        return found

    for _ in range(5):
        assert body_of(node.export(query(report))) == REPORT
        for name in ("missing.txt", "hard-link.txt", "pipe"):
            assert refused(node.export(query(node.root / name)))

        def replace() -> None:
            (node.root / "next.txt").write_bytes(b"another file\n")
            (node.root / "next.txt").replace(report)

        assert refused(swap_during_the_read(node, query(report), replace))
        report.write_bytes(REPORT)
    assert held() == [], "every export closed the file it held"
