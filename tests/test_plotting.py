"""Tests of attnlab.plotting: the heatmap draws the weights it is given, labelled."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

from attnlab import CrossAttention, SelfAttention
from attnlab.plotting import figure_to_svg, heatmap

pytest.importorskip("matplotlib")

WORDS = ["Life", "is", "short", "eat", "dessert", "first"]


def _drawn(fig) -> np.ndarray:  # type: ignore[no-untyped-def]
    (mesh,) = fig.axes[0].collections  # the QuadMesh of pcolormesh
    return np.asarray(mesh.get_array())


def test_heatmap_draws_the_weights() -> None:
    torch.manual_seed(123)
    sa = SelfAttention(d_in=3, d_out_kq=2, d_out_v=4)
    weights = sa.attention_weights(torch.rand(6, 3))  # requires grad: heatmap detaches
    fig = heatmap(weights, WORDS, WORDS)
    np.testing.assert_allclose(_drawn(fig), weights.detach().double().numpy(), rtol=0, atol=0)


def test_heatmap_non_square_keeps_orientation() -> None:
    weights = torch.softmax(torch.randn(3, 5), dim=-1)
    fig = heatmap(weights, ["q0", "q1", "q2"], [f"k{j}" for j in range(5)])
    drawn = _drawn(fig)
    assert drawn.shape == (3, 5)
    np.testing.assert_allclose(drawn, weights.double().numpy(), rtol=0, atol=0)
    ax = fig.axes[0]
    # Row 0 on top: the y axis runs from t_q down to 0.
    assert ax.get_ylim() == (3.0, 0.0)


def test_heatmap_labels_and_title_set() -> None:
    fig = heatmap(
        torch.full((2, 4), 0.25), ["a", "b"], ["w", "x", "y", "z"], title="T", xlabel="ctx"
    )
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w", "x", "y", "z"]
    assert ax.get_title() == "T"
    assert ax.get_xlabel() == "ctx"
    assert ax.get_ylabel() == "query"


def test_heatmap_annotations_show_each_value() -> None:
    weights = torch.tensor([[0.125, 0.875], [0.5, 0.5], [1.0, 0.0]])
    fig = heatmap(weights, ["a", "b", "c"], ["x", "y"])
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["0.12", "0.88", "0.50", "0.50", "1.00", "0.00"]
    assert len(heatmap(weights, ["a", "b", "c"], ["x", "y"], annotate=False).axes[0].texts) == 0


def test_heatmap_into_given_axes_uses_its_figure() -> None:
    from matplotlib.figure import Figure

    fig = Figure()
    left, right = fig.subplots(1, 2)
    out = heatmap(torch.eye(2), ["a", "b"], ["a", "b"], ax=right)
    assert out is fig
    assert len(right.collections) == 1
    assert len(left.collections) == 0


def test_heatmap_accepts_arrays_and_lists() -> None:
    fig = heatmap([[0.3, 0.7]], ["q"], ["a", "b"])
    np.testing.assert_allclose(_drawn(fig), [[0.3, 0.7]])


def test_heatmap_rejects_bad_shapes_with_named_argument() -> None:
    with pytest.raises(ValueError, match=r"weights must have 2 dimensions.*shape=\(6,\)"):
        heatmap(torch.rand(6), WORDS, WORDS)
    with pytest.raises(ValueError, match="row_labels has 5 labels but weights has 6 rows"):
        heatmap(torch.rand(6, 8), WORDS[:5], [str(j) for j in range(8)])
    with pytest.raises(ValueError, match="col_labels has 6 labels but weights has 8 columns"):
        heatmap(torch.rand(6, 8), WORDS, WORDS)


def test_figure_to_svg_valid_and_deterministic() -> None:
    torch.manual_seed(123)
    ca = CrossAttention(d_in=3, d_out_kq=2, d_out_v=4)
    weights = ca.attention_weights(torch.rand(6, 3), torch.rand(8, 3))
    cols = [f"c{j + 1}" for j in range(8)]
    svg = figure_to_svg(heatmap(weights, WORDS, cols, title="cross"))
    root = ET.fromstring(svg)  # well-formed XML
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert not svg.startswith("<?xml")
    # Text is kept as text, so the labels are in the markup.
    for label in [*WORDS, *cols, "cross"]:
        assert f">{label}<" in svg
    assert svg == figure_to_svg(heatmap(weights, WORDS, cols, title="cross"))


def test_figure_to_svg_leaves_global_settings_alone() -> None:
    import matplotlib as mpl

    before = (mpl.rcParams["svg.fonttype"], mpl.rcParams["svg.hashsalt"], mpl.get_backend())
    figure_to_svg(heatmap(torch.eye(2), ["a", "b"], ["a", "b"]))
    assert (mpl.rcParams["svg.fonttype"], mpl.rcParams["svg.hashsalt"], mpl.get_backend()) == (
        before
    )


def test_plotting_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(ImportError, match=r"attnlab\[plot\]"):
        heatmap(torch.eye(2), ["a", "b"], ["a", "b"])
