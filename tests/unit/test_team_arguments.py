"""Team tools' arguments (team-tools.md 6.1-6.3): the published schemas and the hub's own check agree at every
edge the schemas state, and bad arguments are 400 invalid_request naming the first key at fault."""

from __future__ import annotations

from typing import Any

import pytest

from talaria.errors import TalariaError
from talaria.teams.arguments import TOOLS, WHOAMI, check, free_text

CATALOG = [name for name in TOOLS if name != WHOAMI]
READ_ONLY = {"talaria_whoami", "talaria_list_bots", "talaria_list_teams", "talaria_get_goal"}


def good_value(schema: dict[str, Any]) -> Any:
    """A smallest valid value for ``schema``."""
    if schema.get("const") is True:
        return True
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema["type"]
    if kind == "string":
        return "a" * max(1, schema.get("minLength", 1))
    if kind == "integer":
        return schema.get("minimum", 0)
    if kind == "boolean":
        return True
    if kind == "array":
        item = schema["items"]
        return [distinct(good_value(item), i) for i in range(schema.get("minItems", 0))]
    if kind == "object":
        return {key: good_value(sub) for key, sub in schema["properties"].items()}
    raise AssertionError(kind)


def distinct(value: Any, index: int) -> Any:
    return f"{value}{index}" if isinstance(value, str) else value


def good_arguments(tool: str) -> dict[str, Any]:
    schema = TOOLS[tool].input_schema()
    arguments = {key: good_value(schema["properties"][key]) for key in schema["required"]}
    if schema.get("minProperties", 0) > len(arguments):
        optional = next(k for k in schema["properties"] if k not in arguments)
        arguments[optional] = good_value(schema["properties"][optional])
    return arguments


def refused(tool: str, arguments: Any) -> str:
    with pytest.raises(TalariaError) as error:
        check(tool, arguments)
    assert error.value.code == "invalid_request" and error.value.status == 400
    return error.value.message


@pytest.mark.parametrize("tool", CATALOG)
def test_every_schema_is_closed_and_mutating_tools_require_a_request_id(tool: str) -> None:
    schema = TOOLS[tool].input_schema()
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert set(schema["required"]) <= set(schema["properties"])
    assert ("requestId" in schema["required"]) is (tool not in READ_ONLY)
    assert check(tool, good_arguments(tool)) == good_arguments(tool)


def test_whoami_keeps_its_open_schema_and_ignores_what_it_is_given() -> None:
    assert TOOLS[WHOAMI].input_schema() == {"type": "object", "properties": {}, "additionalProperties": True}
    assert check(WHOAMI, {"owner": "mallory", "botId": "bot_x"}) == {}


@pytest.mark.parametrize("tool", CATALOG)
@pytest.mark.parametrize("forged", ["owner", "tenant", "botIdentity", "teamPermission", "token", "conversationId",
                                    "turnId"])  # fmt: skip
def test_a_forged_or_unknown_key_is_refused_by_name(tool: str, forged: str) -> None:
    if forged in TOOLS[tool].fields:
        return
    message = refused(tool, {forged: "x", **good_arguments(tool)})
    assert message.startswith(f"{forged}:")


@pytest.mark.parametrize("tool", CATALOG)
def test_each_missing_required_key_is_named(tool: str) -> None:
    for key in TOOLS[tool].required:
        arguments = good_arguments(tool)
        del arguments[key]
        assert refused(tool, arguments) == f"{key}: required"


def edges(schema: dict[str, Any]) -> list[tuple[Any, bool]]:
    """Values at the edges ``schema`` states, each with whether it must pass."""
    found: list[tuple[Any, bool]] = []
    if schema.get("type") == "string" and "maxLength" in schema:
        top = schema["maxLength"]
        char = "a"
        found += [(char * top, True), (char * (top + 1), False)]
        low = schema.get("minLength", 1 if "pattern" in schema else 0)
        if low >= 1:
            found.append(("", False))
    if schema.get("type") == "array":
        item = good_value(schema["items"])
        top = schema["maxItems"]
        found += [([distinct(item, i) for i in range(top)], True), ([distinct(item, i) for i in range(top + 1)], False)]
        if schema.get("minItems", 0) >= 1:
            found.append(([], False))
        if schema.get("uniqueItems"):
            found.append(([item, item], False))
    if schema.get("type") == "integer":
        found += [(schema["minimum"], True), (schema["minimum"] - 1, False), (True, False), ("1", False)]
        if "maximum" in schema:
            found += [(schema["maximum"], True), (schema["maximum"] + 1, False)]
    if schema.get("type") == "string":
        found += [(7, False), (None, False), (["a"], False)]
    return found


