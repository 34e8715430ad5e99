r"""Heatmaps of attention weights, as SVG for the documentation pages.

A row of an attention-weight matrix is one query token; its entries, one per key token,
are $\alpha_{ij} \ge 0$ and sum to 1. [`heatmap`][attnlab.tools.plotting.heatmap] draws such a
matrix with the tokens as labels and each weight written in its cell;
[`figure_to_svg`][attnlab.tools.plotting.figure_to_svg] turns the figure into an SVG string that
a page can inline.

[`interactive_heatmap`][attnlab.tools.plotting.interactive_heatmap] writes the SVG itself, one
panel per head (or per layer and head), for pages that load the site's small script: it
adds a head selector and a read-out of the cell under the pointer.

[`live_model_widget`][attnlab.tools.plotting.live_model_widget] puts a trained
[`TinyTransformer`][attnlab.models.tiny.TinyTransformer] in the reader's browser: a token box,
the model's next-token predictions and every head's attention, recomputed by the site's
script `live-model.js` from the weights that
the site's build writes as a small script (`docs/hooks/live_model.py`).

The drawings of a paged KV cache's block tables are in
[`attnlab.tools.block_tables`][attnlab.tools.block_tables].

Matplotlib is an optional dependency (`pip install "attnlab[plot]"`), imported only when
`heatmap` or `figure_to_svg` is called; `interactive_heatmap` does not need it. The
figures are built on `matplotlib.figure.Figure` directly, not through `pyplot`, so no GUI backend is
needed and no global state changes.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any

import torch

from attnlab.rules._validation import check_int_sequence, check_rank

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from attnlab.models.tiny import TinyTransformer

__all__ = [
    "LIVE_GLOBAL",
    "check_live_model",
    "figure_to_svg",
    "heatmap",
    "interactive_heatmap",
    "live_model_widget",
]

_INSTALL_HINT = (
    "attnlab.tools.plotting needs matplotlib, which is not installed; "
    'install the plotting extra: pip install "attnlab[plot]"'
)


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ImportError(_INSTALL_HINT) from err


def _as_weights(weights: Any, ranks: tuple[int, ...], layout: str) -> torch.Tensor:
    """Weights to draw as a finite, non-empty float64 CPU tensor of one of `ranks`."""
    if isinstance(weights, torch.Tensor):
        if weights.is_complex() or weights.dtype == torch.bool:
            raise TypeError(f"weights must hold real numbers, got a {weights.dtype} tensor")
        tensor = weights.detach().to(device="cpu", dtype=torch.float64)
    else:
        try:
            tensor = torch.as_tensor(weights, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(
                f"weights must be a {' or '.join(f'{r}-d' for r in ranks)} tensor, array or "
                f"nested list of numbers, got {type(weights).__name__}"
            ) from None
    check_rank("weights", tensor, ranks, layout)
    if tensor.numel() == 0:
        raise ValueError(
            f"weights is empty (weights.shape={tuple(tensor.shape)}): there is no weight to draw"
        )
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(
            "weights must be finite to be drawn, got NaN or inf; attention weights from "
            "attnlab are always finite, so check where these came from"
        )
    return tensor


def _as_matrix(weights: Any) -> torch.Tensor:
    return _as_weights(weights, (2,), "(rows, cols)")


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
        >>> from attnlab.tools.plotting import figure_to_svg, heatmap
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

    The `<svg>` carries the width at which its smallest text is 11 CSS pixels, as the
    custom property `--attn-min-width`: the site's stylesheet keeps a figure at least that
    wide on a phone, where it scrolls sideways in its `attn-figure` box instead of
    shrinking its labels to 6 px, and says so (`data-attn-wide`) when that width is more
    than a phone's column (358 px at a 390 px screen).

    Args:
        fig: The figure to render, e.g. from [`heatmap`][attnlab.tools.plotting.heatmap].

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
    svg = text[text.index("<svg ") :]
    attributes = _min_width_attributes(svg)
    return f"<svg {attributes} {svg[5:]}" if attributes else svg


_SMALLEST_TEXT_PX = 11.0  # the least a reader gets on a phone
_PHONE_COLUMN_PX = 358.0  # the column of a page at a 390 px screen


def _min_width_attributes(svg: str) -> str:
    """`style` (and `data-attn-wide`) for an SVG, so that its smallest text reaches 11 px."""
    view = re.search(r'viewBox="[\d.]+ [\d.]+ ([\d.]+) [\d.]+"', svg)
    sizes = [float(size) for size in re.findall(r"font-size: ?([\d.]+)px", svg)]
    if view is None or not sizes:
        return ""
    # Font sizes are in viewBox units: shown `w` px wide, text of size s is s * w / width.
    width = round(_SMALLEST_TEXT_PX * float(view.group(1)) / min(sizes))
    wide = ' data-attn-wide=""' if width > _PHONE_COLUMN_PX else ""
    return f'style="--attn-min-width: {width}px"{wide}'


# Interactive heatmaps -------------------------------------------------------------------
#
# Plain SVG written here, no matplotlib: every cell is a <rect> that carries its query,
# key and weight, so the page's script (docs/assets/javascripts/attention-heatmap.js) can
# show a read-out, and a <title> so that a browser without the script still shows a
# tooltip. Panels other than the first start hidden; the script reveals the selector, and a
# <noscript> line names the panels a reader without it cannot switch to.

# Stops of a light-to-dark blue scale (after ColorBrewer's "Blues"); each cell has its own
# fill and text colour, so the scale reads the same on Material's light and dark schemes.
_BLUES = (
    (0xF7, 0xFB, 0xFF),
    (0xDE, 0xEB, 0xF7),
    (0xC6, 0xDB, 0xEF),
    (0x9E, 0xCA, 0xE1),
    (0x6B, 0xAE, 0xD6),
    (0x42, 0x92, 0xC6),
    (0x21, 0x71, 0xB5),
    (0x08, 0x51, 0x9C),
    (0x08, 0x30, 0x6B),
)
# Generous widths (px) of characters at the 12 px font, by kind: the page's font is not
# known here, so labels get room for the widest common sans-serif (DejaVu Sans).
_WIDE, _UPPER, _NARROW, _OTHER = 12.0, 9.5, 4.5, 7.5
_FONT = 12
_TITLE_GAP = 30  # px left of the row labels: the turned axis name (12 px) and clear space


def _label_width(text: str) -> float:
    """An upper bound on the width of `text` at the 12 px font, in px."""
    return sum(
        _WIDE
        if ch in "MWmw@%"
        else _NARROW
        if ch in "ijlft.,:;!|'()[] "
        else _UPPER
        if ch.isupper()
        else _OTHER
        for ch in text
    )


def _blues(position: float) -> str:
    """Colour at `position` in [0, 1] along the blue scale, as #rrggbb."""
    position = min(max(position, 0.0), 1.0) * (len(_BLUES) - 1)
    low = min(int(position), len(_BLUES) - 2)
    frac = position - low
    channels = (
        round(a + (b - a) * frac) for a, b in zip(_BLUES[low], _BLUES[low + 1], strict=True)
    )
    return "#" + "".join(f"{c:02x}" for c in channels)


