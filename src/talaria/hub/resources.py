"""The hub's resources, opened in the ASGI lifespan and shared by every route through ``app.state.hub``."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import structlog

from talaria.accounts.service import Accounts
from talaria.accounts.shared_throttle import SharedLoginThrottle
from talaria.accounts.throttle import LoginThrottle, Throttle
from talaria.chat.attachments import Attachments
from talaria.chat.bots import Bots
from talaria.chat.conversations import Conversations
from talaria.chat.turns import ChatTurns
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.hub import restored
from talaria.hub.api.websession import WebSessions, load_secret_key
from talaria.hub.chat.bot_access import BotAccess
from talaria.hub.chat.events import ChatEvents
from talaria.hub.chat.shared_events import SharedChatEvents
from talaria.hub.chat.shared_streams import SharedChatStreams
from talaria.hub.chat.stream_events import StreamEvents
from talaria.hub.chat.streams import ChatStreams
from talaria.hub.client_address import ClientAddresses
from talaria.hub.dispatch.dispatcher import Dispatcher
from talaria.hub.metrics import HubMetrics
from talaria.hub.reaper import Reaper
from talaria.hub.replica import ROLES, Replica, new_replica_id
from talaria.hub.runners.channels import Channels
from talaria.hub.runners.connections import RunnerHub
from talaria.hub.runners.registry import RunnerRegistry
from talaria.hub.runners.shared_connections import SharedRunnerHub
from talaria.hub.runners.slots import SharedSlots
from talaria.hub.runners.transport import RunnerTransport
from talaria.hub.runners.validity import Validity
from talaria.hub.runtime.security_events import SecurityEvents
from talaria.hub.teams.reconciler import TeamReconciler
from talaria.hub.timings import HubTimings
from talaria.hub.turns import team_round, team_tools
from talaria.hub.turns.chat_engine import ChatEngine
from talaria.hub.turns.driver import TurnDriver
from talaria.hub.turns.turn_leases import SharedTurnLeases
from talaria.lifecycle.audit_key import AuditKey
from talaria.lifecycle.audit_sealer import AuditSealer
from talaria.lifecycle.engine import Engine
from talaria.lifecycle.recovery import RecoveryReport
from talaria.release import runner_version
from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.interface import Store
from talaria.store.open import open_store, signals_of
from talaria.teams import catalog
from talaria.teams.calls import TeamToolCalls
from talaria.teams.people import TeamsForPeople
from talaria.teams.permission import TeamBots
from talaria.teams.reconcile import Reconcile

log = structlog.get_logger("talaria.hub")


@dataclass
class Hub:
    settings: Settings
    clock: Clock
    store: Store
    engine: Engine
    accounts: Accounts
    sessions: WebSessions
    throttle: Throttle  # in memory on SQLite, the login_failure table on PostgreSQL (scale.md 3.7)
    security_events: SecurityEvents
    metrics: HubMetrics
    reaper: Reaper
    recovery: RecoveryReport
    registry: RunnerRegistry
    validity: Validity
    runners: RunnerTransport
    channels: Channels
    dispatcher: Dispatcher
    clients: ClientAddresses
    bot_access: BotAccess
    bots: Bots
    team_bots: TeamBots
    conversations: Conversations
    chat_events: StreamEvents  # in memory on SQLite, stream_event rows on PostgreSQL (scale.md 4.2)
    chat_turns: ChatTurns
    chat_attachments: Attachments
    chat_engine: ChatEngine
    chat_streams: ChatStreams  # SharedChatStreams on PostgreSQL: stream_open rows (scale.md 3.7)
    team_people: TeamsForPeople
    team_reconciler: TeamReconciler | None = None  # None while the team set is not installed
    replica: Replica | None = None  # this hub in the cluster's tables (scale.md 1); on SQLite it holds every role
    sealer: AuditSealer | None = None  # PostgreSQL's audit sealer (scale.md 2.4); SQLite chains inline
    draining: bool = False  # a planned restart (operations.md 3.4): no new turn starts here

    def begin_drain(self) -> int:
        """Step 1 of a hub drain: refuse new turns, claim no job, start no chat turn, give the roles up. Returns the
        turns running here."""
        self.draining = True
        self.dispatcher.draining = True
        self.chat_engine.draining = True
        if self.replica is not None:
            self.replica.resign()
        running = self.turns_running()
        log.info("hub_draining", running_turns=running)
        return running

    def refuse_new_turn(self) -> None:
        """503 ``hub_draining`` (``Retry-After: 1``) for a new turn while the hub drains."""
        if self.draining:
            raise TalariaError("hub_draining", "the hub is restarting; send it again in a moment",
                               headers={"Retry-After": "1"})  # fmt: skip

    def turns_running(self) -> int:
        """Job turns and chat turns this process drives on a node now (not chat turns waiting for their node)."""
        return len(self.dispatcher.running) + len(self.chat_engine.running.keys() - self.chat_engine.waiting)

    def tick(self) -> None:
        """One reaper sweep."""
        self.engine.expire_due()
        self.sessions.prune()
        self.chat_events.prune()
        if self.replica is None or self.replica.holds("maintenance"):  # table-wide: one replica does it
            self.chat_attachments.sweep()
            self.chat_streams.sweep()


def audit_unsealed(store: Store) -> dict[str, float]:
    """How many audit events wait for PostgreSQL's sealer (``talaria_audit_unsealed``)."""
    with store.read() as tx:
        row = tx.one("audit_pending_count")
    return {"n": float(row["n"]) if row else 0.0}


