"""``attnkit train``: on a user's file, Ctrl-C and resume, torchrun data parallelism, the run folder's
options and limits, and refusals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from attnkit.cli import main

from cli_helpers import TINY, assert_probe, fill, probe_ids, refused, run_attnkit, run_cli, snapshot


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
    captured = capsys.readouterr()
    assert "BLEU" in captured.out and "source  1-10 words" in captured.out
    # the very file the run trained on: said, on stderr and in the JSON
    assert "is the file this model was trained on" in captured.err and "training-set score" in captured.err
    assert "training-set score" in json.loads((tmp_path / "scores.json").read_text())["warning"]
    other = tmp_path / "held_out.tsv"
    other.write_text("".join(phrase_file.read_text().splitlines(keepends=True)[:30]), encoding="utf-8")
    assert main(["evaluate", "--checkpoint", str(run), "--data", str(other), "--beam", "1", "--quiet"]) == 0
    assert "trained on" not in capsys.readouterr().err
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
@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_ctrl_c_saves_a_checkpoint_and_resume_finishes(phrase_file, tmp_path, stop):
    """Ctrl-C, and SIGTERM as a scheduler's time limit sends it, stop the run the same way."""
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "attnkit.cli", "train", "--data", str(phrase_file), "--out",
                                str(run), "--epochs", "50", "--patience", "0", "--batch-size", "8", *TINY],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in process.stdout:  # wait for the first epoch to finish: training is under way
        if line.startswith("epoch 1:"):
            break
    time.sleep(0.5)
    process.send_signal(getattr(signal, stop))
    rest = process.communicate(timeout=120)[0]
    assert process.returncode == {"SIGINT": 130, "SIGTERM": 143}[stop], rest  # 128 + the signal, as shells count
    assert "interrupted: checkpoint saved" in rest
    import json

    progress = json.loads((run / "last" / "trainer.json").read_text())["progress"]
    assert progress["epoch"] >= 1 and progress["step"] > 0
    resumed = run_attnkit("train", "--data", str(phrase_file), "--out", str(run), "--epochs", str(progress["epoch"] + 1),
                   "--patience", "0", "--batch-size", "8", "--resume", *TINY)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout
    assert json.loads((run / "last" / "trainer.json").read_text())["progress"]["epoch"] == progress["epoch"] + 1


@pytest.mark.slow
def test_two_process_data_parallel_step_equals_one_process_on_the_same_global_batch(phrase_file, tmp_path):
    args = ["train", "--data", str(phrase_file), "--max-steps", "1", "--batch-size", "16", "--dropout", "0",
            "--attention", "luong-general", *TINY]
    single = run_attnkit(*args, "--out", str(tmp_path / "single"))
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


def test_train_with_a_separate_validation_file(phrase_file, tmp_path, capsys):
    code, _, err = run_cli(["train", "--data", phrase_file, "--valid", phrase_file, "--out", tmp_path / "r",
                            "--max-steps", "1", "--epochs", "1", *TINY], capsys)
    assert code == 0, err
    recorded = json.loads((tmp_path / "r" / "attnkit-run.json").read_text())["options"]
    assert recorded["valid"] == str(phrase_file.resolve())


def test_an_absurd_model_size_is_refused_before_allocating(phrase_file, tmp_path, capsys):
    refused(["train", "--data", phrase_file, "--out", tmp_path / "r", "--hidden-size", "65536"], capsys,
             "--hidden-size 65536", "billion parameters")


def test_overwrite_refuses_to_delete_a_users_file_inside_a_checkpoint(phrase_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--data", str(phrase_file), "--out", str(out), "--epochs", "1", "--max-steps", "1",
                 *TINY]) == 0
    (out / "last" / "my-notes.txt").write_text("mine")
    refused(["train", "--data", phrase_file, "--out", out, "--overwrite", "--max-steps", "1", *TINY], capsys,
             "--overwrite", "last/my-notes.txt")
    assert (out / "last" / "my-notes.txt").read_text() == "mine"


