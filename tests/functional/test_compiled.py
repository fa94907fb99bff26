"""attnkit's compiled plain call (attnkit.functional.compiled, plain.cpp): SDPA's own numbers, the NaN rule's rows,
gradients and errors exactly as the Python path gives them; its guards (autocast, a torch.func transform, a torch
function mode) agreeing with torch's own answers; and its loader and builder (switched off, missing, corrupt,
another torch, an interrupted build)."""

from __future__ import annotations

import importlib
import math
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import attnkit
from attnkit.functional import compiled

from helpers import OpsSeen

module = importlib.import_module("attnkit.functional.attention")
needs_compiled = pytest.mark.requires("compiled")


def both_paths(monkeypatch, call):
    """``call()`` with the compiled plain call, then with the Python path."""
    first = call()
    monkeypatch.setattr(module, "_compiled_plain", None)
    second = call()
    monkeypatch.undo()
    return first, second


@needs_compiled
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_random_calls_with_nans_give_the_python_paths_outputs_bit_for_bit(dtype, monkeypatch):
    """Random shapes (1 to 20 keys: below and above the look's threshold; one query among them, a decoding step),
    causal or not, aligned top-left or bottom-right, with no NaN or a NaN at a random place of q, k or v: the same
    output as the Python path, NaN for NaN, bit for bit; and the float64 oracle's where there is no NaN."""
    generator = torch.Generator().manual_seed(20261128)
    for case in range(60):
        B, H, E = (int(torch.randint(1, n, (), generator=generator)) for n in (3, 4, 17))
        L, S = (int(torch.randint(1, 21, (), generator=generator)) for _ in range(2))
        L = 1 if case % 5 == 0 else S if case % 5 == 1 else L
        is_causal = bool(case % 2)
        causal_align = ("top-left", "bottom-right")[case % 3 == 0]
        q, k, v = (torch.randn(B, H, n, E, generator=generator).to(dtype) for n in (L, S, S))
        where = case % 4
        if where:
            target = (q, k, v)[where - 1]
            place = tuple(int(torch.randint(0, n, (), generator=generator)) for n in target.shape)
            target[place] = float("nan")
        got, want = both_paths(monkeypatch, lambda: attnkit.attention(q, k, v, is_causal=is_causal,
                                                                      causal_align=causal_align).output)
        assert torch.equal(got.isnan(), want.isnan()), (case, B, H, L, S, E, is_causal, causal_align, where)
        assert torch.equal(got.nan_to_num(), want.nan_to_num()), case
        if not where:
            offset = S - L if causal_align == "bottom-right" else 0
            allowed = torch.arange(S) <= torch.arange(L)[:, None] + offset if is_causal else None
            oracle = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=allowed)
            tolerance = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 2e-2)
            torch.testing.assert_close(got.double().nan_to_num(), oracle.nan_to_num(), rtol=tolerance, atol=tolerance)


