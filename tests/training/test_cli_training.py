"""The train / translate / evaluate commands on a user's file, Ctrl-C, and torchrun data parallelism."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from attnkit.cli import main

TINY = ["--embedding-dim", "16", "--hidden-size", "32", "--vocab-size", "100", "--tokenizer", "word", "--quiet"]


def _run(*args, **kwargs):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "attnkit.cli", *args], capture_output=True, text=True, env=env,
                          timeout=240, **kwargs)


@pytest.mark.slow
def test_train_translate_evaluate_on_a_user_file(phrase_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--data", str(phrase_file), "--out", str(run), "--epochs", "1", "--attention", "bahdanau",
                 *TINY]) == 0
    assert (run / "best" / "model.safetensors").is_file() and (run / "last" / "trainer.json").is_file()
    heatmap = tmp_path / "align.png"
    assert main(["translate", "--checkpoint", str(run), "--heatmap", str(heatmap), "three red cats"]) == 0
    assert heatmap.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["evaluate", "--checkpoint", str(run), "--data", str(phrase_file), "--limit", "50", "--beam", "2",
                 "--json", str(tmp_path / "scores.json"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "BLEU" in out and "source  1-10 words" in out
    assert (tmp_path / "scores.json").is_file()
    assert main(["evaluate", "--checkpoint", str(run), "--data", str(phrase_file), "--long"]) == 2
    assert "--long: only the bundled bible corpus has a test-long split" in capsys.readouterr().err
    # --long's part on its own (this model knows numbers, not the Bible: the scores are ~0, the shape is checked)
    import argparse

    from attnkit.cli.translation import _by_length_with_intervals
    from attnkit.data import bible_corpus
    from attnkit.training import load_checkpoint

    checkpoint = load_checkpoint(run / "best")
    args = argparse.Namespace(direction="en-fr", limit=15, beam=1, quiet=True)
    pairs = bible_corpus("test")[:15]
    extra = _by_length_with_intervals(args, checkpoint, pairs, ["x"] * 15)
    assert extra["test_long"]["sentences"] == 15
    assert sum(row["sentences"] for row in extra["quality_by_length"]) == 30
    assert max(row["high"] for row in extra["quality_by_length"]) > 25
    assert "by source length over test + test-long, 95% bootstrap intervals" in capsys.readouterr().out


def test_train_stops_at_max_minutes(phrase_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--data", str(phrase_file), "--out", str(run), "--epochs", "5", "--max-minutes", "1e-8",
                 *TINY]) == 0
    assert "time-limit after 1 steps" in capsys.readouterr().out
    assert (run / "best" / "model.safetensors").is_file()
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--data", str(phrase_file), "--out", str(run), "--max-minutes", "0", *TINY])
    assert exit_.value.code == 2 and "--max-minutes: expected a finite number > 0" in capsys.readouterr().err


def test_malformed_file_is_reported_with_its_line(tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\nno tab\n", encoding="utf-8")
    assert main(["train", "--data", str(bad), "--out", str(tmp_path / "run"), *TINY]) == 2
    assert "bad.tsv:2: expected 'source<TAB>target'" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_resume_finishes(phrase_file, tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "attnkit.cli", "train", "--data", str(phrase_file), "--out",
                                str(run), "--epochs", "50", "--patience", "0", "--batch-size", "8", *TINY],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in process.stdout:  # wait for the first epoch to finish: training is under way
        if line.startswith("epoch 1:"):
            break
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    rest = process.communicate(timeout=120)[0]
    assert process.returncode == 130, rest
    assert "interrupted: checkpoint saved" in rest
    import json

    progress = json.loads((run / "last" / "trainer.json").read_text())["progress"]
    assert progress["epoch"] >= 1 and progress["step"] > 0
    resumed = _run("train", "--data", str(phrase_file), "--out", str(run), "--epochs", str(progress["epoch"] + 1),
                   "--patience", "0", "--batch-size", "8", "--resume", *TINY)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout
    assert json.loads((run / "last" / "trainer.json").read_text())["progress"]["epoch"] == progress["epoch"] + 1


@pytest.mark.slow
def test_two_process_data_parallel_step_equals_one_process_on_the_same_global_batch(phrase_file, tmp_path):
    args = ["train", "--data", str(phrase_file), "--max-steps", "1", "--batch-size", "16", "--dropout", "0",
            "--attention", "luong-general", *TINY]
    single = _run(*args, "--out", str(tmp_path / "single"))
    assert single.returncode == 0, single.stderr
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "attnkit.cli", *args, "--out", str(tmp_path / "ddp")],
                         capture_output=True, text=True, env=env, timeout=240)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    a = load_file(tmp_path / "single" / "last" / "model.safetensors")
    b = load_file(tmp_path / "ddp" / "last" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        # float32 sums in another order (all-reduce of two half-batch gradients): a few ulps of a 0.2 weight
        torch.testing.assert_close(b[name], a[name], rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("command", [["translate", "--checkpoint", "missing-run", "x"],
                                     ["evaluate", "--checkpoint", "missing-run"]])
def test_missing_checkpoint_is_a_clear_error(command, capsys):
    assert main(command) == 2
    assert "checkpoint folder not found" in capsys.readouterr().err
