"""``attnkit build-ext``, retired: it says in one line that it is gone and succeeds, so that old set-up scripts go on."""

from __future__ import annotations

import pytest

from attnkit.cli import main


@pytest.mark.parametrize("flags", [[], ["--status"], ["--verbose", "--quiet"]])
def test_build_ext_says_it_is_gone_in_one_line(flags, capsys):
    assert main(["build-ext", *flags]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("attnkit build-ext is gone: attnkit compiles nothing")
