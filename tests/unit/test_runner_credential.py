"""The runner's ``credential.json`` (operations.md 4.2, ADR 0059): its strict shape, the atomic write, a crash's
leftovers, and ``HubClient``'s retries of a 403 with the token in use or the previous one, over a wire that
accepts a set of tokens (the hub faked at its transport, convention 9)."""

from __future__ import annotations

import asyncio
import json
import stat
import uuid
from pathlib import Path

import pytest

from talaria.runner.credential import NAME, Credential, CredentialError, CredentialFile
from talaria.runner.hub_client import HubClient, HubError, Identity
from talaria.wire import WireReply

OLD, NEW, OTHER = "o" * 43, "n" * 43, "x" * 43


def private_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "runner"
    directory.mkdir(mode=0o700)
    return directory


def test_without_a_file_runner_json_s_token_is_used(tmp_path: Path) -> None:
    made = CredentialFile.open(private_dir(tmp_path), OLD)
    assert (made.token, made.previous, made.credential.unconfirmed) == (OLD, None, False)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{", "not JSON"),
        (b"[]", "expected exactly the keys token, issuedAt and previous"),
        (b'{"token": "t", "issuedAt": 1}', "expected exactly the keys"),
        (b'{"token": "", "issuedAt": 1, "previous": null}', "token must be"),
        (b'{"token": "t\\u00e9", "issuedAt": 1, "previous": null}', "token must be"),
        (b'{"token": "t", "issuedAt": -1, "previous": null}', "issuedAt must be"),
        (b'{"token": "t", "issuedAt": true, "previous": null}', "issuedAt must be"),
        (b'{"token": "t", "issuedAt": 1, "previous": 5}', "previous must be"),
        (b" " * 4097, "larger than 4096 bytes"),
    ],
)
def test_an_invalid_file_names_itself_and_why(tmp_path: Path, content: bytes, why: str) -> None:
    directory = private_dir(tmp_path)
    (directory / NAME).write_bytes(content)
    with pytest.raises(CredentialError) as refused:
        CredentialFile.open(directory, OLD)
    assert str(refused.value).startswith(f"{directory / NAME}: invalid credential file: ")
    assert why in str(refused.value) and OLD not in str(refused.value)


def test_a_file_at_the_size_limit_is_read(tmp_path: Path) -> None:
    directory = private_dir(tmp_path)
    body = json.dumps({"token": NEW, "issuedAt": 5, "previous": OLD}).encode()
    (directory / NAME).write_bytes(body + b" " * (4096 - len(body)))
    assert CredentialFile.open(directory, OLD).credential == Credential(NEW, 5, OLD)


def test_adopt_writes_the_file_0600_atomically_and_a_restart_reads_it(tmp_path: Path) -> None:
    directory = private_dir(tmp_path)
    made = CredentialFile.open(directory, OLD)
    made.adopt(NEW, 1234)
    assert made.credential == Credential(NEW, 1234, OLD, unconfirmed=True)
    assert stat.S_IMODE((directory / NAME).stat().st_mode) == 0o600
    assert json.loads((directory / NAME).read_text()) == {"token": NEW, "issuedAt": 1234, "previous": OLD}
    assert sorted(p.name for p in directory.iterdir()) == [NAME], "no temporary file stays"
    assert made.confirm() is True and made.confirm() is False
    assert CredentialFile.open(directory, OTHER).credential == Credential(NEW, 1234, OLD), "the file wins"


