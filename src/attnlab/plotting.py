r"""Heatmaps of attention weights, as SVG for the documentation pages.

A row of an attention-weight matrix is one query token; its entries, one per key token,
are $\alpha_{ij} \ge 0$ and sum to 1. [`heatmap`][attnlab.plotting.heatmap] draws such a
matrix with the tokens as labels and each weight written in its cell;
[`figure_to_svg`][attnlab.plotting.figure_to_svg] turns the figure into an SVG string that
a page can inline.

Matplotlib is an optional dependency (`pip install "attnlab[plot]"`) and is imported only
when a function here is called. The figures are built on `matplotlib.figure.Figure`
directly, not through `pyplot`, so no GUI backend is needed and no global state changes.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from attnlab._validation import check_rank

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["figure_to_svg", "heatmap"]

_INSTALL_HINT = (
    "attnlab.plotting needs matplotlib, which is not installed; "
    'install the plotting extra: pip install "attnlab[plot]"'
)


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ImportError(_INSTALL_HINT) from err


def _as_matrix(weights: Any) -> torch.Tensor:
    if isinstance(weights, torch.Tensor):
        if weights.is_complex() or weights.dtype == torch.bool:
            raise TypeError(f"weights must hold real numbers, got a {weights.dtype} tensor")
        matrix = weights.detach().to(device="cpu", dtype=torch.float64)
    else:
        try:
            matrix = torch.as_tensor(weights, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(
                f"weights must be a 2-d tensor, array or nested list of numbers, got "
                f"{type(weights).__name__}"
            ) from None
    check_rank("weights", matrix, (2,), "(rows, cols)")
    if matrix.numel() == 0:
        raise ValueError(
            f"weights is empty (weights.shape={tuple(matrix.shape)}): there is no weight to draw"
        )
    if not bool(torch.isfinite(matrix).all()):
        raise ValueError(
            "weights must be finite to be drawn, got NaN or inf; attention weights from "
            "attnlab are always finite, so check where these came from"
        )
    return matrix


def _check_labels(name: str, labels: Sequence[str], expected: int, axis: str) -> list[str]:
    if isinstance(labels, str) or not isinstance(labels, Iterable):
        raise TypeError(
            f"{name} must be a sequence of labels, one per {axis[:-1]}, got {type(labels).__name__}"
        )
    labels = [str(label) for label in labels]
    if len(labels) != expected:
        raise ValueError(
            f"{name} has {len(labels)} labels but weights has {expected} {axis}; "
            "give one label per " + axis[:-1]
        )
    return labels


def heatmap(
    weights: Any,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    *,
    title: str | None = None,
    ax: Axes | None = None,
    annotate: bool = True,
    xlabel: str = "key",
    ylabel: str = "query",
    vmin: float = 0.0,
    vmax: float | None = None,
    cmap: str = "Blues",
    colorbar: bool = True,
) -> Figure:
    r"""Draw an attention-weight matrix as a heatmap, one labelled row per query.

    Cell $(i, j)$ is coloured by $\alpha_{ij}$ and, with `annotate`, shows its value to two
    decimals. Row 0 is at the top, as the matrix prints.

    Args:
        weights: A 2-d tensor or array, shape `(t_q, t_k)`; a tensor that requires grad is
            detached first.
        row_labels: One label per row (the query tokens).
        col_labels: One label per column (the key tokens).
        title: Title above the axes.
        ax: Axes to draw into (e.g. one panel of a larger figure); a new figure with one
            axes is made when omitted.
        annotate: Write each weight in its cell.
        xlabel: Label of the column axis.
        ylabel: Label of the row axis.
        vmin: Weight mapped to the lightest colour.
        vmax: Weight mapped to the darkest colour; the largest weight when omitted.
        cmap: Name of a matplotlib colormap.
        colorbar: Draw a colour bar beside the axes. Panels that share `vmin` and
            `vmax` need only one, which leaves their cells more room.

    Returns:
        The figure that holds the heatmap (the one of `ax` when given).

    Raises:
        ImportError: If matplotlib is not installed.
        TypeError: If `weights` does not hold real numbers, or a label argument is not a
            sequence (a single string is refused, not split into characters).
        ValueError: If `weights` is not 2-d, is empty or not finite, the label counts do
            not match its shape, or `vmax` is below `vmin`.

    Examples:
        >>> import torch
        >>> from attnlab.plotting import figure_to_svg, heatmap
        >>> weights = torch.tensor([[0.9, 0.1], [0.4, 0.6]])
        >>> fig = heatmap(weights, ["a", "b"], ["a", "b"], title="toy")
        >>> fig.axes[0].get_title()
        'toy'
        >>> figure_to_svg(fig).startswith("<svg")
        True
        >>> len(fig.axes)  # the heatmap and its colour bar
        2
        >>> len(heatmap(weights, ["a", "b"], ["a", "b"], colorbar=False).axes)
        1
    """
    _require_matplotlib()
    from matplotlib.figure import Figure

    matrix = _as_matrix(weights)
    t_q, t_k = matrix.shape
    rows = _check_labels("row_labels", row_labels, t_q, "rows")
    cols = _check_labels("col_labels", col_labels, t_k, "columns")
    data = matrix.numpy()
    top = float(data.max()) if vmax is None else vmax
    if top < vmin:
        raise ValueError(
            f"vmax must not be below vmin, got vmin={vmin} and vmax={top}"
            + (" (the largest weight)" if vmax is None else "")
        )

    if ax is None:
        fig = Figure(figsize=(1.0 + 0.62 * t_k, 0.8 + 0.5 * t_q), layout="constrained")
        ax = fig.add_subplot()
    else:
        parent = ax.get_figure()
        if not isinstance(parent, Figure):
            raise ValueError("ax must belong to a matplotlib Figure")
        fig = parent

    # Edges at half-integers put cell (i, j) centred on tick (j, i); row 0 goes on top.
    mesh = ax.pcolormesh(data, cmap=cmap, vmin=vmin, vmax=top)
    ax.set_xlim(0, t_k)
    ax.set_ylim(t_q, 0)
    ax.set_xticks([j + 0.5 for j in range(t_k)], cols, rotation=45, ha="right")
    ax.set_yticks([i + 0.5 for i in range(t_q)], rows)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_aspect("equal")
    ax.tick_params(length=0)
    if title is not None:
        ax.set_title(title)
    if annotate:
        threshold = vmin + 0.6 * (top - vmin)
        for i in range(t_q):
            for j in range(t_k):
                value = float(data[i, j])
                ax.text(
                    j + 0.5,
                    i + 0.5,
                    f"{value:.2f}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if value > threshold else "black",
                )
    if colorbar:
        fig.colorbar(mesh, ax=ax, shrink=0.8, label="attention weight")
    return fig


def figure_to_svg(fig: Figure) -> str:
    """Render a figure as an SVG string that can be inlined in HTML.

    Text stays text (`svg.fonttype: none`), so labels are searchable and use the page's
    fonts, and the output is deterministic (fixed hash salt, no date), so rebuilding a
    page does not change it. The settings apply only while the figure is saved.

    Args:
        fig: The figure to render, e.g. from [`heatmap`][attnlab.plotting.heatmap].

    Returns:
        The `<svg>...</svg>` element, without the XML declaration and DOCTYPE.

    Raises:
        ImportError: If matplotlib is not installed.
        TypeError: If `fig` is not a matplotlib `Figure`.

    Examples:
        >>> from matplotlib.figure import Figure
        >>> fig = Figure(figsize=(2, 1))
        >>> _ = fig.add_subplot().plot([0, 1], [1, 0])
        >>> svg = figure_to_svg(fig)
        >>> svg.startswith("<svg"), svg.rstrip().endswith("</svg>")
        (True, True)
    """
    _require_matplotlib()
    import matplotlib as mpl
    from matplotlib.figure import Figure

    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib Figure, got {type(fig).__name__}")
    buffer = io.StringIO()
    with mpl.rc_context({"svg.fonttype": "none", "svg.hashsalt": "attnlab"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None}, facecolor="white")
    text = buffer.getvalue()
    return text[text.index("<svg") :]
