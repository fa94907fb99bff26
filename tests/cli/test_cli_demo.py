"""``attnkit demo``: the main job's report, on a small slice of the bundled corpus."""

from __future__ import annotations

import json

import pytest

from attnkit.cli import main

from cli_helpers import assert_probe, probe_ids


@pytest.mark.slow
def test_demo_writes_the_report(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--epochs", "1", "--train-limit", "150", "--test-limit", "60",
                 "--beam", "2", "--quiet"]) == 0
    report = tmp_path / "report"
    assert f"report: {report.resolve()}/README.md" in capsys.readouterr().out
    for name in ("bleu_by_length.png", "loss_curves.png", "bleu_vs_minutes.png"):
        assert (report / name).read_bytes()[:4] == b"\x89PNG"
    pictures = sorted(p.name for p in (report / "alignments").iterdir())
    assert pictures and all(p.startswith("bahdanau-") for p in pictures)  # the bottleneck has no alignment
    results = json.loads((report / "results.json").read_text())
    assert list(results["results"]) == ["bottleneck", "bahdanau"]
    assert results["settings"]["train_pairs"] == 150 and results["settings"]["test_pairs"] == 60
    for result in results["results"].values():
        assert 0 <= result["bleu"] <= 100 and sum(r["sentences"] for r in result["by_length"]) == 60
    text = (report / "README.md").read_text()
    assert "| bottleneck | none |" in text and "| bahdanau | bahdanau |" in text and "![BLEU by source length]" in text
    assert (tmp_path / "runs" / "bahdanau" / "best" / "model.safetensors").is_file()
    for result in results["results"].values():  # --epochs 1: one epoch each (5 steps)
        assert result["epochs"] == 1 and result["stopped"] == "epochs" and result["steps"] == 5
        ((seconds, bleu),) = result["valid_bleu_by_epoch"]
        assert 0 < seconds and 0 <= bleu <= 100
    assert results["settings"]["minutes"] is None and results["settings"]["steps"] == {"bottleneck": 5, "bahdanau": 5}
    assert results["settings"]["epochs"] == 1 and not results["settings"]["figure2"]
    assert "Mode: a fixed amount of training" in text and "the same numbers on the same machine" in text
    five = text.split("## Five test verses")[1].split("## Alignments")[0]
    assert five.count("- reference: ") == 5 and five.count("- bottleneck: ") == 5 and five.count("- bahdanau: ") == 5
    # Quality against length: test + test-long (limited to 60 each), buckets with paired-bootstrap intervals,
    # and the sentence about Figure 2 generated from the numbers.
    assert results["settings"]["test_long_pairs"] == 60
    length = results["quality_by_length"]
    assert sum(row["sentences"] for row in length["buckets"]) == 120
    assert max(row["high"] for row in length["buckets"]) > 25  # the long verses reach past 25 words
    for row in length["buckets"]:
        for name in ("bottleneck", "bahdanau"):
            cells = row["systems"][name]
            assert cells["bleu_ci"] >= 0 and 0 <= cells["chrf"] <= 100
        p = row["systems"]["bahdanau"]["bleu_p"]
        assert p is None or 0 <= p <= 1  # None: the two scored the same in that bucket
    assert "## Quality against sentence length" in text and "bahdanau BLEU [95%]" in text
    assert "BLEU on the longest sources (41-80 words) over BLEU on 11-20-word sources" in text


@pytest.mark.slow
def test_figure2_trains_four_models_for_the_same_steps_and_judges_them(tmp_path, capsys):
    assert main(["demo", "--figure2", "--out", str(tmp_path), "--epochs", "1", "--train-limit", "100",
                 "--test-limit", "40", "--beam", "1", "--quiet"]) == 0
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert list(results["results"]) == ["bottleneck-25", "bahdanau-25", "bottleneck-50", "bahdanau-50"]
    assert results["settings"]["figure2"] and results["settings"]["train_long_pairs"] == 100
    # The same optimiser steps for all four; the long models see 200 pairs, so they stop partway (and are
    # validated there: their best/ is what was tested).
    assert set(results["settings"]["steps"].values()) == {4}
    for name in ("bottleneck-50", "bahdanau-50"):
        result = results["results"][name]
        assert result["stopped"] == "max-steps" and result["max_train_words"] == 50
        assert (tmp_path / "runs" / name / "best" / "model.safetensors").is_file()
    figure2 = results["quality_by_length"]["figure2"]
    assert [row["bucket"] for row in figure2["long_vs_short"]] == ["31-40", "41-50", "51-80"]
    assert all(row["p"] is None or 0 <= row["p"] <= 1 for row in figure2["long_vs_short"])  # None: equal scores
    text = (tmp_path / "report" / "README.md").read_text()
    assert "### Targets of the four-model run" in text and "| bahdanau-50 | bahdanau | <= 50 words |" in text
    # each target judged, or said to be beyond judging (a tiny run's ratio has BLEU 0 below it: no ratio)
    assert text.count("**met**") + text.count("**missed**") + text.count("**cannot tell** (no ratio)") == 5
    for name in ("attention_ratio", "bottleneck_ratio"):
        ratio = figure2[name]["ratio"]
        assert ratio is None or ratio >= 0


def test_figure2_takes_no_models_or_minutes(tmp_path, capsys):
    assert main(["demo", "--figure2", "--models", "bahdanau", "--out", str(tmp_path)]) == 2
    assert "--figure2 trains its own four models" in capsys.readouterr().err
    assert main(["demo", "--figure2", "--minutes", "5", "--out", str(tmp_path)]) == 2
    assert "leave out --minutes" in capsys.readouterr().err


