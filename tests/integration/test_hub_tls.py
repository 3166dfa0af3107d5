"""TLS without a proxy (operations.md 6; scenario 9.15) over real processes: a ``talaria hub`` with ``--tls-cert`` and
``--tls-key`` signed by a certificate authority the test makes (trustme) for 127.0.0.1 and localhost, a runner whose
runner.json names that authority in ``caFile``, and the Hermes fixture."""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trustme

from talaria.testing.hermes_fixture import HermesFixture
from tests.hermes.site_support import PASSWORD, create_user, register_node
from tests.integration.cli_support import HubProcess, clean_env, free_port, talaria
from tests.integration.runner_support import RunnerProcess


@dataclass
class Tls:
    tmp: Path
    ca: trustme.CA
    ca_file: Path
    cert: Path
    key: Path
    port: int

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def hub_args(self, *extra: str) -> list[str]:
        return ["--data-dir", str(self.tmp / "data"), "--port", str(self.port), "--tls-cert", str(self.cert),
                "--tls-key", str(self.key), *extra]  # fmt: skip


@pytest.fixture
def tls(tmp_path: Path) -> Tls:
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    made = Tls(tmp_path, ca, tmp_path / "ca.pem", tmp_path / "hub.pem", tmp_path / "hub.key", free_port())
    ca.cert_pem.write_to_path(str(made.ca_file))
    issued.cert_chain_pems[0].write_to_path(str(made.cert))
    for extra in issued.cert_chain_pems[1:]:
        extra.write_to_path(str(made.cert), append=True)
    issued.private_key_pem.write_to_path(str(made.key))
    made.key.chmod(0o600)
    create_user(tmp_path / "data", "root", "admin", ("local:default",))
    return made


@pytest.fixture
def hermes() -> Iterator[HermesFixture]:
    with HermesFixture() as fixture:
        yield fixture


def node_config(tls: Tls, hermes: HermesFixture, ca_file: Path | None, source: str | None = None) -> Path:
    """A registered node (of ``source``, else a new one) whose runner.json names ``ca_file``."""
    name = f"node-{uuid.uuid4().hex[:6]}"
    config = register_node(tls.tmp, tls.url, hermes, name, source=source or name)
    body = json.loads(config.read_text())
    if ca_file is not None:
        body["caFile"] = str(ca_file)
    config.write_text(json.dumps(body))
    config.chmod(0o600)
    return config


def client(tls: Tls) -> httpx.Client:
    return httpx.Client(base_url=tls.url, verify=ssl.create_default_context(cafile=str(tls.ca_file)), timeout=30,
                        headers={"Origin": tls.url})  # fmt: skip


def test_a_command_round_trip_over_https_with_the_ca_and_only_transport_failures_without(
    tls: Tls, hermes: HermesFixture
) -> None:
    hub = HubProcess(tls.tmp, tls.hub_args(), clean_env())
    runners: list[RunnerProcess] = []
    try:
        line, url = hub.ready()
        assert url == tls.url, line
        with client(tls) as admin:
            login = admin.post("/api/auth/login", json={"username": "root", "password": PASSWORD})
            assert login.status_code == 200, login.text
            assert "secure" in login.headers["set-cookie"].lower(), "cookies are Secure over https"
            admin.headers["X-CSRF-Token"] = login.json()["csrfToken"]

            config = node_config(tls, hermes, tls.ca_file, source="local")
            trusted = RunnerProcess(config, tls.tmp / "logs", "trusted")
            runners.append(trusted)
            trusted.wait_for("runner connected", timeout=30)
            runner_id = json.loads(config.read_text())["runnerId"]
            turn = admin.post(f"/api/admin/runners/{runner_id}/test-turn", json={"prompt": "over tls"})
            assert turn.status_code == 200 and "event: done" in turn.text, turn.text
            assert hermes.prompt_count("over tls") == 1
        trusted.stop()

        other_ca = tls.tmp / "other-ca.pem"
        trustme.CA().cert_pem.write_to_path(str(other_ca))
        for name, ca_file in (("system store", None), ("another CA", other_ca)):
            refused = RunnerProcess(node_config(tls, hermes, ca_file), tls.tmp / "logs", name.replace(" ", "-"))
            runners.append(refused)
            refused.wait_for("runner disconnected: transport", count=2, timeout=30)
            assert "runner connected" not in refused.lines, (name, refused.lines)
            assert set(refused.lines) == {"runner disconnected: transport"}, (name, refused.lines)
            refused.stop()

        with pytest.raises(httpx.HTTPError):  # plain HTTP gets no HTTP answer
            httpx.get(f"http://127.0.0.1:{tls.port}/healthz", timeout=10)
        tokens = [json.loads(path.read_text())["token"] for path in tls.tmp.glob("node-*/runner.json")]
        assert len(tokens) == 3
        for token in tokens:  # the secrets scan: no runner token in the hub's log or the runners' output
            assert token not in hub.stderr()
            for runner in runners:
                runner.assert_silent_about(token)
    finally:
        for runner in runners:
            runner.close()
        hub.close()


