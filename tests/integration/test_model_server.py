"""The scripted model server over real HTTP on 127.0.0.1 (hermes.md 7)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import pytest

from talaria.testing.model_server import (
    ModelServer,
    ToolSelector,
    cut,
    fail,
    from_prompt,
    from_result,
    gated,
    hang,
    reply,
    slow,
    tool_call,
    when,
)

TOOLS = [
    {"type": "function", "function": {"name": "terminal", "description": "run a command", "parameters": {}}},
    {"type": "function", "function": {"name": "team_" + "a" * 32, "description": "form_team: build", "parameters": {}}},
    {
        "type": "function",
        "function": {"name": "team_" + "b" * 32, "description": "talaria_whoami: who", "parameters": {}},
    },
]


def sse(response: httpx.Response) -> tuple[list[dict[str, Any]], bool]:
    frames, done = [], False
    for line in response.text.splitlines():
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            frames.append(json.loads(line[6:]))
    return frames, done


def chat(model: ModelServer, messages: list[dict[str, Any]], *, stream: bool = True, **extra: Any) -> httpx.Response:
    body = {"model": "scripted", "messages": messages, "stream": stream, "tools": TOOLS} | extra
    return httpx.post(f"{model.base_url}/chat/completions", json=body, timeout=10)


def streamed_text(frames: list[dict[str, Any]]) -> str:
    return "".join(f["choices"][0]["delta"].get("content") or "" for f in frames if f["choices"])


def test_models_and_probes(model: ModelServer) -> None:
    listing = httpx.get(f"{model.base_url}/models").json()
    assert [m["id"] for m in listing["data"]] == ["scripted"]
    assert listing["data"][0]["context_length"] > 0
    assert httpx.get(f"{model.base_url}/models/scripted").json()["id"] == "scripted"
    assert httpx.get(f"{model.base_url}/models/other").status_code == 404
    root = model.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/api/v1/models").status_code == 404
    assert httpx.post(f"{root}/api/show", json={}).status_code == 404
    assert [r.path for r in model.requests()] == ["/v1/models", "/v1/models/scripted", "/v1/models/other",
                                                  "/api/v1/models", "/api/show"]  # fmt: skip


def test_a_prompt_without_a_rule_gets_the_default_reply_streamed_with_usage_and_done(model: ModelServer) -> None:
    response = chat(model, [{"role": "system", "content": "s"}, {"role": "user", "content": "hello there"}])
    assert response.headers["content-type"].startswith("text/event-stream")
    frames, done = sse(response)
    assert done
    assert streamed_text(frames) == "Scripted reply to: hello there"
    assert [f["choices"][0]["finish_reason"] for f in frames if f["choices"]][-1] == "stop"
    assert frames[-1]["choices"] == [] and frames[-1]["usage"]["total_tokens"] > 0
    again = sse(chat(model, [{"role": "user", "content": "hello there"}]))[0]
    assert streamed_text(again) == streamed_text(frames)  # deterministic


def test_non_streamed_replies(model: ModelServer) -> None:
    body = chat(model, [{"role": "user", "content": "plain"}], stream=False).json()
    assert body["choices"][0]["message"]["content"] == "Scripted reply to: plain"
    assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["total_tokens"] > 0


def test_a_rule_calls_a_tool_chosen_by_selector_then_replies(model: ModelServer) -> None:
    model.script(when("who am I", tool_call(ToolSelector("team_", "talaria_whoami"), {"x": 1}), reply("you are you")))
    user = {"role": "user", "content": "please: who am I?"}
    frames, done = sse(chat(model, [user]))
    calls = [
        d["tool_calls"][0] for f in frames if f["choices"] for d in [f["choices"][0]["delta"]] if "tool_calls" in d
    ]
    assert calls[0]["function"]["name"] == "team_" + "b" * 32
    assert json.loads("".join(c["function"].get("arguments", "") for c in calls)) == {"x": 1}
    assert [f["choices"][0]["finish_reason"] for f in frames if f["choices"]][-1] == "tool_calls" and done
    follow = [user, {"role": "assistant", "content": None, "tool_calls": [calls[0]]},
              {"role": "tool", "tool_call_id": calls[0]["id"], "content": "{}"}]  # fmt: skip
    assert streamed_text(sse(chat(model, follow))[0]) == "you are you"
    assert model.turn_starts("who am I") == 1  # the follow-up request ends with a tool message


def test_a_literal_tool_name_is_emitted_even_when_not_offered(model: ModelServer) -> None:
    model.script(when("forbidden", tool_call("team_" + "c" * 32)))
    body = chat(model, [{"role": "user", "content": "forbidden call"}], stream=False).json()
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "team_" + "c" * 32


def test_later_rules_win_and_patterns_match(model: ModelServer) -> None:
    model.script(when("x", reply("first")), when(None, reply("by pattern"), pattern=r"^x\d+$"))
    assert streamed_text(sse(chat(model, [{"role": "user", "content": "x42"}]))[0]) == "by pattern"
    assert streamed_text(sse(chat(model, [{"role": "user", "content": "x-ray"}]))[0]) == "first"


def test_failures_cuts_and_hangs(model: ModelServer) -> None:
    model.script(when("busy", fail(429, '{"error": {"message": "slow down"}}')), when("cut", cut("abcdefghijklmnop")),
                 when("hang", hang()))  # fmt: skip
    failed = chat(model, [{"role": "user", "content": "busy"}])
    assert failed.status_code == 429 and failed.json()["error"]["message"] == "slow down"
    body = {"messages": [{"role": "user", "content": "cut"}], "stream": True, "tools": TOOLS}
    with httpx.stream("POST", f"{model.base_url}/chat/completions", timeout=10, json=body) as response:
        received = b""
        with pytest.raises(httpx.RemoteProtocolError):
            for piece in response.iter_bytes():
                received += piece
    assert b"[DONE]" not in received and b"abcdefgh" in received
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{model.base_url}/chat/completions", json={"messages": [{"role": "user", "content": "hang"}],
                   "tools": TOOLS}, timeout=0.5)  # fmt: skip
    assert model.requests()[-1].last_user == "hang"


def test_a_slow_reply_waits_before_its_first_byte(model: ModelServer) -> None:
    model.script(when("slowly", slow("tick tock", first_byte_delay_s=0.3, chunk_delay_s=0.01)))
    started = time.monotonic()
    frames, done = sse(chat(model, [{"role": "user", "content": "slowly"}]))
    assert time.monotonic() - started >= 0.3  # a lower bound only
    assert streamed_text(frames) == "tick tock" and done


def test_wait_for_and_turn_starts_count_only_tool_offering_user_turns(model: ModelServer) -> None:
    threading.Timer(0.2, lambda: chat(model, [{"role": "user", "content": "[run:1] go"}])).start()
    model.wait_for(lambda log: any(r.last_user == "[run:1] go" for r in log), timeout=10)
    httpx.post(f"{model.base_url}/chat/completions", timeout=10,
               json={"messages": [{"role": "user", "content": "title for [run:1] go"}]})  # fmt: skip
    assert model.turn_starts("[run:1]") == 1  # the title request offers no tools
    with pytest.raises(TimeoutError):
        model.wait_for(lambda log: len(log) > 99, timeout=0.2)


def test_the_command_line_serves_until_sigterm() -> None:
    command = [sys.executable, "-m", "talaria", "testing", "model-server", "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.startswith("model server ready: http://127.0.0.1:")
            url = line.split(": ", 1)[1].strip()
            assert httpx.get(f"{url}/models", timeout=5).json()["data"][0]["id"] == "scripted"
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(10) == 0


def test_a_reply_can_carry_the_last_tool_result(model: ModelServer) -> None:
    from talaria.testing.model_server import demo_rule

    model.script(demo_rule())
    user = {"role": "user", "content": "whoami please"}
    first = chat(model, [user], stream=False).json()["choices"][0]["message"]
    assert first["tool_calls"][0]["function"]["name"] == "team_" + "b" * 32
    call_id = first["tool_calls"][0]["id"]
    follow = [user, {"role": "assistant", "content": None, "tool_calls": first["tool_calls"]},
              {"role": "tool", "tool_call_id": call_id, "content": '{"account": "alice"}'}]  # fmt: skip
    text = streamed_text(sse(chat(model, follow))[0])
    assert text == 'Talaria says this conversation acts for: {"account": "alice"}'


# --- team-tool scenarios (team-tools.md 13) ---------------------------------------------------------------------


def _arguments(response: httpx.Response) -> Any:
    frames, _ = sse(response)
    calls = [f["choices"][0]["delta"]["tool_calls"][0] for f in frames if f["choices"] and
             f["choices"][0]["delta"].get("tool_calls")]  # fmt: skip
    return json.loads("".join(c["function"].get("arguments", "") for c in calls))


def test_arguments_come_from_earlier_tool_results_and_from_the_prompt(model: ModelServer) -> None:
    model.script(when("assign it", tool_call("form_team", {
        "goalId": from_prompt(r"goal (gol_\S+)"), "botIds": [from_result(0, "/bot/id"), from_result(-1, "/team/id")],
        "deep": {"x": from_result(1, "/bots/1/name")},
    })))  # fmt: skip
    messages = [
        {"role": "user", "content": "old turn"}, {"role": "tool", "content": '{"bot": {"id": "bot_old"}}'},
        {"role": "user", "content": "assign it to goal gol_7 now"},
        {"role": "assistant", "content": None}, {"role": "tool", "content": '{"bot": {"id": "bot_w"}}'},
        {"role": "tool", "content": '{"bots": [{"name": "a"}, {"name": "b"}], "team": {"id": "tm_c"}}'},
    ]  # fmt: skip
    assert _arguments(chat(model, messages)) == {"goalId": "gol_7", "botIds": ["bot_w", "tm_c"], "deep": {"x": "b"}}
    assert model.chat_requests()[-1].ended_at is not None


@pytest.mark.parametrize("reference", [from_result(0, "/missing"), from_result(3, "/bot"), from_prompt(r"x(\d+)y")])
def test_a_reference_that_does_not_resolve_answers_500_and_says_why(model: ModelServer, reference: Any) -> None:
    model.script(when("go", tool_call("form_team", {"v": reference})))
    answer = chat(model, [{"role": "user", "content": "go"}, {"role": "tool", "content": '{"bot": 1}'}])
    assert answer.status_code == 500 and "unresolved" in answer.text
    assert len(model.unresolved) == 1


def test_a_gate_holds_its_response_until_released(model: ModelServer) -> None:
    model.script(when("held", gated(reply("let go"), "g1")))
    answers: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: answers.append(chat(model, [{"role": "user", "content": "held"}])))
    worker.start()
    model.wait_for(lambda log: model.arrived("g1") == 1)
    assert answers == [] and model.chat_requests()[-1].ended_at is None
    model.release("g1")
    worker.join(10)
    assert streamed_text(sse(answers[0])[0]) == "let go"


def test_a_gate_with_parties_opens_once_that_many_arrived(model: ModelServer) -> None:
    model.script(when("both", gated(reply("together"), "both", parties=2)))
    answers: list[httpx.Response] = []
    workers = [threading.Thread(target=lambda: answers.append(chat(model, [{"role": "user", "content": "both"}])))
               for _ in range(2)]  # fmt: skip
    workers[0].start()
    model.wait_for(lambda log: model.arrived("both") == 1)
    assert answers == []
    workers[1].start()
    for worker in workers:
        worker.join(10)
    assert [streamed_text(sse(a)[0]) for a in answers] == ["together", "together"]


def test_rules_apply_only_to_requests_that_offer_tools(model: ModelServer) -> None:
    model.script(when("title me", reply("ruled")))
    side = chat(model, [{"role": "user", "content": "title me"}], tools=[])
    assert streamed_text(sse(side)[0]).startswith("Scripted reply to: title me")
    assert streamed_text(sse(chat(model, [{"role": "user", "content": "title me"}]))[0]) == "ruled"
