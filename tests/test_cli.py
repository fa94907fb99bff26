"""The ``attnkit`` command line: the tour runs every mechanism and writes its pictures."""

from __future__ import annotations

import pytest

from attnkit.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_tour_prints_every_mechanism_and_writes_one_png_each(tmp_path, capsys):
    assert main(["tour", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    pictures = sorted(tmp_path.glob("*.png"))
    assert len(pictures) == 13
    assert all(p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 5000 for p in pictures)
    for mechanism in ("Bahdanau", "Luong concat", "local-p", "GQA 8/2", "sliding-window", "ALiBi", "sinusoidal"):
        assert mechanism in printed
    # The content-based scores recover the gold word alignment of the sentence pair.
    assert printed.count("argmax = gold alignment: 14/14") == 3
    assert not list(tmp_path.glob(".*")), "no temporary files left behind"


def test_unknown_command_exits_with_usage(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["nope"])
    assert exit.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_every_option_of_every_command_has_help_text():
    import argparse

    from attnkit.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = {name: [a.dest for a in parser._actions if not a.help] for name, parser in commands.choices.items()}
    assert not any(missing.values()), missing


@pytest.mark.slow
def test_version_and_python_dash_m(capsys):
    import subprocess
    import sys

    from attnkit import __version__

    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0 and capsys.readouterr().out.strip() == f"attnkit {__version__}"
    result = subprocess.run([sys.executable, "-m", "attnkit", "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == f"attnkit {__version__}"


def test_user_mistakes_are_one_line_and_bugs_keep_their_traceback(monkeypatch, capsys):
    """Error policy: a UsageError / InputError / OSError ends with one line and exit 2; any other
    exception (a ValueError from a bug included) propagates with its traceback; --debug shows the
    traceback of a user mistake too."""
    import attnkit.cli.language_models as lm
    from attnkit.cli import UsageError

    assert main(["cost", "--model", "gpt2-small", "--seq", "1024", "--pattern", "window",
                 "--pattern-options", "globals=3"]) == 2
    assert "--pattern-options" in capsys.readouterr().err  # the library's ValueError, named by option
    with pytest.raises(UsageError):
        main(["--debug", "cost", "--model", "gpt2-small", "--seq", "1024", "--pattern", "window",
              "--pattern-options", "globals=3"])

    def bug(*args, **kwargs):
        raise ValueError("an internal bug")

    monkeypatch.setattr(lm, "_model_config", bug)  # outside the call that receives the user's values
    with pytest.raises(ValueError, match="an internal bug"):
        main(["cost", "--model", "gpt2-small", "--seq", "1024"])