def test_a_key_readable_by_others_stops_the_start(tls: Tls) -> None:
    tls.key.chmod(0o644)
    done = talaria("hub", *tls.hub_args(), cwd=tls.tmp, env=clean_env())
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"talaria hub: hub.tls_key {tls.key} may be read by group or other (mode 0644); run chmod 600 {tls.key}"
    ]


def test_a_key_that_does_not_match_the_certificate_stops_the_start(tls: Tls) -> None:
    other = tls.tmp / "other.key"
    tls.ca.issue_cert("127.0.0.1").private_key_pem.write_to_path(str(other))
    other.chmod(0o600)
    args = tls.hub_args()
    args[args.index(str(tls.key))] = str(other)
    done = talaria("hub", *args, cwd=tls.tmp, env=clean_env())
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("talaria hub: hub.tls_key does not match hub.tls_cert"), lines


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tls-cert", "CERT"], "hub.tls_cert and hub.tls_key must be set together (hub.tls_key is missing)"),
        (["--tls-key", "KEY"], "hub.tls_cert and hub.tls_key must be set together (hub.tls_cert is missing)"),
    ],
)
def test_both_or_neither(tls: Tls, args: list[str], message: str) -> None:
    args = [{"CERT": str(tls.cert), "KEY": str(tls.key)}.get(a, a) for a in args]
    done = talaria("hub", "--data-dir", str(tls.tmp / "data"), "--port", "0", *args, cwd=tls.tmp, env=clean_env())
    assert (done.returncode, done.stderr.strip()) == (1, f"talaria hub: {message}")


def test_an_http_public_url_with_tls_is_refused(tls: Tls) -> None:
    env = clean_env(TALARIA_HUB_PUBLIC_URL=f"http://127.0.0.1:{tls.port}")
    done = talaria("hub", *tls.hub_args(), cwd=tls.tmp, env=env)
    assert done.returncode == 1
    assert "hub.public_url must be an https:// URL when hub.tls_cert is set" in done.stderr


@pytest.mark.parametrize("content", ["not a certificate\n", ""])
def test_a_ca_file_that_holds_no_certificate_stops_the_runner_with_2(
    tls: Tls, hermes: HermesFixture, content: str
) -> None:
    bad = tls.tmp / "bad-ca.pem"
    bad.write_text(content)
    runner = RunnerProcess(node_config(tls, hermes, bad), tls.tmp / "logs", f"bad-{uuid.uuid4().hex[:6]}")
    try:
        assert runner.wait(15) == 2
        assert "caFile" in runner.stderr and str(bad) in runner.stderr, runner.stderr
    finally:
        runner.close()


def test_a_missing_or_relative_ca_file_is_an_invalid_config(tls: Tls, hermes: HermesFixture) -> None:
    for ca_file in (tls.tmp / "missing.pem", Path("relative.pem")):
        runner = RunnerProcess(node_config(tls, hermes, ca_file), tls.tmp / "logs", f"ca-{uuid.uuid4().hex[:6]}")
        try:
            assert runner.wait(15) == 2
            assert "caFile" in runner.stderr, runner.stderr
        finally:
            runner.close()
