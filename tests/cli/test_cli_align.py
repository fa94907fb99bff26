"""``attnkit align``: IBM Model 1 converges and stops; refusals."""

from __future__ import annotations

import pytest

from cli_helpers import fill, refused, run_cli


def test_ibm_model_1_stops_at_convergence(phrase_file, tmp_path, capsys):
    code, out, err = run_cli(["align", "--data", phrase_file, "--aligner", "ibm1", "--ibm-iterations", "1000",
                                    "--out", tmp_path / "links.txt", "--quiet"], capsys)
    assert code == 0, err
    assert "converged" in out


@pytest.mark.parametrize("argv, words", [
    (["align", "--aligner", "ibm1", "--symmetrize", "union", "--out", "{tmp}/l.txt"], ["--symmetrize", "eflomal"]),
    (["align", "--aligner", "eflomal", "--ibm-iterations", "9", "--out", "{tmp}/l.txt"], ["--ibm-iterations"]),
])
def test_an_option_that_would_do_nothing_is_refused(argv, words, run, phrase_file, tmp_path, capsys):
    files = {"pairs": phrase_file, "run": run, "tmp": tmp_path}
    refused(fill(argv, files), capsys, *words)