def _as_panels(weights: Any) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Weights as (panels, t_q, t_k) float64, and the (layer, head) of each panel."""
    stack = _as_weights(
        weights, (2, 3, 4), "(t_q, t_k), (heads, t_q, t_k) or (layers, heads, t_q, t_k)"
    )
    layers, heads = (
        (1, 1)
        if stack.ndim == 2
        else (1, stack.shape[0])
        if stack.ndim == 3
        else (
            stack.shape[0],
            stack.shape[1],
        )
    )
    index = [(layer, head) for layer in range(layers) for head in range(heads)]
    return stack.reshape(layers * heads, *stack.shape[-2:]), index  # (panels, t_q, t_k)


@dataclass(frozen=True)
class _Grid:
    """What the panels of one interactive heatmap share: labels, colour scale, cell size."""

    rows: list[str]
    cols: list[str]
    vmin: float
    vmax: float
    xlabel: str
    ylabel: str
    cell: int
    annotate: bool


def _text(attributes: str, label: str) -> str:
    """An SVG text in the page's colour: an axis label or a row or column label."""
    return f'<text {attributes} fill="currentColor">{escape(label)}</text>'


def _panel_svg(matrix: torch.Tensor, grid: _Grid, *, panel: int, name: str, hidden: bool) -> str:
    rows, cols, cell, vmin = grid.rows, grid.cols, grid.cell, grid.vmin
    t_q, t_k = matrix.shape
    left = _TITLE_GAP + round(max(map(_label_width, rows))) + 8  # axis name, labels, gap
    # Column labels are turned 45 degrees: their height is their length over sqrt(2).
    longest = max(map(_label_width, cols))
    top = 20 + round(longest * 0.71) + 10
    # ... and reach past their column's centre to the right by as much.
    right = max(4, round(longest * 0.71) - cell // 2 + 4)
    width = left + t_k * cell + right
    height = top + t_q * cell + 4
    span = grid.vmax - vmin
    # The `hidden` attribute hides HTML elements only, so each SVG sits in a <div>.
    parts = [
        f'<div class="attn-heatmap-panel" data-panel="{panel}" '
        f'data-name="{escape(name)}"{" hidden" if hidden else ""}>'
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-size="{_FONT}" '
        'style="display:block;margin:0 auto;max-width:none" '
        f'role="group" aria-label="{escape(name)}">',
        f"<title>{escape(name)}</title>",
        f'<text x="{left + t_k * cell / 2:g}" y="12" text-anchor="middle" '
        f'fill="currentColor" font-weight="600">{escape(grid.xlabel)}</text>',
        f'<text transform="translate(13 {top + t_q * cell / 2:g}) rotate(-90)" '
        f'text-anchor="middle" fill="currentColor" font-weight="600">{escape(grid.ylabel)}</text>',
    ]
    for j, col in enumerate(cols):
        x = left + j * cell + cell / 2
        where = f'transform="translate({x:g} {top - 6}) rotate(-45)"'
        parts.append(_text(f'class="attn-heatmap-col" data-k="{j}" {where}', col))
    for i, row in enumerate(rows):
        y = top + i * cell + cell / 2
        where = f'x="{left - 8}" y="{y:g}" text-anchor="end" dominant-baseline="central"'
        parts.append(_text(f'class="attn-heatmap-row" data-q="{i}" {where}', row))
    for i in range(t_q):
        for j in range(t_k):
            value = float(matrix[i, j])
            position = (value - vmin) / span if span > 0 else 0.0
            x, y = left + j * cell, top + i * cell
            readout = f"query {i} ({rows[i]}) → key {j} ({cols[j]}): {value:.4f}"
            parts.append(
                f'<g class="attn-heatmap-cell" data-q="{i}" data-k="{j}" '
                f'data-w="{value:.4f}"><title>{escape(readout)}</title>'
                f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" '
                f'fill="{_blues(position)}" stroke="#ffffff" stroke-width="1"/>'
                + (
                    f'<text x="{x + cell / 2:g}" y="{y + cell / 2:g}" text-anchor="middle" '
                    f'dominant-baseline="central" font-size="11" pointer-events="none" '
                    f'fill="{"#ffffff" if position > 0.55 else "#1a1a1a"}">{value:.2f}</text>'
                    if grid.annotate
                    else ""
                )
                + "</g>"
            )
    # The outline of the active cell is drawn last, so that no neighbour paints over it;
    # the script moves it onto the cell under the pointer or the keyboard focus.
    parts.append(
        f'<rect class="attn-heatmap-outline" x="{left + 1.5:g}" y="{top + 1.5:g}" '
        f'width="{cell - 3}" height="{cell - 3}" fill="none" stroke-width="3" '
        'visibility="hidden" pointer-events="none"/>'
    )
    parts.append("</svg></div>")
    return "".join(parts)


def interactive_heatmap(
    weights: Any,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    *,
    title: str | None = None,
    panel_names: Sequence[str] | None = None,
    xlabel: str = "key",
    ylabel: str = "query",
    vmin: float = 0.0,
    vmax: float | None = None,
    cell_size: int = 40,
    annotate: bool = True,
) -> str:
    r"""Attention weights as an HTML snippet: one SVG heatmap per head, a head selector
    and a read-out of the cell under the pointer.

    Every cell shows its weight to two decimals and carries a tooltip
    `query <i> (<token>) → key <j> (<token>): <weight>`, positions counted from 0 as the
    tensor is indexed (a repeated token is told apart by its position). With the site's
    script (`docs/assets/javascripts/attention-heatmap.js`) the buttons switch between
    panels (heads, or layer and head), the arrow keys move between cells, and a read-out
    box shows the hovered, tapped or focused cell; a figure wider than its column scrolls
    sideways and says so. Without the script the first panel shows, with its tooltips, and
    a line names the panels it cannot switch to. All panels share one colour scale, from
    `vmin` to `vmax`, so their colours compare. Nothing is loaded from another host, and
    matplotlib is not needed.

    Args:
        weights: Attention weights, shape `(t_q, t_k)`, `(heads, t_q, t_k)` or
            `(layers, heads, t_q, t_k)`; a tensor that requires grad is detached first.
        row_labels: One label per query (row).
        col_labels: One label per key (column).
        title: Caption above the heatmap.
        panel_names: One name per panel, in order (layer-major for 4-d weights); by
            default `head 1`, `head 2`, ... or `layer 1 · head 1`, ...
        xlabel: Name of the column axis.
        ylabel: Name of the row axis.
        vmin: Weight mapped to the lightest colour.
        vmax: Weight mapped to the darkest colour; the largest weight when omitted.
        cell_size: Side of one cell in pixels. A figure wider than the page scrolls
            inside its box; smaller cells fit longer sequences.
        annotate: Write each weight in its cell (two decimals). Below 30 px cells the
            numbers no longer fit: turn it off, the tooltips and read-out remain.

    Returns:
        A `<figure>` element as a string, to print from a markdown-exec `html="1"` block.

    Raises:
        TypeError: If `weights` does not hold real numbers, or a label argument is not a
            sequence (a single string is refused, not split into characters).
        ValueError: If `weights` has the wrong number of dimensions, is empty or not
            finite, a label or name count does not match its shape, or `vmax` is below
            `vmin`, or `cell_size` is below 8 pixels.

    Examples:
        >>> import torch
        >>> from attnlab.tools.plotting import interactive_heatmap
        >>> weights = torch.tensor([[[0.9, 0.1], [0.4, 0.6]], [[0.5, 0.5], [0.2, 0.8]]])
        >>> html = interactive_heatmap(weights, ["a", "b"], ["a", "b"], title="toy")
        >>> html.startswith('<figure class="attn-heatmap"')
        True
        >>> html.count('class="attn-heatmap-cell"')  # 2 heads of 2 x 2 weights
        8
        >>> 'data-w="0.4000"' in html, "query 1 (b) → key 0 (a): 0.4000" in html
        (True, True)
    """
    stack, index = _as_panels(weights)
    _, t_q, t_k = stack.shape
    rows = _check_labels("row_labels", row_labels, t_q, "rows")
    cols = _check_labels("col_labels", col_labels, t_k, "columns")
    layers = index[-1][0] + 1
    if panel_names is None:
        if len(index) == 1:
            names = ["weights"]
        elif layers == 1:
            names = [f"head {head + 1}" for _, head in index]
        else:
            names = [f"layer {layer + 1} · head {head + 1}" for layer, head in index]
    else:
        names = _check_labels("panel_names", panel_names, len(index), "panels")
    top = float(stack.max()) if vmax is None else vmax
    if top < vmin:
        raise ValueError(
            f"vmax must not be below vmin, got vmin={vmin} and vmax={top}"
            + (" (the largest weight)" if vmax is None else "")
        )
    if isinstance(cell_size, bool) or not isinstance(cell_size, int) or cell_size < 8:
        raise ValueError(f"cell_size must be an int of at least 8 pixels, got {cell_size!r}")

    label = title or "attention weights"
    out = [
        f'<figure class="attn-heatmap" data-attn-heatmap aria-label="{escape(label)}" '
        'style="display:block;width:auto;max-width:100%;margin:1em 0;text-align:center">'
    ]
    if title is not None:
        out.append(
            '<figcaption style="font-weight:600;font-style:normal;max-width:none;'
            'margin:0 0 .4em">'
            f"{escape(title)}</figcaption>"
        )
    if len(names) > 1:
        # Hidden until the script runs: without it the buttons could do nothing.
        out.append(
            '<div class="attn-heatmap-select" role="group" aria-label="choose a panel" '
            'hidden style="flex-wrap:wrap;justify-content:center;gap:.3em;margin:0 0 .5em">'
        )
        for panel, name in enumerate(names):
            out.append(
                f'<button type="button" data-panel="{panel}" '
                f'aria-pressed="{"true" if panel == 0 else "false"}">{escape(name)}</button>'
            )
        out.append("</div>")
        out.append(
            '<noscript><p class="attn-heatmap-noscript" data-search-exclude '
            'style="font-size:.8em;margin:0 0 .5em">'
            f"Showing {escape(names[0])}, the first of {len(names)} panels; the others ("
            + escape(", ".join(names[1:]))
            + ") need JavaScript to be shown.</p></noscript>"
        )
    out.append(
        '<div class="attn-heatmap-scroll" style="overflow-x:auto;max-width:100%;padding:0 0 .3em">'
    )
    grid = _Grid(rows, cols, vmin, top, xlabel, ylabel, cell_size, annotate)
    for panel, name in enumerate(names):
        out.append(_panel_svg(stack[panel], grid, panel=panel, name=name, hidden=panel > 0))
    out.append("</div>")
    # Shown by the script while the drawing is wider than its box (a phone's column).
    out.append(
        '<p class="attn-heatmap-hint" hidden data-search-exclude '
        'style="font-size:.75em;margin:.1em 0 0">'
        "Wider than the screen: scroll sideways to see every column.</p>"
    )
    out.append(
        '<output class="attn-heatmap-readout" aria-live="polite" hidden data-search-exclude '
        'style="min-height:1.6em;font-size:.8em;margin:.2em 0 0">'
        "Point at a cell, tap it, or focus it (Tab, then the arrow keys) to read its "
        "weight.</output>"
    )
    out.append("</figure>")
    return "".join(out)


# The live model ---------------------------------------------------------------------------
#
# The browser runs the model itself (docs/assets/javascripts/live-model.js, a plain
# JavaScript forward tested equal to PyTorch's in tests/test_browser.py). Its weights
# travel as a script that sets a global, not as JSON to fetch: a page opened from file://
# may load a <script> but not fetch a file. The widget's first state is drawn here, from
# PyTorch, so that a page read without JavaScript still shows the model at work.

LIVE_GLOBAL = "attnlabLiveModel"
"""The global that the live model's weights script sets and `live-model.js` reads."""


def check_live_model(model: Any) -> TinyTransformer:
    """`model` if the browser can run it: an attention-only `TinyTransformer`."""
    from attnlab.models.tiny import TinyTransformer

    if not isinstance(model, TinyTransformer):
        raise TypeError(
            f"model must be an attnlab.models.tiny.TinyTransformer, got {type(model).__name__}"
        )
    if model.config.mlp:
        raise ValueError(
            "the browser forward covers attention-only models: this model has an MLP "
            "(model.config.mlp=True)"
        )
    return model


def _check_live_tokens(tokens: Any, vocab_size: int, max_len: int) -> list[int]:
    checked = check_int_sequence(
        "tokens", tokens, high=vocab_size, within="the model's vocabulary "
    )
    ids = checked.tolist() if isinstance(checked, torch.Tensor) else checked
    if not 1 <= len(ids) <= max_len:
        raise ValueError(f"tokens must hold 1 to max_len={max_len} ids, got {len(ids)}")
    return ids


def _predictions_html(tokens: list[int], best: list[int], probabilities: list[float]) -> str:
    """The model's top prediction at every position, and where it is the next token.

    live-model.js writes the same markup (`predictionsHtml`); tests/test_browser.py
    checks that the two agree.
    """
    hits = [best[i] == tokens[i + 1] for i in range(len(tokens) - 1)]

    def row(name: str, cells: list[str]) -> str:
        return f'<tr><th scope="row">{name}</th>{"".join(cells)}</tr>'

    predicted = [
        f'<td class="attn-live-hit"><b>{b}</b></td>'
        if i < len(hits) and hits[i]
        else f"<td>{b}</td>"
        for i, b in enumerate(best)
    ]
    table = (
        '<div class="attn-live-scroll" style="overflow-x:auto;max-width:100%">'
        '<table class="attn-live-table" style="font-size:.75em;margin:0 auto;'
        'border-collapse:separate;border-spacing:.5em .1em">'
        + row("position", [f"<td>{i}</td>" for i in range(len(tokens))])
        + row("token", [f"<td>{t}</td>" for t in tokens])
        + row("predicts", predicted)
        + row("probability", [f"<td>{p:.2f}</td>" for p in probabilities])
        + "</table></div>"
    )
    if hits:
        summary = (
            f"The top prediction is the token that comes next at {sum(hits)} of the "
            f"{len(hits)} positions that have a next token."
        )
    else:
        summary = "One token: its next token is not in the sequence."
    return table + f'<p class="attn-live-summary" style="font-size:.8em">{summary}</p>'


def live_model_widget(
    model: TinyTransformer,
    tokens: Any,
    *,
    title: str | None = "Attention of the live model",
    panel_names: Sequence[str] | None = None,
    cell_size: int = 16,
) -> str:
    """The model running in the reader's browser: edit the tokens, see it predict and attend.

    The snippet holds a token box, a "repeat it" button (the sequence twice, cut at
    `max_len`), a "random" and a "reset" button, a table of the top next-token
    prediction at every position with its probability (bold where it is the token that
    actually comes next), and the attention of every head of every layer in an
    [`interactive_heatmap`][attnlab.tools.plotting.interactive_heatmap], all computed here
    from `model` on `tokens`. The site's script `live-model.js` reveals the controls and
    recomputes everything in the browser at each edit, from the weights of
    the script that the site's build writes (`docs/hooks/live_model.py`; they must be
    those of `model`); bad input is named under the box. Without JavaScript the first state
    stays, with a line that says what the script would add.

    Args:
        model: An attention-only [`TinyTransformer`][attnlab.models.tiny.TinyTransformer].
        tokens: The first sequence: ints in `[0, vocab_size)`, 1 to `max_len` of them.
        title: Caption of the heatmap.
        panel_names: One name per head, layer-major; by default `layer 1 · head 1`, ...
        cell_size: Side of a heatmap cell in pixels (at least 8).

    Returns:
        A `<div>` as a string, to print from a markdown-exec `html="1"` block.

    Raises:
        TypeError: If `model` is not a `TinyTransformer` or `tokens` not a sequence of
            ints (or a 1-d integer tensor).
        ValueError: If `model` has an MLP, a token is outside the vocabulary, the
            sequence is empty or longer than `max_len`, `panel_names` has the wrong
            count, or `cell_size` is below 8.

    Examples:
        >>> import torch
        >>> from attnlab.models.tiny import ModelConfig, TinyTransformer
        >>> from attnlab.tools.plotting import live_model_widget
        >>> _ = torch.manual_seed(0)
        >>> model = TinyTransformer(ModelConfig(vocab_size=5, max_len=4, d_model=8))
        >>> html = live_model_widget(model, [1, 2, 1])
        >>> html.startswith('<div class="attn-live" data-attn-live'), html.count("<svg")
        (True, 8)
    """
    model = check_live_model(model)
    config = model.config
    ids = _check_live_tokens(tokens, config.vocab_size, config.max_len)
    if panel_names is not None:
        panel_names = _check_labels(
            "panel_names", panel_names, config.num_layers * config.num_heads, "panels"
        )
    with torch.no_grad():
        batch = torch.tensor([ids])
        probabilities = torch.softmax(model(batch)[0].double(), dim=-1)  # (t, vocab)
        maps = torch.stack([m[0] for m in model.attention_maps(batch)])  # (layers, h, t, t)
    top, best = probabilities.max(dim=-1)
    labels = [str(t) for t in ids]
    figure = interactive_heatmap(
        maps,
        labels,
        labels,
        title=title,
        panel_names=panel_names,
        cell_size=cell_size,
        annotate=False,
    )
    names = json.dumps(None if panel_names is None else list(panel_names))
    attributes = (
        f'data-tokens="{" ".join(labels)}" data-title="{escape(title or "")}" '
        f'data-panel-names="{escape(names)}" data-cell-size="{cell_size}"'
    )
    limits = f"ids from 0 to {config.vocab_size - 1}, at most {config.max_len} of them"
    return (
        f'<div class="attn-live" data-attn-live {attributes} data-search-exclude '
        'style="margin:1em 0">'
        '<div class="attn-live-controls" hidden style="margin:0 0 .5em">'
        '<label style="display:block;font-size:.8em">Tokens '
        f"({limits}, separated by spaces or commas)"
        f'<input class="attn-live-input" type="text" value="{" ".join(labels)}" '
        'autocomplete="off" spellcheck="false" inputmode="numeric" '
        'style="display:block;box-sizing:border-box;width:100%;font:inherit;'
        "font-family:var(--md-code-font-family,monospace);padding:.3em .4em;"
        "margin:.2em 0 .4em;border:1px solid var(--md-default-fg-color--lighter,#999);"
        'border-radius:.2em;background:transparent;color:inherit"></label>'
        '<div class="attn-heatmap-select" style="display:flex;flex-wrap:wrap;gap:.3em">'
        '<button type="button" data-attn-live-action="repeat">repeat it</button>'
        '<button type="button" data-attn-live-action="random">random tokens</button>'
        '<button type="button" data-attn-live-action="reset">reset</button></div></div>'
        '<p class="attn-live-error" role="alert" hidden style="font-size:.8em;'
        'color:var(--md-code-hl-special-color,#c62828);margin:0 0 .5em"></p>'
        '<noscript><p data-search-exclude style="font-size:.8em">This is the model run '
        f"by the build on the tokens {escape(' '.join(labels))}; with JavaScript you can "
        "edit them and the model reruns in your browser.</p></noscript>"
        '<div class="attn-live-output">'
        + _predictions_html(ids, best.tolist(), top.tolist())
        + figure
        + "</div></div>"
    )
