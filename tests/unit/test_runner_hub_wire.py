"""Which wire the runner uses to reach the hub: direct (lean client) unless an environment proxy applies."""

from __future__ import annotations

import pytest

from talaria.runner.hub_client import ProxiedWire, hub_wire, uses_proxy
from talaria.wire import WireClient

RUNNER = "0b5e7f1c-3d2a-4c6b-9e8f-1a2b3c4d5e6f"


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "no_proxy"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def test_without_proxy_variables_every_hub_is_reached_directly() -> None:
    wire = hub_wire("https://hub.example.com", RUNNER)
    assert isinstance(wire, WireClient)
    assert (wire.scheme, wire.host, wire.port, wire.prefix) == (
        "https",
        "hub.example.com",
        443,
        f"/api/runner/v1/{RUNNER}",
    )


def test_localhost_becomes_127_0_0_1_and_keeps_a_path_prefix() -> None:
    wire = hub_wire("http://localhost:8080/talaria/", RUNNER)
    assert isinstance(wire, WireClient)
    assert (wire.host, wire.port, wire.prefix) == ("127.0.0.1", 8080, f"/talaria/api/runner/v1/{RUNNER}")
    assert wire.host_header == "127.0.0.1:8080"


@pytest.mark.parametrize("url", ["http://127.0.0.1:9000", "http://localhost:9000", "http://[::1]:9000"])
def test_a_loopback_hub_ignores_proxy_variables(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    assert not uses_proxy(url)
    assert isinstance(hub_wire(url, RUNNER), WireClient)


def test_a_remote_hub_goes_through_the_environment_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    assert uses_proxy("https://hub.example.com")
    assert isinstance(hub_wire("https://hub.example.com", RUNNER), ProxiedWire)
    assert not uses_proxy("http://hub.example.com")  # only an https proxy is named


def test_no_proxy_exempts_a_remote_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "example.com")
    assert not uses_proxy("https://hub.example.com")
    assert isinstance(hub_wire("https://hub.example.com", RUNNER), WireClient)
