"""A fake Hermes Agent 0.19.0 for tests: ``hermes serve`` on a loopback bind, as far as Talaria's runner uses it
(hermes.md 2-6 and 11; runner-protocol.md 10 and 11). The acceptance suite (``tests/hermes``) runs a real Hermes
instead.

    with HermesFixture(profiles=["default", "work"]) as hermes:
        hermes.knobs.delta_delay = 0.05
        hermes.reply_for("marker-1", "done")
        ...                       # the runner talks to hermes.url with hermes.session_token
        hermes.wait_for(lambda: hermes.prompt_count("marker-1") == 1)

What it serves, on ``127.0.0.1:<port>`` (``url``, ``port``; ``ws_url`` adds ``/api/ws?token=``):

- Guards, in Hermes' order: every ``/api/*`` route except the public ones (``/api/status`` …) needs the session
  token (``X-Hermes-Session-Token``, ``Authorization: Bearer``, or ``?token=`` on ``/api/files/download``; else
  401), then the plugin gate, then ``Host`` must be ``127.0.0.1:<port>`` (else 400). ``/api/ws`` needs ``?token=``,
  that Host and an absent or exact ``Origin``; otherwise the upgrade is refused (HTTP 403).
- REST: ``GET /api/status``, ``/api/profiles``, ``/api/config?profile=``, ``/api/sessions``,
  ``/api/sessions/{id}/messages?profile=&limit=&offset=``, ``/api/files/download?path=``,
  ``/api/plugins/talaria/capabilities``; ``POST /api/plugins/talaria/bind`` and ``/unbind``. ``GET /`` is 404
  unless ``knobs.dashboard_page`` (then the page carries ``window.__HERMES_SESSION_TOKEN__``).
- ``/api/ws`` JSON-RPC: ``gateway.ready`` first, then ``session.create|resume|close|interrupt|usage|active_list|
  history|steer``, ``prompt.submit``, ``approval.respond``, ``clarify.respond``, ``image.attach_bytes``,
  ``file.attach``. A turn streams ``message.start``, ``message.delta`` pieces, ``message.complete`` and
  ``session.info``; the reply is ``"echo: " + prompt`` unless a ``reply_for`` rule matches.
- WebSocket loss: ``close_on_disconnect`` sessions close at once, the others detach (a running turn goes on, its
  events are lost) and are closed ``knobs.reap_grace`` seconds later if idle then.

Constructor (all keyword): ``session_token`` (default random per instance; a given one survives ``restart``),
``profiles`` (names or ``/api/profiles`` entries; ``default`` is always there), ``configs`` (profile name →
``/api/config`` body; default: scripted model, Tool Search off, plugin enabled), ``home`` (where uploads go and
profile paths point; default a temporary directory removed by ``stop``), ``dashboard`` (sets
``knobs.dashboard_page``), ``knobs`` (a ``Knobs``), ``now`` (wall clock for stored ids, timestamps and grant
expiry). ``start()``/``stop()`` are idempotent (``stop`` before ``start`` is a no-op); the fixture is also a
context manager.

Plain knobs, ``fixture.knobs.<name>`` (seconds for times), read where they apply:
``ready_delay`` (before ``gateway.ready``), ``send_ready`` (False: never sent), ``drop_after_frames`` (connections
opened while set are aborted after sending that many frames; ``gateway.ready`` is the first), ``delta_count``,
``delta_delay`` (before each delta), ``agent_build_delay`` (create → ``session.info``, default 0.05),
``persist_delay`` (submit answer → user row), ``interrupt_delay`` (interrupt → ``message.complete``),
``end_info_delay`` (``message.complete`` → the end-of-turn ``session.info``),
``clarify_timeout`` (also bounds an approval wait), ``reap_grace`` (default 20), ``max_sessions`` (then 4090),
``dashboard_page``, ``status_overrides`` (merged into ``/api/status``), ``plugin_enabled`` (False: plugin routes
404), ``capabilities`` (the capabilities body; default ready), ``bind_native_tools``, ``bind_tools``,
``max_download_bytes`` (then 413).

Rule knobs, methods (``times``: how many matches a rule serves, None until ``reset_knobs``; the newest matching
rule wins): ``fail_method(method, code=5000, message=…)``, ``delay_method(method, seconds | None)`` (None: never
answered), ``drop_on_method(method, after_handling=True, times=1)``, ``fail_route(glob, status, body=None)``,
``delay_route(glob, seconds)`` (HTTP slowness), ``hold_route(glob)`` (held until its gate is released),
``reply_for(substring, text)``, ``approval_for(substring, …)``, ``clarify_for(substring, question, choices)``,
``fail_turn_for(substring, message)``,
``error_event_for(substring, message)``, ``compress_on(substring, times=1)``; ``reset_knobs()`` (back to the knobs
the fixture was constructed with).

Simulations: ``drop_connections()`` (abort every WebSocket), ``restart(crash=False, new_token=None)`` (every live
session ends, sockets close with 1012 or are aborted, stored transcripts stay), ``seed_session(messages, profile=,
title=)`` (a stored session from an earlier run); ``restarts`` counts ``restart`` calls.

Reads (copies, thread-safe): ``requests(path=None)`` (method, path, query, headers with credentials redacted, JSON
body, status), ``rpc_requests(method=None)``, ``turns()``, ``prompt_count(text)`` (turns started on a prompt
containing ``text``), ``transcript(stored_id, profile=)``, ``stored_ids(profile=)``, ``live_sessions()``,
``session(runtime_id)``, ``binds()``, ``unbinds()``, ``bindings()``, ``steers()``, ``approval_choices()``,
``clarify_answers()``, ``attachments()``, ``connection_count()``, ``connections_opened()``,
``internal_errors()``; ``wait_for(predicate, timeout=10)`` waits on the fixture's condition variable.
"""

from talaria.testing.hermes_fixture.knobs import HERMES_VERSION, Knobs, default_capabilities
from talaria.testing.hermes_fixture.server import HermesFixture
from talaria.testing.hermes_fixture.state import RequestRecord, RpcRecord, SessionView, TurnRecord

__all__ = [
    "HERMES_VERSION",
    "HermesFixture",
    "Knobs",
    "RequestRecord",
    "RpcRecord",
    "SessionView",
    "TurnRecord",
    "default_capabilities",
]
