"""``attnkit bench``: JSON, plots and markdown, the context-parallel benchmark, refusals."""

from __future__ import annotations

import json
import os

import pytest
import torch

from attnkit.cli import main

from cli_helpers import assert_probe, fill, probe_ids, refused


@pytest.mark.slow
def test_cli_writes_json_and_plots_and_renders_markdown(tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(["bench", "--out", str(out), "--sizes", "64", "128", "--masks", "causal", "padding",
                 "--impls", "torch-sdpa", "auto", "--repeats", "1", "--min-seconds", "0", "--no-memory", "--quiet"])
    assert code == 0
    report = json.loads((out / "attention.json").read_text())
    assert {(r["mask"], r["n"], r["impl"]) for r in report["results"]} == {
        (m, n, i) for m in ("causal", "padding") for n in (64, 128) for i in ("torch-sdpa", "auto")
    }
    assert (out / "attention_time_fwd_float32.png").exists()
    printed = capsys.readouterr().out
    assert "x sdpa" in printed and "causal" in printed
    assert main(["bench", "--render", str(out / "attention.json")]) == 0
    markdown = capsys.readouterr().out
    assert markdown.startswith("| mode | dtype | mask | n | torch-sdpa | auto |")
    assert "| fwd | float32 | padding | 128 |" in markdown


def test_cli_bad_size_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:  # refused by argparse, before any work
        main(["bench", "--out", str(tmp_path), "--sizes", "0", "--quiet"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "argument --sizes: expected an integer in [1, 16,777,216], got 0" in err and "Traceback" not in err


@pytest.mark.slow
def test_cli_json_records_machine_and_config(tmp_path):
    out = tmp_path / "bench"
    assert main(["bench", "--out", str(out), "--sizes", "32", "--masks", "dense", "--impls", "torch-sdpa",
                 "--repeats", "1", "--min-seconds", "0", "--no-memory", "--quiet", "--heads", "2"]) == 0
    report = json.loads((out / "attention.json").read_text())
    assert report["machine"]["threads"] == torch.get_num_threads() and report["config"]["heads"] == 2


@pytest.mark.slow
def test_context_parallel_bench_counts_bytes_and_balance(tmp_path, capsys):
    from attnkit.cli import main

    assert main(["bench", "--context-parallel", "64", "--worlds", "1", "2", "--heads", "2", "--head-dim", "8",
                 "--out", str(tmp_path), "--quiet"]) == 0
    assert "| W | layout |" in capsys.readouterr().out
    rows = json.loads((tmp_path / "context_parallel.json").read_text())["results"]
    assert [(r["world"], r["layout"]) for r in rows] == [(1, "zigzag"), (2, "zigzag"), (2, "contiguous")]
    assert rows[0]["rank_sent_bytes"] == [0] and rows[0]["formula_sent_bytes"] == 0
    for row in rows[1:]:  # one hop of k, v (2 x 32 x 8 float32 each) and 32 int64 positions
        assert row["rank_sent_bytes"] == [row["formula_sent_bytes"]] * 2 == [2 * 2 * 32 * 8 * 4 + 32 * 8] * 2
    zigzag, contiguous = rows[1], rows[2]
    assert zigzag["pair_balance"] == 1.0  # chunks 0 + 3 and 1 + 2 of 16: 1,040 causal pairs each
    assert contiguous["pair_balance"] == sum(range(33, 65)) / sum(range(1, 33))
    assert main(["bench", "--context-parallel", "60", "--worlds", "4", "--out", str(tmp_path)]) == 2
    assert "multiple of 2 x W = 8" in capsys.readouterr().err


def test_bench_render_escapes_and_handles_no_rows():
    from attnkit.bench.report import format_markdown

    assert format_markdown([]) == "(no results)"
    table = format_markdown([{"mode": "fwd", "dtype": "f|32", "mask": "<b>x</b>", "n": 8, "impl": "sdpa",
                              "time_s": 0.001}])
    assert "f\\|32" in table and "&lt;b&gt;" in table and "<b>" not in table


def test_context_parallel_bench_is_capped_by_the_machine(tmp_path, capsys):

    refused(["bench", "--context-parallel", "128", "--worlds", "64", "--out", tmp_path / "b"], capsys, "--worlds 64",
             f"{os.cpu_count()} cores")


PROBES = [
    # (argv with {placeholders}, words the message must contain)
    (["bench", "--render", "{bad-bench.json}"], ["not valid JSON"]),
    (["bench", "--render", "{nonresults.json}"], ["--render", "malformed"]),
    (["bench", "--render", "{root}/nothing.json"], ["--render", "no such file"]),
    (["bench", "--out", "/proc/attnkit-probe", "--sizes", "8"], ["--out", "cannot write"]),
]


@pytest.mark.parametrize("argv, words", PROBES, ids=probe_ids(PROBES))
def test_bad_input_gives_exit_2_and_a_message_naming_it(world, argv, words, capsys):
    assert_probe(argv, world, words, capsys)


@pytest.mark.parametrize("argv, words", [
    (["bench", "--context-parallel", "64", "--sizes", "8", "--out", "{tmp}/f"], ["--sizes", "--context-parallel"]),
    (["bench", "--context-parallel", "64", "--masks", "causal", "--out", "{tmp}/g"], ["--masks"]),
    (["bench", "--sizes", "8", "--worlds", "2", "--out", "{tmp}/h"], ["--worlds", "--context-parallel only"]),
])
def test_an_option_that_would_do_nothing_is_refused(argv, words, run, phrase_file, tmp_path, capsys):
    files = {"pairs": phrase_file, "run": run, "tmp": tmp_path}
    refused(fill(argv, files), capsys, *words)
