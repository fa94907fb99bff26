"""matplotlib pictures: every plot writes a real PNG or SVG, rejects bad shapes, thins labels."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from attnkit import viz

pytest.importorskip("matplotlib")


def _png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    return data


@pytest.mark.slow
def test_alignment_head_grid_and_overview_write_png_and_svg(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.dirichlet(np.ones(7), size=(3, 4, 5))  # (layers, H, L, S)
    viz.plot_heatmap(w[0, 0], tmp_path / "head.png", x_labels=list("abcdefg"), y_labels=list("vwxyz"), annotate=True)
    viz.plot_heatmap(w[0, 0], tmp_path / "head.svg", x_labels=list("abcdefg"), y_labels=list("vwxyz"))
    viz.plot_heads(w[1], tmp_path / "grid.png", x_labels=list("abcdefg"), y_labels=list("vwxyz"))
    viz.plot_overview(w, tmp_path / "overview.png", title="3 layers x 4 heads")
    viz.plot_head_values({"previous": w[..., 0, 0], "entropy": w[..., 1, 1]}, tmp_path / "roles.png")
    viz.plot_distributions({"a": [0.1, 0.2, -0.3], "b": [0.5]}, tmp_path / "dist.png", x_title="rho")
    for name in ("head.png", "grid.png", "overview.png", "roles.png", "dist.png"):
        _png(tmp_path / name)
    svg = (tmp_path / "head.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg


def test_the_overview_is_one_image_each_thumbnail_on_its_own_scale():
    """Layers down, heads across, each head's map scaled to its own least and greatest value (a flat one all dark),
    blank gaps between the thumbnails, the heads named above and the layers (or their given names) beside."""
    rng = np.random.default_rng(2)
    w = rng.random((3, 2, 4, 5)) * np.array([1.0, 100.0])[:, None, None]  # (layers, H, L, S); head 1's scale 100x
    w[2, 0] = 0.25  # a flat map
    figure = viz.plot_overview(w, layer_names=["a", "b", "c"]).figure
    (ax,) = figure.axes
    mosaic = ax.images[0].get_array()
    gap = 1
    for layer in range(3):
        for head in range(2):
            cell = mosaic[layer * (4 + gap):layer * (4 + gap) + 4, head * (5 + gap):head * (5 + gap) + 5]
            expected = w[layer, head] - w[layer, head].min()
            expected = expected / expected.max() if expected.max() > 0 else expected
            np.testing.assert_allclose(cell, expected, rtol=1e-12, atol=1e-12)
    assert mosaic.mask[4].all() and mosaic.mask[:, 5].all()  # the gaps: drawn blank
    assert [t.get_text() for t in ax.get_xticklabels()] == ["head 0", "head 1"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]


def test_the_overviews_nan_cells_are_blank_and_the_rest_keeps_its_scale():
    w = np.arange(2 * 2 * 3 * 3, dtype=np.float64).reshape(1, 4, 3, 3)[:, :2]  # (1 layer, 2 heads, 3, 3)
    w = np.concatenate([w, w], axis=1)  # four heads
    w[0, 1, 0, 0] = np.nan  # one NaN cell
    w[0, 2] = np.nan  # a head of NaN only
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about
        mosaic = viz.plot_overview(w).figure.axes[0].images[0].get_array()
    gap = 1
    head = lambda h: mosaic[:3, h * (3 + gap):h * (3 + gap) + 3]  # noqa: E731
    assert head(1).mask[0, 0] and not head(1).mask.ravel()[1:].any()
    np.testing.assert_allclose(head(1).ravel()[1:], (w[0, 1].ravel()[1:] - 10.0) / 7.0)  # its least 10, greatest 17
    assert head(2).mask.all()
    np.testing.assert_allclose(head(3), (w[0, 3] - w[0, 3].min()) / np.ptp(w[0, 3]))


@pytest.mark.slow  # three grids drawn: about a second
def test_a_head_grid_labels_keys_under_each_column_and_queries_beside_the_first():
    """Every panel shows the same tokens: keys under the lowest panel of each column, queries left of the first
    column, none elsewhere (nine times the text made a 30-layer inspect draw for minutes); a label list of the
    wrong length is still refused by name."""
    rng = np.random.default_rng(1)
    w = rng.dirichlet(np.ones(6), size=(6, 5))  # (H, L, S): 2 rows of 4 panels, the last two empty
    keys, queries = [f"k{i}" for i in range(6)], [f"q{i}" for i in range(5)]
    figure = viz.plot_heads(w, x_labels=keys, y_labels=queries).figure
    panels = [ax for ax in figure.axes if ax.get_title().startswith("head")]
    assert len(panels) == 6
    for h, ax in enumerate(panels):
        x = [t.get_text() for t in ax.get_xticklabels()]
        y = [t.get_text() for t in ax.get_yticklabels()]
        assert x == (keys if h + 4 >= 6 else []), f"head {h}: {x}"  # heads 2..5 are the lowest of their columns
        assert y == (queries if h % 4 == 0 else []), f"head {h}: {y}"
    unlabelled = [ax for ax in viz.plot_heads(w).figure.axes if ax.get_title().startswith("head")]
    assert all(len(ax.get_xticks()) and len(ax.get_yticks()) for ax in unlabelled)  # positions on every panel
    with pytest.raises(ValueError, match="x labels: expected 6, got 5"):
        viz.plot_heads(w, x_labels=keys[:5])
    with pytest.raises(ValueError, match="y labels: expected 5, got 4"):
        viz.plot_heads(w, y_labels=queries[:4])


@pytest.mark.slow
def test_labels_are_thinned_for_long_sequences(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    assert viz.label_step(512, 60) == 9 and viz.label_step(40, 60) == 1
    tokens = [f"tok{i}" for i in range(150)]
    w = np.eye(150)
    viz.plot_heatmap(w, tmp_path / "long.svg", x_labels=tokens, y_labels=tokens)
    svg = (tmp_path / "long.svg").read_text()
    shown = [t for t in tokens if f"<!-- {t} -->" in svg]  # matplotlib names each drawn text in a comment
    assert shown == tokens[::3]  # 150 tokens, at most 60 labels per axis: every third is drawn


@pytest.mark.parametrize("bad", [np.zeros(5), np.zeros((2, 3, 4))])
def test_heatmap_rejects_non_matrices(tmp_path, bad):
    with pytest.raises(ValueError, match="2-D"):
        viz.plot_heatmap(bad, tmp_path / "x.png")


def test_bad_inputs_name_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="x labels: expected 3, got 2"):
        viz.plot_heatmap(np.ones((2, 3)), tmp_path / "x.png", x_labels=["a", "b"])
    with pytest.raises(ValueError, match="at most 900 cells"):
        viz.plot_heatmap(np.ones((40, 40)), tmp_path / "x.png", annotate=True)
    with pytest.raises(ValueError, match="per-layer"):
        viz.plot_overview([np.ones((2, 3, 3)), np.ones((2, 4, 4))], tmp_path / "x.png")
    for empty in ((1, 2, 0, 3), (1, 0, 3, 3), (1, 2, 3, 0)):
        with pytest.raises(ValueError, match=r"at least one head, query and key.*\(H, L, S\)"):
            viz.plot_overview(np.zeros(empty))
    with pytest.raises(ValueError, match="layers, heads"):
        viz.plot_head_values({"a": np.ones((2, 3)), "b": np.ones((3, 3))}, tmp_path / "x.png")
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_annotation_colour_follows_the_rendered_cell_colour_for_any_colormap():
    from matplotlib import colormaps

    from attnkit.viz.heatmap import text_colour

    assert text_colour(colormaps["Blues"](0.0)) == "k"  # near-white cells: black text
    assert text_colour(colormaps["Blues"](1.0)) == "w"
    assert text_colour(colormaps["viridis"](0.0)) == "w"  # dark purple
    assert text_colour(colormaps["viridis"](1.0)) == "k"  # yellow
    assert text_colour(colormaps["Greys"](1.0)) == "w"


def test_user_text_is_plain_text_in_pictures(tmp_path):
    from attnkit.viz import plot_heatmap

    path = tmp_path / "dollars.png"  # "$x^{$" is broken mathtext: it must render as the characters
    plot_heatmap([[0.2, 0.8], [0.6, 0.4]], path, x_labels=["$5", "and $6"], y_labels=["$x^{$", "b"],
                 title="costs $5 and $6", annotate=True, cmap="Blues")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_pictures_leave_the_users_matplotlib_backend_and_pyplot_alone(tmp_path):
    import sys

    import matplotlib

    from attnkit.viz import plot_heatmap

    backend = matplotlib.get_backend()
    figures = sys.modules["matplotlib.pyplot"].get_fignums() if "matplotlib.pyplot" in sys.modules else []
    plot_heatmap([[0.5, 0.5]], tmp_path / "a.png")
    assert matplotlib.get_backend() == backend
    if "matplotlib.pyplot" in sys.modules:
        assert sys.modules["matplotlib.pyplot"].get_fignums() == figures


def test_a_log_axis_keeps_its_tick_labels_as_mathematics_and_user_text_stays_plain(tmp_path, monkeypatch):
    """Since user text became plain text, every log-scale axis attnkit drew showed raw mathtext
    ($\\mathdefault{10^{2}}$) as its tick labels: matplotlib's own labels must stay mathematics."""
    import matplotlib.figure

    from attnkit.viz.curves import plot_lines

    drawn = {}
    real = matplotlib.figure.Figure.savefig

    def keep(self, *args, **kwargs):
        real(self, *args, **kwargs)
        ax = self.axes[0]
        drawn["ticks"] = [(t.get_text(), t.get_parse_math()) for t in ax.get_yticklabels() if t.get_text()]
        drawn["title"] = ax.get_title()

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    plot_lines({"costs $5": ([1, 10, 100], [1, 10, 100])}, tmp_path / "log.png", x_title="x", y_title="y",
               title="costs $5 and $6", log_y=True)
    assert drawn["ticks"] and all(math for _, math in drawn["ticks"])
    assert any("10^" in text for text, _ in drawn["ticks"])
    assert drawn["title"] == r"costs \$5 and \$6"  # escaped: drawn as the characters "$5 and $6"


