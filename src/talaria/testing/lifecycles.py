"""Job lifecycles driven through the engine in process, as the benchmarks and the load tests run them: tasks
created and approved, then dispatch, claim, start, one heartbeat and complete with reconcile (five write
transactions, every step with audit, evidence and an idempotency key as the Runtime API would store it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from talaria.canonical import digest, sha256_hex
from talaria.ids import trace_id
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.answers import Beat, Claimed, Ended, Reply, Started
from talaria.lifecycle.context import IdemRequest
from talaria.lifecycle.engine import Engine

TENANT = "default"
AUTHOR = Actor("acct:default/alice", frozenset(), "web", TENANT)
ADMIN = Actor("acct:default/bob", frozenset({"platform_admin"}), "web", TENANT)
WORKER = Actor("worker-1", frozenset({"runtime"}), "in_process", TENANT)
WORKER_INSTANCE = "w1"
CELL, PROFILE = "local", "default"


class LifecycleFailure(Exception):
    """A step did not answer as a lifecycle must (not a slow figure)."""


def idem(key: str, body: dict[str, Any]) -> IdemRequest:
    """What the Runtime API derives from a request: the key's SHA-256 and the parsed body's digest."""
    return IdemRequest(sha256_hex(key), digest(body))


A = TypeVar("A", Claimed, Started, Beat, Ended)


def expect(reply: Reply[A], state: str, what: str) -> A:
    if reply.replayed or reply.answer.state != state:
        raise LifecycleFailure(f"{what}: expected a fresh answer in {state}, got {reply}")
    return reply.answer


def prepare_tasks(eng: Engine, count: int, progress: Callable[[int], None] | None = None) -> list[str]:
    """Create, submit and approve ``count`` tasks (untimed); returns their ids. ``progress`` hears each count."""
    ids: list[str] = []
    for i in range(count):
        task = eng.create_task(
            AUTHOR,
            tenant=TENANT,
            title=f"bench task {i}",
            spec={"prompt": "hi"},
            cell=CELL,
            profile=PROFILE,
            trace=trace_id(),
        )
        eng.submit_task(AUTHOR, tenant=TENANT, task_id=task.id)
        eng.approve_task(ADMIN, tenant=TENANT, task_id=task.id)
        ids.append(task.id)
        if progress is not None:
            progress(i + 1)
    return ids


def lifecycle(eng: Engine, task_id: str) -> None:
    """One job from enqueue to SUCCEEDED: dispatch, claim, start, heartbeat, complete (5 write tx)."""
    _task, dispatch, job = eng.dispatch(ADMIN, tenant=TENANT, task_id=task_id)
    job_id = job.id
    binding = dispatch.binding(WORKER.principal)
    bound = binding.as_dict()

    body: dict[str, Any] = {"binding": bound, "worker_instance": WORKER_INSTANCE}
    claimed = eng.claim(
        WORKER,
        job_id=job_id,
        binding=binding,
        worker_instance=WORKER_INSTANCE,
        idem=idem(f"bench:{job_id}:claim", body),
    )
    lease = expect(claimed, "LEASED", "claim").lease.ref
    held = {"binding": bound, "lease_id": lease.lease_id, "lease_epoch": lease.lease_epoch}

    started = eng.start(
        WORKER,
        job_id=job_id,
        binding=binding,
        lease=lease,
        idem=idem(f"bench:{job_id}:start", held),
    )
    expect(started, "RUNNING", "start")

    progress = {"step": 1}
    beat = eng.heartbeat(
        WORKER,
        job_id=job_id,
        binding=binding,
        lease=lease,
        progress=progress,
        idem=idem(f"bench:{job_id}:heartbeat", held | {"progress": progress}),
    )
    expect(beat, "RUNNING", "heartbeat")

    result = {"outputs": {}, "artifacts": [], "summary": "ok"}
    done = eng.complete(
        WORKER,
        job_id=job_id,
        binding=binding,
        lease=lease,
        result=result,
        idem=idem(f"bench:{job_id}:complete", held | {"result": result}),
    )
    if expect(done, "SUCCEEDED", "complete").wire()["task_state"] != "SUCCEEDED":
        raise LifecycleFailure(f"complete: the task of {job_id} was not reconciled to SUCCEEDED")
