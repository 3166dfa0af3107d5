"""Answers to a running turn's approvals and questions (chat.md 3.5), relayed through the turn's own channel.

Checks, in order: the conversation, turn and approval are the owner's (404); the body fits the kind (400); the
approval is ``pending`` (else 409 ``approval_expired``); it is the turn's oldest pending one (409
``approval_out_of_order``); the turn is ``running`` on an open channel, and Hermes still waits: ``approval.respond``
resolved one, ``clarify.respond`` was taken (else 409 ``approval_expired``, and the approval becomes ``expired``).
Then the resolution is stored with its system message and ``chat.approval.answered``, and ``approval.resolved``
and the message's ``message.complete`` are emitted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from talaria.accounts.service import Account
from talaria.chat import approvals
from talaria.chat.bots import owner_actor
from talaria.chat.records import Approval, approval_json, message_json
from talaria.chat.turn_writes import expire
from talaria.errors import TalariaError
from talaria.hub.runners.connection_state import Gateway
from talaria.hub.turns.chat_context import ChatContext
from talaria.store.interface import Tx

log = structlog.get_logger("talaria.chat")


class AnswerEntries(ChatContext):
    async def answer(self, account: Account, conversation_id: str, turn_id: str, body: dict[str, Any]) -> Approval:
        """Relay the owner's answer; raises the codes above."""
        approval, value = await asyncio.to_thread(self._checked, account, conversation_id, turn_id, body)
        stream = self.streams.get(turn_id)
        result = stream.result if stream is not None else None
        gateway = result.gateway if result is not None else None
        if result is None or gateway is None or not gateway.open:
            await asyncio.to_thread(self._expired, approval)
            raise TalariaError("approval_expired", "the turn no longer waits for this answer")
        # the turn's channel stays open until this answer has its reply (TurnStream.settle_answers)
        relay = asyncio.ensure_future(self._relay(gateway, result.runtime_id, approval, value))
        assert stream is not None
        stream.answers.add(relay)
        relay.add_done_callback(stream.answers.discard)
        if not await relay:
            await asyncio.to_thread(self._expired, approval)
            raise TalariaError("approval_expired", "Hermes no longer waits for this answer")
        return await asyncio.to_thread(self._resolved, account, approval, value)

    async def _relay(self, gateway: Gateway, runtime_id: str, approval: Approval, value: str) -> bool:
        """Whether Hermes took the answer."""
        try:
            if approval.kind == "approval":
                params: dict[str, Any] = {"session_id": runtime_id, "choice": value}
                done = await self.driver.channels.rpc(gateway, "approval.respond", params)
                return int(done.get("resolved", 0) or 0) > 0
            params = {"session_id": runtime_id, "request_id": approval.hermes_request_id, "answer": value}
            await self.driver.channels.rpc(gateway, "clarify.respond", params)
            return True
        except TalariaError as exc:
            log.info("chat_answer_refused", turn=approval.turn_id, code=exc.code)
            return False

    def _checked(
        self, account: Account, conversation_id: str, turn_id: str, body: dict[str, Any]
    ) -> tuple[Approval, str]:
        with self.store.read() as tx:
            conversation = tx.one("chat_conversation_get", tenant=account.tenant, owner=account.username,
                                  id=conversation_id)  # fmt: skip
            turn = tx.one("chat_turn_get", tenant=account.tenant, owner=account.username,
                          conversation_id=conversation_id, id=turn_id)  # fmt: skip
            if conversation is None or turn is None:
                raise TalariaError("not_found", "no such turn")
            approval_id = body.get("approvalId")
            if not isinstance(approval_id, str):
                raise TalariaError("invalid_request", "approvalId: the approval's id")
            approval = approvals.get(tx, turn_id, approval_id)
            _, value = approvals.check_answer(approval, body)
            if approval.state != "pending":
                raise TalariaError("approval_expired", "this approval is no longer pending")
            oldest = approvals.pending(tx, turn_id)
            if oldest and oldest[0].id != approval.id:
                raise TalariaError("approval_out_of_order", "answer the turn's oldest pending approval first")
            running = turn["state"] == "running"
        if not running:
            self._expired(approval)
            raise TalariaError("approval_expired", "the turn is not running")
        return approval, value

    def _expired(self, approval: Approval) -> None:
        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            current = approvals.get(tx, approval.turn_id, approval.id)
            if current.state != "pending":
                return []
            gone = expire(tx, current, self.clock.now_ms())
            return [("approval.resolved", {"turnId": approval.turn_id, "approval": approval_json(gone)})]

        self._write(approval.conversation_id, write)

    def _resolved(self, account: Account, approval: Approval, value: str) -> Approval:
        out: list[Approval] = []

        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            done, message = approvals.resolve(tx, approval, value, tenant=account.tenant, actor=owner_actor(account),
                                              key=self.key, now_ms=self.clock.now_ms())  # fmt: skip
            out.append(done)
            return [
                ("approval.resolved", {"turnId": approval.turn_id, "approval": approval_json(done)}),
                ("message.complete", {"turnId": approval.turn_id, "message": message_json(message)}),
            ]

        self._write(approval.conversation_id, write)
        return out[-1]  # the committed try's
