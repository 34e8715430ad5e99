"""Tests of attnlab.tools.plotting: the heatmap draws the weights it is given, labelled."""

from __future__ import annotations

import base64
import json
import re
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from hooks.live_model import live_model_asset

from attnlab import CrossAttention, SelfAttention
from attnlab.tools.block_tables import block_tables_svg
from attnlab.tools.plotting import figure_to_svg, heatmap, interactive_heatmap, live_model_widget
from attnlab.tools.train import load_run

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
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


def test_figure_to_svg_carries_the_width_for_11px_text() -> None:
    from matplotlib.figure import Figure

    svg = figure_to_svg(heatmap(torch.eye(6), WORDS, WORDS))
    root = ET.fromstring(svg)
    width = float(root.get("viewBox", "").split()[2])
    # The cell numbers are the smallest text: 8 units of the viewBox (matplotlib's points).
    smallest = min(float(s) for s in re.findall(r"font-size: ([\d.]+)px", svg))
    assert smallest == 8
    found = re.fullmatch(r"--attn-min-width: (\d+)px", root.get("style", ""))
    assert found
    min_width = int(found.group(1))
    assert smallest * min_width / width == pytest.approx(11, abs=0.05)
    # Wider than a phone's column (358 px at 390), so the page says it scrolls.
    assert min_width > 358
    assert root.get("data-attn-wide") == ""

    small = Figure(figsize=(1.5, 1))
    small.add_subplot().set_title("t", fontsize=14)
    tiny = ET.fromstring(figure_to_svg(small))
    assert "data-attn-wide" not in tiny.attrib  # fits a phone: no hint
    assert tiny.get("style", "").startswith("--attn-min-width:")
    bare = Figure(figsize=(1, 1))
    bare.add_subplot().set_axis_off()
    assert ET.fromstring(figure_to_svg(bare)).get("style") is None  # no text, no width


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


# interactive_heatmap ---------------------------------------------------------------------


