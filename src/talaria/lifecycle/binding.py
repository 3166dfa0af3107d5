"""The ten-field binding tuple and its verification (lifecycle.md 2 and 6.3)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from talaria.errors import TalariaError
from talaria.limits import MAX_BINDING_FIELD_CHARS

FIELDS = ("tenant", "task", "trace", "principal", "provenance", "run", "dispatch", "job", "cell", "profile")


@dataclass(frozen=True)
class Binding:
    tenant: str
    task: str
    trace: str
    principal: str
    provenance: str
    run: str
    dispatch: str
    job: str
    cell: str
    profile: str

    @classmethod
    def parse(cls, value: Any) -> Binding:
        """Exactly the ten fields, each a string of 1-256 characters; else 400 invalid_request."""
        if not isinstance(value, Mapping):
            raise TalariaError("invalid_request", "binding must be an object of the ten binding fields")
        missing = [f for f in FIELDS if f not in value]
        extra = sorted(set(value) - set(FIELDS))
        if missing:
            raise TalariaError("invalid_request", f"binding.{missing[0]} is missing")
        if extra:
            raise TalariaError("invalid_request", f"binding.{extra[0]} is not a binding field")
        for name in FIELDS:
            item = value[name]
            if not isinstance(item, str) or not 1 <= len(item) <= MAX_BINDING_FIELD_CHARS:
                raise TalariaError("invalid_request", f"binding.{name} must be a string of 1-256 characters")
        return cls(**{name: value[name] for name in FIELDS})

    def as_dict(self) -> dict[str, str]:
        # written out: dataclasses.asdict deep-copies and was a quarter of the engine's CPU time
        return {
            "tenant": self.tenant,
            "task": self.task,
            "trace": self.trace,
            "principal": self.principal,
            "provenance": self.provenance,
            "run": self.run,
            "dispatch": self.dispatch,
            "job": self.job,
            "cell": self.cell,
            "profile": self.profile,
        }


def persisted_binding(dispatch: Mapping[str, Any], principal: str) -> Binding:
    """The binding a worker presents for a dispatched job, with ``principal`` filled in."""
    return Binding(
        tenant=dispatch["tenant"],
        task=dispatch["task_id"],
        trace=dispatch["trace"],
        principal=principal,
        provenance=dispatch["provenance"],
        run=dispatch["run_id"],
        dispatch=dispatch["id"],
        job=dispatch["job_id"],
        cell=dispatch["cell"],
        profile=dispatch["profile"],
    )


def check_identity(binding: Binding, *, tenant: str, principal: str, path_job: str | None) -> None:
    """Step 1: tenant and principal against the caller (403), job against the path (409)."""
    if binding.tenant != tenant:
        raise TalariaError("binding_mismatch", "binding.tenant differs from the caller's tenant", status=403)
    if binding.principal != principal:
        raise TalariaError("binding_mismatch", "binding.principal differs from the caller's principal", status=403)
    if path_job is not None and binding.job != path_job:
        raise TalariaError("binding_mismatch", "binding.job differs from the job in the path", status=409)


def check_dispatch(binding: Binding, dispatch: Mapping[str, Any]) -> None:
    """Step 3: against the persisted Dispatch."""
    pairs = {
        "dispatch": dispatch["id"],
        "task": dispatch["task_id"],
        "run": dispatch["run_id"],
        "trace": dispatch["trace"],
        "provenance": dispatch["provenance"],
        "cell": dispatch["cell"],
        "profile": dispatch["profile"],
        "tenant": dispatch["tenant"],
    }
    _compare(binding, pairs, "dispatch")


def check_job(binding: Binding, job: Mapping[str, Any]) -> None:
    """Step 4: against the job row."""
    pairs = {
        "job": job["id"],
        "dispatch": job["dispatch_id"],
        "task": job["task_id"],
        "cell": job["cell"],
        "profile": job["profile"],
    }
    _compare(binding, pairs, "job")


def _compare(binding: Binding, pairs: Mapping[str, Any], against: str) -> None:
    presented = binding.as_dict()
    for name, stored in pairs.items():
        if presented[name] != stored:
            raise TalariaError("binding_mismatch", f"binding.{name} does not match the {against}", status=409)