@needs_compiled
def test_gradients_are_the_python_paths():
    """The compiled call runs torch's own op under autograd: the same gradients for q, k and v."""
    generator = torch.Generator().manual_seed(3)
    inputs = [torch.randn(2, 3, 12, 8, generator=generator, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    grads = []
    for compiled_plain in (module._compiled_plain, None):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(module, "_compiled_plain", compiled_plain)
            out = attnkit.attention(*inputs, is_causal=True).output
            grads.append(torch.autograd.grad(out.square().sum(), inputs))
    for got, want in zip(*grads):
        assert torch.equal(got, want)


class Seen(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.functions = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.functions.append(func)
        return func(*args, **(kwargs or {}))


def _guards_answer(q) -> tuple[bool, bool]:
    """(whether the compiled call stepped aside, whether torch says autocast, a transform or a function mode is on)."""
    torch_says = (torch._C._is_any_autocast_enabled() or torch._C._are_functorch_transforms_active()
                  or torch._C._is_torch_function_mode_enabled())
    return compiled.plain(q, q, q, False, "top-left") is None, torch_says


@needs_compiled
@pytest.mark.parametrize("context", ["none", "autocast", "autocast off", "function mode", "device", "dispatch mode",
                                     "vmap", "grad", pytest.param("jvp", marks=pytest.mark.slow),  # (0.3 s: first jvp)
                                     "functionalize"])
def test_the_compiled_guards_answer_as_torch_does(context):
    """Under autocast, a torch.func transform or a torch function mode (torch.device's among them) the compiled
    call steps aside, exactly where torch._C says one is on; a dispatch mode (which sees the ops either way) and
    autocast switched off leave it in place."""
    q = torch.randn(1, 2, 16, 8)
    answers = []

    def look(x):
        answers.append(_guards_answer(x))
        return x.sin()

    if context in ("vmap", "grad", "jvp", "functionalize"):
        transform = {"vmap": lambda: torch.func.vmap(look)(q[None]),
                     "grad": lambda: torch.func.grad(lambda x: look(x).sum())(q),
                     "jvp": lambda: torch.func.jvp(look, (q,), (q,)),
                     "functionalize": lambda: torch.func.functionalize(look)(q)}[context]
        transform()
    else:
        manager = {"none": lambda: torch.autocast("cpu", enabled=False), "autocast off": lambda: torch.autocast(
            "cpu", enabled=False), "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
                   "function mode": Seen, "device": lambda: torch.device("cpu"),
                   "dispatch mode": OpsSeen}[context]()
        if context == "none":
            answers.append(_guards_answer(q))
        else:
            with manager:
                answers.append(_guards_answer(q))
        if context == "dispatch mode":  # the compiled call's ops went through the dispatcher, and the mode saw them
            assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in manager.seen
    stepped_aside, torch_says = answers[0]
    assert stepped_aside == torch_says
    assert stepped_aside == (context not in ("none", "autocast off", "dispatch mode"))


@needs_compiled
def test_a_function_mode_still_sees_sdpa_and_autocast_and_vmap_give_the_python_paths_outputs(monkeypatch):
    """Where the compiled call steps aside the checked path runs: a TorchFunctionMode sees F.sdpa as before, and
    calls under autocast and vmap equal the Python path's."""
    q, k, v = (torch.randn(2, 2, 16, 8) for _ in range(3))
    with Seen() as seen:
        attnkit.attention(q, k, v)
    assert F.scaled_dot_product_attention in seen.functions

    def under_autocast():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return attnkit.attention(q, k, v, is_causal=True).output

    got, want = both_paths(monkeypatch, under_autocast)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    queries = torch.randn(3, 2, 2, 16, 8)
    got, want = both_paths(monkeypatch, lambda: torch.func.vmap(lambda x: attnkit.attention(x, k, v).output)(queries))
    assert torch.equal(got, want)


@needs_compiled
@pytest.mark.parametrize("L, is_causal, causal_align, steps_aside", [
    (6, True, "top-left", False), (6, True, "bottom-right", False), (1, True, "bottom-right", False),
    (4, True, "bottom-right", True), (4, False, "bottom-right", False), (4, True, "bottom", True),
    (4, False, None, True)], ids=str)
def test_the_alignment_is_settled_in_cpp_as_plain_causal_settles_it(L, is_causal, causal_align, steps_aside,
                                                                      monkeypatch):
    """Bottom-right is top-left where L = S and no mask for one query; a bottom-right causal call with 1 < L < S needs
    a mask and steps aside, and so does an alignment that is not one (the checked path names it): the same numbers
    or error as the Python path."""
    q, k, v = torch.randn(1, 2, L, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    assert (compiled.plain(q, k, v, is_causal, causal_align) is None) == steps_aside

    def call():
        try:
            return attnkit.attention(q, k, v, is_causal=is_causal, causal_align=causal_align).output
        except (TypeError, ValueError) as error:
            return f"{type(error).__name__}: {error}"

    got, want = both_paths(monkeypatch, call)
    assert (got == want) if isinstance(want, str) else torch.equal(got, want)


@needs_compiled
def test_other_head_shapes_step_aside_for_the_checked_path(monkeypatch):
    """Fewer key than query heads, another batch, another value width, rank 3 or an empty size: None from the
    compiled call, and attention() answers as the Python path does (numbers or the named error)."""
    r = torch.randn
    cases = {"gqa": (r(1, 4, 6, 8), r(1, 2, 6, 8), r(1, 2, 6, 8)), "Ev": (r(1, 2, 6, 8), r(1, 2, 6, 8), r(1, 2, 6, 4)),
             "batch": (r(2, 2, 6, 8), r(1, 2, 6, 8), r(1, 2, 6, 8)), "rank 3": (r(2, 6, 8),) * 3,
             "empty": (r(0, 2, 6, 8),) * 3}
    for name, (q, k, v) in cases.items():
        assert compiled.plain(q, k, v, False, "top-left") is None, name

        def call(q=q, k=k, v=v):
            try:
                return attnkit.attention(q, k, v).output
            except (TypeError, ValueError) as error:
                return f"{type(error).__name__}: {error}"

        got, want = both_paths(monkeypatch, call)
        assert (got == want) if isinstance(want, str) else torch.equal(got, want), name


def test_switched_off_missing_or_corrupt_it_is_not_loaded_and_says_why(tmp_path, monkeypatch):
    """ATTNKIT_COMPILED=0 and a library not built give None; a bad switch is named; a library that does not load, and
    one built for another source or torch where none is for this one, are a RuntimeWarning naming it (the Python
    path runs)."""
    monkeypatch.setenv(compiled.DIRECTORY_VARIABLE, str(tmp_path))
    assert compiled.load() is None  # not built there
    monkeypatch.setenv(compiled.SWITCH_VARIABLE, "yes")
    with pytest.raises(ValueError, match="ATTNKIT_COMPILED takes 0 or 1, got 'yes'"):
        compiled.load()
    monkeypatch.setenv(compiled.SWITCH_VARIABLE, "1")
    compiled.library().write_bytes(b"not a shared library")
    monkeypatch.delitem(compiled.sys.modules, compiled.library().name.split(".")[0], raising=False)  # (loaded here)
    with pytest.warns(RuntimeWarning, match="does not load.*attnkit build-ext"):
        assert compiled.load() is None
    monkeypatch.setenv(compiled.SWITCH_VARIABLE, "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compiled.load() is None
    monkeypatch.setenv(compiled.SWITCH_VARIABLE, "1")
    stale = compiled.library().with_name("attnkit_plain_0123456789abcdef.so")
    compiled.library().rename(stale)  # a build for another source or torch, none for this one
    with pytest.warns(RuntimeWarning, match="built for another source or torch .*attnkit_plain_0123456789abcdef"):
        assert compiled.load() is None


def test_a_library_built_for_another_torch_is_never_looked_for(monkeypatch):
    """The library's name carries a tag of the source, torch's build and Python: another torch, another name."""
    here = compiled.library()
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert compiled.library() != here and compiled.library().parent == here.parent


def test_the_build_moves_a_whole_library_into_place_or_nothing(tmp_path, monkeypatch):
    """The build runs in a temporary folder and the library lands in one rename; a failed build leaves no library
    and no folder behind, and PATH as it was."""
    from torch.utils import cpp_extension

    monkeypatch.setenv(compiled.DIRECTORY_VARIABLE, str(tmp_path))
    path = compiled.library()
    seen = {}

    def fake_load(name, sources, build_directory, **options):
        seen["PATH"] = compiled.os.environ["PATH"]
        (compiled.Path(build_directory) / path.name).write_bytes(b"library")

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    before = compiled.os.environ["PATH"]
    assert compiled.build(progress=True) == path and path.read_bytes() == b"library"
    assert not any(thread.name == "attnkit build-ext ticker" for thread in threading.enumerate())  # (it has ended)
    assert seen["PATH"].startswith(compiled.sysconfig.get_path("scripts")) and compiled.os.environ["PATH"] == before
    path.unlink()

    def failing_load(name, sources, build_directory, **options):
        (compiled.Path(build_directory) / path.name).write_bytes(b"half")
        raise RuntimeError("Error building extension")

    monkeypatch.setattr(cpp_extension, "load", failing_load)
    with pytest.raises(RuntimeError, match="Error building extension"):
        compiled.build()
    assert list(tmp_path.iterdir()) == [] and compiled.os.environ["PATH"] == before


@needs_compiled
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_the_compiled_scan_finds_every_nan_and_nothing_else(dtype):
    """nan.holds_nan's compiled scan (the elements' bits, SSE2 lanes and the rest one by one): True exactly where a
    NaN is, of either sign and any payload, at every position of tensors of 1 to 37 elements (whole lanes and tails)
    and at the ends of larger ones on both sides of the size where the maximum takes over, contiguous, transposed,
    a view with an offset and a strided view (read through the maximum); infinities, the largest finite values and
    subnormals are no NaN; an empty tensor holds none."""
    from attnkit.functional import nan

    assert nan._scan is compiled.holds_nan
    info = torch.finfo(dtype)
    specials = [math.inf, -math.inf, info.max, -info.max, info.tiny / 2, -0.0]
    bits = {torch.float64: torch.int64, torch.float32: torch.int32}.get(dtype, torch.int16)
    exponent = {torch.float64: 0x7FF0000000000000, torch.float32: 0x7F800000, torch.bfloat16: 0x7F80,
                torch.float16: 0x7C00}[dtype]
    nans = [torch.tensor([exponent | 1], dtype=bits).view(dtype), torch.tensor([-1], dtype=bits).view(dtype),
            torch.tensor([float("nan")], dtype=dtype)]  # the least payload, a negative NaN with every bit set, torch's
    for n in (*range(1, 38), 2048, 2049, 16384, 16385, 70000):
        x = torch.linspace(-3, 3, n).to(dtype)
        assert not compiled.holds_nan(x), n
        for index in (range(n) if n < 38 else (0, n // 2, n - 1)):
            for nan_value in nans:
                y = x.clone()
                y[index] = nan_value[0]
                assert compiled.holds_nan(y), (n, index)
            for special in specials:
                y = x.clone()
                y[index] = special
                assert not compiled.holds_nan(y), (n, index, special)
    grid = torch.randn(6, 40).to(dtype)
    views = {"transposed": lambda t: t.t(), "offset": lambda t: t[1:], "strided": lambda t: t[:, ::2]}
    for name, view in views.items():
        assert not compiled.holds_nan(view(grid)), name
        poisoned = grid.clone()
        view(poisoned)[-1, -1] = math.nan
        assert compiled.holds_nan(view(poisoned)), name
    outside = grid.clone()
    outside[0, 1] = math.nan  # a NaN the strided view does not hold
    assert not compiled.holds_nan(outside[:, ::2])
    assert not compiled.holds_nan(torch.empty(0, dtype=dtype))


@needs_compiled
def test_the_scan_reads_only_tensors_in_cpu_memory(monkeypatch):
    """A FakeTensor (a Python subclass whose storage is meta: no memory to read) goes to torch's own maximum, which
    raises torch's data-dependent error as the Python path's look did, and never to the scan (it read address 0
    there before this was asked)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.randn(4, 8)
        with pytest.raises(torch._subclasses.fake_tensor.DataDependentOutputException):
            compiled.holds_nan(x)

        def call():
            try:
                return attnkit.attention(x[None, None], x[None, None], x[None, None]).output
            except torch._subclasses.fake_tensor.DataDependentOutputException as error:
                return type(error).__name__

        assert both_paths(monkeypatch, call) == ("DataDependentOutputException",) * 2


@needs_compiled
@pytest.mark.parametrize("mode", ["inference_mode", "no_grad", "views", "threads"])
def test_inference_mode_no_grad_views_and_threads_give_the_python_paths_outputs(mode, monkeypatch):
    """Under inference_mode and no_grad, on q, k and v that are transposed views of one packed projection (as the
    layers make them), and from four threads at once (the C++ call lets go of the GIL around SDPA): the Python
    path's outputs, bit for bit."""
    import contextlib
    from concurrent.futures import ThreadPoolExecutor

    generator = torch.Generator().manual_seed(11)
    packed = torch.randn(2, 24, 3 * 4 * 16, generator=generator)
    q, k, v = (x.contiguous() for x in packed.view(2, 24, 3, 4, 16).permute(2, 0, 3, 1, 4))
    if mode == "views":
        q, k, v = packed.view(2, 24, 3, 4, 16).permute(2, 0, 3, 1, 4).unbind(0)
        assert not q.is_contiguous()
    context = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad}.get(mode, contextlib.nullcontext)

    def call():
        with context():
            if mode != "threads":
                return attnkit.attention(q, k, v, is_causal=True).output
            with ThreadPoolExecutor(4) as pool:
                outputs = list(pool.map(lambda i: attnkit.attention(q, k, v, is_causal=bool(i % 2)).output, range(64)))
            return torch.stack(outputs)

    got, want = both_paths(monkeypatch, call)
    assert torch.equal(got, want)
