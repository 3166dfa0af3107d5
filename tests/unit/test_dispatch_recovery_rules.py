"""The history rule of hermes.md 11: a run finished if and only if an assistant ``stop`` row follows its marked
user row before the next user row."""

from __future__ import annotations

from talaria.hub.dispatch.turn_recovery import reply_after_marker

M1, M2 = "[talaria-run:r:job-1]", "[talaria-run:r:job-2]"


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str, finish: str | None = "stop") -> dict[str, object]:
    return {"role": "assistant", "content": text, "finish_reason": finish}


def test_the_stop_row_after_the_marked_user_row_is_the_reply() -> None:
    rows = [user("earlier"), assistant("old"), user(f"{M1} do it"), assistant("", "tool_calls"),
            {"role": "tool", "content": "{}"}, assistant("done")]  # fmt: skip
    assert reply_after_marker(rows, M1) == "done"


def test_an_interrupted_or_lost_run_has_no_reply_even_if_a_later_run_answered() -> None:
    rows = [user(f"{M1} first"), user(f"{M2} second"), assistant("answer to the second")]
    assert reply_after_marker(rows, M1) is None
    assert reply_after_marker(rows, M2) == "answer to the second"


def test_a_run_still_without_a_stop_row_or_an_absent_marker_has_no_reply() -> None:
    assert reply_after_marker([user(f"{M1} go"), assistant("", "tool_calls")], M1) is None
    assert reply_after_marker([user("no marker here"), assistant("x")], M1) is None
    assert reply_after_marker([], M1) is None


def test_content_parts_are_read_as_text() -> None:
    rows = [{"role": "user", "content": [{"type": "text", "text": f"{M1} parts"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
             "finish_reason": "stop"}]  # fmt: skip
    assert reply_after_marker(rows, M1) == "ab"
