"""The benchmark harness: what it measures, what it skips and why, and what it writes."""

from __future__ import annotations

import json

import pytest
import torch

import attnkit
from attnkit import bench, masks
from attnkit.bench.attention import _History, _skip_reason

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


def test_a_gpu_reports_head_names_the_card_and_versions_and_its_end_writes_and_prints(tmp_path, capsys):
    """benchmarks/gpu*.py share these: the head carries machine_info (on a machine without CUDA the card is None),
    the end writes the JSON atomically and prints the table with the card and versions above it."""
    from attnkit.bench.harness import finish_gpu_report, gpu_report

    report = gpu_report(shape={"B": 1}, rows=[1, 2])
    assert report["torch"] == torch.__version__ and report["machine"]["device"] == "cuda"
    assert report["shape"] == {"B": 1} and report["rows"] == [1, 2] and "commit" in report
    out = tmp_path / "r.json"
    finish_gpu_report(out, report, "| a table |")
    assert json.loads(out.read_text())["rows"] == [1, 2]
    printed = capsys.readouterr().out
    assert f"torch {torch.__version__}" in printed and "| a table |" in printed and str(out) in printed


def test_in_mode_runs_forward_without_gradients_and_forward_backward_with_them():
    from attnkit.bench.harness import in_mode

    x = torch.randn(3, requires_grad=True)
    out = in_mode(lambda: x * 2, "fwd")()
    assert not out.requires_grad and x.grad is None
    in_mode(lambda: x * 2, "fwd+bwd")()
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    with pytest.raises(ValueError, match="mode must be"):
        in_mode(lambda: x, "bwd")
