"""``attnkit tour``: every mechanism on one sentence pair, one picture each."""

from __future__ import annotations

import pytest

from attnkit.cli import main

from cli_helpers import PNG, assert_probe, probe_ids


@pytest.mark.slow
def test_tour_prints_every_mechanism_and_writes_one_png_each(tmp_path, capsys):
    assert main(["tour", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    pictures = sorted(tmp_path.glob("*.png"))
    assert len(pictures) == 13
    assert all(p.read_bytes()[:8] == PNG and p.stat().st_size > 5000 for p in pictures)
    for mechanism in ("Bahdanau", "Luong concat", "local-p", "GQA 8/2", "sliding-window", "ALiBi", "sinusoidal"):
        assert mechanism in printed
    # The content-based scores recover the gold word alignment of the sentence pair.
    assert printed.count("argmax = gold alignment: 14/14") == 3
    assert not list(tmp_path.glob(".*")), "no temporary files left behind"


PROBES = [
    # (argv with {placeholders}, words the message must contain)
    (["tour", "--out", "/proc/attnkit-probe"], ["--out", "cannot write"]),
    (["tour", "--out", "{pairs}"], ["--out", "is a file"]),
]


@pytest.mark.parametrize("argv, words", PROBES, ids=probe_ids(PROBES))
def test_bad_input_gives_exit_2_and_a_message_naming_it(world, argv, words, capsys):
    assert_probe(argv, world, words, capsys)
