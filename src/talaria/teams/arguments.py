"""Team tools' arguments (team-tools.md 6.1-6.3): one table per tool gives both the ``inputSchema`` the catalog
publishes and the hub's own strict check, so the two cannot drift.

``check(tool, arguments)`` answers the arguments normalised (one-line texts trimmed) or raises 400
``invalid_request`` naming the first key at fault: keys in the order the caller sent them (an unknown key, a wrong
type or bound), then the missing required keys in the schema's order, then an update tool's "at least one". No
argument may name an owner, tenant, caller, conversation or turn: identity comes only from the round.
Error messages name keys and rules, never values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from talaria.accounts.rules import PROFILE, SOURCE
from talaria.errors import TalariaError
from talaria.limits import (
    MAX_BRIEF_CHARS,
    MAX_CRITERIA,
    MAX_CRITERION_CHARS,
    MAX_DEPENDS_ON,
    MAX_GOAL_OBJECTIVE_CHARS,
    MAX_MEMBER_IDS,
    MAX_NOTE_CHARS,
    MAX_REASON_CHARS,
    MAX_TEAM_ID_CHARS,
    MAX_TEAM_INSTRUCTIONS_CHARS,
    MAX_TEAM_NAME_CHARS,
)
from talaria.text_rules import MULTI_LINE_PATTERN, ONE_LINE_PATTERN, TextRefused, multi_line, one_line

ID_PATTERN: Final = rf"^[A-Za-z0-9._:-]{{1,{MAX_TEAM_ID_CHARS}}}$"
_ID = re.compile(ID_PATTERN)


class _Refused(Exception):
    """A value broke its rule; the message names the rule (the key is added by ``check``)."""


@dataclass(frozen=True)
class Kind:
    """A value type of 6.2: its JSON schema and its check (answers the normalised value or raises ``_Refused``)."""

    schema: Mapping[str, Any]
    check: Callable[[Any], Any]
    free_text: bool = False  # a person's or a model's words: only its keyed digest reaches audit and evidence


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise _Refused("must be a string")
    return value


def _ident(value: Any) -> str:
    if not _ID.match(_string(value)):
        raise _Refused(f"must be 1-{MAX_TEAM_ID_CHARS} characters of A-Z, a-z, 0-9, '.', '_', ':', '-'")
    return str(value)


def _one_line(limit: int) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        try:
            trimmed = one_line("it", _string(value))
        except TextRefused as exc:
            raise _Refused(str(exc).removeprefix("it ")) from None
        if len(trimmed) > limit:
            raise _Refused(f"must be at most {limit} characters")
        return trimmed

    return check


def _text(low: int, high: int) -> Callable[[Any], str]:
    """Multi-line text of ``low``-``high`` characters (0 allows empty), kept as written."""

    def check(value: Any) -> str:
        text = _string(value)
        if len(text) > high:
            raise _Refused(f"must be at most {high} characters")
        if low == 0 and not text:
            return text
        try:
            return multi_line("it", text)
        except TextRefused as exc:
            raise _Refused(str(exc).removeprefix("it ")) from None

    return check


def _list_of(item: Callable[[Any], Any], low: int, high: int, *, distinct: bool = False) -> Callable[[Any], list[Any]]:
    def check(value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise _Refused("must be a list")
        if not low <= len(value) <= high:
            raise _Refused(f"must hold {low}-{high} items")
        items = [item(v) for v in value]
        if distinct and len(set(items)) != len(items):
            raise _Refused("must hold distinct items")
        return items

    return check


def _integer(low: int, high: int | None = None) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Refused("must be an integer")
        if value < low or (high is not None and value > high):
            raise _Refused(f"must be {low}-{high}" if high is not None else f"must be at least {low}")
        return value

    return check


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Refused("must be a boolean")
    return value


def _true(value: Any) -> bool:
    if value is not True:
        raise _Refused("must be true")
    return True


def _one_of(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if _string(value) not in choices:
            raise _Refused(f"must be one of {', '.join(choices)}")
        return str(value)

    return check


def _pattern(regex: re.Pattern[str], what: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not regex.fullmatch(_string(value)):
            raise _Refused(f"must be {what}")
        return str(value)

    return check


_CHECK_KEYS: Final = ("criterion", "passed", "evidence")


def _check_item(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Refused("items must be objects")
    for key in value:
        if key not in _CHECK_KEYS:
            raise _Refused(f"items take only {', '.join(_CHECK_KEYS)}")
    for key in _CHECK_KEYS:
        if key not in value:
            raise _Refused(f"items need {key}")
    return {
        "criterion": _integer(0, MAX_CRITERIA - 1)(value["criterion"]),
        "passed": _boolean(value["passed"]),
        "evidence": _text(1, MAX_REASON_CHARS)(value["evidence"]),
    }


def _one_line_schema(limit: int) -> dict[str, Any]:
    return {"type": "string", "pattern": ONE_LINE_PATTERN, "maxLength": limit}


def _text_schema(low: int, high: int) -> dict[str, Any]:
    if low == 0:
        return {"type": "string", "maxLength": high}
    return {"type": "string", "pattern": MULTI_LINE_PATTERN, "minLength": low, "maxLength": high}


_ID_SCHEMA: Final = {"type": "string", "pattern": ID_PATTERN, "minLength": 1, "maxLength": MAX_TEAM_ID_CHARS}


def _criteria(low: int) -> Kind:
    item = _text(1, MAX_CRITERION_CHARS)
    schema = {"type": "array", "minItems": low, "maxItems": MAX_CRITERIA, "items": _text_schema(1, MAX_CRITERION_CHARS)}
    return Kind(schema, _list_of(item, low, MAX_CRITERIA), free_text=True)


def _ids(low: int, high: int) -> Kind:
    return Kind({"type": "array", "minItems": low, "maxItems": high, "uniqueItems": True, "items": _ID_SCHEMA},
                _list_of(_ident, low, high, distinct=True))  # fmt: skip


def _prose(low: int, high: int) -> Kind:
    """Free text of ``low``-``high`` characters."""
    return Kind(_text_schema(low, high), _text(low, high), free_text=True)


ID: Final = Kind(_ID_SCHEMA, _ident)
NAME: Final = Kind(_one_line_schema(MAX_TEAM_NAME_CHARS), _one_line(MAX_TEAM_NAME_CHARS), free_text=True)
INSTRUCTIONS: Final = _prose(0, MAX_TEAM_INSTRUCTIONS_CHARS)
OBJECTIVE: Final = _prose(1, MAX_GOAL_OBJECTIVE_CHARS)
BRIEF: Final = _prose(1, MAX_BRIEF_CHARS)
NOTE: Final = _prose(1, MAX_NOTE_CHARS)
REASON: Final = _prose(1, MAX_REASON_CHARS)
CRITERIA: Final = _criteria(1)
ASSIGNMENT_CRITERIA: Final = _criteria(0)
MEMBER_IDS: Final = _ids(1, MAX_MEMBER_IDS)
DEPENDS_ON: Final = _ids(0, MAX_DEPENDS_ON)
REVISION: Final = Kind({"type": "integer", "minimum": 1}, _integer(1))
ARCHIVED: Final = Kind({"type": "boolean", "const": True}, _true)
SOURCE_NAME: Final = Kind({"type": "string", "pattern": SOURCE.pattern}, _pattern(SOURCE, "a source name"))
PROFILE_NAME: Final = Kind({"type": "string", "pattern": PROFILE.pattern}, _pattern(PROFILE, "a profile name"))
DECISION: Final = Kind({"type": "string", "enum": ["accept", "retry", "block"]}, _one_of("accept", "retry", "block"))
FINISH_STATUS: Final = Kind({"type": "string", "enum": ["complete", "blocked", "waiting"]},
                            _one_of("complete", "blocked", "waiting"))  # fmt: skip
CHECKS: Final = Kind(
    {"type": "array", "maxItems": MAX_CRITERIA, "items": {
        "type": "object", "additionalProperties": False, "required": list(_CHECK_KEYS),
        "properties": {"criterion": {"type": "integer", "minimum": 0, "maximum": MAX_CRITERIA - 1},
                       "passed": {"type": "boolean"}, "evidence": _text_schema(1, MAX_REASON_CHARS)}}},
    _list_of(_check_item, 0, MAX_CRITERIA),
    free_text=True,
)  # fmt: skip


@dataclass(frozen=True)
class Tool:
    """One tool's arguments: ``fields`` in schema order, which are required, and whether at least one of the
    optional ones must be given (the update tools)."""

    name: str
    fields: Mapping[str, Kind]
    required: tuple[str, ...]
    mutating: bool = True
    at_least_one: bool = False
    open_schema: bool = False  # talaria_whoami: any arguments, ignored
    description: str = field(default="", compare=False)

    def input_schema(self) -> dict[str, Any]:
        if self.open_schema:
            return {"type": "object", "properties": {}, "additionalProperties": True}
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {key: dict(kind.schema) for key, kind in self.fields.items()},
            "required": list(self.required),
            "additionalProperties": False,
        }
        if self.at_least_one:
            optional = [key for key in self.fields if key not in self.required]
            schema["minProperties"] = len(self.required) + 1
            schema["description"] = f"give at least one of {', '.join(optional)}"
        return schema


def _tool(tool_name: str, /, *, required: tuple[str, ...] = (), mutating: bool = True, at_least_one: bool = False,
          **fields: Kind) -> Tool:  # fmt: skip
    if mutating:
        fields = {"requestId": ID, **fields}
        required = ("requestId", *required)
    return Tool(tool_name, fields, required, mutating=mutating, at_least_one=at_least_one)


WHOAMI: Final = "talaria_whoami"

TOOLS: Final[Mapping[str, Tool]] = {tool.name: tool for tool in (
    Tool(WHOAMI, {}, (), mutating=False, open_schema=True),
    _tool("talaria_list_bots", mutating=False),
    _tool("talaria_create_bot", required=("name",), name=NAME, source=SOURCE_NAME, profile=PROFILE_NAME,
          instructions=INSTRUCTIONS),
    _tool("talaria_update_bot", required=("botId",), at_least_one=True, botId=ID, name=NAME, instructions=INSTRUCTIONS),
    _tool("talaria_archive_bot", required=("botId", "confirmName"), botId=ID, confirmName=NAME),
    _tool("talaria_list_teams", mutating=False),
    _tool("talaria_create_team", required=("name", "memberIds"), name=NAME, memberIds=MEMBER_IDS,
          instructions=INSTRUCTIONS),
    _tool("talaria_update_team", required=("teamId",), at_least_one=True, teamId=ID, name=NAME,
          instructions=INSTRUCTIONS, memberIds=MEMBER_IDS, archived=ARCHIVED),
    _tool("talaria_start_goal", required=("teamId", "title", "objective"), teamId=ID, title=NAME,
          objective=OBJECTIVE, acceptanceCriteria=CRITERIA),
    _tool("talaria_get_goal", required=("goalId",), mutating=False, goalId=ID),
    _tool("talaria_update_goal_criteria", required=("goalId", "expectedRevision", "acceptanceCriteria"), goalId=ID,
          expectedRevision=REVISION, acceptanceCriteria=CRITERIA),
    _tool("talaria_assign", required=("goalId", "botId", "title", "brief"), goalId=ID, botId=ID, title=NAME,
          brief=BRIEF, acceptanceCriteria=ASSIGNMENT_CRITERIA, dependsOn=DEPENDS_ON),
    _tool("talaria_review_assignment", required=("assignmentId", "decision", "note"), assignmentId=ID,
          decision=DECISION, note=NOTE),
    _tool("talaria_cancel_assignment", required=("assignmentId", "reason"), assignmentId=ID, reason=REASON),
    _tool("talaria_finish_goal", required=("goalId", "status", "result", "acceptanceRevision"), goalId=ID,
          status=FINISH_STATUS, result=BRIEF, acceptanceRevision=REVISION, checks=CHECKS),
    _tool("talaria_resume_goal", required=("goalId",), goalId=ID),
)}  # fmt: skip


def free_text(tool_name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The free-text arguments of a checked call (names, titles, instructions, objective, brief, criteria, result,
    note, reason, checks' evidence), by key: what evidence keeps only as digests (team-tools.md 10)."""
    fields = TOOLS[tool_name].fields
    return {key: value for key, value in arguments.items() if key in fields and fields[key].free_text}