def open_hub(settings: Settings, clock: Clock, timings: HubTimings | None = None) -> Hub:
    """Open the store, apply pending migrations, run start-up recovery (lifecycle.md 10)."""
    timings = timings or HubTimings()
    replica_id = new_replica_id()
    # creates or tightens the data directory (0700, files 0600); PostgreSQL connections are named for the replica
    store = open_store(settings, hub=True, application_name=f"talaria/{replica_id}")
    try:
        applied = migrations.upgrade(store)
        if applied:
            log.info("migrations_applied", applied=applied)
        engine = Engine(store, clock, settings)
        metrics = HubMetrics()
        metrics.watch_store(store)
        engine.add_listener(metrics.on_signal)
        restored.apply(store, engine, settings, clock)  # operations.md 7.2: before recovery's expiry step
        report = engine.recover()
        with store.write() as tx:
            tx.run("tenant_ensure", name="default", now=clock.now_ms())
        replica = Replica(store, settings, renew_s=timings.replica_renew_s,
                          clock_check_s=timings.replica_clock_check_s, replica_id=replica_id)  # fmt: skip
        replica.join()  # after recovery, so a refused start leaves no row; a clock that strays refuses it here
    except BaseException:
        store.close()
        raise
    runners: RunnerTransport
    if store.dialect == "postgresql":  # connection states and queue in tables, shared by the replicas (scale.md 3)
        runners = SharedRunnerHub(
            store, signals_of(store, listen=settings.database_listen), clock, Validity(store), replica_id=replica.id,
            may_act=replica.holds, fallback_ms=settings.database_wake_fallback_ms, observe=metrics.observe_command,
            on_fallback_wake=metrics.observe_fallback_wake, timings=timings,
        )  # fmt: skip
    else:
        runners = RunnerHub(clock, Validity(store), observe=metrics.observe_command, timings=timings)
    metrics.watch_runners(runners)
    registry = RunnerRegistry(store, clock, on_rotated=metrics.observe_rotation)
    channels = Channels(runners, {team_tools.WHOAMI_KIND: team_tools.from_descriptor})
    dispatcher = Dispatcher(
        engine=engine, store=store, clock=clock, settings=settings, registry=registry, runners=runners,
        driver=TurnDriver(channels, registry, clock, grant_renew_s=timings.grant_renew_s), timings=timings,
        slots=SharedSlots(store, clock, "dispatch") if store.dialect == "postgresql" else None,
        signals=signals_of(store, listen=settings.database_listen) if store.dialect == "postgresql" else None,
        fallback_ms=settings.database_wake_fallback_ms,
    )  # fmt: skip
    engine.add_listener(dispatcher.on_signal)
    bot_access = BotAccess(registry, runners)
    audit_key = AuditKey.load(store, settings.data_dir, clock.now_ms())
    accounts = Accounts(store, clock)
    conversations = Conversations(store, clock, bot_access.allowed)
    chat_events: StreamEvents
    chat_streams: ChatStreams
    if store.dialect == "postgresql":  # stream events and open streams in tables (scale.md 4.2, 3.7)
        chat_events = SharedChatEvents(store, clock, signals_of(store, listen=settings.database_listen),
                                       fallback_ms=settings.database_wake_fallback_ms)  # fmt: skip
        chat_streams = SharedChatStreams(store, clock, replica.id, keepalive_s=timings.chat_keepalive_s)
    else:
        chat_events = ChatEvents(store, clock)
        chat_streams = ChatStreams(keepalive_s=timings.chat_keepalive_s)
    team_calls = None
    if migrations.current(store).get("team", 0) > 0:  # chat.md 5.9: without the set, talaria_whoami alone
        team_calls = TeamToolCalls(store, clock, audit_key, bot_access, catalog.HANDLERS,
                                   count=metrics.observe_team_call)  # fmt: skip
        channels.tool_kinds[team_round.ROUND_KIND] = functools.partial(team_round.from_descriptor, team_calls)
    shared_turns: dict[str, Any] = {}
    if store.dialect == "postgresql":  # which replica drives each chat turn (scale.md 4.3)
        shared_turns = {"leases": SharedTurnLeases(store, replica.id, renew_s=timings.turn_lease_renew_s),
                        "signals": signals_of(store, listen=settings.database_listen),
                        "slots": SharedSlots(store, clock, "chat")}  # fmt: skip
    chat_engine = ChatEngine(
        store=store, clock=clock, settings=settings, key=audit_key, accounts=accounts, allowed=bot_access.allowed,
        registry=registry, runners=runners, driver=TurnDriver(channels, registry, clock), events=chat_events,
        timings=timings, team_calls=team_calls, **shared_turns,
    )  # fmt: skip
    hub = Hub(
        settings=settings,
        clock=clock,
        store=store,
        engine=engine,
        accounts=accounts,
        sessions=WebSessions(
            store,
            clock,
            load_secret_key(store, settings.data_dir, clock.now_ms()),
            public_origin=settings.public_origin,
        ),
        throttle=SharedLoginThrottle(store, clock) if store.dialect == "postgresql" else LoginThrottle(clock),
        security_events=SecurityEvents(store, clock, settings.security_event_rate_per_minute),
        metrics=metrics,
        reaper=Reaper(lambda: None, settings.lifecycle_reaper_interval_s),
        recovery=report,
        registry=registry,
        validity=runners.validity,
        runners=runners,
        channels=channels,
        dispatcher=dispatcher,
        clients=ClientAddresses(settings.hub_trusted_proxies),
        bot_access=bot_access,
        bots=Bots(store, clock, audit_key, bot_access.allowed),
        team_bots=TeamBots(store),
        conversations=conversations,
        chat_events=chat_events,
        chat_turns=ChatTurns(store, clock, audit_key, bot_access.allowed, conversations, settings),
        chat_engine=chat_engine,
        chat_attachments=Attachments(store, clock, conversations),
        chat_streams=chat_streams,
        team_people=TeamsForPeople(store, clock),
    )
    hub.reaper = Reaper(hub.tick, settings.lifecycle_reaper_interval_s)
    hub.replica = replica
    metrics.watch_hub(runner_version(), store.dialect, replica.id, lambda: len(dispatcher.running),
                      lambda: hub.draining)  # fmt: skip
    if store.dialect == "postgresql":
        from talaria.store.postgres.store import PostgresStore

        assert isinstance(store, PostgresStore)
        metrics.watch_postgres(store.pool_connections, replica, ROLES, lambda: audit_unsealed(store))
        store.signals(listen=settings.database_listen).on_sent = metrics.observe_notify
    if store.dialect == "postgresql":
        hub.sealer = AuditSealer(store, settings.audit_seal_interval_ms, may_seal=lambda: replica.holds("audit_sealer"),
                                 clock=clock, observe_lag=hub.metrics.audit_seal_lag.observe)  # fmt: skip
        hub.sealer.watch()
    if team_calls is not None:
        reconcile = Reconcile(store, clock, settings, audit_key, bot_access.allowed, engine)
        hub.team_reconciler = TeamReconciler(reconcile, store=store, engine=engine, chat=chat_engine,
                                             events=chat_events, interval_s=timings.team_reconcile_s,
                                             may_run=lambda: replica.holds("maintenance"))  # fmt: skip
        team_calls.on_applied = hub.team_reconciler.applied
    return hub