@pytest.mark.slow
def test_every_plot_returns_a_picture_a_notebook_shows_inline(tmp_path):
    """Without a path nothing is written and a Picture comes back: PNG bytes for Jupyter's
    ``_repr_png_``, the matplotlib Figure to adjust, ``save`` to write it afterwards."""
    rng = np.random.default_rng(1)
    w = rng.dirichlet(np.ones(6), size=(2, 3, 4))
    pictures = [
        viz.plot_heatmap(w[0, 0], x_labels=list("abcdef"), title="costs $5 and $6"),
        viz.plot_heads(w[0]),
        viz.plot_overview(w),
        viz.plot_head_values({"share": w[..., 0, 0]}),
        viz.plot_lines({"a": ([1, 2, 3], [3.0, 2.0, 1.0])}, x_title="x", y_title="y"),
        viz.plot_scaling({"time": {"a": ([1, 2, 4], [1.0, 2.0, 4.0])}}, x_title="n", y_title="s"),
        viz.plot_distributions({"a": [0.1, 0.2]}, x_title="rho"),
    ]
    assert list(tmp_path.iterdir()) == []
    for picture in pictures:
        assert isinstance(picture, viz.Picture) and picture.figure.axes
        assert picture._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"
    heatmap = pictures[0]
    heatmap.figure.axes[0].set_title("adjusted, $7")  # adjusted after the fact, then saved
    heatmap.save(tmp_path / "adjusted.png")
    _png(tmp_path / "adjusted.png")
    assert heatmap.figure.axes[0].get_title() == "adjusted, \\$7"  # user text stays plain text when saved
    heatmap._repr_png_()
    assert heatmap.figure.axes[0].get_title() == "adjusted, \\$7"  # escaped once, however often drawn


def test_the_viewer_embeds_in_a_notebook_without_network(tmp_path):
    import html

    weights = np.random.default_rng(2).dirichlet(np.ones(3), size=(1, 2, 3))
    shown = viz.viewer([viz.AttentionView("self", ["<b>a</b>", "b", "c"], weights)], title="t & <i>u</i>")
    frame = shown._repr_html_()
    assert frame.startswith("<iframe srcdoc=\"") and frame.count("<script") == 0  # the page is escaped inside
    page = html.unescape(frame.split('srcdoc="', 1)[1].split('" style=', 1)[0])
    assert page == shown.html and "<script" in page and "<b>a</b>" not in page
    assert "http://" not in page and "https://" not in page
    written = viz.write_viewer(tmp_path / "v.html", [viz.AttentionView("self", list("abc"), weights)], title="t & <i>u</i>")
    assert (tmp_path / "v.html").read_text(encoding="utf-8") == written.html
