"""Issue 17, part 2: hypothesis fuzzers over two parsers of untrusted input, with bounded example counts.

- ``runner.json`` (``talaria.runner.config``): any file content and any decoded object, a valid config with fields
  replaced by arbitrary JSON values, added or removed, either parses or raises ``ConfigError`` (the CLI's exit
  status 2), never another exception; a refusal never repeats the token or the Hermes password it was given.
- the chat stream's resume point (``Last-Event-ID`` and ``after``, chat.md 4.1): any header text is a resume point
  >= 0 or 400 ``invalid_request``; a decimal resumes exactly there (capped), whichever of the two was sent.
- the names people type (usernames, tenants, sources, profiles): a trailing line break is refused.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from talaria.accounts.rules import check_allowed_profiles, check_tenant, check_username
from talaria.errors import TalariaError
from talaria.hub.chat.stream_api import resume_point
from talaria.hub.runners.registry import parse_registration
from talaria.runner.config import FIELDS, ConfigError, RunnerConfig, load_config, parse_config

TOKEN = "tok-" + "Z9q" * 12  # what must never be echoed back
PASSWORD = "pw-" + "Kx7" * 10
VALID: dict[str, Any] = {
    "protocol": 1,
    "serverURL": "https://hub.example.com",
    "runnerId": "3f2b1c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d",
    "token": TOKEN,
    "allowedProfiles": ["default"],
    "hermesURL": "http://127.0.0.1:9119",
    "hermesCredentials": {"username": "runner", "password": PASSWORD},
}
EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
field_names = st.sampled_from(sorted(FIELDS)) | st.text(max_size=16)


def _check_refusal(error: ConfigError) -> None:
    text = str(error)
    assert TOKEN not in text and PASSWORD not in text, text
    assert text.strip(), "a refusal says what is wrong"


@EXAMPLES
@given(changes=st.dictionaries(field_names, json_values, max_size=5), removed=st.sets(st.sampled_from(sorted(VALID))))
def test_a_mutated_runner_json_parses_or_is_refused_without_echoing_secrets(
    changes: dict[str, Any], removed: set[str]
) -> None:  # fmt: skip
    candidate = {k: v for k, v in VALID.items() if k not in removed} | changes
    try:
        config = parse_config(candidate)
    except ConfigError as error:
        _check_refusal(error)
    else:
        assert isinstance(config, RunnerConfig)


@EXAMPLES
@given(value=json_values)
def test_any_json_document_parses_or_is_refused(value: Any) -> None:
    try:
        parse_config(value)
    except ConfigError as error:
        _check_refusal(error)


@settings(max_examples=150, deadline=None)
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_file_content_loads_or_is_refused(tmp_path_factory: Any, raw: bytes) -> None:
    path = Path(tmp_path_factory.mktemp("fuzz")) / "runner.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(raw)
    try:
        load_config(path)
    except ConfigError as error:
        _check_refusal(error)


@settings(max_examples=50, deadline=None)
@given(token=st.text(min_size=1, max_size=60))
def test_a_refused_token_is_never_echoed(token: str) -> None:
    candidate = VALID | {"token": token + "\n"}  # a token with a line break is always refused
    try:
        parse_config(candidate)
    except ConfigError as error:
        assert token + "\n" not in str(error)
    else:
        raise AssertionError("a token with a line break was accepted")


DECIMAL = re.compile(r"[0-9]+")
CAP_DIGITS = 30  # a longer decimal resumes at 10**30: after everything there is


@settings(max_examples=500, deadline=None)
@given(header=st.none() | st.text(max_size=40), after=st.none() | st.text(max_size=40))
@example(header=None, after="5\n")  # a trailing line break is not a decimal (a "$" anchor would let it through)
@example(header="7\n", after=None)
@example(header="٣", after=None)  # a non-ASCII digit is not one either
def test_any_resume_point_text_is_a_point_or_invalid_request(header: str | None, after: str | None) -> None:
    valid = [v for v in (header, after) if v is not None]
    try:
        point = resume_point(header, after)
    except TalariaError as error:
        assert error.code == "invalid_request"
        assert any(not DECIMAL.fullmatch(v) for v in valid)
        assert str(error) in ("Last-Event-ID must be a decimal integer >= 0", "after must be a decimal integer >= 0")
        return
    assert all(DECIMAL.fullmatch(v) for v in valid)
    chosen = header if header is not None else after
    if chosen is None:
        assert point is None
    else:
        digits = chosen.lstrip("0") or "0"
        assert point == (int(digits) if len(digits) <= CAP_DIGITS else 10**CAP_DIGITS)


@given(n=st.integers(0, 10**15), zeros=st.integers(0, 5))
def test_a_decimal_resumes_exactly_there_with_or_without_leading_zeros(n: int, zeros: int) -> None:
    text = "0" * zeros + str(n)
    assert resume_point(text, None) == n
    assert resume_point(None, text) == n
    assert resume_point(text, "999") == n  # Last-Event-ID wins over after


def test_an_absurdly_long_decimal_is_capped_not_an_error() -> None:
    assert resume_point("9" * 500, None) == resume_point("9" * 31, None) == 10**CAP_DIGITS


# The fuzzer above found that a "$"-anchored pattern checked with ``.match`` lets a trailing line break through
# (test_static_rules.py now forbids the pattern). These are the names a user or an admin types.
URL = "https://hub.example.com"


def test_a_name_with_a_trailing_line_break_is_refused() -> None:
    with pytest.raises(TalariaError):
        check_username("bob\n")
    with pytest.raises(TalariaError):
        check_tenant("acme\n")
    with pytest.raises(TalariaError):
        check_allowed_profiles({"local\n": ["default"]})
    with pytest.raises(TalariaError):
        check_allowed_profiles({"local": ["default\n"]})
    with pytest.raises(TalariaError):
        parse_registration({"name": "n", "source": "local\n", "allowedProfiles": ["default"]}, default_server_url=URL)
    assert check_username("bob") == "bob"


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=20))
def test_a_username_is_accepted_only_when_it_is_a_username(text: str) -> None:
    try:
        check_username(text)
    except TalariaError:
        assert not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", text) or text in (".", "..")
    else:
        assert re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", text)
