"""The runner's own exposition (operations.md 5.2): parsed by prometheus-client's parser, label values escaped and
bounded, the histogram cumulative."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from talaria.runner.metrics import BUCKETS, Gauges, NodeMetrics
from talaria.runner.metrics_listener import ListenError, parse_listen

GAUGES = Gauges(connected=True, draining=False, hermes_up=None, gateway_channels=2, grants=1, token_age_seconds=None)


def parsed(metrics: NodeMetrics, gauges: Gauges = GAUGES) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    text = metrics.render(gauges).decode()
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


def test_label_values_are_escaped_and_unknown_kinds_and_codes_are_other() -> None:
    metrics = NodeMetrics('1.0+"odd"\\\nversion', kinds={"http"})
    metrics.command_done("http", "ok", 0.2)
    metrics.command_done("made.up", "runner_draining", 0.01)
    metrics.command_done("http", "Not A Code", 1000.0)
    metrics.disconnected("x" * 65)
    found = parsed(metrics)
    assert found["talaria_node_build_info"][0][1]["version"] == '1.0+"odd"\\\nversion'
    commands = {(s[1]["kind"], s[1]["outcome"]): s[2] for s in found["talaria_node_commands"]}
    assert commands == {("http", "ok"): 1, ("other", "runner_draining"): 1, ("http", "other"): 1}
    assert found["talaria_node_disconnects"] == [("talaria_node_disconnects_total", {"reason": "other"}, 1)]
    assert found["talaria_node_hermes_up"] == [] and found["talaria_node_token_age_seconds"] == []
    assert found["talaria_node_gateway_channels"][0][2] == 2


def test_the_histogram_is_cumulative_with_sum_and_count() -> None:
    metrics = NodeMetrics("1", kinds={"http"})
    for seconds in (0.004, 0.005, 0.3, 5000.0):
        metrics.command_done("http", "ok", seconds)
    samples = parsed(metrics)["talaria_node_command_seconds"]
    buckets = {s[1]["le"]: s[2] for s in samples if s[0].endswith("_bucket")}
    assert len(buckets) == len(BUCKETS) + 1
    assert (buckets["0.005"], buckets["0.5"], buckets["900.0"], buckets["+Inf"]) == (2, 3, 3, 4)
    assert {s[0]: s[2] for s in samples if not s[0].endswith("_bucket")} == {
        "talaria_node_command_seconds_count": 4,
        "talaria_node_command_seconds_sum": pytest.approx(5000.309),
    }


@pytest.mark.parametrize(
    ("text", "address"),
    [("9100", ("127.0.0.1", 9100)), ("0.0.0.0:0", ("0.0.0.0", 0)), ("[::1]:65535", ("::1", 65535)),
     ("node.example:9100", ("node.example", 9100))],
)  # fmt: skip
def test_listen_addresses(text: str, address: tuple[str, int]) -> None:
    assert parse_listen(text) == address


@pytest.mark.parametrize("text", ["", ":9100", "65536", "a:b", "1.2.3.4:", "[::1]", "host:-1", "h o:1"])
def test_bad_listen_addresses(text: str) -> None:
    with pytest.raises(ListenError):
        parse_listen(text)


def test_a_failing_page_is_a_500_and_the_connection_closes() -> None:
    import asyncio

    from talaria.runner.metrics_listener import MetricsListener, Readiness

    def broken() -> bytes:
        raise RuntimeError("a bug")

    async def scrape() -> bytes:
        listener = MetricsListener(broken, lambda: Readiness(True))
        url = await listener.start("127.0.0.1", 0)
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)  # read() returns once the listener closed the connection
        writer.close()
        await listener.close()
        return answer

    answer = asyncio.run(scrape())
    assert answer.startswith(b"HTTP/1.1 500 Internal Server Error\r\n") and b'"code":"internal_error"' in answer
