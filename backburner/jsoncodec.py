"""The one place that decides what JSON backburner stores: strict (no NaN), compact."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from pydantic import ValidationError
from pydantic_core import from_json

from .errors import InvalidInputError
from .models import Usage

MAX_DEPTH = 192
"""How deeply objects and arrays may nest in a stored value. pydantic-core, which reads every
stored job, stops at 201 levels, and a document wraps a value in one more (the job, the
event): deeper, a job would be stored and then no read, listing or worker could take it back.
The margin leaves room for what wraps a value before it is stored (a pipeline's record of
its children's results adds two levels to theirs)."""

# Built once: json.dumps with any option builds a new encoder per call (a third of its time).
_COMPACT = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def encode(value: Any, what: str = "value") -> str:
    """Compact JSON text; InvalidInputError for what JSON cannot hold (sets, NaN, objects)."""
    # The values a job is made of most often (ids, names, no input, a handler's None) need no
    # encoder: a printable ASCII string without quote or backslash is itself between quotes,
    # and a scalar is written as the encoder writes it. The encoder makes its C encoder and a
    # closure on every call: for None, 2.4 µs against 0.1, and most handlers return None.
    kind = type(value)  # (not __class__, which a proxy may fake)
    if kind is str:
        if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
            return f'"{value}"'
    elif value is None:
        return "null"
    elif kind is dict and not value:
        return "{}"
    elif kind is bool:
        return "true" if value else "false"
    try:
        if kind is int:
            return int.__repr__(value)  # (ValueError past the interpreter's digit limit)
        if kind is float and math.isfinite(value):
            return float.__repr__(value)
        text = _COMPACT.encode(value)
    except RecursionError:  # (nested past the interpreter's own limit, about 1,000)
        raise InvalidInputError(f"{what} nests deeper than {MAX_DEPTH} levels") from None
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} is not JSON-serialisable: {exc}") from None
    if "\\ud" in text:  # (a character past U+FFFF, written as two escapes, or a lone one)
        _check_surrogates(text, what)
    # Nesting past MAX_DEPTH takes that many opening brackets: only then walk the value.
    if (
        len(text) > 2 * MAX_DEPTH
        and text.count("[") + text.count("{") > MAX_DEPTH
        and depth(value) > MAX_DEPTH
    ):
        raise InvalidInputError(f"{what} nests deeper than {MAX_DEPTH} levels")
    return text


# An escape in the encoder's text, in order (so an escaped backslash is one escape): a
# surrogate pair (a character past U+FFFF), a lone surrogate (group 1), or any other one.
_ESCAPE = re.compile(r"\\(?:ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}|u(d[89a-f][0-9a-f]{2})|.)")


def _check_surrogates(text: str, what: str) -> None:
    """InvalidInputError if ``text`` holds a lone UTF-16 surrogate: Python's json reads one
    back, but it is not Unicode, and every reader of a stored job (pydantic-core) refuses it,
    so a job holding one could never be read, listed or run again. pydantic-core's own parse
    goes first (several times faster than the scan of the escapes, done in Python): only what
    it refuses is scanned, as it also refuses text nested too deeply, left to encode."""
    try:
        from_json(text)
        return
    except ValueError:
        pass
    if any(m.group(1) for m in _ESCAPE.finditer(text)):
        raise InvalidInputError(
            f"{what} holds a lone UTF-16 surrogate (U+D800..U+DFFF outside a pair): "
            "not valid Unicode"
        )


def is_unicode(text: str) -> bool:
    """Whether ``text`` is Unicode: no lone UTF-16 surrogate (which no JSON reader takes)."""
    return text.isascii() or valid_unicode(text) == text


def valid_unicode(text: str) -> str:
    """``text`` with each lone UTF-16 surrogate replaced by U+FFFD (for text of our own making,
    such as an exception's message, that must be stored whatever it holds)."""
    if text.isascii():
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def round_trip(value: Any, what: str = "value") -> Any:
    """Exactly what a reader gets back after storing ``value`` (tuples become lists, ...)."""
    return json.loads(encode(value, what))


def check_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Usage as it will be stored; InvalidInputError unless it fits ``Usage``."""
    if usage is None:
        return None
    copied: dict[str, Any] = round_trip(usage, "usage")
    try:
        Usage.model_validate(copied)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise InvalidInputError(f"usage.{where}: {first['msg']}") from None
    return copied


def depth(value: Any) -> int:
    """How deeply objects and arrays nest in ``value`` (0 for a scalar); iterative."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):  # (the encoder writes a tuple as an array)
            children = item
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        stack.extend((child, level) for child in children)
    return deepest