@pytest.mark.parametrize("tool", CATALOG)
def test_the_check_holds_every_edge_its_schema_states(tool: str) -> None:
    schema = TOOLS[tool].input_schema()
    for key, sub in schema["properties"].items():
        for value, passes in edges(sub):
            arguments = {**good_arguments(tool), key: value}
            if passes:
                assert check(tool, arguments)[key] == value, (key, len(value) if isinstance(value, str) else value)
            else:
                assert refused(tool, arguments).startswith(f"{key}:"), (key, value)


def test_the_first_key_at_fault_is_named_in_the_order_sent() -> None:
    arguments = {"requestId": "R1", "teamPermission": True, "name": "x" * 500}
    assert refused("talaria_create_bot", arguments).startswith("teamPermission:")
    arguments = {"requestId": "R1", "name": "x" * 500, "teamPermission": True}
    assert refused("talaria_create_bot", arguments).startswith("name:")
    assert refused("talaria_create_bot", {"name": "Writer"}) == "requestId: required"


def test_one_line_texts_are_trimmed_and_refuse_controls_and_blank() -> None:
    assert check("talaria_create_bot", {"requestId": "R1", "name": "  Writer  "})["name"] == "Writer"
    assert refused("talaria_create_bot", {"requestId": "R1", "name": "   "}) == "name: must not be blank"
    assert refused("talaria_create_bot", {"requestId": "R1", "name": "Wri\nter"}).startswith("name: must not contain")
    assert refused("talaria_create_bot", {"requestId": "R1", "name": "a\u202eb"}).startswith("name: must not contain")
    brief = check("talaria_assign", {"requestId": "R1", "goalId": "g", "botId": "b", "title": "t",
                                     "brief": "line one\n\tline two"})["brief"]  # fmt: skip
    assert brief == "line one\n\tline two"


def test_ids_take_only_their_characters() -> None:
    assert check("talaria_get_goal", {"goalId": "gol_01J:a.b-c_d"})["goalId"] == "gol_01J:a.b-c_d"
    for bad in ("", "a b", "a/b", "é", "x" * 129):
        assert refused("talaria_get_goal", {"goalId": bad}).startswith("goalId:")
    assert check("talaria_get_goal", {"goalId": "x" * 128})


def test_update_tools_need_one_change_and_archived_is_only_true() -> None:
    assert refused("talaria_update_bot", {"requestId": "R1", "botId": "b"}).startswith("name: give at least one of")
    assert refused("talaria_update_team", {"requestId": "R1", "teamId": "t"}).startswith("name: give at least one of")
    assert refused("talaria_update_team", {"requestId": "R1", "teamId": "t", "archived": False}).startswith(
        "archived:")  # fmt: skip
    assert check("talaria_update_team", {"requestId": "R1", "teamId": "t", "archived": True})["archived"] is True


def test_checks_are_strict_objects() -> None:
    base = {"requestId": "R6", "goalId": "g", "status": "complete", "result": "done", "acceptanceRevision": 1}
    good = {"criterion": 0, "passed": True, "evidence": "seen"}
    assert check("talaria_finish_goal", {**base, "checks": [good]})["checks"] == [good]
    for bad in ({"criterion": 0, "passed": True}, {**good, "extra": 1}, {**good, "criterion": 12},
                {**good, "passed": "yes"}, {**good, "evidence": ""}, "x"):  # fmt: skip
        assert refused("talaria_finish_goal", {**base, "checks": [bad]}).startswith("checks:")
    assert refused("talaria_finish_goal", {**base, "status": "done"}).startswith("status:")


def test_arguments_that_are_not_an_object_and_unknown_tools() -> None:
    assert refused("talaria_get_goal", ["goalId"]) == "the arguments must be an object"
    with pytest.raises(TalariaError) as error:
        check("talaria_drop_tables", {})
    assert error.value.code == "not_found"


def test_free_text_is_every_person_s_or_model_s_words_and_no_id() -> None:
    arguments = {"requestId": "R1", "name": "Writer", "source": "local", "profile": "work", "instructions": "Be brief."}
    assert free_text("talaria_create_bot", arguments) == {"name": "Writer", "instructions": "Be brief."}
    finish = {"requestId": "R6", "goalId": "g", "status": "complete", "result": "done", "acceptanceRevision": 1,
              "checks": [{"criterion": 0, "passed": True, "evidence": "seen"}]}  # fmt: skip
    assert set(free_text("talaria_finish_goal", finish)) == {"result", "checks"}
    texts = {key for tool in TOOLS.values() for key, kind in tool.fields.items() if kind.free_text}
    assert texts == {"name", "instructions", "confirmName", "title", "objective", "acceptanceCriteria", "brief",
                     "note", "reason", "result", "checks"}  # fmt: skip