def test_a_budget_too_small_to_train_is_refused(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--minutes", "0.5", "--train-limit", "20", "--quiet"]) == 2
    assert "a budget of 0.5 minutes leaves" in capsys.readouterr().err


PROBES = [
    # (argv with {placeholders}, words the message must contain)
    (["demo", "--out", "/proc/attnkit-probe", "--train-limit", "10"], ["--out", "cannot write"]),
    (["demo", "--beam", "0"], ["--beam"]),
    (["demo", "--epochs", "-1"], ["--epochs"]),
]


@pytest.mark.parametrize("argv, words", PROBES, ids=probe_ids(PROBES))
def test_bad_input_gives_exit_2_and_a_message_naming_it(world, argv, words, capsys):
    assert_probe(argv, world, words, capsys)


@pytest.mark.slow
def test_the_quick_demo_finishes_and_its_report_says_nothing_false(tmp_path, capsys):
    """The quick path crashed after both models trained ('yerr' must not contain negative values: the bars were
    drawn around the point BLEU, the interval around the bootstrap mean); its report gave p = 0.001 where both
    systems scored 0.00 [0.00, 0.00], concluded "does not hold" from NaN ratios, and results.json held bare NaN."""
    assert main(["demo", "--out", str(tmp_path), "--train-limit", "300", "--test-limit", "10", "--epochs", "1",
                 "--beam", "2", "--quiet"]) == 0
    report = tmp_path / "report"
    raw = (report / "results.json").read_text()
    json.loads(raw, parse_constant=lambda name: pytest.fail(f"results.json holds {name}, which is not JSON"))
    results = json.loads(raw)
    text = (report / "README.md").read_text()
    for row in results["quality_by_length"]["buckets"]:
        a, b = (row["systems"][n] for n in ("bottleneck", "bahdanau"))
        if a["bleu"] == b["bleu"]:
            assert b["bleu_p"] is None
    for name, ratio in results["quality_by_length"]["ratios"].items():
        if ratio.get("ratio") is None:  # no ratio (BLEU 0 on short sources): the report says so, judges nothing
            assert f"{name}: no ratio" in text
            assert "does not hold" not in text and "cannot be judged" in text
    assert (report / "bleu_by_length.png").read_bytes()[:4] == b"\x89PNG"


QUICK_DEMO = ["--epochs", "2", "--train-limit", "150", "--test-limit", "30", "--beam", "2", "--quiet"]


def _stop_the_second_model_at_step_6(monkeypatch, signal_name: str) -> None:
    """The demo's training steps, with ``signal_name`` sent to this process at the Bahdanau model's sixth step."""
    import os
    import signal

    from attnkit.training import loop

    real_step = loop._Trainer._step

    def step(self, indices):
        if self.folder.name == "bahdanau" and self.state.step == 6:
            os.kill(os.getpid(), getattr(signal, signal_name))
        return real_step(self, indices)

    monkeypatch.setattr(loop._Trainer, "_step", step)


@pytest.mark.slow
def test_sigterm_stops_a_demo_as_ctrl_c_does_with_143(tmp_path, monkeypatch, capsys):
    """SIGTERM (a job scheduler's stop) while the second model trains: exit 143 (128 + 15), the pointer to --resume, no
    report; the resume that follows is Ctrl-C's (the next test)."""
    _stop_the_second_model_at_step_6(monkeypatch, "SIGTERM")
    assert main(["demo", "--out", str(tmp_path / "split"), *QUICK_DEMO]) == 143
    assert "--resume" in capsys.readouterr().err and not (tmp_path / "split" / "report").exists()
    runs = tmp_path / "split" / "runs"  # the first model's finished run kept, the second's checkpoint saved
    assert (runs / "bottleneck" / "best" / "model.safetensors").is_file()
    assert (runs / "bahdanau" / "last" / "trainer.json").is_file()


@pytest.mark.slow
def test_an_interrupted_demo_stops_with_130_and_resume_finishes_it_as_an_uninterrupted_one(tmp_path, monkeypatch,
                                                                                          capsys):
    """Ctrl-C while the second model trains: the demo stops there (exit 130) and says to --resume; the same
    command with --resume finishes it, with the results of a demo never stopped. A finished demo's --out is
    refused without --resume or --overwrite (its runs and report are kept)."""
    quick = QUICK_DEMO
    assert main(["demo", "--out", str(tmp_path / "whole"), *quick]) == 0
    whole = json.loads((tmp_path / "whole" / "report" / "results.json").read_text())["results"]
    capsys.readouterr()

    _stop_the_second_model_at_step_6(monkeypatch, "SIGINT")
    split = tmp_path / "split"
    assert main(["demo", "--out", str(split), *quick]) == 130
    assert "--resume" in capsys.readouterr().err and not (split / "report").exists()
    monkeypatch.undo()
    assert main(["demo", "--out", str(split), *quick]) == 2  # a stopped demo's runs: --resume or --overwrite
    assert "--resume continues it" in capsys.readouterr().err
    assert main(["demo", "--out", str(split), *quick, "--resume"]) == 0
    resumed = json.loads((split / "report" / "results.json").read_text())["results"]
    for name in ("bottleneck", "bahdanau"):
        assert resumed[name]["steps"] == whole[name]["steps"]
        assert resumed[name]["bleu"] == whole[name]["bleu"] and resumed[name]["best_valid_loss"] == whole[name]["best_valid_loss"]
    assert main(["demo", "--out", str(split), *quick]) == 2
    assert "holds a demo's runs and report" in capsys.readouterr().err
