"""Canonical JSON, digests, timestamps, identifiers and the clock (lifecycle.md 1.2, 5)."""

from __future__ import annotations

import hashlib
import random
import re
from datetime import UTC, datetime, timedelta

import pytest

from talaria import ids
from talaria.canonical import canonical_json, digest, sha256_hex
from talaria.clock import ManualClock, SystemClock, rfc3339

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ULID = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")
HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
RFC3339_MS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


# ---------------------------------------------------------------- canonical JSON


def test_keys_sorted_no_spaces() -> None:
    value = {"b": 1, "a": [1, 2, {"z": None, "y": True}], "c": {"k": "v", "j": 1.5}}
    assert canonical_json(value) == b'{"a":[1,2,{"y":true,"z":null}],"b":1,"c":{"j":1.5,"k":"v"}}'


def test_key_order_of_the_input_does_not_matter() -> None:
    assert canonical_json({"x": 1, "y": 2}) == canonical_json({"y": 2, "x": 1})


def test_non_ascii_is_kept_as_utf8() -> None:
    out = canonical_json({"name": "Zoë 東京"})
    assert out == '{"name":"Zoë 東京"}'.encode()
    assert b"\\u" not in out


def test_control_characters_are_escaped() -> None:
    assert canonical_json('a\nb"') == b'"a\\nb\\""'


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused(bad: float) -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": bad})


def test_canonical_json_is_bytes() -> None:
    assert isinstance(canonical_json({}), bytes)
    assert canonical_json({}) == b"{}"


def test_digest_is_sha256_hex_of_canonical_json() -> None:
    value = {"reason": "stop", "n": 2, "é": [1]}
    expected = hashlib.sha256(canonical_json(value)).hexdigest()
    assert digest(value) == expected
    assert HEX64.match(digest(value))
    assert digest({"b": 1, "a": 2}) == digest({"a": 2, "b": 1})
    assert digest({"a": 1}) != digest({"a": "1"})


def test_digest_of_the_cancel_reason_shape() -> None:
    # lifecycle.md 6.4: result_digest of a cancel is the digest of {"reason": reason}
    assert digest({"reason": "x"}) == hashlib.sha256(b'{"reason":"x"}').hexdigest()


def test_sha256_hex_of_text_and_bytes_agree() -> None:
    assert sha256_hex("héllo") == sha256_hex("héllo".encode()) == hashlib.sha256("héllo".encode()).hexdigest()
    assert sha256_hex(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


# ---------------------------------------------------------------- timestamps


def test_rfc3339_examples() -> None:
    assert rfc3339(1_784_628_030_000) == "2026-07-21T10:00:30.000Z"
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1_784_628_030_007) == "2026-07-21T10:00:30.007Z"
    assert rfc3339(1_784_628_030_999) == "2026-07-21T10:00:30.999Z"


def test_rfc3339_matches_exact_arithmetic() -> None:
    rng = random.Random(20260721)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for _ in range(2000):
        ms = rng.randrange(0, 4_102_444_800_000)  # up to 2100
        out = rfc3339(ms)
        assert RFC3339_MS.match(out), out
        moment = epoch + timedelta(milliseconds=ms)
        assert out == moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


# ---------------------------------------------------------------- identifiers


def _decode_time(ulid: str) -> int:
    value = 0
    for char in ulid[:10]:
        value = value * 32 + CROCKFORD.index(char)
    return value


@pytest.mark.parametrize("prefix", ["tsk", "dsp", "run", "job", "evt", "evd"])
def test_minted_ids_are_prefixed_ulids(prefix: str) -> None:
    minted = ids.mint(prefix, 1_784_628_030_000)
    head, sep, tail = minted.partition("_")
    assert (head, sep) == (prefix, "_")
    assert ULID.match(tail), minted
    assert _decode_time(tail) == 1_784_628_030_000
    assert ids.OPAQUE_ID.match(minted)


def test_ulids_carry_their_time_and_sort_by_it() -> None:
    times = [0, 1, 999, 1_000, 1_784_628_030_000, 1_784_628_030_001, 2**48 - 1]
    minted = [ids.ulid(t) for t in times]
    assert all(ULID.match(u) for u in minted)
    assert [_decode_time(u) for u in minted] == times
    assert sorted(minted) == minted
    shuffled = [ids.mint("job", t) for t in reversed(times)]
    assert sorted(shuffled) == list(reversed(shuffled))


def test_ulids_of_the_same_millisecond_differ() -> None:
    now = 1_784_628_030_000
    minted = {ids.ulid(now) for _ in range(200)}
    assert len(minted) == 200
    assert {u[:10] for u in minted} == {ids.ulid(now)[:10]}


def test_lease_ids_are_32_lowercase_hex_and_fresh() -> None:
    leases = [ids.lease_id() for _ in range(200)]
    assert all(HEX32.match(lease) for lease in leases)
    assert len(set(leases)) == 200


def test_trace_ids_are_32_hex_and_not_all_zero() -> None:
    traces = [ids.trace_id() for _ in range(100)]
    assert all(HEX32.match(t) and t != "0" * 32 for t in traces)
    assert len(set(traces)) == 100


def test_trace_id_never_returns_all_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter(["0" * 32, "0" * 32, "00000000000000000000000000000abc"])
    monkeypatch.setattr(ids.secrets, "token_hex", lambda n=32: next(answers))
    assert ids.trace_id() == "00000000000000000000000000000abc"


@pytest.mark.parametrize("value", ["a", "job_01ABC", "x.y:z-1_2", "A" * 128])
def test_opaque_ids_accepted(value: str) -> None:
    assert ids.OPAQUE_ID.match(value)


@pytest.mark.parametrize("value", ["", "A" * 129, "has space", "slash/no", "ünïcode", "semi;colon"])
def test_opaque_ids_refused(value: str) -> None:
    assert not ids.OPAQUE_ID.match(value)


# ---------------------------------------------------------------- clocks


def test_manual_clock_starts_at_the_spec_example_time() -> None:
    assert rfc3339(ManualClock().now_ms()) == "2026-07-21T10:00:00.000Z"


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(start_ms=1_000)
    assert clock.now_ms() == 1_000
    assert clock.now_ms() == 1_000
    clock.advance(1.5)
    assert clock.now_ms() == 2_500
    clock.advance(0)
    assert clock.now_ms() == 2_500
    clock.set_ms(2_500)
    clock.set_ms(10_000)
    assert clock.now_ms() == 10_000


def test_manual_clock_never_goes_backwards() -> None:
    clock = ManualClock(start_ms=5_000)
    with pytest.raises(ValueError):
        clock.advance(-0.001)
    with pytest.raises(ValueError):
        clock.set_ms(4_999)
    assert clock.now_ms() == 5_000


def test_system_clock_is_integer_milliseconds() -> None:
    now = SystemClock().now_ms()
    assert isinstance(now, int)
    assert now > 1_700_000_000_000
