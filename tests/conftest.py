"""Shared fixtures: a seeded generator per test, small tiles for the tiled backend, a tiny generated translation
task (the training and command-line tests). Helpers live in helpers.py."""

from __future__ import annotations

import os

import pytest
import torch

from attnkit.data import Tokenizer, number_phrases
from attnkit.functional.backends import tiled


def pytest_collection_modifyitems(config, items):
    """Markers by place: tests/external/ are "external", tests/gpu/ "gpu", the Chromium tests
    "browser" and "slow" (they start a browser; and they require Chromium)."""
    for item in items:
        path = item.path.as_posix()
        if "/tests/external/" in path:
            item.add_marker(pytest.mark.external)
        if "/tests/gpu/" in path:
            item.add_marker(pytest.mark.gpu)
        if path.endswith("test_viewer_browser.py"):
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.requires("chromium", "playwright"))


def pytest_runtest_setup(item):
    """``@pytest.mark.requires("minilm", ...)``: a test that needs an optional package, weights or a
    browser skips with the reason when it is absent (``pip install -e .[test]`` alone has no weights
    and no Chromium). Under CI (CI set, as .ci/run runs) it fails instead: CI installs everything, so
    a missing dependency there is a broken set-up, never a silently skipped test."""
    from helpers import missing_dependencies

    if item.get_closest_marker("gpu") and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (tests/gpu/ run on the lent device: docs/performance.md)")

    for marker in item.iter_markers("requires"):
        missing = missing_dependencies(*marker.args)
        if missing:
            message = "missing dependency: " + "; ".join(missing)
            if os.environ.get("CI"):
                pytest.fail(message + " (CI installs every dependency: the set-up is broken)", pytrace=False)
            pytest.skip(message)


if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per xdist worker: two workers with two threads each would oversubscribe 2 cores.
    torch.set_num_threads(1)


@pytest.fixture
def nan_rule_on():
    """The NaN rule switched on for the test (attnkit.nan_rule(True)), restored after it: the rule is off by default."""
    import attnkit

    with attnkit.nan_rule(True):
        yield


@pytest.fixture(params=[False, True], ids=["nan_rule_off", "nan_rule_on"])
def nan_rule_setting(request):
    """Each test run twice, with the NaN rule off (the default) and on: what holds for finite inputs holds both ways."""
    import attnkit

    with attnkit.nan_rule(request.param):
        yield request.param


@pytest.fixture
def rng():
    """A fresh, seeded generator per test: fresh random inputs, reproducible failures."""
    return torch.Generator().manual_seed(20261121)


@pytest.fixture
def small_tiles(monkeypatch):
    """Make the tiled backend use many small blocks so that block edges are exercised."""
    monkeypatch.setattr(tiled, "BLOCK_Q", 16)
    monkeypatch.setattr(tiled, "MIN_BLOCK_K", 8)
    monkeypatch.setattr(tiled, "SCORE_BLOCK_ELEMENTS", 16 * 24)


@pytest.fixture(scope="session")
def phrases():
    """(train, valid, test) pairs and word-level (source, target) tokenisers of the number-phrase task."""
    pairs = number_phrases(2200, seed=0)
    train, valid, test = pairs[:1800], pairs[1800:2000], pairs[2000:]
    source = Tokenizer.train([p.source for p in train], kind="word", vocab_size=100, min_frequency=1)
    target = Tokenizer.train([p.target for p in train], kind="word", vocab_size=100, min_frequency=1)
    return train, valid, test, source, target


@pytest.fixture(scope="session")
def phrase_file(tmp_path_factory, phrases):
    """The training pairs as a user's source<TAB>target file."""
    path = tmp_path_factory.mktemp("data") / "phrases.tsv"
    path.write_text("".join(f"{p.source}\t{p.target}\n" for p in phrases[0]), encoding="utf-8")
    return path
