"""The CLI on CUDA (marker ``gpu``): ``attnkit bench --device cuda`` times attnkit's backends against
PyTorch's on the GPU, the compiled ones (torch-flex, flex, auto) once before the timings."""

from __future__ import annotations

import json

from attnkit.cli import main


def test_bench_on_cuda_times_every_backend(tmp_path):
    code = main(["bench", "--device", "cuda", "--sizes", "1024", "--masks", "causal", "window", "--modes", "fwd",
                 "fwd+bwd", "--dtypes", "bfloat16", "--impls", "torch-sdpa", "torch-flex", "sdpa", "flex", "auto",
                 "--repeats", "3", "--min-seconds", "0.2", "--no-memory", "--out", str(tmp_path / "b")])
    assert code == 0
    rows = json.loads((tmp_path / "b" / "attention.json").read_text())["results"]
    assert len(rows) == 2 * 2 * 5
    for row in rows:
        assert "skipped" not in row and row["time_s"] > 0, row
    assert all("compile_s" in row for row in rows if row["impl"] in ("torch-flex", "flex", "auto"))


def test_train_on_cuda_then_translate_on_the_cpu(tmp_path, capsys):
    """A few steps of translation training on the GPU; the checkpoint loads and translates on the CPU."""
    tiny = ["--embedding-dim", "16", "--hidden-size", "32", "--vocab-size", "100", "--tokenizer", "word", "--quiet"]
    assert main(["train", "--device", "cuda", *tiny, "--max-steps", "5", "--batch-size", "16",
                 "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "last" / "model.safetensors").exists()
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(tmp_path / "run" / "last"), "In the beginning"]) == 0
    assert capsys.readouterr().out.count("\n") == 1  # one line per sentence (5 steps may not say much)
