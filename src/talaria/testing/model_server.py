"""A scripted OpenAI-compatible model server for real Hermes in tests and the demo (hermes.md 7).

``ModelServer(script).start()`` serves on ``127.0.0.1:0`` in a background thread; ``base_url`` is the
``.../v1`` URL for Hermes' ``config.yaml``. It answers ``GET /v1/models`` and ``/v1/models/<id>`` (with
a ``context_length``), 404 to Hermes' other probes, and ``POST /v1/chat/completions`` streamed (SSE
``chat.completion.chunk`` frames, a final ``usage`` chunk, ``data: [DONE]``) or not.

Replies are deterministic. A ``Rule`` matches the last user message (substring or regex) and gives
one ``Step`` per request of that turn: the n-th request after the user's message (counted by the
assistant messages that follow it) gets ``steps[n]``, the last step repeating. Without a rule the
reply is ``Scripted reply to: <prompt>``. Steps: ``reply(text)`` (streamed in chunks of ``chunk_chars``
characters, 8 by default), ``tool_call(tool, arguments)`` (``tool`` a literal name, emitted even when not
offered, or a ``ToolSelector`` over the offered tools), ``reply_with_tool_result(prefix)``, ``slow(...)``
delays, ``fail(status, body)``, ``cut()`` (the stream stops mid-way) and ``hang()`` (no answer until the
client gives up).

Team-tool scenarios (team-tools.md 13): argument values may be ``from_result(index, pointer)`` (the ``index``-th
tool message after the last user message, from 0, negative from the end, parsed as JSON, at a JSON Pointer) or
``from_prompt(pattern)`` (group 1 of the first match of a regex over the last user message), anywhere in a step's
arguments, lists included, resolved when the step is answered; one that does not resolve answers 500 and says why
in ``unresolved``. ``gated(step, name, parties=None)`` holds the response until ``release(name)`` or, with
``parties``, until that many requests reached the gate; each response's end is logged (``LoggedRequest.ended_at``).
Rules apply only to requests that offer tools: Hermes' side requests (session titles) get the default reply.

Hermes' compression summary request (it begins "You are a summarization agent") gets a fixed summary
before any rule is tried. Every request is logged (method, path, body, tool names offered, last user message) in order;
``turn_starts(text)`` counts chat requests that offer tools and end with a user message containing
``text`` (Hermes' title requests offer none), and ``wait_for(predicate, timeout)`` waits on the log.
Thread-safe. ``python -m talaria testing model-server --port P`` runs one from the command line.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL_ID = "scripted"
SUMMARY_PREFIX = "You are a summarization agent"  # how Hermes' compression request begins
SUMMARY_REPLY = "## Summary\nThe conversation so far, summarised by the scripted model."
CONTEXT_LENGTH = 128_000
CHUNK_CHARS = 8  # text is streamed in pieces of this many characters


@dataclass(frozen=True)
class ToolSelector:
    """Picks one offered tool: the first whose name starts with ``prefix`` and whose description
    contains ``description_contains`` (team tool names are opaque, their descriptions are not)."""

    prefix: str = ""
    description_contains: str = ""

    def pick(self, offered: Sequence[dict[str, Any]]) -> str | None:
        for tool in offered:
            function = tool.get("function", {}) if isinstance(tool, dict) else {}
            name = str(function.get("name", ""))
            if name.startswith(self.prefix) and self.description_contains in str(function.get("description", "")):
                return name
        return None


@dataclass(frozen=True)
class FromResult:
    """An argument taken from an earlier tool result of the turn (team-tools.md 13)."""

    index: int
    pointer: str


@dataclass(frozen=True)
class FromPrompt:
    """An argument taken from the last user message: group 1 of the first match of ``pattern``."""

    pattern: str


def from_result(index: int, pointer: str) -> FromResult:
    return FromResult(index, pointer)


def from_prompt(pattern: str) -> FromPrompt:
    return FromPrompt(pattern)


class Unresolved(Exception):
    """An argument reference that the request does not satisfy."""


def _pointer(document: Any, pointer: str) -> Any:
    """RFC 6901: ``/a/0/b`` in ``document``; ``Unresolved`` when a step is missing."""
    if pointer == "":
        return document
    if not pointer.startswith("/"):
        raise Unresolved(f"{pointer!r} is not a JSON Pointer")
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(document, list) and token.isdigit() and int(token) < len(document):
            document = document[int(token)]
        elif isinstance(document, dict) and token in document:
            document = document[token]
        else:
            raise Unresolved(f"{pointer!r} names nothing in the tool result")
    return document


def resolve(value: Any, messages: list[Any]) -> Any:
    """``value`` with every ``FromResult`` and ``FromPrompt`` replaced from ``messages`` (the request's)."""
    if isinstance(value, FromResult | FromPrompt):
        prompt, start = _last_user(messages)
        if isinstance(value, FromPrompt):
            found = re.search(value.pattern, prompt)
            if found is None or found.lastindex is None:
                raise Unresolved(f"{value.pattern!r} does not match the last user message")
            return found.group(1)
        results = [m for m in messages[start:] if isinstance(m, dict) and m.get("role") == "tool"]
        try:
            text = _text_of(results[value.index].get("content"))
        except IndexError:
            raise Unresolved(f"there is no tool result {value.index} after the last user message") from None
        try:
            parsed = json.loads(text)
        except ValueError:
            raise Unresolved(f"tool result {value.index} is not JSON") from None
        return _pointer(parsed, value.pointer)
    if isinstance(value, dict):
        return {key: resolve(item, messages) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve(item, messages) for item in value]
    return value


@dataclass(frozen=True)
class Step:
    kind: str  # reply | tool_call | fail | cut | hang
    text: str = ""
    tool: str | ToolSelector = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    status: int = 500
    body: str = ""
    first_byte_delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    chunk_chars: int = CHUNK_CHARS  # characters of text per streamed chunk
    prompt_tokens: int | None = None  # reported usage instead of the estimate (large values make Hermes compress)
    gate: str | None = None  # held until release(gate), or until ``parties`` requests reached it
    parties: int | None = None


def reply(
    text: str, *, first_byte_delay_s: float = 0.0, chunk_delay_s: float = 0.0, chunk_chars: int = CHUNK_CHARS
) -> Step:
    """``text`` streamed in chunks of ``chunk_chars`` characters: the first after ``first_byte_delay_s``, then one
    every ``chunk_delay_s``."""
    if chunk_chars < 1:
        raise ValueError("chunk_chars must be at least 1")
    return Step("reply", text=text, first_byte_delay_s=first_byte_delay_s, chunk_delay_s=chunk_delay_s,
                chunk_chars=chunk_chars)  # fmt: skip


def tool_call(
    tool: str | ToolSelector, arguments: dict[str, Any] | None = None, *, prompt_tokens: int | None = None
) -> Step:
    """A call of ``tool``; ``prompt_tokens`` overrides the reported usage (at or above 75 % of the context
    length, Hermes compresses the conversation once the tool has run)."""
    return Step("tool_call", tool=tool, arguments=dict(arguments or {}), prompt_tokens=prompt_tokens)


def slow(
    text: str, *, first_byte_delay_s: float = 0.0, chunk_delay_s: float = 0.05, chunk_chars: int = CHUNK_CHARS
) -> Step:
    """A reply that takes its time: a delay before the first byte and between chunks."""
    return reply(text, first_byte_delay_s=first_byte_delay_s, chunk_delay_s=chunk_delay_s, chunk_chars=chunk_chars)


def reply_with_tool_result(prefix: str) -> Step:
    """A reply made of ``prefix`` and the content of the last tool message (what the tool answered)."""
    return Step("tool_echo", text=prefix)


def fail(status: int = 500, body: str = '{"error": {"message": "scripted failure"}}') -> Step:
    return Step("fail", status=status, body=body)


def cut(text: str = "this reply is cut") -> Step:
    """Stream half of ``text``, then close the connection without a finish or ``[DONE]``."""
    return Step("cut", text=text)


def hang() -> Step:
    return Step("hang")


def gated(step: Step, name: str, parties: int | None = None) -> Step:
    """``step``, answered only once ``release(name)`` was called or, with ``parties``, that many requests reached
    the gate ``name``."""
    if parties is not None and parties < 1:
        raise ValueError("parties must be at least 1")
    return replace(step, gate=name, parties=parties)


@dataclass(frozen=True)
class Rule:
    steps: tuple[Step, ...]
    contains: str | None = None
    pattern: str | None = None

    def matches(self, prompt: str) -> bool:
        if self.contains is not None and self.contains not in prompt:
            return False
        return self.pattern is None or re.search(self.pattern, prompt) is not None


def when(contains: str | None = None, *steps: Step, pattern: str | None = None) -> Rule:
    if not steps:
        raise ValueError("a rule needs at least one step")
    return Rule(tuple(steps), contains=contains, pattern=pattern)


@dataclass
class LoggedRequest:
    method: str
    path: str
    body: Any
    tools: tuple[str, ...]
    last_user: str | None  # the text of the last message if it is a user message
    at: float
    ended_at: float | None = field(default=None, compare=False)  # when its response was fully sent
    # how it ended: "stop" (a reply), "tool_calls", "error" (a scripted failure, an unresolved argument), "gone"
    finish: str | None = field(default=None, compare=False)
    prompt: str = ""  # the text of the last user message, wherever it is (a run's later requests end otherwise)


def _last_user(messages: list[Any]) -> tuple[str, int]:
    """The last user message's text and the index after it."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content")), index + 1
    return "", 0


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _turn_position(messages: list[Any]) -> tuple[str, int]:
    """The last user message's text and how many assistant messages follow it."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "user":
            later = [m for m in messages[index + 1 :] if isinstance(m, dict) and m.get("role") == "assistant"]
            return _text_of(message.get("content")), len(later)
    return "", 0


class ModelServer:
    def __init__(self, rules: Sequence[Rule] = (), *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._rules: list[Rule] = list(rules)
        self._log: list[LoggedRequest] = []
        self._lock = threading.Condition()
        self._host, self._port = host, port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._gates: dict[str, asyncio.Event] = {}
        self._arrived: dict[str, int] = {}
        self._released: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.unresolved: list[str] = []  # why a step's argument did not resolve (the request got a 500)
        self.app = Starlette(
            routes=[
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/models/{model_id:path}", self._model, methods=["GET"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/{rest:path}", self._other, methods=["GET", "POST", "PUT", "DELETE"]),
            ]
        )

    # --- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> ModelServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        self._socket = sock
        config = uvicorn.Config(self.app, log_config=None, access_log=False, lifespan="off", timeout_keep_alive=30)
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[sock])), name="model-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the scripted model server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        if self._socket is not None:
            self._socket.close()

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._socket is not None, "the server is not started"
        return int(self._socket.getsockname()[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # --- script and log ---------------------------------------------------------------------------------------

    def script(self, *rules: Rule) -> None:
        """Add rules; later rules are tried first, so a test can override a default."""
        with self._lock:
            self._rules.extend(rules)

    def requests(self) -> list[LoggedRequest]:
        with self._lock:
            return list(self._log)

    def chat_requests(self) -> list[LoggedRequest]:
        return [r for r in self.requests() if r.path == "/v1/chat/completions"]

    def turn_starts(self, text: str) -> int:
        """Chat requests that offer tools and end with a user message containing ``text``."""
        return sum(1 for r in self.chat_requests() if r.tools and r.last_user is not None and text in r.last_user)

    def wait_for(self, predicate: Callable[[list[LoggedRequest]], bool], timeout: float = 30.0) -> list[LoggedRequest]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate(list(self._log)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the model server's request log did not satisfy the condition in {timeout} s")
                self._lock.wait(left)
            return list(self._log)

    def release(self, name: str) -> None:
        """Let every response held at gate ``name`` go, now and later (any thread)."""
        with self._lock:
            self._released.add(name)
            loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._open_gate, name)

    def arrived(self, name: str) -> int:
        """How many requests reached gate ``name``."""
        with self._lock:
            return self._arrived.get(name, 0)

    def _open_gate(self, name: str) -> None:
        self._gates.setdefault(name, asyncio.Event()).set()

    async def _at_gate(self, step: Step) -> None:
        assert step.gate is not None
        self._loop = asyncio.get_running_loop()
        gate = self._gates.setdefault(step.gate, asyncio.Event())
        with self._lock:
            self._arrived[step.gate] = self._arrived.get(step.gate, 0) + 1
            reached = step.parties is not None and self._arrived[step.gate] >= step.parties
            released = step.gate in self._released
            self._lock.notify_all()
        if reached or released:
            gate.set()
        await gate.wait()

    def _ended(self, request: LoggedRequest, finish: str) -> None:
        with self._lock:
            request.ended_at = time.time()
            request.finish = finish
            self._lock.notify_all()

    def _record(self, request: LoggedRequest) -> None:
        with self._lock:
            self._log.append(request)
            self._lock.notify_all()

    def _step_for(self, prompt: str, position: int) -> Step:
        with self._lock:
            rules = list(reversed(self._rules))
        for rule in rules:
            if rule.matches(prompt):
                return rule.steps[min(position, len(rule.steps) - 1)]
        return reply(f"Scripted reply to: {prompt[:200]}")

    # --- routes -----------------------------------------------------------------------------------------------

    async def _models(self, request: Request) -> Response:
        self._record(LoggedRequest("GET", request.url.path, None, (), None, time.time()))
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def _model(self, request: Request) -> Response:
        self._record(LoggedRequest("GET", request.url.path, None, (), None, time.time()))
        if request.path_params["model_id"] != MODEL_ID:
            return JSONResponse({"error": {"message": "model not found"}}, status_code=404)
        return JSONResponse(self._model_card())

    async def _other(self, request: Request) -> Response:
        self._record(LoggedRequest(request.method, request.url.path, None, (), None, time.time()))
        return JSONResponse({"error": {"message": "not found"}}, status_code=404)

    @staticmethod
    def _model_card() -> dict[str, Any]:
        return {
            "id": MODEL_ID,
            "object": "model",
            "created": 0,
            "owned_by": "talaria",
            "context_length": CONTEXT_LENGTH,
        }

    async def _chat(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": {"message": "the body is not JSON"}}, status_code=400)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return JSONResponse({"error": {"message": "messages is required"}}, status_code=400)
        messages: list[Any] = body["messages"]
        offered = [t for t in body.get("tools") or [] if isinstance(t, dict)]
        names = tuple(str(t.get("function", {}).get("name", "")) for t in offered)
        last = messages[-1] if messages else None
        last_user = _text_of(last.get("content")) if isinstance(last, dict) and last.get("role") == "user" else None
        logged = LoggedRequest("POST", request.url.path, body, names, last_user, time.time(),
                               prompt=_last_user(messages)[0])  # fmt: skip
        self._record(logged)
        prompt, position = _turn_position(messages)
        first = _text_of(messages[0].get("content")) if messages and isinstance(messages[0], dict) else ""
        # Hermes' compression summary quotes the user's prompts: recognise it before any rule can match it
        if first.startswith(SUMMARY_PREFIX):
            step = reply(SUMMARY_REPLY)
        elif not offered:  # a side request (a session title): rules are for the agent's own requests
            step = reply(f"Scripted reply to: {prompt[:200]}")
        else:
            step = self._step_for(prompt, position)
        if step.gate is not None:
            await self._at_gate(step)
        if step.kind == "tool_call":
            try:
                step = replace(step, arguments=resolve(step.arguments, messages))
            except Unresolved as exc:
                with self._lock:
                    self.unresolved.append(str(exc))
                self._ended(logged, "error")
                return JSONResponse({"error": {"message": f"scripted argument unresolved: {exc}"}}, status_code=500)
        if step.kind == "tool_echo":
            results = [m for m in messages if isinstance(m, dict) and m.get("role") == "tool"]
            step = reply(step.text + (_text_of(results[-1].get("content")) if results else "(no tool result)"))
        if step.kind == "fail":
            self._ended(logged, "error")
            return Response(step.body, status_code=step.status, media_type="application/json")
        if step.kind == "hang":
            await _until_disconnected(request)
            self._ended(logged, "gone")
            return Response(status_code=499)
        if step.first_byte_delay_s:
            await asyncio.sleep(step.first_byte_delay_s)
        call = self._tool_call(step, offered) if step.kind == "tool_call" else None
        usage = {"prompt_tokens": step.prompt_tokens or _tokens(json.dumps(messages)),
                 "completion_tokens": _tokens(step.text) + 1}  # fmt: skip
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if body.get("stream"):
            return StreamingResponse(self._stream(step, call, usage, logged), media_type="text/event-stream")
        message: dict[str, Any] = {"role": "assistant", "content": None if call else step.text}
        if call is not None:
            message["tool_calls"] = [call]
        self._ended(logged, "tool_calls" if call else "stop")
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": MODEL_ID,
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if call else "stop"}],
                "usage": usage,
            }
        )

    @staticmethod
    def _tool_call(step: Step, offered: list[dict[str, Any]]) -> dict[str, Any]:
        name = step.tool.pick(offered) if isinstance(step.tool, ToolSelector) else step.tool
        if name is None:
            name = "no_matching_tool_offered"
        return {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(step.arguments)},
        }

    async def _stream(
        self, step: Step, call: dict[str, Any] | None, usage: dict[str, int], logged: LoggedRequest
    ) -> AsyncIterator[bytes]:
        ident = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            frame = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": MODEL_ID,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(frame)}\n\n".encode()

        yield chunk({"role": "assistant", "content": ""})
        if call is not None:
            function = call["function"]
            head = {"index": 0, "id": call["id"], "type": "function", "function": {"name": function["name"]}}
            yield chunk({"tool_calls": [head | {"function": {"name": function["name"], "arguments": ""}}]})
            yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": function["arguments"]}}]})
            finish = "tool_calls"
        else:
            text = step.text if step.kind != "cut" else step.text[: max(1, len(step.text) // 2)]
            for start in range(0, len(text), step.chunk_chars):
                if step.chunk_delay_s and start:
                    await asyncio.sleep(step.chunk_delay_s)
                yield chunk({"content": text[start : start + step.chunk_chars]})
            if step.kind == "cut":
                raise ConnectionAbortedError("scripted cut")  # the server drops the connection mid-stream
            finish = "stop"
        yield chunk({}, finish)
        usage_frame = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": MODEL_ID,
                       "choices": [], "usage": usage}  # fmt: skip
        yield f"data: {json.dumps(usage_frame)}\n\n".encode()
        yield b"data: [DONE]\n\n"
        self._ended(logged, finish)


def demo_rule() -> Rule:
    """``whoami``: call ``talaria_whoami`` (claiming to be someone else), then say what Talaria answered."""
    return when(
        "whoami",
        tool_call(ToolSelector("team_", "talaria_whoami"), {"account": "someone-else", "tenant": "elsewhere"}),
        reply_with_tool_result("Talaria says this conversation acts for: "),
    )


def demo_chat_rules() -> list[Rule]:
    """The demo's chat: two short replies, streamed in small chunks so that the demo shows them arrive."""
    return [
        when("What can you do", slow("I am Helper, running in this node's Hermes. Ask me to read, write or "
                                     "summarise here; Talaria streams my answers to you.", chunk_delay_s=0.03)),
        when("One more line", slow("Continue this chat in your browser; I will remember it.", chunk_delay_s=0.03)),
    ]  # fmt: skip


def demo_team_rules(
    request_id: Callable[[int], Any] = lambda n: f"demo-{n}",
    writer: Any = "Writer",
    crew: Any = "Launch crew",
    lead: str = r"^Write the launch note",
) -> list[Rule]:
    """The demo's team goal (team-tools.md 13's S1 in small): the coordinator forms a team and assigns a draft, the
    member writes it, the review wake accepts it and finishes the goal. ``request_id(n)`` is the n-th mutating call's
    ``requestId`` (1-6), ``writer`` and ``crew`` the names, ``lead`` the pattern of the lead's prompt: values or
    ``from_prompt`` arguments, so that many goals can run side by side (the chaos benchmark's). The review rule
    matches only a wake that shows an assignment in review (another wake gets the default reply)."""

    def team(name: str) -> ToolSelector:
        return ToolSelector("team_", f"talaria_{name}:")

    return [
        when(None,
             tool_call(team("create_bot"), {"requestId": request_id(1), "name": writer,
                                            "instructions": "Write short, plain text."}),
             tool_call(team("create_team"), {"requestId": request_id(2), "name": crew,
                                             "memberIds": [from_result(0, "/bot/id")]}),
             tool_call(team("start_goal"), {"requestId": request_id(3), "teamId": from_result(1, "/team/id"),
                                            "title": "Launch note",
                                            "objective": "A three-line note announcing the node.",
                                            "acceptanceCriteria": ["Three lines, plain text."]}),
             tool_call(team("assign"), {"requestId": request_id(4), "goalId": from_result(2, "/goal/id"),
                                        "botId": from_result(0, "/bot/id"), "title": "Draft",
                                        "brief": "Write three lines announcing the node."}),
             slow("Writer is drafting the launch note; I will report back here.", chunk_delay_s=0.03),
             pattern=lead),
        when(None, reply("The node is up.\nHermes runs where it belongs.\nTalaria keeps the receipts."),
             pattern=r"(?m)^\[talaria-assignment\]"),
        when(None,
             tool_call(team("review_assignment"), {"requestId": request_id(5), "decision": "accept", "note": "Good.",
                                                   "assignmentId": from_prompt(r"assignment (asg_\S+) review")}),
             tool_call(team("finish_goal"), {"requestId": request_id(6), "goalId": from_prompt(r"goalId: (\S+)"),
                                             "status": "complete", "acceptanceRevision": 1,
                                             "result": "The launch note is written: three plain lines.",
                                             "checks": [{"criterion": 0, "passed": True,
                                                         "evidence": "Writer's draft has three plain lines."}]}),
             reply("The launch note is ready: Writer wrote it and I checked it."),
             pattern=r"(?ms)^\[talaria-goal-review\].*^assignment asg_\S+ review "),
    ]  # fmt: skip


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


async def _until_disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def main(argv: Sequence[str] | None = None) -> int:
    """``talaria testing model-server``: serve the default script until interrupted."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="talaria testing model-server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    demo = ("add the demo's rules: a prompt with 'whoami' calls the talaria_whoami team tool and replies with what it "
            "answered; the demo chat's two replies; the demo's team goal")  # fmt: skip
    parser.add_argument("--demo", action="store_true", help=demo)
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    rules = [demo_rule(), *demo_chat_rules(), *demo_team_rules()] if args.demo else []
    with ModelServer(rules, host=args.host, port=args.port) as server:
        print(f"model server ready: http://{args.host}:{server.port}/v1", flush=True)
        stop.wait()
    return 0