def test_resume_sees_through_the_path_and_refuses_another_corpus(phrase_file, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pairs.tsv").write_bytes(phrase_file.read_bytes())
    common = ["--out", "r", "--epochs", "1", *TINY]
    assert run_cli(["train", "--data", "pairs.tsv", "--max-steps", "1", *common], capsys)[0] == 0
    code, _, err = run_cli(["train", "--data", "./pairs.tsv", "--max-steps", "2", "--resume", *common], capsys)
    assert code == 0, err  # the same file by another spelling
    (tmp_path / "pairs.tsv").write_text("another\tcorpus\n" * 50)
    refused(["train", "--data", "pairs.tsv", "--max-steps", "3", "--resume", *common], capsys, "data_sha256")


def test_resume_takes_the_runs_data_and_model_options_and_refuses_only_given_ones(phrase_file, tmp_path, capsys):
    """train --out RUN --resume needs no repetition of the run's options (its marker holds them); an
    option given that differs from the run's is refused by name."""
    run = tmp_path / "run"
    first = ["train", "--data", phrase_file, "--out", run, "--epochs", "1", "--max-steps", "2",
             "--embedding-dim", "16", "--hidden-size", "32", "--vocab-size", "100", "--tokenizer", "word",
             "--dropout", "0.1", "--attention", "luong-general", "--quiet"]
    assert run_cli(first, capsys)[0] == 0
    code, out, err = run_cli(["train", "--out", run, "--resume", "--epochs", "1", "--max-steps", "3", "--quiet"], capsys)
    assert code == 0, err
    assert "max-steps after 3 steps" in out
    assert json.loads((run / "attnkit-run.json").read_text())["options"]["attention"] == "luong-general"
    refused(["train", "--out", run, "--resume", "--hidden-size", "64", "--max-steps", "4"], capsys,
             "--resume", "hidden_size (run: 32, now: 64)")


def test_a_resume_whose_limits_are_reached_trains_nothing_and_says_so(phrase_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert run_cli(["train", "--data", phrase_file, "--out", run, "--epochs", "1", "--max-steps", "5", *TINY], capsys)[0] == 0
    before = {name: data for name, data in snapshot(run).items() if name != "attnkit-run.json"}
    for limits in (["--max-steps", "3"], ["--max-steps", "5", "--lr", "0.01"], []):
        code, out, err = run_cli(["train", "--out", run, "--resume", "--epochs", "1", *limits, "--quiet"], capsys)
        assert code == 0, err
        assert out.count("nothing to train") == 1, out  # said once, in the words of the resume line
        assert "nothing to train: the run is at step 5, 0 epochs finished, 5 batches into epoch 1" in out
        assert "max-steps" in out and "resuming from" in out and "at epoch 2" not in out
    after = snapshot(run)
    assert {name: data for name, data in after.items() if name != "attnkit-run.json"} == before  # no step, no checkpoint
    marker = json.loads(after["attnkit-run.json"])  # no step ran under the limits given: nothing recorded
    assert "changes" not in marker or marker["changes"] == []


def test_a_run_that_stopped_before_writing_anything_is_not_an_existing_run(phrase_file, tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    (out / "attnkit-run.json").write_text(json.dumps({"format": "attnkit-run", "version": 1, "options": {}}))
    code, _, err = run_cli(["train", "--data", phrase_file, "--out", out, "--max-steps", "1", "--epochs", "1", *TINY],
                           capsys)
    assert code == 0, err


def test_a_users_files_survive_a_refused_train(world):
    assert (world["user"] / "last" / "thesis.tex").read_text() == "precious"
    assert not (world["root"] / "new1").exists() or not any((world["root"] / "new1").iterdir()) or \
        (world["root"] / "new1" / "attnkit-run.json").exists()


def test_overwrite_replaces_only_the_run(world, phrase_file, tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--data", str(phrase_file), "--out", str(run), "--epochs", "1", "--max-steps", "1", *TINY]) == 0
    (run / "notes.txt").write_text("mine")
    assert main(["train", "--data", str(phrase_file), "--out", str(run), "--epochs", "1", "--max-steps", "1",
                 "--overwrite", *TINY]) == 0
    assert (run / "notes.txt").read_text() == "mine" and (run / "last" / "checkpoint.json").is_file()


PROBES = [
    # (argv with {placeholders}, words the message must contain)
    (["train", "--data", "{fake.gz}", "--out", "{root}/new1", *TINY], ["--data", "not a gzip file"]),
    (["train", "--preset", "gpt2-small", "--arch", "transformer", "--out", "{root}/new2"], ["--preset"]),
    (["train", "--lr", "inf", "--out", "{root}/new3"], ["--lr"]),
    (["train", "--clip", "-5", "--out", "{root}/new4"], ["--clip"]),
    (["train", "--dropout", "nan", "--out", "{root}/new5"], ["--dropout"]),
    (["train", "--data", "{pairs}", "--out", "{user}", *TINY], ["--out", "not an attnkit run"]),
    (["train", "--data", "{pairs}", "--out", "", *TINY], ["--out", "empty"]),
    (["train", "--data", "{pairs}", "--out", "{run}", *TINY], ["--out", "--resume", "--overwrite"]),
    (["train", "--data", "{pairs}", "--out", "{pairs}", *TINY], ["--out", "is a file"]),
    (["train", "--data", "bible", "--out", "{run}", "--resume", *TINY], ["--resume", "data", "'bible'"]),
    (["train", "--data", "{pairs}", "--out", "{run}", "--resume", "--hidden-size", "64", "--embedding-dim", "16",
      "--vocab-size", "100", "--tokenizer", "word"], ["--resume", "hidden_size"]),
    (["train", "--data", "{pairs}", "--out", "/proc/attnkit-probe", *TINY], ["--out", "/proc/attnkit-probe"]),
    (["train", "--data", "{long.tsv}", "--out", "{root}/new6", *TINY], ["long.tsv:1", "characters"]),
    (["train", "--data", "{pairs}", "--out", "{pickle-trainer}", "--resume", *TINY], ["trainer.safetensors",
                                                                                       "not a readable safetensors"]),
]


@pytest.mark.parametrize("argv, words", PROBES, ids=probe_ids(PROBES))
def test_bad_input_gives_exit_2_and_a_message_naming_it(world, argv, words, capsys):
    assert_probe(argv, world, words, capsys)


@pytest.mark.parametrize("argv, words", [
    (["train", "--data", "{pairs}", "--direction", "fr-en", "--out", "{tmp}/a"], ["--direction", "--data bible"]),
    (["train", "--arch", "transformer", "--attention", "luong-dot", "--out", "{tmp}/b"], ["--attention", "seq2seq"]),
    (["train", "--arch", "transformer", "--hidden-size", "64", "--out", "{tmp}/c"], ["--hidden-size", "seq2seq"]),
    (["train", "--preset", "transformer-small", "--out", "{tmp}/d"], ["--preset", "--arch transformer"]),
    (["train", "--alignment-weight", "0.5", "--out", "{tmp}/e"], ["--alignment-weight", "--guided-alignment"]),
])
def test_an_option_that_would_do_nothing_is_refused(argv, words, run, phrase_file, tmp_path, capsys):
    files = {"pairs": phrase_file, "run": run, "tmp": tmp_path}
    refused(fill(argv, files), capsys, *words)


def test_a_file_too_small_to_hold_validation_pairs_is_refused_and_leaves_no_folder(tmp_path, capsys):
    """10 pairs give no validation pair (every 20th is held out): a traceback before, now one line, and the
    run folder it had made is gone."""
    data = tmp_path / "ten.tsv"
    data.write_text("".join(f"hello {i}\tbonjour {i}\n" for i in range(10)))
    out = tmp_path / "run"
    refused(["train", "--data", data, "--out", out, *TINY], capsys, "--data", "10 training and 0 validation pairs",
            "--valid FILE")
    assert not out.exists()


@pytest.mark.slow
def test_a_resume_is_the_same_run_with_its_training_options(phrase_file, tmp_path, capsys):
    """A run of batch 16 stopped at --max-steps 4, resumed with nothing but --resume: it trained 2,280 steps at
    batch 64 before. Now the run's own options: nothing to train; a longer limit trains on at batch 16; an
    option given explicitly applies and is recorded."""
    run = tmp_path / "run"
    assert run_cli(["train", "--data", phrase_file, "--out", run, "--max-steps", "4", "--batch-size", "16",
                    "--lr", "0.003", *TINY], capsys)[0] == 0
    code, out, err = run_cli(["train", "--out", run, "--resume", "--quiet"], capsys)
    assert code == 0, err
    assert "nothing to train: the run is at step 4" in out
    code, out, err = run_cli(["train", "--out", run, "--resume", "--max-steps", "6", "--quiet"], capsys)
    assert code == 0 and "max-steps after 6 steps" in out, err
    marker = json.loads((run / "attnkit-run.json").read_text())
    assert marker["training"]["batch_size"] == 16 and marker["training"]["lr"] == 0.003
    assert marker["training"]["max_steps"] == 6
    assert marker["changes"] == [{"step": 4, "changed": [{"option": "max_steps", "was": 4, "now": 6}]}]
    trainer = json.loads((run / "last" / "trainer.json").read_text())
    assert trainer["progress"]["step"] == 6


def test_a_stop_before_any_validation_names_only_the_checkpoints_written(phrase_file, tmp_path, capsys, monkeypatch):
    """Ctrl-C before the first validation left last/ alone; train named best/ too."""
    import attnkit.training as training
    from attnkit.training import TrainingResult

    def interrupted(model, source, target, train_pairs, valid_pairs, config, folder, **kwargs):
        (folder / "last").mkdir(parents=True)
        (folder / "last" / "checkpoint.json").write_text("{}")
        return TrainingResult(folder, 3, 0, float("inf"), "interrupted", {}, new_steps=3)

    monkeypatch.setattr(training, "train", interrupted)
    code, out, _ = run_cli(["train", "--data", phrase_file, "--out", tmp_path / "run", *TINY], capsys)
    assert code == 130
    assert "(last/)" in out and "best/" not in out


def test_resume_messages_name_the_real_mistake(phrase_file, tmp_path, capsys):
    """an empty --out gives one line (no false 'older attnkit' warning); another --arch on a
    resumed run is blamed on --arch, not on options the user never gave."""
    empty = tmp_path / "empty"
    empty.mkdir()
    err = refused(["train", "--out", empty, "--resume"], capsys, "holds no run to resume")
    assert "older attnkit" not in err
    run = tmp_path / "run"
    assert run_cli(["train", "--data", phrase_file, "--out", run, "--max-steps", "2", *TINY], capsys)[0] == 0
    err = refused(["train", "--out", run, "--resume", "--arch", "transformer"], capsys, "--arch transformer",
                  "--arch seq2seq")
    assert "--attention" not in err
