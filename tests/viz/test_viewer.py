"""The HTML viewer's payload, decoded in Python: top-k entries, quantisation, thumbnails, escaping."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

from attnkit.viz.html import AttentionView, encode_view, write_viewer


def _decode(view: dict):
    shape = (view["layers"], view["heads"], view["L"], view["k"])
    index = np.frombuffer(base64.b64decode(view["index"]), dtype="<u2").reshape(shape)
    weight = np.frombuffer(base64.b64decode(view["weight"]), dtype=np.uint8).reshape(shape) / 255
    thumb = np.frombuffer(base64.b64decode(view["thumb"]), dtype=np.uint8).reshape(view["layers"], view["heads"], view["tq"], view["tk"])
    return index, weight, thumb


def _payload(page: str) -> dict:
    match = re.search(r'<script id="attnkit-data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(match.group(1))


def test_each_row_keeps_its_top_k_weights_quantised_to_1_over_255():
    rng = np.random.default_rng(1)
    w = rng.dirichlet(np.full(40, 0.3), size=(2, 3, 25))  # (layers, H, L, S)
    view = encode_view(AttentionView("cross", [f"q{i}" for i in range(25)], w, keys=[f"k{j}" for j in range(40)]), top_k=6)
    index, weight, thumb = _decode(view)
    expected = np.sort(w, -1)[..., ::-1][..., :6]
    assert np.abs(weight - expected).max() <= 0.5 / 255 + 1e-9
    assert np.abs(np.take_along_axis(w, index.astype(int), -1) - expected).max() <= 1e-6  # the right keys
    assert np.all(np.diff(weight, axis=-1) <= 0)  # largest first
    assert np.allclose(view["coverage"], weight.sum(-1).mean(-1).ravel(), atol=1e-4)
    assert (view["tq"], view["tk"]) == (25, 32)
    assert thumb.reshape(6, -1).max(1).tolist() == [255] * 6  # each head scaled to its own maximum


def test_short_rows_keep_everything_and_thumbnails_pool():
    w = np.zeros((1, 1, 64, 64))
    w[0, 0, np.arange(64), np.arange(64)] = 1.0  # identity: the thumbnail is a 32 x 32 diagonal
    view = encode_view(AttentionView("self", [str(i) for i in range(64)], w), top_k=100)
    index, weight, thumb = _decode(view)
    assert view["k"] == 64 and np.array_equal(index[0, 0, :, 0], np.arange(64)) and np.all(weight[..., 0] == 1)
    assert np.array_equal(thumb[0, 0], 255 * np.eye(32, dtype=np.uint8))


def test_user_text_cannot_escape_the_data_block(tmp_path):
    tokens = ["<script>alert(1)</script>", "</script><script>window.__xss=1</script>", "&amp;", "\u2028", "ok"]
    w = np.full((1, 1, 5, 5), 0.2)
    path = tmp_path / "v.html"
    write_viewer(path, [AttentionView("self <b>", tokens, w)], title="<img src=x onerror=alert(1)>")
    page = path.read_text(encoding="utf-8")
    assert page.count("<script") == 2 and page.count("</script>") == 2  # only the page's own two blocks
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    payload = _payload(page)
    assert payload["views"][0]["queries"] == tokens and payload["title"] == "<img src=x onerror=alert(1)>"


def test_bad_views_raise_naming_the_problem(tmp_path):
    with pytest.raises(ValueError, match=r"need 3 query and 3 key tokens, got 2 and 2"):
        encode_view(AttentionView("v", ["a", "b"], np.ones((1, 1, 3, 3))))
    with pytest.raises(ValueError, match="self-attention needs L == S"):
        encode_view(AttentionView("v", ["a", "b"], np.ones((1, 1, 2, 3))))
    with pytest.raises(ValueError, match=r"\(layers, H, L, S\)"):
        encode_view(AttentionView("v", ["a"], np.ones((1, 1, 1))))
    with pytest.raises(ValueError, match="views is empty"):
        write_viewer(tmp_path / "v.html", [])
    assert not (tmp_path / "v.html").exists()


def test_the_page_comes_from_package_files_and_a_title_is_never_a_placeholder(tmp_path):
    from importlib import resources

    import numpy as np

    from attnkit.viz.html import AttentionView, write_viewer

    folder = resources.files("attnkit.viz") / "viewer"
    script = (folder / "viewer.js").read_text(encoding="utf-8")
    path = tmp_path / "v.html"
    write_viewer(path, [AttentionView("self", ["a", "b"], np.full((1, 1, 2, 2), 0.5))], title="__DATA__ and __SCRIPT__")
    page = path.read_text(encoding="utf-8")
    assert script in page and (folder / "viewer.css").read_text(encoding="utf-8") in page
    assert "<title>__DATA__ and __SCRIPT__</title>" in page and page.count(script) == 1
