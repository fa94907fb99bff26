"""``layers`` of :func:`attnkit.inspect.report.inspect_encoder` (``attnkit inspect --layers``): the head grids of
the layers asked for, each once and in order; a layer the model does not have, none at all, or a bool is refused
by name with the model's range."""

from __future__ import annotations

import pytest

from attnkit.cli import main
from attnkit.errors import InputError
from attnkit.inspect.report import _checked_layers


def test_every_layer_by_default_and_the_ones_asked_for_once_each_in_order():
    assert _checked_layers(None, 4) == [0, 1, 2, 3]
    assert _checked_layers([3, 0, 3], 4) == [0, 3]


@pytest.mark.parametrize("layers", [[4], [-1], [], [True], [0, 9]], ids=["past-the-last", "negative", "none", "bool",
                                                                          "one-of-two"])
def test_a_layer_the_model_lacks_is_refused_with_its_range(layers):
    with pytest.raises(InputError, match=r"layers \(--layers\) must be layer numbers in \[0, 3\] of this 4-layer model"):
        _checked_layers(layers, 4)


@pytest.mark.slow  # loads MiniLM and runs it: 0.6 s
@pytest.mark.requires("minilm")
def test_the_command_names_the_models_layers(tmp_path, capsys):
    assert main(["inspect", "--model", "minilm", "--layers", "6", "--out", str(tmp_path / "r"), "--quiet", "hi"]) == 2
    assert "[0, 5] of this 6-layer model" in capsys.readouterr().err
    assert not list((tmp_path / "r").glob("*.png"))  # refused before any picture is drawn
    assert main(["inspect", "--model", "minilm", "--coref", "--layers", "1", "--out", str(tmp_path / "c"), "--quiet"]) == 2
    assert "--layers chooses the head grids of a report; --coref writes none" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [("0,x", "expected an integer, got 'x'"), ("0,,2", "comma-separated"),
                                           ("-1", ">= 0")], ids=["word", "empty", "negative"])
def test_a_bad_layer_list_is_refused_by_the_parser(text, message, capsys):
    with pytest.raises(SystemExit) as exited:  # argparse refuses it before any work
        main(["inspect", "--model", "minilm", "--layers", text, "hi"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "--layers" in error and message in error


@pytest.mark.parametrize("name, value", [("limit", 0), ("dev_limit", -2), ("dev_limit", True), ("limit", 1.5)])
def test_a_verse_limit_that_is_not_a_positive_count_is_refused_by_name(name, value):
    """score_alignments' limit (test verses) and dev_limit (dev verses choosing the reading): refused before any
    model runs (the checkpoint is never read: a placeholder stands for it)."""
    from attnkit.inspect.aer import score_alignments

    with pytest.raises(ValueError, match=f"{name} must be a positive number of verses or None"):
        score_alignments({"run": object()}, **{name: value})
