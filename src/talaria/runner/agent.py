"""The runner's connection loop (runner-protocol.md 3, 5.2, 6.2): poll, adopt epochs, run commands.

With ``failover-v1`` echoed by the hub (scale.md 3.5), a poll failing by transport or with 502, 503 or 504 is not a
local disconnect while it is within ``failover_window_s`` (20 s) of sending the last poll that succeeded: the poll
is sent again after 0.25 s doubling to 2 s (full jitter); an answer with the same epoch means nothing happened. A
new epoch, a 403 or 409, or the window passing without success disconnects locally as protocol v1 says.

A drain (SIGQUIT, or ``drain: true`` in a poll answer; operations.md 3.3) keeps polling and running what is open,
answers new work (a ``gateway.open`` neither cleanup-only nor ``recovery``, ``grant.create``, ``prompt.submit``)
with ``runner_draining`` before ``admit``, and stops once nothing executes and no channel or grant is open, or when
``drain_timeout_s`` passes (0: never), as a stop on request (exit 0).

With ``rotate-v1`` (operations.md 4.2, ADR 0059) a poll answer's ``rotate: true`` makes the runner call ``rotate``,
write the new token to ``credential.json`` and only then use it; ``runner credential rotated`` once the hub accepts it.

Status lines on stderr: ``runner connected`` when a new epoch is adopted, ``runner disconnected:
<reason>`` on a local disconnect caused by an error, ``runner draining``, ``runner drained`` and ``runner drain timed
out: <n> channels open``, ``runner: <code>: <advice>`` before a stop for good
(a terminal refusal, exit status 3, operations.md 2.3; ``receipts_failed``, a receipt the file refused, exit status
4, ADR 0019). Never the token or a Hermes credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, TextIO

from talaria.clock import Clock
from talaria.hermes.rest import HermesRest
from talaria.release import runner_version
from talaria.runner import limits
from talaria.runner.compaction import Compactor
from talaria.runner.config import RunnerConfig
from talaria.runner.credential import CredentialFile
from talaria.runner.errors import CommandError
from talaria.runner.executor import Executor
from talaria.runner.gateway import Gateways
from talaria.runner.grants import Grants
from talaria.runner.http_kind import run_http
from talaria.runner.hub_client import RETRY_WINDOW_S, HubClient, HubError, Identity, Wire, retry_delays
from talaria.runner.metrics import Gauges, NodeMetrics
from talaria.runner.metrics_listener import MetricsListener, Readiness
from talaria.runner.receipts import Receipts, ReceiptsError
from talaria.runner.status_log import StatusLog
from talaria.timeouts import within

GRACE_S = 10.0
GOODBYE_S = 2.0
DRAIN_TIMEOUT_S = 900.0  # --drain-timeout's default
READY_POLL_S = 20.0  # /readyz: a poll answered within this long (operations.md 5.2)
HERMES_KINDS = frozenset({"http", "gateway.open", "gateway.rpc"})  # commands whose success shows Hermes answered
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}\Z")
ROTATE_EVERY_S = 60.0  # operations.md 4.2: rotate at most once a minute
DRAIN_CHECK_S = 0.1  # how often a drain looks whether the runner is drained
DRAINING = CommandError("runner_draining", "the execution node is draining; it takes no new work")
MAX_BACKOFF_S = 30.0
RIDDEN_OUT = frozenset({0, 502, 503, 504})  # poll failures failover-v1 rides out: transport, a proxy, a stopping hub
EXIT_CONFIG = 2  # an invalid configuration (here: a --metrics-listen address that cannot be listened on)
EXIT_TERMINAL = 3  # the hub refused this runner for good (TERMINAL_ADVICE): a service manager must not restart it
EXIT_RECEIPTS_FAILED = 4  # a receipt could not be written: stopped rather than leave a command unanswered
RECEIPTS_ADVICE = "the runner stops; free or repair the disk of its state directory, then start it again"
TERMINAL_ADVICE = {
    "runner_unauthorized": "the runner was disabled or its token is invalid; register it again on the hub",
    "runner_protocol_mismatch": "the hub speaks another runner protocol version; upgrade Talaria on this node",
    "runner_instance_retired": "another runner process replaced this one; stop the duplicate",
    "runner_instance_limit": "too many replaced runner processes; register the runner again",
}


def trace_of(command: dict[str, Any]) -> str | None:
    """The trace id of a command's ``traceparent`` (trace-v1, operations.md 5.5), which is only logged."""
    match = TRACEPARENT.match(str(command.get("traceparent", "")))
    return match.group(1) if match else None


