"""A chat turn's prompt text (chat.md 5.4): instructions block, carry-over notice and bounded transcript."""

from __future__ import annotations

from talaria.chat import prompt as prompts
from talaria.chat.prompt import Earlier, prompt_text, transcript
from talaria.chat.turns import auto_title


def test_a_new_session_starts_with_the_instructions_block_and_a_resumed_one_has_none() -> None:
    fresh = prompt_text(text="hi", instructions="Answer briefly.", new_session=True, carry=prompts.NONE)
    assert fresh.split("\n") == ["[talaria-bot-instructions]", "Answer briefly.", "[/talaria-bot-instructions]", "hi"]
    assert prompt_text(text="hi", instructions="Answer briefly.", new_session=False, carry=prompts.NONE) == "hi"
    assert prompt_text(text="hi", instructions="", new_session=True, carry=prompts.NONE) == "hi"


def test_the_instructions_come_before_the_carry_over_notice() -> None:
    text = prompt_text(text="next", instructions="Be kind.", new_session=True, carry=prompts.SESSION_REPLACED,
                       earlier=[Earlier("assistant", "old reply"), Earlier("user", "old question")])  # fmt: skip
    lines = text.split("\n")
    assert lines[:3] == ["[talaria-bot-instructions]", "Be kind.", "[/talaria-bot-instructions]"]
    assert lines[3].startswith("[talaria-notice:session-replaced] ")
    assert lines[4:] == ["[talaria-transcript]", "User: old question", "", "Assistant: old reply",
                         "[/talaria-transcript]", "next"]  # fmt: skip


def test_the_transcript_keeps_at_most_50_messages_and_30000_characters_newest_first() -> None:
    many = [Earlier("user", f"m{i}") for i in range(60)]  # newest first
    kept = transcript(many, node_changed=False)
    assert len(kept) == 50 and kept[0] == "User: m49" and kept[-1] == "User: m0"
    big = [Earlier("user", "a" * 20_000), Earlier("user", "b" * 20_000), Earlier("user", "c")]
    assert transcript(big, node_changed=False) == ["User: " + "a" * 20_000]  # the next would break 30,000


def test_a_message_over_24000_characters_is_carried_as_its_ends() -> None:
    long = "x" * 12_000 + "y" * 6_000 + "z" * 12_000
    (entry,) = transcript([Earlier("user", long)], node_changed=False)
    assert entry == "User: " + "x" * 12_000 + "\n[… 6000 characters cut …]\n" + "z" * 12_000
    exact = "q" * 24_000
    assert transcript([Earlier("user", exact)], node_changed=False) == ["User: " + exact]


def test_attachments_are_named_absent_after_a_node_switch_and_by_path_otherwise() -> None:
    earlier = [Earlier("user", "see file", attachments=[("notes.txt", "/srv/in/notes.txt")])]
    moved = transcript(earlier, node_changed=True)
    assert moved == ['User: see file\n(attachment "notes.txt" was on the previous node and is not here)']
    stayed = transcript(earlier, node_changed=False)
    assert stayed == ['User: see file\n(attachment "notes.txt" was at /srv/in/notes.txt on this node; check that it '
                      'is still there)']  # fmt: skip


def test_an_untitled_conversation_takes_its_first_non_blank_line_cut_at_80_characters() -> None:
    assert auto_title("\n  \n  Plan the trip  \nmore") == "Plan the trip"
    assert auto_title("a" * 80) == "a" * 80
    assert auto_title("a" * 81) == "a" * 80 + "…"