class _Cells(HTMLParser):
    """Collects the cells, buttons and panels of an interactive heatmap, with their text."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[dict[str, str]] = []  # data-q, data-k, data-w, title, shown
        self.buttons: list[str] = []
        self.panels: list[dict[str, str | None]] = []
        self.hidden: dict[str, bool] = {}
        self._text: list[str] | None = None
        self._where = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        cls = a.get("class") or ""
        if "attn-heatmap-cell" in cls:
            self.cells.append({k: v or "" for k, v in a.items() if k.startswith("data-")})
        elif "attn-heatmap-panel" in cls:
            self.panels.append(a)
        elif cls in ("attn-heatmap-select", "attn-heatmap-readout", "attn-heatmap-hint"):
            self.hidden[cls] = "hidden" in a
        if tag == "button":
            self._text, self._where = [], "button"
        elif tag == "title" and self.cells and "title" not in self.cells[-1]:
            self._text, self._where = [], "title"
        elif (
            tag == "text"
            and self.cells
            and "shown" not in self.cells[-1]
            and ("title" in self.cells[-1])
        ):
            self._text, self._where = [], "shown"

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if self._text is None or tag not in ("button", "title", "text"):
            return
        text, self._text = "".join(self._text), None
        if self._where == "button":
            self.buttons.append(text)
        else:
            self.cells[-1][self._where] = text


def _parse(html: str) -> _Cells:
    parser = _Cells()
    parser.feed(html)
    return parser


def test_interactive_heatmap_one_cell_per_weight_with_its_readout() -> None:
    torch.manual_seed(123)
    weights = torch.softmax(torch.randn(3, 4, 5), dim=-1)  # (heads, t_q, t_k)
    rows = ["The", "cat", "sat", "down"]
    cols = [f"k{j}" for j in range(5)]
    page = _parse(interactive_heatmap(weights, rows, cols))
    assert len(page.cells) == 3 * 4 * 5
    # Cells come panel by panel, row by row; each carries its weight to 4 decimals (the
    # read-out), the tooltip names both tokens, and the cell shows 2 decimals.
    flat = weights.reshape(-1, 5)
    for n, cell in enumerate(page.cells):
        i, j = (n // 5) % 4, n % 5
        value = flat[n // 5, j].item()
        assert (int(cell["data-q"]), int(cell["data-k"])) == (i, j)
        assert float(cell["data-w"]) == pytest.approx(value, abs=5e-5)
        assert cell["title"] == f"query {i} ({rows[i]}) → key {j} ({cols[j]}): {value:.4f}"
        assert cell["shown"] == f"{value:.2f}"


def test_interactive_heatmap_selector_lists_every_panel_first_shown() -> None:
    weights = torch.softmax(torch.randn(2, 3, 4, 4), dim=-1)  # (layers, heads, t, t)
    page = _parse(interactive_heatmap(weights, list("abcd"), list("abcd")))
    names = [f"layer {layer} · head {head}" for layer in (1, 2) for head in (1, 2, 3)]
    assert page.buttons == names
    assert [p["data-name"] for p in page.panels] == names
    # Without the script only the first panel shows, and no dead controls; a <noscript>
    # line names the panels that cannot be shown.
    assert ["hidden" in p for p in page.panels] == [False] + [True] * 5
    assert page.hidden == {
        "attn-heatmap-select": True,
        "attn-heatmap-readout": True,
        "attn-heatmap-hint": True,
    }
    html = interactive_heatmap(weights, list("abcd"), list("abcd"))
    noscript = re.findall(r"<noscript>(.*?)</noscript>", html)
    assert len(noscript) == 1
    assert f"the first of 6 panels; the others ({', '.join(names[1:])})" in noscript[0]

    named = _parse(
        interactive_heatmap(weights[0], list("abcd"), list("abcd"), panel_names=list("xyz"))
    )
    assert named.buttons == ["x", "y", "z"]
    single_html = interactive_heatmap(weights[0, 0], list("abcd"), list("abcd"))
    assert "<noscript>" not in single_html  # one panel: nothing is missing without JS
    single = _parse(single_html)
    assert single.buttons == []
    assert len(single.panels) == 1
    assert len(single.cells) == 16


def test_interactive_heatmap_colours_follow_the_weights() -> None:
    html = interactive_heatmap(torch.tensor([[0.0, 0.5, 1.0]]), ["q"], ["a", "b", "c"])
    fills = re.findall(r'<rect [^>]*fill="(#[0-9a-f]{6})"', html)
    assert fills == ["#f7fbff", "#6baed6", "#08306b"]  # lightest, middle, darkest stop
    # A shared scale: vmax fixes the darkest colour for every panel.
    html = interactive_heatmap(torch.tensor([[0.0, 0.5]]), ["q"], ["a", "b"], vmax=1.0)
    assert re.findall(r'<rect [^>]*fill="(#[0-9a-f]{6})"', html) == ["#f7fbff", "#6baed6"]


def test_interactive_heatmap_escapes_labels() -> None:
    html = interactive_heatmap(torch.eye(2), ["<s>", "a&b"], ["x", "y"], title='"t"')
    assert "<s>" not in html
    assert "&lt;s&gt;" in html
    assert "a&amp;b" in html
    assert _parse(html).cells[0]["title"] == "query 0 (<s>) → key 0 (x): 1.0000"


def test_interactive_heatmap_rejects_bad_input_with_named_argument() -> None:
    with pytest.raises(ValueError, match=r"weights must have 2 or 3 or 4 dimensions.*\(6,\)"):
        interactive_heatmap(torch.rand(6), WORDS, WORDS)
    with pytest.raises(ValueError, match="row_labels has 5 labels but weights has 6 rows"):
        interactive_heatmap(torch.rand(2, 6, 8), WORDS[:5], [str(j) for j in range(8)])
    with pytest.raises(ValueError, match="col_labels has 6 labels but weights has 8 columns"):
        interactive_heatmap(torch.rand(6, 8), WORDS, WORDS)
    with pytest.raises(ValueError, match="panel_names has 1 labels but weights has 2 panels"):
        interactive_heatmap(torch.rand(2, 6, 6), WORDS, WORDS, panel_names=["only"])
    with pytest.raises(ValueError, match="weights must be finite"):
        interactive_heatmap(torch.tensor([[float("nan")]]), ["a"], ["b"])
    with pytest.raises(ValueError, match="weights is empty"):
        interactive_heatmap(torch.zeros(2, 0), ["a", "b"], [])
    with pytest.raises(ValueError, match="vmax must not be below vmin"):
        interactive_heatmap(torch.eye(2), ["a", "b"], ["a", "b"], vmin=0.5, vmax=0.1)
    with pytest.raises(TypeError, match="row_labels must be a sequence"):
        interactive_heatmap(torch.eye(2), "ab", ["a", "b"])  # not split into characters
    with pytest.raises(TypeError, match="weights must hold real numbers"):
        interactive_heatmap(torch.eye(2, dtype=torch.bool), ["a", "b"], ["a", "b"])


def test_interactive_heatmap_cell_size_and_annotate() -> None:
    weights = torch.softmax(torch.randn(3, 7), dim=-1)
    rows, cols = list("abc"), list("abcdegh")
    small = interactive_heatmap(weights, rows, cols, cell_size=16, annotate=False)
    sizes = re.findall(r'<rect x="[\d.]+" y="[\d.]+" width="(\d+)" height="(\d+)"', small)
    assert sizes == [("16", "16")] * 21
    cells = _parse(small).cells
    # No numbers in the cells, but every tooltip and read-out value is still there.
    assert all("shown" not in cell for cell in cells)
    flat = weights.flatten().tolist()
    assert [float(cell["data-w"]) for cell in cells] == pytest.approx(flat, abs=5e-5)
    assert all(cell["title"].startswith("query ") for cell in cells)
    # The drawing is as wide as its cells: 7 columns of 16 px are 7 * 24 px narrower.
    big = interactive_heatmap(weights, rows, cols)
    width = [int(w) for w in re.findall(r'<svg [^>]*width="(\d+)"', small + big)]
    assert width[1] - width[0] == 7 * (40 - 16)
    with pytest.raises(ValueError, match="cell_size must be an int of at least 8 pixels"):
        interactive_heatmap(weights, rows, cols, cell_size=4)


def test_interactive_heatmap_outline_is_drawn_after_every_cell() -> None:
    # SVG paints in document order: an outline drawn on a cell's own rect is covered by
    # the cells after it, so each panel draws one outline last, above all of them.
    html = interactive_heatmap(torch.rand(2, 3, 3), list("abc"), list("abc"), cell_size=30)
    panels = re.findall(r"<svg .*?</svg>", html)
    assert len(panels) == 2
    for svg in panels:
        last = re.findall(r"<rect [^>]*/>", svg)[-1]
        assert 'class="attn-heatmap-outline"' in last
        assert 'width="27" height="27"' in last  # 1.5 px inside the cell on every side
        assert 'pointer-events="none"' in last  # the cell under it still gets the pointer


# block_tables_svg ------------------------------------------------------------------------


def _block_cells(svg: str) -> dict[str, list[dict[str, str]]]:
    """The drawn cells of each row ("pool" and every table), with their attributes."""
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    rows: dict[str, list[dict[str, str]]] = {}
    for group in root.iter(f"{ns}g"):
        kind = group.get("class", "")
        if kind not in ("attn-blocks-pool", "attn-blocks-table"):
            continue
        cells = []
        for cell in group.findall(f"{ns}g"):
            (text,) = cell.findall(f"{ns}text")
            rects = cell.findall(f"{ns}rect")
            cells.append(
                {
                    **cell.attrib,
                    "shown": text.text or "",
                    "fill": rects[-1 if len(rects) == 1 else 1].get("fill", ""),
                }
            )
        rows[group.get("data-seq", "")] = cells
    return rows


def test_block_tables_svg_draws_a_real_cache() -> None:
    from attnlab.serving.cache import PagedKVCache

    cache = PagedKVCache(num_layers=2, num_blocks=10, block_size=4, num_kv_heads=1, head_dim=2)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13]  # two full blocks and one token

    def write(seq: int, n: int) -> None:
        for layer in range(2):
            cache.append(seq, layer, torch.randn(1, n, 2), torch.randn(1, n, 2))

    a, _ = cache.add_sequence(prompt)
    write(a, 9)
    b, cached = cache.add_sequence([*prompt[:8], 1, 2])  # shares the two full blocks
    assert cached == 8
    write(b, 2)
    c = cache.fork(a)  # shares all three of a's blocks
    write(c, 1)  # copies a's last block (copy-on-write)
    labels = {a: "a", b: "b", c: "c"}
    tables = {labels[s]: cache.block_table(s) for s in cache.sequences}
    lengths = {labels[s]: cache.length(s) for s in cache.sequences}
    svg = block_tables_svg(tables, cache.num_blocks, lengths=lengths, block_size=4, title="t")
    rows = _block_cells(svg)

    assert list(rows) == ["pool", "a", "b", "c"]
    for label, table in tables.items():  # each table in token order, its block ids shown
        assert [int(cell["data-block"]) for cell in rows[label]] == table
        assert [cell["shown"] for cell in rows[label]] == [str(block) for block in table]
        assert [int(cell["data-slot"]) for cell in rows[label]] == list(range(len(table)))
    pool = rows["pool"]
    assert [int(cell["data-block"]) for cell in pool] == list(range(10))
    for block, cell in enumerate(pool):
        refs = cache.allocator.refcount(block)
        holders = cell["data-holders"].split()
        assert len(holders) == refs  # one holder per table entry, as the refcounts count
        assert ("data-shared" in cell) == (refs > 1)
        assert (cell["fill"] == "none") == (refs == 0)  # free: an outline only
    # The shared prefix blocks are hatched everywhere they are drawn; a block that only
    # a holds has a's colour in the pool and in a's table.
    shared = tables["a"][:2]
    assert all(cache.allocator.refcount(block) == 3 for block in shared)
    for label in "abc":
        hatched = [cell["fill"].startswith("url(#attn-shared-") for cell in rows[label]]
        assert hatched[:2] == [True, True]
    own = rows["a"][2]  # a's third block: c copied it on write
    assert "data-shared" not in own
    assert own["fill"] == pool[int(own["data-block"])]["fill"] != rows["b"][2]["fill"]


def test_block_tables_svg_fills_the_last_block_by_its_tokens() -> None:
    svg = block_tables_svg({"x": [3, 1], "y": [0]}, 4, lengths={"x": 5}, block_size=4)
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    widths = {}
    for cell in root.iter(f"{ns}g"):
        if cell.get("data-slot") is not None:
            fill_rect = cell.findall(f"{ns}rect")[1]
            widths[cell.get("data-seq"), int(cell.get("data-slot", ""))] = float(
                fill_rect.get("width", "")
            )
    # x holds 5 tokens: its first block is full, its last holds 1 of 4; y is full.
    assert widths == {("x", 0): 22.0, ("x", 1): 5.5, ("y", 0): 22.0}


def test_block_tables_svg_fits_a_phone_with_11px_text() -> None:
    tables = {f"seq {k}": list(range(3 * k, 3 * k + 3)) for k in range(5)}
    svg = block_tables_svg(tables, 16, title="a pool of 16 blocks")
    root = ET.fromstring(svg)
    width = float(root.get("viewBox", "").split()[2])
    assert width <= 358  # a phone's column at 390 px: shown at its own size
    assert root.get("style") == f"--attn-min-width: {width:g}px"
    sizes = [float(s) for s in re.findall(r'font-size="([\d.]+)"', svg)]
    assert min(sizes) >= 11
    # Two drawings on one page do not share the id of their hatch pattern.
    other = block_tables_svg({"seq 0": [1]}, 16)
    ids = re.findall(r'<pattern id="([^"]+)"', svg + other)
    assert len(ids) == len(set(ids)) == 2
    # The pool wraps after 12 blocks: 16 blocks take two lines.
    ys = {
        cell.get("data-block"): cell.find("{http://www.w3.org/2000/svg}rect").get("y")  # type: ignore[union-attr]
        for cell in root.iter("{http://www.w3.org/2000/svg}g")
        if cell.get("data-slot") is None and cell.get("data-block")
    }
    assert ys["0"] == ys["11"] != ys["12"]


def test_block_tables_svg_colours_stay_with_their_sequence() -> None:
    first = _block_cells(block_tables_svg({"A": [0], "B": [1]}, 4, order=["A", "B", "C"]))
    later = _block_cells(block_tables_svg({"C": [2], "B": [1]}, 4, order=["A", "B", "C"]))
    assert first["B"][0]["fill"] == later["B"][0]["fill"]
    assert later["C"][0]["fill"] not in (first["A"][0]["fill"], first["B"][0]["fill"])
    assert "hatched" not in block_tables_svg({"A": [0]}, 4, legend=False)


def test_block_tables_svg_rejects_bad_input_with_named_argument() -> None:
    with pytest.raises(ValueError, match=r"tables\['a'\]\[1\]=4 is not a block of the pool"):
        block_tables_svg({"a": [0, 4]}, 4)
    with pytest.raises(TypeError, match=r"tables\['a'\]\[0\] must be an int"):
        block_tables_svg({"a": [1.0]}, 4)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="tables must be a mapping"):
        block_tables_svg([[0, 1]], 4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_blocks must be a positive int"):
        block_tables_svg({"a": []}, 0)
    with pytest.raises(TypeError, match="block_size must be a positive int"):
        block_tables_svg({"a": [0]}, 4, lengths={"a": 1})
    with pytest.raises(ValueError, match=r"lengths\['a'\]=9 does not fit its 2 block"):
        block_tables_svg({"a": [0, 1]}, 4, lengths={"a": 9}, block_size=4)
    with pytest.raises(ValueError, match=r"lengths\['a'\]=4 does not fit"):
        block_tables_svg({"a": [0, 1]}, 4, lengths={"a": 4}, block_size=4)  # 2nd block empty
    with pytest.raises(ValueError, match="tables does not have: \\['z'\\]"):
        block_tables_svg({"a": [0]}, 4, lengths={"z": 1}, block_size=4)
    with pytest.raises(ValueError, match=r"order must list every label.*\['b'\]"):
        block_tables_svg({"a": [0], "b": [1]}, 4, order=["a"])


# The live model ---------------------------------------------------------------------------

MODEL_RUN = ROOT / "docs" / "assets" / "model"


def _decode_asset(text: str) -> tuple[dict[str, object], dict[str, torch.Tensor]]:
    """The config and tensors of a live-model asset, decoded independently of the writer."""
    prefix = "window.attnlabLiveModel = "
    assert text.startswith(prefix)
    assert text.rstrip().endswith(";")
    payload = json.loads(text[len(prefix) :].rstrip().rstrip(";"))
    data = base64.b64decode(payload["data"])
    tensors, offset = {}, 0
    for name, shape in payload["tensors"]:
        count = int(np.prod(shape))
        values = np.frombuffer(data, dtype="<f4", count=count, offset=offset)
        tensors[name] = torch.from_numpy(values.copy()).reshape(shape)
        offset += 4 * count
    assert offset == len(data)  # nothing left over
    return payload["config"], tensors


def test_live_model_asset_from_the_build_hook_round_trips_the_state_dict(
    tmp_path: Path,
) -> None:
    from hooks import live_model
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files

    # The hook as MkDocs runs it: loaded from the config's `hooks`, called by the event.
    config = MkDocsConfig()
    config.load_dict(
        {
            "site_name": "t",
            "docs_dir": str(ROOT / "docs"),
            "site_dir": str(tmp_path),
            "hooks": [str(ROOT / "docs" / "hooks" / "live_model.py")],
            "plugins": [],
        }
    )
    failed, _ = config.validate()
    assert not failed
    files = config.plugins.on_files(Files([]), config=config)
    generated = files.get_file_from_path(live_model.ASSET)
    assert generated is not None
    text = generated.content_string
    model, record = load_run(MODEL_RUN)
    assert text == live_model_asset(model)
    saved, tensors = _decode_asset(text)
    assert saved == record["config"]["model"] == model.config.to_dict()
    state = model.state_dict()
    assert list(tensors) == list(state)
    for name, tensor in state.items():
        assert torch.equal(tensors[name], tensor), name  # bit for bit
    assert sum(t.numel() for t in tensors.values()) == record["parameters"]
    assert len(text) < 250_000  # 45k float32 in base64, plus the names


def test_live_model_widget_shows_the_models_predictions_and_every_head() -> None:
    model, _ = load_run(MODEL_RUN)
    tokens = [5, 17, 42, 9, 5, 17, 42, 9]
    html = live_model_widget(model, tokens, title="live", cell_size=12)
    logits = model(torch.tensor([tokens]))[0]
    best = logits.argmax(dim=-1).tolist()
    cells = re.findall(r"<tr><th scope=\"row\">predicts</th>(.*?)</tr>", html)
    assert len(cells) == 1
    shown = [int(v) for v in re.findall(r"<td[^>]*>(?:<b>)?(\d+)(?:</b>)?</td>", cells[0])]
    assert shown == best
    hits = sum(best[i] == tokens[i + 1] for i in range(len(tokens) - 1))
    assert hits > 0  # the second copy is predicted, so the marking below is checked
    assert cells[0].count('<td class="attn-live-hit"><b>') == hits
    assert f"comes next at {hits} of the 7 positions" in html
    # 2 layers x 4 heads, each a full t x t grid; the weights are the model's.
    assert html.count('class="attn-heatmap-panel"') == 8
    assert html.count('class="attn-heatmap-cell"') == 8 * len(tokens) ** 2
    maps = model.attention_maps(torch.tensor([tokens]))
    expected = f'data-q="7" data-k="5" data-w="{maps[1][0, 3, 7, 5].item():.4f}"'
    assert expected in html.split('data-panel="7"')[-1]
    assert 'data-tokens="5 17 42 9 5 17 42 9"' in html
    assert "layer 2 · head 4" in html


def test_live_model_widget_rejects_bad_input_with_named_argument() -> None:
    from attnlab.models.tiny import ModelConfig, TinyTransformer

    model, _ = load_run(MODEL_RUN)
    with pytest.raises(ValueError, match=r"tokens\[1\]=64 is outside .*\[0, 64\)"):
        live_model_widget(model, [1, 64])
    with pytest.raises(ValueError, match="1 to max_len=48 ids, got 49"):
        live_model_widget(model, [1] * 49)
    with pytest.raises(ValueError, match="got 0"):
        live_model_widget(model, [])
    with pytest.raises(TypeError, match=r"tokens\[0\] must be an int"):
        live_model_widget(model, [1.5])
    with pytest.raises(TypeError, match="1-d integer tensor"):
        live_model_widget(model, torch.zeros(3))
    with pytest.raises(TypeError, match="1-d integer tensor"):
        live_model_widget(model, torch.tensor([True, False]))
    with pytest.raises(ValueError, match=r"tokens\[2\]=70 is outside .*\[0, 64\)"):
        live_model_widget(model, torch.tensor([1, 2, 70]))
    with pytest.raises(TypeError, match=r"model must be an attnlab\.models\.tiny\.TinyTransformer"):
        live_model_widget(torch.nn.Linear(2, 2), [1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attention-only"):
        live_model_asset(TinyTransformer(ModelConfig(vocab_size=4, max_len=4, mlp=True)))
    with pytest.raises(ValueError, match="panel_names has 2 labels"):
        live_model_widget(model, [1], panel_names=["a", "b"])
