"""``attnkit demo --device cuda`` (marker ``gpu``): both models train and translate on the GPU (the
Bahdanau model through its hand-written recurrence, on CUDA tensors), and the report says so."""

from __future__ import annotations

import json

from attnkit.cli import main


def test_demo_on_cuda_writes_the_report(tmp_path):
    assert main(["demo", "--device", "cuda", "--out", str(tmp_path), "--epochs", "1", "--train-limit", "150",
                 "--test-limit", "30", "--beam", "2", "--quiet"]) == 0
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert results["settings"]["device"].startswith("cuda")
    for result in results["results"].values():
        assert result["steps"] == 5 and 0 <= result["bleu"] <= 100
    assert (tmp_path / "report" / "bleu_by_length.png").is_file()
