"""One team tool call, from the round's grant to its answer (team-tools.md 5 "Each call", 6.1).

The hub's grant has already passed checks 1 and 2 (the grant open, its turn live, the tool in its catalog); this
frame runs the rest in order, and the first failure answers and writes nothing:

3-6. the round's account, bot, profile and conversation as they are in this transaction (``round.check``);
7.   the arguments against the tool's schema (``arguments.check``);
8.   for a mutating tool, the request ledger: the stored answer byte for byte, or 409 ``idempotency_conflict``;
9.   the tool's own rules (its handler, in the order of 6.3);
10.  the effect, the ledger row, the audit events and the evidence row, in the same write transaction.

A success is the tool's object as compact JSON, ids and states before the other keys (6.1); the text is what the
ledger keeps and what a replay answers. ``talaria_whoami`` needs none of 3-10: it answers the round. Outcomes are
counted by tool (``applied``, ``replayed``, ``refused``); nothing here logs an argument or a result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from talaria.accounts.service import Account
from talaria.canonical import compact_json
from talaria.chat.bots import Bot
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.lifecycle.audit_key import AuditKey
from talaria.store.interface import Store, Tx
from talaria.teams import arguments, ledger
from talaria.teams import round as rounds
from talaria.teams.evidence import Event, record_call, record_more
from talaria.teams.round import Round

APPLIED: Final = "applied"
REPLAYED: Final = "replayed"
REFUSED: Final = "refused"


class Access(Protocol):
    """The owner's (source, profile) intersection as the hub knows it now (runner-protocol.md 8)."""

    def allowed(self, account: Account, source: str, profile: str) -> bool: ...

    def pairs(self, account: Account) -> list[tuple[str, str]]:
        """Every pair the account may use now, by source, then profile."""
        ...


@dataclass(frozen=True)
class Context:
    """What a tool's handler works with: the call's transaction, the round, and what checks 3-6 read."""

    tx: Tx
    round: Round
    owner: Account
    caller: Bot
    now_ms: int
    access: Access

    def usable(self, bot: Bot) -> bool:
        """Not archived, and its (source, profile) in the owner's intersection now."""
        return not bot.archived and self.access.allowed(self.owner, bot.source, bot.profile)


@dataclass(frozen=True)
class Applied:
    """A mutating tool's effect, written in ``Context.tx``: its result, its main event (the one with evidence) and
    any further events (a cancel cascade's)."""

    result: dict[str, Any]
    event: Event
    more: tuple[Event, ...] = ()
    goal_id: str | None = None  # the goal it changed, if any (the reconciler's signal)


Read = Callable[[Context, dict[str, Any]], dict[str, Any]]
Write = Callable[[Context, dict[str, Any]], Applied]


@dataclass(frozen=True)
class Handlers:
    reads: Mapping[str, Read]
    writes: Mapping[str, Write]


@dataclass
class TeamToolCalls:
    """Runs calls for rounds. ``on_applied(goal_id)`` is called after each applied mutating call has committed
    (the reconciler's signal); ``count(tool, outcome)`` after every answered call."""

    store: Store
    clock: Clock
    key: AuditKey
    access: Access
    handlers: Handlers
    on_applied: Callable[[str | None], None] = field(default=lambda goal_id: None)
    count: Callable[[str, str], None] = field(default=lambda tool, outcome: None)

    def __post_init__(self) -> None:
        known = set(self.handlers.reads) | set(self.handlers.writes) | {arguments.WHOAMI}
        if known != set(arguments.TOOLS):
            raise ValueError(f"team tools without a handler or schema: {sorted(known ^ set(arguments.TOOLS))}")

    def call(self, round: Round, tool: str, given: Any) -> str:
        """The answer's text for one call of ``tool`` with ``given`` arguments; a refusal raises its
        ``TalariaError`` (``team_tools_forbidden`` for checks 3-6: the caller then closes the grant)."""
        try:
            text, outcome, goal_id = self._call(round, tool, given)
        except TalariaError:
            self.count(tool if tool in arguments.TOOLS else "unknown", REFUSED)
            raise
        self.count(tool, outcome)
        if outcome == APPLIED and tool in self.handlers.writes:
            self.on_applied(goal_id)
        return text

    def _call(self, round: Round, tool: str, given: Any) -> tuple[str, str, str | None]:
        if tool == arguments.WHOAMI:
            return compact_json(round.whoami()), APPLIED, None
        read = self.handlers.reads.get(tool)
        if read is not None:
            with self.store.read() as tx:
                context = self._context(tx, round)
                return compact_json(read(context, arguments.check(tool, given))), APPLIED, None
        write = self.handlers.writes.get(tool)
        if write is None:
            raise TalariaError("not_found", "no such team tool")
        with self.store.write() as tx:
            # the owner's row first: mutating calls of one owner run one after another across replicas, so a
            # concurrent repeat of a request replays it and the limits count after each other (scale.md 3.7)
            tx.run("account_lock", username=round.owner)
            context = self._context(tx, round)
            checked = arguments.check(tool, given)
            request = ledger.Request.of(self.key, tenant=round.tenant, owner=round.owner, bot_id=round.bot_id,
                                        tool=tool, arguments=checked)  # fmt: skip
            stored = ledger.replay(tx, request, context.now_ms)
            if stored is not None:
                return stored, REPLAYED, None
            applied = write(context, checked)
            text = compact_json(applied.result)
            ledger.keep(tx, request, text, context.now_ms)
            call = round.call(tool)
            main = applied.event
            record_call(
                tx, self.key, call, event_type=main.type, now_ms=context.now_ms, ids=main.ids(),
                from_state=main.from_state, to_state=main.to_state, arguments=checked, result=text,
                revision_after=main.revision_after, reason_code=main.reason_code, subject=main.subject,
            )  # fmt: skip
            for more in applied.more:
                record_more(tx, call, more, context.now_ms)
        return text, APPLIED, applied.goal_id

    def _context(self, tx: Tx, round: Round) -> Context:
        checked = rounds.check(tx, round, self.access.allowed)
        return Context(tx, round, checked.owner, checked.bot, self.clock.now_ms(), self.access)
