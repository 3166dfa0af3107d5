"""One-line and multi-line text fields (web-api.md 9, issue 12 item 3)."""

from __future__ import annotations

import pytest

from talaria.text_rules import TextRefused, multi_line, one_line


def test_one_line_fields_are_trimmed_and_refuse_blanks_controls_and_bidi() -> None:
    assert one_line("title", "  Release notes \t") == "Release notes"
    assert one_line("title", "ümlaut · ok — 東京") == "ümlaut · ok — 東京"
    assert one_line("title", "\n padded \n") == "padded"  # trimmed first: only what is inside counts
    for bad in ("", "   ", "\t\n", "a\u0000b", "a\nb", "a\tb", "a\x7fb", "a\x85b", "\u202etxt.exe", "a\u2066b",
                "a\u202ab", "a\u2069b"):  # fmt: skip
        with pytest.raises(TextRefused) as refused:
            one_line("title", bad)
        assert str(refused.value).startswith("title must not"), bad
        assert bad.strip() == "" or bad not in str(refused.value)


def test_multi_line_fields_allow_newlines_and_tabs_only() -> None:
    assert multi_line("prompt", "line one\n\tline two\n") == "line one\n\tline two\n"
    for bad in ("", " \n\t ", "a\rb", "a\u0000b", "a\x1bb", "\u202eevil", "a\u2068b"):
        with pytest.raises(TextRefused):
            multi_line("prompt", bad)


def test_the_edges_of_the_bidi_ranges() -> None:
    for ch in ("\u2029", "\u202f", "\u2065", "\u206a"):  # just outside U+202A-202E and U+2066-2069
        assert one_line("name", f"a{ch}b") == f"a{ch}b"
