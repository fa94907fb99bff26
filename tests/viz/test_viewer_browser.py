"""The HTML viewer in a real browser: Debian's headless Chromium driven by Playwright (which is
pointed at /usr/bin/chromium and never downloads a browser of its own). `make test` installs
Chromium (apt packages chromium and chromium-driver) before running the tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from attnkit.viz.html import AttentionView, write_viewer

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Headless, no sandbox (root in CI), and no background networking: the machine has no network.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
XSS = ["<script>window.__xss=1</script>", '<img src=x onerror="window.__xss=2">']


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    page.close()
    assert not errors, f"JavaScript errors: {errors}"


def _open(page, path: Path):
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("body[data-ready='1']")


def _shown(weight: float) -> float:
    """A weight as the page shows it: quantised to steps of 1/255, printed with 3 decimals."""
    return round(float(np.rint(weight * 255)) / 255, 3)


def _highlighted(page, role: str) -> dict[int, float]:
    found = page.eval_on_selector_all(f".tok.hl[data-role='{role}']", "els => els.map(e => [e.dataset.index, e.dataset.weight])")
    return {int(i): float(w) for i, w in found}


def test_click_a_head_hover_tokens_and_the_script_payload_stays_text(page, tmp_path):
    rng = np.random.default_rng(0)
    L, S = 4, 6
    cross = rng.dirichlet(np.ones(S), size=(2, 3, L)) * 0.5  # rows sum to 0.5 ...
    cross[..., 0] += 0.5  # ... plus 0.5 on the first key, so the chosen head below is told apart
    cross[1, 2, 2] = [0.05, 0.5, 0.02, 0.3, 0.08, 0.05]
    cross[1, 2, :, 3] = [0.05, 0.6, 0.3, 0.05]
    keys = ["In", "the", "beginning", *XSS, "word"]
    queries = ["Au", "commencement", "était", "la parole"]
    self_attn = rng.dirichlet(np.ones(L), size=(2, 2, L))
    path = tmp_path / "viewer.html"
    write_viewer(path, [AttentionView("decoder self", queries, self_attn), AttentionView("cross", queries, cross, keys=keys)],
                 title="test <b>viewer</b>")
    _open(page, path)
    assert page.title() == "test <b>viewer</b>"  # escaped in the source, shown as text
    assert page.locator("#overview canvas").count() == 4  # 2 layers x 2 heads of the first view
    page.select_option("#view", "1")
    assert page.locator("#overview canvas").count() == 6

    page.click("#overview canvas[data-layer='1'][data-head='2']")
    assert page.input_value("#layer") == "1" and page.input_value("#head") == "2"
    assert page.locator("#overview canvas.selected").count() == 1

    page.hover(".tok[data-role='q'][data-index='2']")  # a query: which keys does it attend to?
    assert _highlighted(page, "k") == {1: _shown(0.5), 3: _shown(0.3)}  # the weights >= 0.1
    assert page.eval_on_selector(".tok.top[data-role='k']", "e => e.dataset.index") == "1"
    assert "attends to" in page.text_content("#details")

    page.hover(".tok[data-role='k'][data-index='3']")  # a key: which queries attend to it?
    assert _highlighted(page, "q") == {1: _shown(0.6), 2: _shown(0.3)}
    assert "attended by" in page.text_content("#details")

    for j, payload in enumerate(XSS, 3):  # shown as the literal text, never run
        assert page.text_content(f".tok[data-role='k'][data-index='{j}']") == payload
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.locator("#blocks img, #blocks script").count() == 0

    shot = tmp_path / "viewer.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_responsive_at_512_tokens_12_layers_12_heads(page, tmp_path):
    rng = np.random.default_rng(0)
    L, layers, H = 512, 12, 12
    w = rng.random((layers, H, L, L), dtype=np.float32) ** 16
    w /= w.sum(-1, keepdims=True)
    path = tmp_path / "big.html"
    write_viewer(path, [AttentionView("self", [f"t{i}" for i in range(L)], w)])
    assert path.stat().st_size < 8e6  # top-16 uint8 entries per row: ~5 MB instead of 151 MB of floats
    _open(page, path)
    assert page.locator("#overview canvas").count() == layers * H
    assert page.locator(".tok").count() == L
    page.click("#overview canvas[data-layer='11'][data-head='7']")
    page.hover(".tok[data-index='300']")
    top = int(page.eval_on_selector(".tok.top", "e => e.dataset.index"))
    assert top == int(w[11, 7, 300].argmax())
    page.select_option("#direction", "from")
    page.hover(".tok[data-index='5']")
    page.hover(".tok[data-index='300']")  # now colours what attends to token 300
    weights = page.eval_on_selector_all(".tok[data-weight]", "els => els.map(e => [+e.dataset.index, +e.dataset.weight])")
    kept = np.sort(w[11, 7], -1)[:, -16][:, None]  # a query shows up only if token 300 is in its top 16
    expected = {i for i in range(L) if w[11, 7, i, 300] >= kept[i, 0] and round(w[11, 7, i, 300] * 255) > 0}
    assert {i for i, _ in weights} == expected


def test_a_right_to_left_override_or_a_huge_token_does_not_disturb_its_neighbours(page, tmp_path):
    tokens = ["alpha", "\u202eevil", "beta", "gamma", "x" * 3000, "delta"]
    weights = np.full((1, 1, len(tokens), len(tokens)), 1 / len(tokens))
    path = tmp_path / "viewer.html"
    write_viewer(path, [AttentionView("self", tokens, weights)], title="bidi")
    _open(page, path)
    boxes = page.eval_on_selector_all(".tok[data-role='both']", "els => els.map(e => e.getBoundingClientRect().toJSON())")
    assert len(boxes) == len(tokens)
    # Logical order on screen: each token starts right of where the previous one started (same line) or on a
    # later line; the override inside token 1 does not flip beta and gamma.
    for before, after in zip(boxes, boxes[1:]):
        assert after["top"] > before["top"] + 1 or after["left"] > before["left"]
    assert boxes[4]["width"] < 400  # the 3,000-character token is cut with an ellipsis (full text on hover)
    assert page.get_attribute(".tok[data-role='both'][data-index='4']", "title") == tokens[4]
