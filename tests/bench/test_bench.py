"""The benchmark harness: what it measures, what it skips and why, and what it writes."""

from __future__ import annotations

import json

import pytest
import torch

import attnkit
from attnkit import bench, masks
from attnkit.bench.attention import _History, _skip_reason
from attnkit.cli import main

TINY = dict(sizes=(64, 128), impls=("torch-sdpa", "naive", "tiled"), repeats=1, min_seconds=0.0)


def test_naive_three_lines_equal_the_reference_backend(rng):
    q, k, v = (torch.randn(1, 2, 9, 8, dtype=torch.float64, generator=rng) for _ in range(3))
    mask = masks.sliding_window(9, 9, 3)
    expected = attnkit.attention(q, k, v, mask=mask, backend="reference").output
    torch.testing.assert_close(bench.naive_attention(q, k, v, mask), expected)


def test_round_robin_times_every_callable_at_least_repeats_times_in_rotating_order():
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in "abc"}
    times = bench.time_round_robin(calls, repeats=4, min_seconds=0.0, warmup_seconds=0.0)
    assert {name: t["repeats"] for name, t in times.items()} == {"a": 4, "b": 4, "c": 4}
    timed = order[3:]  # after one warm-up call each
    firsts = {timed[i] for i in range(0, len(timed), 3)}
    assert firsts == {"a", "b", "c"}, "the first position rotates"


def test_peak_extra_memory_sees_an_allocation_and_not_what_was_already_held():
    held = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MB already resident: not counted
    def allocate():
        return torch.ones(50 << 20).sum()  # 200 MB of float32 touched, then freed
    assert 150 < bench.peak_extra_mb(allocate) < 260
    assert bench.peak_extra_mb(lambda: None) < 20
    del held


def test_skips_are_predicted_from_the_measured_growth():
    config = bench.AttentionBench(max_call_seconds=10.0, max_memory_gb=1.0)
    history = _History()
    key = ("fwd", "float32", "dense", "tiled")
    assert _skip_reason("tiled", "fwd", "float32", "dense", 2048, config, history) is None
    history.add(key, 1024, 1.0)
    history.add(key, 2048, 4.0)  # quadratic growth -> 16 s at 4K
    assert "predicted 16 s" in _skip_reason("tiled", "fwd", "float32", "dense", 4096, config, history)
    linear = _History()
    linear.add(key, 1024, 3.0)
    linear.add(key, 2048, 6.0)  # linear growth -> 12 s at 4K, 6 x 4 s at 8K
    assert linear.predict(key, 4096) == pytest.approx(12.0)
    assert "GiB > max_memory_gb=1" in _skip_reason("naive", "fwd", "float32", "dense", 8192, config, history)
    assert "backward on CPU" in _skip_reason("torch-flex", "fwd+bwd", "float32", "dense", 512, config, history)


@pytest.mark.parametrize(
    "kwargs, words",
    [({"masks": ("dense", "banded")}, "masks must be"), ({"sizes": (0,)}, "sizes must be"),
     ({"impls": ()}, "impls must be"), ({"heads": 0}, "heads must be >= 1"),
     ({"device": "tpu"}, "device must be .cpu. or an available CUDA device, got .tpu.")],
)
def test_bad_configs_are_rejected_with_the_argument_named(kwargs, words):
    with pytest.raises(ValueError, match=words):
        bench.AttentionBench(**kwargs)


@pytest.mark.slow
def test_run_times_and_measures_every_point_in_fresh_processes(tmp_path):
    config = bench.AttentionBench(masks=("window",), modes=("fwd+bwd",), window=16, memory=True,
                                  **dict(TINY, sizes=(96,)))
    seen = []
    report = bench.run(config, on_point=lambda so_far: seen.append(len(so_far["results"])))
    rows = report["results"]
    assert seen == [3] and [r["impl"] for r in rows] == ["torch-sdpa", "naive", "tiled"]
    assert all(r["time_s"] > 0 and r["peak_extra_mb"] is not None for r in rows)
    assert report["machine"]["torch"] == torch.__version__ and report["config"]["window"] == 16
    ratios = {r["impl"]: r["x_sdpa"] for r in bench.ratios(rows)}
    assert ratios["torch-sdpa"] == 1.0 and ratios["tiled"] > 0
    pictures = bench.plot_attention(rows, tmp_path)
    assert sorted(p.name for p in pictures) == ["attention_memory_fwd_bwd_float32.png", "attention_time_fwd_bwd_float32.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in pictures)


@pytest.mark.slow
def test_a_failing_worker_comes_back_as_an_error_not_an_exception():
    result = bench.run_worker("attnkit.bench.attention", {"task": "time"}, timeout=120)
    assert "error" in result and "KeyError" in result["error"]


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


@pytest.mark.slow
def test_the_gpu_generation_benchmark_runs_on_a_cpu_with_the_same_tokens_in_every_row(tmp_path):
    """benchmarks/gpu_generation.py's smoke mode: every row runs (compiled ones through aot_eager)
    and gives transformers' greedy tokens, so the lent GPU's run only has to time it."""
    import importlib.util
    from pathlib import Path

    pytest.importorskip("transformers")
    path = Path(__file__).parents[2] / "benchmarks" / "gpu_generation.py"
    spec = importlib.util.spec_from_file_location("gpu_generation", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "generation.json"
    assert module.main(["--device", "cpu", "--tiny", "--backend", "aot_eager", "--new-tokens", "6", "--repeats", "1",
                        "--dtypes", "float32", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4
    assert all(r["error"] is None and r["same_tokens_as_transformers"] for r in rows), rows