class Agent:
    def __init__(
        self,
        config: RunnerConfig,
        receipts: Receipts,
        clock: Clock,
        *,
        out: TextIO = sys.stderr,
        hub_wire: Wire | None = None,
        compact_interval_s: float = limits.RECEIPT_COMPACT_INTERVAL_S,
        failover_window_s: float = RETRY_WINDOW_S,
        monotonic: Callable[[], float] = time.monotonic,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
        credential: CredentialFile | None = None,
        log_format: str = "text",
        metrics_listen: tuple[str, int] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.out = out
        self.instance = str(uuid.uuid4())
        self.status = StatusLog(log_format, out=out, runner_id=config.runner_id)
        self.status.instance = self.instance
        self.metrics_listen = metrics_listen
        self._listener: MetricsListener | None = None
        self.last_poll_ok: float | None = None  # monotonic time of the last poll answered 200
        self.hermes_up: bool | None = None  # what the last command that reached Hermes found
        self.failover_window_s = failover_window_s
        self._monotonic = monotonic
        self.credential = credential
        token = credential.token if credential is not None else config.token
        self.hub = HubClient(config.server_url, Identity(config.runner_id, token, self.instance), wire=hub_wire,
                             retry_window_s=failover_window_s, monotonic=monotonic, credential=credential,
                             say=self.say, tls=config.hub_tls())  # fmt: skip
        self._rotation: asyncio.Task[None] | None = None
        self._rotated_at: float | None = None  # monotonic time of the last rotate sent
        self.polls_ridden_out = 0  # poll failures that did not disconnect (failover-v1)
        self.receipts = receipts
        self._rest: HermesRest | None = None  # made on first use: no Hermes request before the first poll
        self.server_epoch: str | None = None
        self.connected = False
        self.disconnects = 0
        self.features = ["team-tools-v1", "failover-v1", "drain-v1", "trace-v1"]
        if config.artifact_roots:
            self.features.append("export-v1")
        if credential is not None:  # rotation needs credential.json's directory (operations.md 4.2)
            self.features.append("rotate-v1")
        self.drain_timeout_s = drain_timeout_s
        self.draining = False
        self.drained = False  # the drain ended with nothing open (not by its timeout)
        self._drain: asyncio.Task[None] | None = None
        self._repoll = False  # the poll was cancelled to send X-Runner-Draining at once
        self.gateways = Gateways(
            hub=self.hub,
            receipts=receipts,
            allowed_profiles=config.allowed_profiles,
            hermes_url=config.hermes_url,
            rest=self.rest,
            disconnects=lambda: self.disconnects,
            on_hub_failure=self._hub_error,
        )
        self.grants = Grants(
            config,
            self.hub,
            self.rest,
            clock,
            self.gateways,
            lambda: self.server_epoch if self.connected else None,
            stored_of=self.gateways.stored_of,
            record_session=receipts.record_session,
            on_hub_error=self._hub_error,
        )
        self.gateways.on_session_closed.append(self.grants.session_closed)
        # (epoch, disconnect counter) at each command's arrival, while it executes (gateway.open needs them, 10.1)
        self._arrivals: dict[str, tuple[str, int]] = {}
        self.executor = Executor(
            self.hub,
            receipts,
            clock,
            handlers={
                "http": self._http,
                "gateway.open": self._gateway_open,
                "gateway.rpc": self._gateway_rpc,
                "gateway.close": self._gateway_close,
                **self.grants.handlers(),
            },
            epoch_is_current=lambda epoch: self.connected and epoch == self.server_epoch,
            on_hub_error=self._hub_error,
            on_receipts_failure=self._receipts_failed,
            refuse=self._new_work_while_draining,
            on_started=self._command_started,
            on_answered=self._command_answered,
            monotonic=monotonic,
        )
        self.metrics = NodeMetrics(runner_version(), kinds=self.executor.handlers)
        self.compactor = Compactor(receipts, interval_s=compact_interval_s, on_failure=self._receipts_failed)
        self.connected_event = asyncio.Event()
        self._stop = asyncio.Event()
        self._stop_now = False
        self._poll: asyncio.Task[dict[str, Any]] | None = None
        self.exit_code = 0
        self.receipts_failure: ReceiptsError | None = None

    def say(self, line: str) -> None:
        self.status.say(line)

    def _disconnected(self, code: str) -> None:
        self.say(f"runner disconnected: {code}")
        self.metrics.disconnected(code)

    # --- logs and metrics (operations.md 5.2, 5.3) -------------------------------------------------------------

    def _command_started(self, command: dict[str, Any]) -> None:
        self.status.command("command_started", command_id=command["id"], kind=command.get("kind"),
                            trace=trace_of(command))  # fmt: skip

    def _command_answered(self, command: dict[str, Any], reply: dict[str, Any], seconds: float) -> None:
        error = reply.get("error")
        outcome = str(error.get("code")) if isinstance(error, dict) else "ok"
        kind = command.get("kind")
        self.metrics.command_done(kind, outcome, seconds)
        if outcome == "hermes_unavailable":
            self.hermes_up = False
        elif outcome == "ok" and kind in HERMES_KINDS:
            self.hermes_up = True
        self.status.command("command_finished", command_id=command["id"], kind=kind, outcome=outcome,
                            ms=round(seconds * 1000, 1), trace=trace_of(command))  # fmt: skip

    def gauges(self) -> Gauges:
        issued = self.credential.credential.issued_at if self.credential is not None else None
        return Gauges(
            connected=self.connected, draining=self.draining, hermes_up=self.hermes_up,
            gateway_channels=len(self.gateways.channels), grants=len(self.grants.open_ids()),
            token_age_seconds=max(0.0, (self.clock.now_ms() - issued) / 1000) if issued is not None else None,
        )  # fmt: skip

    def readiness(self) -> Readiness:
        """``/readyz``: an adopted epoch and a poll answered within the last 20 s (operations.md 5.2)."""
        if not self.connected or self.last_poll_ok is None:
            return Readiness(False, "the runner is not connected to the hub")
        if self._monotonic() - self.last_poll_ok > READY_POLL_S:
            return Readiness(False, f"no poll succeeded in the last {READY_POLL_S:.0f} s")
        return Readiness(True)

    async def _listen(self) -> bool:
        """``--metrics-listen``: False (exit 2) when the address cannot be listened on."""
        if self.metrics_listen is None:
            return True
        listener = MetricsListener(lambda: self.metrics.render(self.gauges()), self.readiness)
        host, port = self.metrics_listen
        try:
            url = await listener.start(host, port)
        except OSError as exc:
            self.say(f"talaria runner: --metrics-listen: cannot listen on {host}:{port}: {exc.strerror or exc}")
            return False
        self._listener = listener
        self.say(f"runner metrics on {url}")
        return True

    # --- the loop --------------------------------------------------------------------------------------------

    async def run(self) -> int:
        backoff = 0.0
        last_ok_sent: float | None = None  # when the last poll that succeeded was sent
        riding = retry_delays()
        if not await self._listen():
            await self.hub.close()
            return EXIT_CONFIG
        try:
            self.compactor.start()
            while not self._stop.is_set():
                counter = self.disconnects
                sent = self._monotonic()
                self._poll = asyncio.get_running_loop().create_task(
                    self.hub.poll(reset=not self.connected, features=self.features, draining=self.draining)
                )
                try:
                    answer = await self._poll
                except asyncio.CancelledError:
                    if self._stop.is_set():
                        break
                    if self._repoll:  # a drain began or the token changed: poll again at once
                        self._repoll = False
                        continue
                    raise
                except HubError as exc:
                    self.metrics.polled(exc.code)
                    if exc.terminal:
                        self.say(f"runner: {exc.code}: {TERMINAL_ADVICE[exc.code]}")
                        self.exit_code = EXIT_TERMINAL
                        break
                    if self._rides_out(exc, last_ok_sent):
                        self.polls_ridden_out += 1
                        await self._pause(riding())
                        continue
                    self._disconnected(exc.code)
                    await self.local_disconnect()
                    backoff = 1.0 if backoff == 0 else min(MAX_BACKOFF_S, backoff * 2)
                    await self._pause(random.uniform(0, backoff))  # noqa: S311 - jitter, not a secret
                    continue
                self.metrics.polled("ok")
                self.last_poll_ok = self._monotonic()
                backoff = 0.0
                riding = retry_delays()
                last_ok_sent = sent
                if self.disconnects != counter:
                    continue  # a local disconnect overtook this poll: discard it entirely
                if answer["epoch"] != self.server_epoch:
                    await self.local_disconnect()
                    self.server_epoch, self.connected = answer["epoch"], True
                    self.status.epoch = self.server_epoch
                    self.metrics.epoch_changed()
                    self.connected_event.set()
                    self.say("runner connected")
                if answer.get("drain") is True:
                    self.request_drain()
                if answer.get("rotate") is True:
                    self._rotate_soon(answer["epoch"])
                for command in answer["commands"]:
                    self._submit(command, answer["epoch"])
        finally:
            await self._shutdown()
        if self.drained:
            self.say("runner drained")
        return self.exit_code

    def _rides_out(self, exc: HubError, last_ok_sent: float | None) -> bool:
        """failover-v1: a transport failure, 502, 503 or 504 within the window of the last poll that succeeded."""
        return (
            self.connected
            and self.hub.failover
            and exc.status in RIDDEN_OUT
            and last_ok_sent is not None
            and self._monotonic() - last_ok_sent < self.failover_window_s
        )

    def _submit(self, command: Any, epoch: str) -> None:
        """Hand a command to the executor, noting the epoch and disconnect counter of its arrival."""
        command_id = command.get("id") if isinstance(command, dict) else None
        if not isinstance(command_id, str) or command_id in self.executor.running:
            self.executor.submit(command, epoch)  # malformed, or joined to the execution already running
            return
        self._arrivals[command_id] = (epoch, self.disconnects)
        self.executor.submit(command, epoch)
        task = self.executor.running.get(command_id)
        if task is None:
            self._arrivals.pop(command_id, None)
        else:
            task.add_done_callback(lambda _: self._arrivals.pop(command_id, None))

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await within(self._stop.wait(), seconds)

    def _rotate_soon(self, epoch: str) -> None:
        """Operations.md 4.2: ``rotate: true`` in a poll answer; at most once a minute, never while the token in use
        is unconfirmed (the hub has not yet answered a request made with it)."""
        credential = self.credential
        if credential is None or credential.credential.unconfirmed:
            return
        if self._rotation is not None and not self._rotation.done():
            return
        now = self._monotonic()
        if self._rotated_at is not None and now - self._rotated_at < ROTATE_EVERY_S:
            return
        self._rotated_at = now
        self._rotation = asyncio.get_running_loop().create_task(self._rotate(credential, epoch))

    async def _rotate(self, credential: CredentialFile, epoch: str) -> None:
        try:
            answer = await self.hub.post("rotate", epoch, {})
        except HubError as exc:  # the old token stays; the hub asks again at a later poll
            self.say(f"runner credential rotation failed: {exc.code}")
            return
        token, issued = (answer.get("token"), answer.get("issuedAt")) if isinstance(answer, dict) else (None, None)
        if not isinstance(token, str) or type(issued) is not int:
            self.say("runner credential rotation failed: the hub's answer is malformed")
            return
        try:
            await asyncio.to_thread(credential.adopt, token, issued)
        except (OSError, ValueError) as exc:
            self.say(f"runner credential rotation failed: cannot write {credential.path}: {exc}")
            return
        self.hub.switch_token(token)  # only now: the file holds it; the first 200 with it confirms it
        if self._poll is not None and self._poll.cancel():  # poll again at once with it, so that it promotes now
            self._repoll = True

    def request_drain(self) -> None:
        """SIGQUIT or the hub's ``drain: true``: take no new work, stop once drained. Again, or while stopping:
        nothing."""
        if self.draining or self._stop.is_set():
            return
        self.draining = True
        self.say("runner draining")
        self._drain = asyncio.get_running_loop().create_task(self._until_drained())
        if self._poll is not None and self._poll.cancel():  # end the held poll: the next one says it drains
            self._repoll = True

    async def _until_drained(self) -> None:
        deadline = self._monotonic() + self.drain_timeout_s if self.drain_timeout_s > 0 else None
        while not self._stop.is_set():
            if not self.executor.running and not self.gateways.channels and not self.grants.open_ids():
                self.drained = True
                self.request_stop()
                return
            if deadline is not None and self._monotonic() >= deadline:
                self.say(f"runner drain timed out: {len(self.gateways.channels)} channels open")
                self.request_stop()
                return
            await self._pause(DRAIN_CHECK_S)

    def _new_work_while_draining(self, command: dict[str, Any]) -> CommandError | None:
        """Operations.md 3.3: while draining, new work is answered ``runner_draining`` before ``admit``."""
        if not self.draining:
            return None
        kind, payload = command.get("kind"), command.get("payload")
        fields = payload if isinstance(payload, dict) else {}
        opens = kind == "gateway.open" and not fields.get("cleanupOnly") and not fields.get("recovery")
        submits = kind == "gateway.rpc" and fields.get("method") == "prompt.submit"
        return DRAINING if opens or submits or kind == "grant.create" else None

    def request_stop(self) -> None:
        """First call: graceful stop. A second call during the grace period: stop at once."""
        if self._stop.is_set():
            self._stop_now = True
            self.executor.cancel_all()
            return
        self._stop.set()
        if self._poll is not None:
            self._poll.cancel()

    def _receipts_failed(self, exc: ReceiptsError) -> None:
        """A receipt could not be written: say so once and stop gracefully with exit status 4. Commands in
        flight finish and post their outcomes; the hub gets ``goodbye`` and fails what is left at once."""
        if self.receipts_failure is not None:
            return
        self.receipts_failure = exc
        self.say(f"runner: receipts_failed: {exc}; {RECEIPTS_ADVICE}")
        if self.exit_code == 0:
            self.exit_code = EXIT_RECEIPTS_FAILED
        if not self._stop.is_set():
            self.request_stop()

    async def _shutdown(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.cancel()
        if self._rotation is not None:
            self._rotation.cancel()  # safe at any step: the old token, or the written new one, still works
        await self.compactor.stop()
        if not self._stop_now:
            await self.executor.drain(GRACE_S)
        if self.connected and self.server_epoch is not None and self.exit_code != EXIT_TERMINAL:
            with contextlib.suppress(HubError, TimeoutError):  # best effort
                await within(self.hub.post("goodbye", self.server_epoch, {}), GOODBYE_S)
        self.executor.cancel_all()
        await self.local_disconnect()
        await self.hub.close()
        if self._listener is not None:
            await self._listener.close()
        if self._rest is not None:
            await self._rest.close()

    async def local_disconnect(self) -> None:
        """Section 5.2: bump the counter and drop ``connected``; then every gateway channel interrupts its running
        sessions (3 s in total) and closes without posting further events, and every grant is disposed."""
        self.disconnects += 1
        self.connected = False
        self.connected_event.clear()
        results = await asyncio.gather(self.gateways.close_all(), self.grants.dispose_all(), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                self.say(f"runner: local disconnect failed: {type(result).__name__}")

    async def _hub_error(self, exc: HubError) -> None:
        """A post failed: a local disconnect, unless the post belonged to a connection that has already ended (a
        retried post of an earlier epoch answered ``runner_epoch_changed`` by a restarted hub, say)."""
        if exc.epoch is not None and exc.epoch != self.server_epoch:
            return
        if self.connected:
            self._disconnected(exc.code)
            await self.local_disconnect()

    # --- command kinds ---------------------------------------------------------------------------------------

    def rest(self) -> HermesRest:
        if self._rest is None:
            self._rest = HermesRest(
                self.config.hermes_url,
                token_file=self.config.hermes_token_file,
                clock=self.clock,
                credentials=(creds.username, creds.password) if (creds := self.config.hermes_credentials) else None,
            )
        return self._rest

    async def _http(self, command: dict[str, Any]) -> Any:
        from talaria.hermes.auth import HermesUnavailable

        try:
            return await run_http(
                command["payload"],
                rest=self.rest(),
                allowed_profiles=self.config.allowed_profiles,
                artifact_roots=self.config.artifact_roots,
                session_profile=self.receipts.session_profile,
            )
        except HermesUnavailable as exc:
            raise CommandError("hermes_unavailable", str(exc)) from exc

    async def _gateway_open(self, command: dict[str, Any]) -> Any:
        epoch, counter = self._arrivals.get(command["id"], (self.server_epoch or "", self.disconnects))
        return await self.gateways.open(command["payload"], epoch=epoch, counter=counter)

    async def _gateway_rpc(self, command: dict[str, Any]) -> Any:
        return await self.gateways.rpc(command["payload"])

    async def _gateway_close(self, command: dict[str, Any]) -> Any:
        return await self.gateways.close(command["payload"])
