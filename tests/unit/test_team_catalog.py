"""The round's catalog (team-tools.md 6.1, 6.3): 6.3's tools in its order, ``id`` = ``name``, descriptions a
scripted model can select by ``<name>:`` (none says ``talaria_``), strict schemas, and a handler for every tool."""

from __future__ import annotations

import pytest

from talaria.teams import catalog
from talaria.teams.calls import Handlers, TeamToolCalls

SPEC_ORDER = [
    "talaria_whoami", "talaria_list_bots", "talaria_create_bot", "talaria_update_bot", "talaria_archive_bot",
    "talaria_list_teams", "talaria_create_team", "talaria_update_team", "talaria_start_goal", "talaria_get_goal",
    "talaria_update_goal_criteria", "talaria_assign", "talaria_review_assignment", "talaria_cancel_assignment",
    "talaria_finish_goal", "talaria_resume_goal",
]  # fmt: skip


def test_the_catalog_is_the_spec_s_tools_in_its_order() -> None:
    entries = catalog.catalog()
    assert [e["name"] for e in entries] == SPEC_ORDER
    assert all(set(e) == {"id", "name", "description", "inputSchema"} and e["id"] == e["name"] for e in entries)


def test_no_description_names_a_tool_so_a_model_can_select_by_name_and_colon() -> None:
    for entry in catalog.catalog():
        assert entry["description"] and "talaria_" not in entry["description"], entry["name"]
    described = {e["name"]: e["description"] for e in catalog.catalog()}
    assert "starts no work" in described["talaria_create_team"]
    assert "explicitly asks for a delivery" in described["talaria_start_goal"]
    assert "reuse its requestId" in described["talaria_assign"]
    assert "acceptanceRevision" in described["talaria_finish_goal"]


def test_every_schema_but_whoami_s_is_closed() -> None:
    for entry in catalog.catalog():
        schema = entry["inputSchema"]
        closed = entry["name"] != "talaria_whoami"
        assert schema["additionalProperties"] is (not closed), entry["name"]


def test_a_tool_without_a_handler_stops_the_frame_from_being_built() -> None:
    broken = Handlers(reads=catalog.HANDLERS.reads, writes={k: v for k, v in catalog.HANDLERS.writes.items()
                                                            if k != "talaria_assign"})  # fmt: skip
    with pytest.raises(ValueError, match="talaria_assign"):
        TeamToolCalls(None, None, None, None, broken)  # type: ignore[arg-type]
