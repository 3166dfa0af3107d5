"""The ten-field binding tuple and its verification (lifecycle.md 2 and 6.3)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from talaria.errors import TalariaError
from talaria.limits import MAX_BINDING_FIELD_CHARS


class DispatchFields(Protocol):
    """The persisted half of a binding, as ``records.Dispatch`` holds it."""

    @property
    def id(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def trace(self) -> str: ...
    @property
    def provenance(self) -> str: ...
    @property
    def cell(self) -> str: ...
    @property
    def profile(self) -> str: ...


class JobFields(Protocol):
    """The binding fields copied onto the job row (``records.Job``)."""

    @property
    def id(self) -> str: ...
    @property
    def dispatch_id(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def cell(self) -> str: ...
    @property
    def profile(self) -> str: ...


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


def check_identity(binding: Binding, *, tenant: str, principal: str, path_job: str | None) -> None:
    """Step 1: tenant and principal against the caller (403), job against the path (409)."""
    if binding.tenant != tenant:
        raise TalariaError("binding_mismatch", "binding.tenant differs from the caller's tenant", status=403)
    if binding.principal != principal:
        raise TalariaError("binding_mismatch", "binding.principal differs from the caller's principal", status=403)
    if path_job is not None and binding.job != path_job:
        raise TalariaError("binding_mismatch", "binding.job differs from the job in the path", status=409)


def check_dispatch(binding: Binding, dispatch: DispatchFields) -> None:
    """Step 3: against the persisted Dispatch (tested in the order of lifecycle.md 6.3)."""
    for name, presented, stored in (
        ("dispatch", binding.dispatch, dispatch.id),
        ("task", binding.task, dispatch.task_id),
        ("run", binding.run, dispatch.run_id),
        ("trace", binding.trace, dispatch.trace),
        ("provenance", binding.provenance, dispatch.provenance),
        ("cell", binding.cell, dispatch.cell),
        ("profile", binding.profile, dispatch.profile),
        ("tenant", binding.tenant, dispatch.tenant),
    ):
        if presented != stored:
            raise TalariaError("binding_mismatch", f"binding.{name} does not match the dispatch", status=409)


def check_job(binding: Binding, job: JobFields) -> None:
    """Step 4: against the job row."""
    for name, presented, stored in (
        ("job", binding.job, job.id),
        ("dispatch", binding.dispatch, job.dispatch_id),
        ("task", binding.task, job.task_id),
        ("cell", binding.cell, job.cell),
        ("profile", binding.profile, job.profile),
    ):
        if presented != stored:
            raise TalariaError("binding_mismatch", f"binding.{name} does not match the job", status=409)
