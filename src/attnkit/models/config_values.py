"""What each value of a Hugging Face ``config.json`` must be, checked when a native loader reads the file.

A loader names, for every key it reads, the kind of value it takes (:class:`Value`): a size (an integer >= 1), a
count (>= 0), a number, a positive number, a switch (true or false), a name, a list of names... A value of another
kind is refused at load, in one line naming the key and what it must be (:func:`checked_values`), where it would
otherwise surface later as a traceback that names neither (``"6" x 16 must equal 96``, ``unsupported operand
type(s) for //``, or a forward that raises on every call). The loader that reads the file adds its path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

from ..errors import InputError

__all__ = ["UnsupportedConfigError", "Value", "SIZE", "COUNT", "NUMBER", "POSITIVE", "NON_NEGATIVE", "FLAG", "NAME", "NAMES", "NUMBERS",
           "INDICES", "MAPPING", "STEP_LIMIT", "nullable", "size_or", "checked_values", "is_number"]


class UnsupportedConfigError(InputError):
    """A Hugging Face config asks for something attnkit does not implement, or holds a value of the wrong kind
    (never silently ignored)."""


class Value(NamedTuple):
    """A kind of config value: ``accepts(value)`` says whether a value is one, ``says`` what one is (for the error);
    ``nullable``: null is taken too (the loader reads it as absent, as transformers does)."""

    accepts: Callable[[object], bool]
    says: str
    nullable: bool = False
    kind: str = ""  # the kind's name (the tests make wrong values for each kind)


def is_number(value: object) -> bool:
    """A finite JSON number (not a bool), or transformers' form of one (``{"__float__": "1e-5"}``)."""
    if isinstance(value, dict) and set(value) == {"__float__"}:
        try:
            value = float(value["__float__"])
        except (TypeError, ValueError):
            return False
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: object) -> float:
    return float(value["__float__"]) if isinstance(value, dict) else float(value)  # type: ignore[arg-type]


def _integer(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


SIZE = Value(lambda v: _integer(v, 1), "an integer >= 1", kind="size")
COUNT = Value(lambda v: _integer(v, 0), "an integer >= 0", kind="count")
NUMBER = Value(is_number, "a finite number", kind="number")
POSITIVE = Value(lambda v: is_number(v) and _number(v) > 0, "a finite number > 0", kind="positive")
NON_NEGATIVE = Value(lambda v: is_number(v) and _number(v) >= 0, "a finite number >= 0", kind="non-negative")
FLAG = Value(lambda v: isinstance(v, bool), "true or false", kind="flag")
NAME = Value(lambda v: isinstance(v, str), "a string", kind="name")
NAMES = Value(lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings",
              kind="names")
NUMBERS = Value(lambda v: isinstance(v, list) and all(is_number(x) for x in v), "a list of finite numbers",
                kind="numbers")
INDICES = Value(lambda v: isinstance(v, list) and all(_integer(x, 0) for x in v), "a list of integers >= 0",
                kind="indices")
MAPPING = Value(lambda v: isinstance(v, dict), "an object", kind="mapping")
STEP_LIMIT = Value(lambda v: isinstance(v, list) and len(v) == 2 and all(is_number(x) or _infinite(x) for x in v)
                   and 0 <= _bound(v[0]) <= _bound(v[1]),
                   "[low, high] with 0 <= low <= high (Mamba-2's step bounds; high may be Infinity)", kind="limit")


def _infinite(value: object) -> bool:
    return isinstance(value, dict) and value == {"__float__": "Infinity"} or value == math.inf


def _bound(value: object) -> float:
    return math.inf if _infinite(value) else _number(value)


def nullable(value: Value) -> Value:
    """``value``, or null (read as absent)."""
    return value._replace(nullable=True)


def size_or(*words: str) -> Value:
    """A size, or one of ``words`` (``mamba_d_head: "auto"``)."""
    return Value(lambda v: _integer(v, 1) or v in words, "an integer >= 1 or " + " or ".join(map(repr, words)),
                 kind="size")


def checked_values(hf: Mapping, kind: str, values: Mapping[str, Value]) -> None:
    """Refuse by name the first value of ``hf`` (a ``kind`` config.json) that is not of the kind ``values`` names
    for its key: an :class:`UnsupportedConfigError` naming the key, what it must be and
    what it is. Keys ``values`` does not name are the caller's."""
    for key, value in hf.items():
        want = values.get(key)
        if want is None or (value is None and want.nullable):
            continue
        if not want.accepts(value):
            raise UnsupportedConfigError(f"{kind} config: {key} must be {want.says}, got {value!r}")