def check(tool_name: str, arguments: Any) -> dict[str, Any]:
    """``arguments`` for ``tool_name`` normalised, or 400 ``invalid_request`` naming the first key at fault
    (module docstring). ``talaria_whoami`` takes anything and answers ``{}``."""
    tool = TOOLS.get(tool_name)
    if tool is None:
        raise TalariaError("not_found", "no such team tool")
    if tool.open_schema:
        return {}
    if not isinstance(arguments, dict):
        raise TalariaError("invalid_request", "the arguments must be an object")
    checked: dict[str, Any] = {}
    for key, value in arguments.items():
        kind = tool.fields.get(key)
        if kind is None:
            raise TalariaError("invalid_request", f"{_shown(key)}: not an argument of {tool.name}")
        try:
            checked[key] = kind.check(value)
        except _Refused as exc:
            raise TalariaError("invalid_request", f"{key}: {exc}") from None
    for key in tool.required:
        if key not in checked:
            raise TalariaError("invalid_request", f"{key}: required")
    if tool.at_least_one and len(checked) == len(tool.required):
        optional = [key for key in tool.fields if key not in tool.required]
        raise TalariaError("invalid_request", f"{optional[0]}: give at least one of {', '.join(optional)}")
    return checked


def _shown(key: str) -> str:
    """An unknown key as it may appear in an error: a key is the model's text, so only a short, plain one."""
    return key if re.fullmatch(r"[A-Za-z0-9_]{1,64}", key) else "an argument"


def check_value(tool_name: str, key: str, value: Any) -> Any:
    """One argument's value as ``tool_name`` checks it (the JSON API's bodies share the tools' rules), or 400
    ``invalid_request`` naming ``key``."""
    try:
        return TOOLS[tool_name].fields[key].check(value)
    except _Refused as exc:
        raise TalariaError("invalid_request", f"{key}: {exc}") from None
