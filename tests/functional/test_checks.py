"""The shared input checks (attnkit.functional.checks): messages name the argument, what was
expected and what was given."""

from __future__ import annotations

import pytest


def test_check_int_is_the_one_integer_check():
    from attnkit.functional.checks import check_int

    assert check_int("window", 3, 1) == 3
    assert check_int("window", None, 1, optional=True) is None
    for value, message in [(0, "window must be a positive int, got 0"), (2.0, "window must be a positive int, got 2.0"),
                           (True, "window must be a positive int, got True"), ("3", "window must be a positive int, got '3'")]:
        with pytest.raises(ValueError, match=message):
            check_int("window", value, 1)
    with pytest.raises(ValueError, match=r"seq must be an int in \[1, 10\], got 11"):
        check_int("seq", 11, 1, 10)
    with pytest.raises(ValueError, match="sinks must be a non-negative int or None, got -1"):
        check_int("sinks", -1, 0, optional=True)