def test_a_failed_rename_keeps_the_old_file_and_the_token_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = private_dir(tmp_path)
    made = CredentialFile.open(directory, OLD)
    made.adopt(NEW, 1)

    def refuse(self: CredentialFile, temp: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(CredentialFile, "_install", refuse)
    with pytest.raises(OSError):
        made.adopt(OTHER, 2)
    assert made.token == NEW
    assert json.loads((directory / NAME).read_text())["token"] == NEW
    assert sorted(p.name for p in directory.iterdir()) == [NAME]


def test_a_crash_s_leftovers_are_removed_at_open(tmp_path: Path) -> None:
    directory = private_dir(tmp_path)
    (directory / ".credential-0123456789abcdef.tmp").write_text("{}")
    (directory / "other.tmp").write_text("kept")
    CredentialFile.open(directory, OLD)
    assert sorted(p.name for p in directory.iterdir()) == ["other.tmp"]


class TokenWire:
    """Accepts requests whose bearer is in ``valid``; records the bearer of each request."""

    def __init__(self, *valid: str) -> None:
        self.valid = set(valid)
        self.sent: list[str] = []

    async def request(
        self, method: str, target: str, *, headers: dict[str, str] | None = None, body: bytes | None = None,
        timeout: float | None = None,
    ) -> WireReply:  # fmt: skip
        assert headers is not None
        token = headers["Authorization"].removeprefix("Bearer ")
        self.sent.append(token)
        if token not in self.valid:
            return WireReply(403, {}, b'{"code": "runner_unauthorized", "error": "register it again"}')
        return WireReply(200, {}, b'{"ok": true}')

    async def aclose(self) -> None:
        return None


def hub_client(wire: TokenWire, token: str, credential: CredentialFile | None) -> tuple[HubClient, list[str]]:
    said: list[str] = []
    identity = Identity(str(uuid.uuid4()), token, str(uuid.uuid4()))
    return HubClient("http://127.0.0.1:1", identity, wire=wire, credential=credential, say=said.append), said


def test_the_first_200_with_the_new_token_confirms_it(tmp_path: Path) -> None:
    credential = CredentialFile.open(private_dir(tmp_path), OLD)
    wire = TokenWire(OLD, NEW)
    hub, said = hub_client(wire, OLD, credential)
    credential.adopt(NEW, 1)
    hub.switch_token(NEW)
    asyncio.run(hub.post("admit", "e", {"id": "c"}))
    asyncio.run(hub.post("admit", "e", {"id": "c"}))
    assert (wire.sent, said) == ([NEW, NEW], ["runner credential rotated"])


def test_a_403_to_a_token_no_longer_in_use_is_sent_once_more_with_the_one_in_use(tmp_path: Path) -> None:
    credential = CredentialFile.open(private_dir(tmp_path), OLD)
    wire = TokenWire(NEW)

    class Switching(TokenWire):
        async def request(self, method: str, target: str, **kwargs: object) -> WireReply:
            reply = await wire.request(method, target, **kwargs)  # type: ignore[arg-type]
            hub.switch_token(NEW)  # the switch happened while this request was in flight
            return reply

    hub, _ = hub_client(Switching(), OLD, credential)
    assert asyncio.run(hub.post("admit", "e", {"id": "c"})) == {"ok": True}
    assert wire.sent == [OLD, NEW]


def test_a_403_to_the_token_in_use_falls_back_to_previous_and_rewrites_the_file(tmp_path: Path) -> None:
    directory = private_dir(tmp_path)
    (directory / NAME).write_text(json.dumps({"token": NEW, "issuedAt": 1, "previous": OLD}))
    credential = CredentialFile.open(directory, OTHER)
    wire = TokenWire(OLD)  # the hub dropped the unused new token
    hub, said = hub_client(wire, NEW, credential)
    assert asyncio.run(hub.post("admit", "e", {"id": "c"})) == {"ok": True}
    assert wire.sent == [NEW, OLD] and hub.identity.token == OLD
    assert json.loads((directory / NAME).read_text()) == {"token": OLD, "issuedAt": None, "previous": None}
    assert said == ["runner credential restored: the hub refused the new token and accepted the previous one"]
    asyncio.run(hub.post("admit", "e", {"id": "c"}))
    assert wire.sent[-1] == OLD


def test_both_refused_is_the_hub_s_refusal_and_changes_nothing(tmp_path: Path) -> None:
    directory = private_dir(tmp_path)
    (directory / NAME).write_text(json.dumps({"token": NEW, "issuedAt": 1, "previous": OLD}))
    credential = CredentialFile.open(directory, OTHER)
    wire = TokenWire()  # disabled
    hub, said = hub_client(wire, NEW, credential)
    with pytest.raises(HubError) as refused:
        asyncio.run(hub.post("admit", "e", {"id": "c"}))
    assert (refused.value.status, refused.value.code) == (403, "runner_unauthorized")
    assert wire.sent == [NEW, OLD] and said == [] and credential.token == NEW
    without = TokenWire()
    plain, _ = hub_client(without, OLD, None)
    with pytest.raises(HubError):
        asyncio.run(plain.post("admit", "e", {"id": "c"}))
    assert without.sent == [OLD], "no credential file: no second try"
