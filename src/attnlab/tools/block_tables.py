r"""The block tables of a paged KV cache, drawn as SVG.

[`block_tables_svg`][attnlab.tools.block_tables.block_tables_svg] draws the block pool of a
[`PagedKVCache`][attnlab.serving.cache.PagedKVCache] as a row of numbered cells and, under
it, each sequence's block table in token order, every entry naming the pool block it
points at; blocks that several sequences share are marked, as the chapter on serving
shows them. Cells carry their block id and holders as data attributes, so tests (and
readers of the markup) can check what is drawn. Plain SVG: no matplotlib needed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from html import escape

from attnlab.rules._validation import check_positive_int
from attnlab.tools.plotting import _label_width

__all__ = ["block_tables_svg"]

_CELL, _GAP, _PER_ROW = 22, 2, 12  # px per block, px between blocks, blocks per line
_INK = "#1a1a1a"  # text on a coloured cell, in light and dark schemes alike

# Light fills (after ColorBrewer's "Set3"), one per sequence, dark text on all of them.
_SEQUENCE_FILLS = (
    "#8dd3c7",
    "#ffffb3",
    "#bebada",
    "#fb8072",
    "#80b1d3",
    "#fdb462",
    "#b3de69",
    "#fccde5",
    "#d9d9d9",
    "#bc80bd",
)


def _check_tables(tables: Mapping[str, Sequence[int]], num_blocks: int) -> dict[str, list[int]]:
    if not isinstance(tables, Mapping):
        raise TypeError(
            f"tables must be a mapping of sequence label -> block ids, got {type(tables).__name__}"
        )
    checked: dict[str, list[int]] = {}
    for label, table in tables.items():
        if isinstance(table, (str, bytes)) or not isinstance(table, Sequence):
            raise TypeError(
                f"tables[{label!r}] must be a sequence of block ids, got {type(table).__name__}"
            )
        for i, block in enumerate(table):
            if isinstance(block, bool) or not isinstance(block, int):
                raise TypeError(f"tables[{label!r}][{i}] must be an int, got {block!r}")
            if not 0 <= block < num_blocks:
                raise ValueError(
                    f"tables[{label!r}][{i}]={block} is not a block of the pool "
                    f"[0, num_blocks={num_blocks})"
                )
        checked[str(label)] = list(table)
    return checked


def _fill_fractions(
    tables: dict[str, list[int]], lengths: Mapping[str, int] | None, block_size: int | None
) -> dict[str, float]:
    """How full the last block of each table is (1.0 when lengths are not given)."""
    if lengths is None:
        return dict.fromkeys(tables, 1.0)
    size = check_positive_int("block_size", block_size)
    fractions = {}
    for label, table in tables.items():
        n = lengths.get(label, len(table) * size)
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"lengths[{label!r}] must be an int, got {n!r}")
        if not (len(table) - 1) * size < n <= len(table) * size and (n or table):
            raise ValueError(
                f"lengths[{label!r}]={n} does not fit its {len(table)} block(s) of "
                f"block_size={size}: it must be in ({(len(table) - 1) * size}, "
                f"{len(table) * size}]"
            )
        last = n - (len(table) - 1) * size
        fractions[label] = last / size if table else 1.0
    unknown = sorted(set(lengths) - set(tables))
    if unknown:
        raise ValueError(f"lengths names sequences that tables does not have: {unknown}")
    return fractions


def _block_cell(
    x: float, y: float, block: int, fill: str | None, pattern: str, *, fraction: float = 1.0
) -> str:
    """One block: its id in a box, coloured (`fill`), hatched (`"shared"`, with the
    `pattern` id) or free (None); `fraction` of its width is filled."""
    if fill is None:  # free: an outline in the text colour
        box = (
            f'<rect x="{x:g}" y="{y:g}" width="{_CELL}" height="{_CELL}" fill="none" '
            'stroke="currentColor" stroke-opacity="0.45" stroke-dasharray="3 2"/>'
        )
        ink = 'fill="currentColor" fill-opacity="0.6"'
    else:
        paint = f"url(#{pattern})" if fill == "shared" else fill
        width = _CELL * fraction
        box = (
            f'<rect x="{x:g}" y="{y:g}" width="{_CELL}" height="{_CELL}" fill="#ffffff"/>'
            f'<rect x="{x:g}" y="{y:g}" width="{width:g}" height="{_CELL}" fill="{paint}"/>'
            f'<rect x="{x:g}" y="{y:g}" width="{_CELL}" height="{_CELL}" fill="none" '
            f'stroke="{_INK}" stroke-width="{2 if fill == "shared" else 1}"/>'
        )
        ink = f'fill="{_INK}"'
    return (
        box + f'<text x="{x + _CELL / 2:g}" y="{y + _CELL / 2:g}" text-anchor="middle" '
        f'dominant-baseline="central" font-size="11" {ink}>{block}</text>'
    )


def block_tables_svg(
    tables: Mapping[str, Sequence[int]],
    num_blocks: int,
    *,
    lengths: Mapping[str, int] | None = None,
    block_size: int | None = None,
    title: str | None = None,
    order: Sequence[str] | None = None,
    legend: bool = True,
) -> str:
    """Draw the block pool of a paged KV cache and the block table of each sequence.

    The top rows are the pool, blocks `0` to `num_blocks - 1` in the order they sit in
    memory: a block is coloured like the one sequence whose table holds it, hatched
    when several tables hold it (shared through a prefix or a fork), and a dashed
    outline when it is free. Below, one row per sequence lists its table in token
    order, each entry showing the id of the pool block it points at, so a sequence
    whose blocks are scattered over the pool reads left to right. With `lengths` and
    `block_size`, the last entry of each table is filled in proportion to the tokens it
    holds: the empty part is the only memory a paged cache leaves unused.

    The drawing is at most 358 px wide at its own size (a phone's column), with no text
    below 11 px; it carries that width as `--attn-min-width`, as
    [`figure_to_svg`][attnlab.tools.plotting.figure_to_svg] does. Every block cell is a
    `<g>` with `data-block` (its id) and `data-holders` (the labels of the tables that
    hold it, space-separated); table entries add `data-seq` and `data-slot`.

    Args:
        tables: Sequence label -> its block ids in token order, e.g.
            `{f"seq {s}": cache.block_table(s) for s in cache.sequences}` of a
            [`PagedKVCache`][attnlab.serving.cache.PagedKVCache].
        num_blocks: Blocks in the pool.
        lengths: Tokens held per sequence label, e.g. `cache.length(s)`; a label left
            out counts as full.
        block_size: Tokens per block; needed with `lengths`.
        title: A line above the drawing.
        order: Every label that may appear, so that a sequence keeps its colour from
            one drawing to the next (one drawing per moment of a run); by default the
            order of `tables`.
        legend: Write a line under the drawing that says what hatched and dashed
            cells mean (one is enough for several drawings in a row).

    Returns:
        An `<svg>` element as a string, to print from a markdown-exec `html="1"` block.

    Raises:
        TypeError: If `tables` is not a mapping of sequences of ints, or a size or
            length is not an int.
        ValueError: If a block id is outside the pool, `num_blocks` or `block_size` is
            not positive, a length does not fit its table's blocks, or `order` lacks
            a label.

    Examples:
        >>> from attnlab.tools.block_tables import block_tables_svg
        >>> svg = block_tables_svg({"a": [0, 1], "b": [0, 3]}, num_blocks=4, title="t")
        >>> svg.startswith("<svg"), svg.count('data-seq="b" data-slot=')  # b's entries
        (True, 2)
        >>> '<g class="attn-block" data-block="0" data-holders="a b" data-shared=""' in svg
        True
    """
    num_blocks = check_positive_int("num_blocks", num_blocks)
    checked = _check_tables(tables, num_blocks)
    fractions = _fill_fractions(checked, lengths, block_size)
    labels = list(checked)
    palette = labels if order is None else [str(label) for label in order]
    missing = [label for label in labels if label not in palette]
    if missing:
        raise ValueError(f"order must list every label of tables; it lacks {missing}")
    fills = {label: _SEQUENCE_FILLS[k % len(_SEQUENCE_FILLS)] for k, label in enumerate(palette)}
    holders: dict[int, list[str]] = {}
    for label, table in checked.items():
        for block in table:
            if label not in holders.setdefault(block, []):
                holders[block].append(label)

    key_line = "hatched: shared by several tables · dashed: free"
    left = round(max(map(_label_width, ["pool", *labels]))) + 10
    step = _CELL + _GAP
    columns = min(_PER_ROW, max([num_blocks, *(len(t) for t in checked.values())]))
    texts = [key_line] if title is None else [key_line, title]
    width = max(left + columns * step, *(round(_label_width(t)) for t in texts))
    # One pattern per drawing: several drawings on a page must not share an id.
    key = repr((sorted(checked.items()), num_blocks, title)).encode()
    pattern = f"attn-shared-{hashlib.sha1(key).hexdigest()[:8]}"
    parts: list[str] = []
    y = 4.0
    if title is not None:
        parts.append(
            f'<text x="0" y="{y + 12:g}" font-weight="600" fill="currentColor">'
            f"{escape(title)}</text>"
        )
        y += 22

    def row(label: str, kind: str, cells: list[tuple[int, str | None, str, float]]) -> None:
        """A labelled row of cells (block, fill, extra attributes, fraction), wrapped."""
        nonlocal y
        parts.append(
            f'<text x="{left - 8}" y="{y + _CELL / 2:g}" text-anchor="end" '
            f'dominant-baseline="central" fill="currentColor">{escape(label)}</text>'
            f'<g class="attn-blocks-{kind}" data-seq="{escape(label)}">'
        )
        for k, (block, fill, extra, fraction) in enumerate(cells):
            line, col = divmod(k, _PER_ROW)
            who = holders.get(block, [])
            shared = ' data-shared=""' if len(who) > 1 else ""
            parts.append(
                f'<g class="attn-block" data-block="{block}" '
                f'data-holders="{escape(" ".join(who))}"{shared}{extra}>'
                + _block_cell(
                    left + col * step, y + line * step, block, fill, pattern, fraction=fraction
                )
                + "</g>"
            )
        parts.append("</g>")
        y += max(1, -(-len(cells) // _PER_ROW)) * step + 6

    pool: list[tuple[int, str | None, str, float]] = []
    for block in range(num_blocks):
        who = holders.get(block, [])
        fill = None if not who else fills[who[0]] if len(who) == 1 else "shared"
        pool.append((block, fill, "", 1.0))
    row("pool", "pool", pool)
    for label, table in checked.items():
        entries: list[tuple[int, str | None, str, float]] = []
        for slot, block in enumerate(table):
            fill = "shared" if len(holders[block]) > 1 else fills[label]
            fraction = fractions[label] if slot == len(table) - 1 else 1.0
            entries.append(
                (block, fill, f' data-seq="{escape(label)}" data-slot="{slot}"', fraction)
            )
        row(label, "table", entries)
    if legend:
        parts.append(
            f'<text x="0" y="{y + 10:g}" font-size="11" fill="currentColor">{key_line}</text>'
        )
        y += 16
    height = round(y)
    defs = (
        f'<defs><pattern id="{pattern}" width="5" height="5" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="5" height="5" fill="#e3e3e3"/>'
        '<line x1="0" y1="0" x2="0" y2="5" stroke="#b4b4b4" stroke-width="1.5"/></pattern></defs>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-size="12" role="img" '
        f'aria-label="{escape(title or "block tables")}" '
        f'style="--attn-min-width: {width}px">{defs}{"".join(parts)}</svg>'
    )
