"""What every benchmark shares: round-robin timing, peak memory in a fresh process, machine facts.

Timing: every implementation of one point is called in turn, the order rotating every round,
after a warm-up, until each has at least ``repeats`` calls and ``min_seconds`` of time; medians.
A slow spell of the machine then hits all implementations alike, and ratios taken from the same
rounds are far steadier than the absolute times.

Memory: one call in a fresh process (:func:`run_worker`), after a warm-up that initialises the
libraries; the peak resident set is reset (``/proc/self/clear_refs``) just before the call and
the peak extra memory is the high-water mark minus the resident set before it. On CUDA the
allocator's peak is used instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

import torch

__all__ = ["in_mode", "time_round_robin", "cuda_median_ms", "median_ms", "cuda_back_to_back_ms", "peak_extra_mb", "run_worker", "serve_worker", "machine_info",
           "gpu_report", "finish_gpu_report"]


def in_mode(run: Callable[[], torch.Tensor], mode: str) -> Callable[[], object]:
    """The call a benchmark times for ``run`` (a function returning an output): ``"fwd"`` runs it without
    gradients, ``"fwd+bwd"`` runs it and back-propagates its sum."""
    if mode == "fwd":
        def forward():
            with torch.no_grad():
                return run()
        return forward
    if mode != "fwd+bwd":
        raise ValueError(f"mode must be 'fwd' or 'fwd+bwd', got {mode!r}")

    def forward_backward():
        run().sum().backward()
    return forward_backward


def time_round_robin(
    calls: Mapping[str, Callable[[], object]],
    *,
    repeats: int = 3,
    min_seconds: float = 1.0,
    warmup_seconds: float = 0.5,
    max_repeats: int = 200,
    sync: Callable[[], None] = lambda: None,
) -> dict[str, dict]:
    """Median seconds per call of each callable, timed round-robin in this process.

    Returns ``{name: {"time_s": median, "repeats": count}}``. ``sync`` is called before reading
    the clock (``torch.cuda.synchronize`` on a GPU).
    """
    times: dict[str, list[float]] = {name: [] for name in calls}
    warm_until = time.perf_counter() + warmup_seconds
    while True:  # at least one warm-up call each, more while they are short
        for run in calls.values():
            run()
        sync()
        if time.perf_counter() >= warm_until:
            break
    order = list(calls.items())
    while True:
        order = order[1:] + order[:1]  # rotate: no implementation always runs first
        for name, run in order:
            sync()
            start = time.perf_counter()
            run()
            sync()
            times[name].append(time.perf_counter() - start)
        if all(len(t) >= max_repeats or (len(t) >= repeats and sum(t) >= min_seconds) for t in times.values()):
            break
    return {name: {"time_s": statistics.median(t), "repeats": len(t)} for name, t in times.items()}


def cuda_median_ms(run: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median milliseconds of ``run()`` on the current CUDA stream, timed with CUDA events, after
    ``warmup`` calls (which include any compile)."""
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def median_ms(run: Callable[[], object], repeats: int, device: str, warmup: int = 2) -> float:
    """Median milliseconds of ``run()`` after ``warmup`` calls: CUDA events on a CUDA ``device``
    (:func:`cuda_median_ms`), the host clock elsewhere (a benchmark's smoke run on the CPU)."""
    if device.startswith("cuda"):
        return cuda_median_ms(run, repeats, warmup)
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(1e3 * (time.perf_counter() - started))
    return statistics.median(times)


def cuda_back_to_back_ms(run: Callable[[], object], calls: int, warmup: int = 2) -> float:
    """Milliseconds per call of ``calls`` calls of ``run()`` issued back to back between two CUDA events,
    as a model issues them: the host's per-call work overlaps the kernels of earlier calls, so this is
    the throughput a layer sees, where :func:`cuda_median_ms` times one call alone (its latency)."""
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _trim_heap() -> None:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim(0)``); a no-op elsewhere."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def peak_extra_mb(run: Callable[[], object], device: str = "cpu") -> float:
    """Peak memory (MB) one call of ``run`` needs above what is already held.

    CPU: resident-set high-water mark (Linux); CUDA: the caching allocator's peak. Call it in a
    fresh process, after a warm-up. On the CPU, memory earlier calls freed but the C allocator kept
    resident (glibc keeps chunks below its mmap threshold, up to 32 MiB each, in its heap) is handed back
    first (``malloc_trim``): otherwise a call that reuses it would show no peak at all.
    """
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        return max(0.0, (torch.cuda.max_memory_allocated() - before) / 2**20)
    _trim_heap()
    baseline = _status_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak resident set (VmHWM) to the current one
    run()
    return max(0.0, _status_mb("VmHWM") - baseline)


def run_worker(target: str, spec: Mapping, timeout: float | None = None) -> dict:
    """Run ``python -m target --worker JSON`` (or ``python target ...`` for a ``.py`` script) in a
    fresh process; its last stdout line is the JSON result. A crash, a timeout or an
    out-of-memory kill comes back as ``{"error": "..."}``."""
    entry = [target] if str(target).endswith(".py") else ["-m", target]
    command = [sys.executable, *entry, "--worker", json.dumps(dict(spec))]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit code {done.returncode}"
        if done.returncode < 0:
            reason = f"killed by signal {-done.returncode} (out of memory?)"
        return {"error": reason[:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def serve_worker(spec: str, work: Callable[[dict], dict]) -> int:
    """The worker's side of :func:`run_worker`: ``work`` on the JSON ``spec`` of ``--worker``, its result
    printed as the last stdout line; the exit status 0 (a crash exits non-zero on its own)."""
    print(json.dumps(work(json.loads(spec))))
    return 0


def machine_info(device: str = "cpu") -> dict:
    """Facts a reader needs to compare numbers: CPU or GPU, cores, torch version, threads."""
    info = {
        "platform": platform.platform(),
        "processor": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        info["driver"] = _driver()
        for package in ("triton", "transformers"):
            try:
                info[package] = __import__(package).__version__
            except ImportError:
                info[package] = None
    # The code measured: ATTNKIT_COMMIT where a copy without .git runs (the GPU record), else git's HEAD.
    info["commit"] = os.environ.get("ATTNKIT_COMMIT") or _git_head()
    return info


def gpu_report(**fields) -> dict:
    """The head of a GPU benchmark's JSON: the card, torch, CUDA, the driver, Triton, transformers and the commit
    (:func:`machine_info` on CUDA, whole under ``machine``), then ``fields``."""
    machine = machine_info("cuda")
    return {"device": machine.get("gpu"), "torch": torch.__version__, "cuda": torch.version.cuda,
            "driver": machine.get("driver"), "triton": machine.get("triton"), "transformers": machine.get("transformers"),
            "commit": machine["commit"], "machine": machine, **fields}


def finish_gpu_report(out, report: dict, table: str) -> None:
    """Write ``report`` to ``out`` (atomically), then print the card and versions, ``table`` and where it went."""
    from .._files import write_json

    write_json(out, report)
    print(f"{report['device']}, torch {report['torch']}, CUDA {report['cuda']}\n")
    print(table)
    print(f"\nwritten {out}")


def _driver() -> str | None:
    """The NVIDIA driver's version, from nvidia-smi where it is on the PATH."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def _git_head() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=os.path.dirname(os.path.abspath(__file__)))
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
