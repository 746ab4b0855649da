"""encode's short cuts write exactly what the JSON encoder writes."""

from __future__ import annotations

import json
import math
import random
import sys

import pytest
from pydantic_core import from_json

from backburner.errors import InvalidInputError
from backburner.jsoncodec import MAX_DEPTH, encode, valid_unicode

REFERENCE = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# Every ASCII character (controls, quote, backslash, DEL), and some that are not ASCII.
ALPHABET = [chr(i) for i in range(0x80)] + ["é", "\u2028", "😀", "\ud800"]


def test_strings_encode_as_the_json_encoder_writes_them() -> None:
    rng = random.Random(5)
    for _ in range(50_000):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 8)))
        if "\ud800" in text:  # (never in a pair here: no low surrogate in the alphabet)
            with pytest.raises(InvalidInputError, match="lone UTF-16 surrogate"):
                encode(text)
        else:
            assert encode(text) == REFERENCE.encode(text), repr(text)


@pytest.mark.parametrize(
    "value", ["\ud800", "x\udfff", {"\udc00": 1}, [1, {"a": ["\udbff"]}], "\ude00\ud83d"]
)
def test_a_lone_surrogate_is_refused_wherever_it_is(value: object) -> None:
    # Python's json would read it back, but pydantic-core (every reader of a stored job) not.
    with pytest.raises(InvalidInputError, match=r"^input holds a lone UTF-16 surrogate"):
        encode(value, "input")


def test_characters_past_the_bmp_are_stored_and_read_back() -> None:
    text = encode({"s": "😀 \\ud800 é"}, "input")  # (an escaped backslash, then 'ud800')
    assert text == REFERENCE.encode({"s": "😀 \\ud800 é"})
    assert from_json(text) == {"s": "😀 \\ud800 é"}


def nested(levels: int, leaf: object = "😀") -> object:
    for _ in range(levels):
        leaf = [leaf] if levels % 2 else {"k": leaf}
    return leaf


def test_a_value_nested_past_what_readers_take_is_refused() -> None:
    # pydantic-core reads 201 levels: deeper, a stored job could never be read back.
    for levels in (MAX_DEPTH, MAX_DEPTH - 1):
        text = encode(nested(levels), "result")
        assert from_json(text) == nested(levels)
        assert from_json('{"a":{"b":[' + text + "]}}")  # (room for what wraps it)
    for levels in (MAX_DEPTH + 1, MAX_DEPTH + 2, 250, 5000):  # (5000: past Python's own limit)
        with pytest.raises(InvalidInputError, match=rf"^result nests deeper than {MAX_DEPTH}"):
            encode(nested(levels), "result")
    deep_tuples: object = "x"
    for _ in range(250):
        deep_tuples = (deep_tuples,)  # (the encoder writes a tuple as an array)
    with pytest.raises(InvalidInputError, match="nests deeper"):
        encode(deep_tuples)
    # Many brackets side by side are not deep.
    wide = [{"a": [1]} for _ in range(1000)]
    assert encode(wide) == REFERENCE.encode(wide)


def test_valid_unicode_replaces_only_lone_surrogates() -> None:
    assert valid_unicode("ok é 😀") == "ok é 😀"
    assert valid_unicode("a\ud800b\udfff") == "a\ufffdb\ufffd"


@pytest.mark.parametrize(
    "value",
    ["task_0123abcd", "", "a b", 'say "hi"', "back\\slash", "tab\there", "\x7f", {}, {"a": [1]}],
)
def test_common_values_encode_as_the_json_encoder_writes_them(value: object) -> None:
    assert encode(value) == REFERENCE.encode(value)


def test_a_str_subclass_and_what_json_cannot_hold() -> None:
    class Name(str):
        pass

    assert encode(Name("x")) == '"x"'
    with pytest.raises(InvalidInputError, match="input is not JSON-serialisable"):
        encode({"x": math.nan}, "input")
    with pytest.raises(InvalidInputError):
        encode({1, 2})


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, -1, 2**63, 10**600, 0.0, -0.0, 1.5, 1e300, 5e-324, 1 / 3, -math.pi],
    ids=lambda v: f"{type(v).__name__}:{v!r:.20}",
)
def test_scalars_encode_as_the_json_encoder_writes_them(value: object) -> None:
    assert encode(value) == REFERENCE.encode(value)


def test_scalars_json_cannot_hold_are_refused_like_the_encoder_refuses_them() -> None:
    limit = sys.get_int_max_str_digits()  # (0: no limit)
    too_long = [10**limit] if limit else []  # limit + 1 digits: a ValueError, not text
    for value in (math.nan, math.inf, -math.inf, *too_long):
        with pytest.raises(ValueError):
            REFERENCE.encode(value)
        with pytest.raises(InvalidInputError, match="result is not JSON-serialisable"):
            encode(value, "result")
