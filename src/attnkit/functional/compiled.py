"""attnkit's one compiled piece (``plain.cpp``): the plain CPU call and the NaN rule's look, built on demand and
loaded where it was built.

A tiny CPU call of :func:`attnkit.attention` is mostly host time around SDPA's kernel: the checks of its
arguments and the NaN rule's one look (:mod:`.nan`). In Python a 16-token call costs 1.45-1.48x SDPA, in C++
1.12-1.16x (benchmarks/results/overhead_ab_2026-11-28_fifteenth/), so the commonest call (q (B, H, L, E), k and v
(B, H, S, E), nothing else asked but ``is_causal`` and ``causal_align``) has a compiled twin of
:func:`.plain.one_head_shape`, and the rule's look at a CPU tensor (:func:`.nan.holds_nan`) a compiled scan. It is
optional: without it (no C++ compiler, not built yet, ``ATTNKIT_COMPILED=0``) the same call takes the Python path,
with the same numbers, errors and NaN rows (tests/functional/test_compiled.py holds the two together).

``attnkit build-ext`` (or :func:`build`) compiles it with PyTorch's own extension builder (a C++ compiler and
ninja), once per torch build, Python and source: it lands in ``$ATTNKIT_EXT_DIR`` or ``~/.cache/attnkit/ext``
under a tag of those, so a library built for another torch is never loaded. attnkit loads it at import when it is
there and never compiles anything by itself. The Makefile's set-up builds it (with the ``compiled`` extra's ninja).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import tempfile
import threading
import warnings
from pathlib import Path
from types import ModuleType

import torch

__all__ = ["SOURCE", "build", "directory", "holds_nan", "library", "load", "loaded", "module", "plain"]

SOURCE = Path(__file__).with_name("plain.cpp")
"""The C++ source, shipped with the package."""

DIRECTORY_VARIABLE = "ATTNKIT_EXT_DIR"
SWITCH_VARIABLE = "ATTNKIT_COMPILED"


def _tag() -> str:
    """What the built library depends on: the source, torch's build, the C++ ABI, Python and the platform."""
    parts = [SOURCE.read_bytes(), torch.__version__.encode(), str(torch.version.git_version).encode(),
             str(torch._C._GLIBCXX_USE_CXX11_ABI).encode(), sys.implementation.cache_tag.encode(),
             sysconfig.get_platform().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _name() -> str:
    return f"attnkit_plain_{_tag()}"


def directory() -> Path:
    """Where :func:`build` puts the library and :func:`load` looks for it."""
    root = os.environ.get(DIRECTORY_VARIABLE) or Path.home() / ".cache" / "attnkit" / "ext"
    return Path(root)


def library() -> Path:
    """The built library's path for this source, torch and Python (it may not exist)."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[-1]  # ".so" on Linux and macOS, what torch's builder writes
    return directory() / f"{_name()}{suffix}"


def load() -> ModuleType | None:
    """The built module, or None where it is switched off (``ATTNKIT_COMPILED=0``) or not built. A library that is
    there but does not load, and one built for another source or torch where none is built for this one, are a
    warning naming them (rebuild with ``attnkit build-ext``), and the Python path runs."""
    switch = os.environ.get(SWITCH_VARIABLE, "1")
    if switch not in ("0", "1"):
        raise ValueError(f"{SWITCH_VARIABLE} takes 0 or 1, got {switch!r}")
    if switch == "0":
        return None
    path = library()
    if not path.is_file():
        others = sorted(other.name for other in path.parent.glob("attnkit_plain_*") if other.name != path.name)
        if others:  # built before, for another source or torch: say so rather than run slower unseen
            warnings.warn(f"attnkit's compiled plain call in {path.parent} is built for another source or torch "
                          f"({', '.join(others)}), not for this one; the Python path runs. Build it with "
                          "`attnkit build-ext` (or set ATTNKIT_COMPILED=0)", RuntimeWarning, stacklevel=2)
        return None
    name = path.name.split(".")[0]
    if name in sys.modules:
        return sys.modules[name]
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError) as error:
        warnings.warn(f"attnkit's compiled plain call at {path} does not load ({error}); the Python path runs. "
                      "Rebuild it with `attnkit build-ext`", RuntimeWarning, stacklevel=2)
        return None
    sys.modules[name] = module
    return module


@contextlib.contextmanager
def _ticking(show: bool, description: str):
    """A progress bar that shows the time elapsed while the block runs (one step of unknown length), when ``show``."""
    from .._progress import progress_bar

    bar = progress_bar(total=None, progress=show, desc=description, bar_format="{desc}: {elapsed}")
    stop = threading.Event()
    ticker = threading.Thread(target=lambda: [bar.refresh() for _ in iter(lambda: stop.wait(0.5), True)], daemon=True,
                              name="attnkit build-ext ticker")
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
        bar.close()


def build(verbose: bool = False, progress: bool = False) -> Path:
    """Compile ``plain.cpp`` with ``torch.utils.cpp_extension`` (a C++ compiler and ninja) and put the library in
    :func:`directory`; its path. The build runs in a temporary folder beside it and the library is moved into place
    in one rename, so a crash or Ctrl-C leaves either no library or a whole one. ``progress`` shows the time elapsed
    (not with ``verbose``, whose compiler output would run through it)."""
    from torch.utils import cpp_extension

    target = library()
    target.parent.mkdir(parents=True, exist_ok=True)
    path = os.environ.get("PATH", "")
    # torch's builder runs `ninja` from PATH: the ninja package installed beside this Python comes first
    os.environ["PATH"] = os.pathsep.join([sysconfig.get_path("scripts"), path])
    try:
        with (tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as folder,
              _ticking(progress and not verbose, f"compiling {SOURCE.name}")):
            cpp_extension.load(_name(), [str(SOURCE)], extra_cflags=["-O2"], build_directory=folder, verbose=verbose,
                               is_python_module=True)
            os.replace(Path(folder) / target.name, target)
    finally:
        os.environ["PATH"] = path
    return target


def loaded() -> bool:
    """Whether attention() calls the compiled plain call in this process."""
    return module is not None


module = load()
"""The loaded module, or None. Its ``plain(q, k, v, is_causal, causal_align)`` answers None, the output, or (output,
causal) (attention.py); ``holds_nan(x)`` is :func:`.nan.holds_nan`'s scan; ``configure(min_keys)`` takes the
NaN rule's thresholds, which :mod:`.nan` gives it when it loads (until then no look settles a call)."""

plain = None if module is None else module.plain
holds_nan = None if module is None else module.holds_nan
