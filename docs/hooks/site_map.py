"""MkDocs hook: the map of the site on the home page, and the table it is drawn from.

Two tables below are the one source for how the chapters connect:

- ``PREREQUISITES``: which chapter (or which section of one) needs which other chapter
  read first, and why, in a few words. It draws the map's "read this first" arrows, and
  it gives each such chapter its "Before this" line, the first line after its title (or
  after the section's heading). That line is written in the chapter's Markdown, so that
  it is there in the source and in the downloaded notebook too; ``before_line`` is the
  text it must have. The strict build (a warning) and ``tests/test_site_map.py`` fail
  when a page's line and this table disagree, or when a page has a "Before this" line
  the table does not give; ``python docs/hooks/site_map.py --update`` writes the lines
  the table gives into the pages.
- ``READING_PATHS``: three readers' ways through the site, listed under the map.

The map is drawn from ``mkdocs.yml``'s nav: the article's chapters in reading order,
then the chapters of *Beyond the article* and of *Attention in modern LLMs*, each box a
link to its chapter, titled with the chapter's own heading. So a chapter added to the
nav appears on the map, and a renamed or removed one that the tables still name fails
the strict build (a warning here) and the tests. The page that shows the map holds the
markers ``<!-- attnlab:site-map -->`` and ``<!-- attnlab:reading-paths -->``; once its
Markdown is rendered, the first becomes two drawings of the map, a wide one and a narrow
one that a phone shows instead (``assets/stylesheets/extra.css``), the second the list
of reading paths. The drawings' colours are the theme's own variables, so the light and
the dark scheme both draw them.
"""

from __future__ import annotations

import html
import itertools
import logging
import posixpath
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.site_map")

DOCS = Path(__file__).resolve().parent.parent
MARKER = "<!-- attnlab:site-map -->"  # where the map goes
PATHS_MARKER = "<!-- attnlab:reading-paths -->"  # where the reading paths go
BEFORE = "**Before this:**"  # how a "Before this" line starts


@dataclass(frozen=True)
class Prerequisite:
    """``page`` (or its ``section``) is best read after ``needs`` (or its ``needs_section``)."""

    page: str  # a chapter, relative to docs/
    needs: str  # the chapter to read first
    why: str  # the rest of the line, after the link
    section: str | None = None  # a heading of `page`: only that section needs it
    needs_section: str | None = None  # a heading of `needs`: the link goes there


PREREQUISITES = (
    Prerequisite(
        "modern/real-llm.md",
        "beyond/induction-heads.md",
        "its probes for previous-token and induction heads are the ones this chapter "
        "runs on a real model.",
    ),
    Prerequisite(
        "modern/softcapping-and-sinks.md",
        "beyond/flash-attention.md",
        "both changes go into that tiled kernel, forward and backward, through $dS$ and "
        "the saved log-sum-exp.",
        needs_section="The backward pass",
    ),
    Prerequisite(
        "modern/flex-attention.md",
        "beyond/flash-attention.md",
        "FlexAttention generates that tiled kernel, forward and backward, for each rule you write.",
        needs_section="The backward pass",
    ),
    Prerequisite(
        "modern/serving.md",
        "modern/flex-attention.md",
        "this section writes the packed prompts and the block tables as its mask "
        "functions and block masks.",
        section="Where FlexAttention's block masks fit",
    ),
    Prerequisite(
        "modern/sparse-attention.md",
        "modern/mla.md",
        "DeepSeek's sparse attention selects entries of that latent cache.",
    ),
)


@dataclass(frozen=True)
class ReadingPath:
    reader: str
    steps: tuple[str, ...]  # chapters (a section's index page stands for the section)
    note: str


READING_PATHS = (
    ReadingPath(
        "A learner",
        ("article/index.md", "modern/index.md"),
        "the article in order, then the modern chapters in order.",
    ),
    ReadingPath(
        "An engineer",
        (
            "beyond/production.md",
            "beyond/flash-attention.md",
            "modern/kv-cache.md",
            "modern/serving.md",
        ),
        "from the article's class to a fused module, a kernel without the score matrix, "
        "the cache of generation and a server's paged cache.",
    ),
    ReadingPath(
        "A researcher",
        (
            "beyond/induction-heads.md",
            "modern/real-llm.md",
            "modern/softcapping-and-sinks.md",
            "modern/linear-attention.md",
        ),
        "heads found in a trained toy, then in a real model, what models change in the "
        "softmax, and layers that replace attention with a state.",
    ),
)

MAP_SECTIONS = ("article", "beyond", "modern")  # the folders the map draws


# --- the nav and the pages ---------------------------------------------------------


def nav_pages(nav: list[Any]) -> list[tuple[str, str]]:
    """Each page of the nav with the title of its top-level section, in nav order."""

    def walk(items: list[Any], section: str) -> Iterator[tuple[str, str]]:
        for item in items:
            if isinstance(item, str):
                yield section, item
            elif isinstance(item, dict):
                for title, value in item.items():
                    if isinstance(value, str):
                        yield section or title, value
                    else:
                        yield from walk(value, section or title)

    return list(walk(nav, ""))


def title(page: str, docs: Path = DOCS) -> str:
    """A page's ``# `` heading as plain text (inline code unmarked)."""
    found = re.search(r"^# (.+)$", (docs / page).read_text("utf-8"), flags=re.M)
    return found[1].replace("`", "").strip() if found else Path(page).stem


def headings(page: str, docs: Path = DOCS) -> list[str]:
    """The texts of a page's ``## ``/``### `` headings (outside code fences)."""
    text = re.sub(r"^(```|~~~).*?^\1", "", (docs / page).read_text("utf-8"), flags=re.M | re.S)
    return [m[1].strip() for m in re.finditer(r"^#{2,6} (.+?)\s*#*$", text, flags=re.M)]


def slug(heading: str) -> str:
    """The anchor MkDocs gives a heading (the toc extension's default slugify)."""
    from markdown.extensions.toc import slugify

    return str(slugify(heading, "-"))


def _lower_first(text: str) -> str:
    return text[0].lower() + text[1:] if text[1:2].islower() else text


def before_line(entry: Prerequisite, docs: Path = DOCS) -> str:
    """The "Before this" line that ``entry`` gives its page, as Markdown."""
    target = posixpath.relpath(entry.needs, posixpath.dirname(entry.page))
    text = title(entry.needs, docs)
    if entry.needs_section is not None:
        target += "#" + slug(entry.needs_section)
        text += ": " + _lower_first(entry.needs_section)
    return f"{BEFORE} [{text}]({target}): {entry.why}"


def before_lines(docs: Path = DOCS) -> dict[tuple[str, str | None], str]:
    """The "Before this" lines the chapters have: (page, section or None) -> line.

    A line counts where it stands: the first line after the page's title (section
    None) or after a section's heading. One anywhere else is listed under its line
    number, as ``(page, "line N")``, so that it fails the comparison with the table.
    """
    found: dict[tuple[str, str | None], str] = {}
    for folder in MAP_SECTIONS:
        for path in sorted((docs / folder).glob("*.md")):
            page = f"{folder}/{path.name}"
            lines = path.read_text("utf-8").splitlines()
            after: str | None = None  # the heading the text below belongs to
            fence = False
            for number, line in enumerate(lines, start=1):
                if line.startswith(("```", "~~~")):
                    fence = not fence
                if fence or not line.strip():
                    continue
                heading = re.match(r"^(#{1,6}) (.+?)\s*$", line)
                if heading:
                    after = "" if heading[1] == "#" else heading[2]
                    continue
                if line.startswith(BEFORE):
                    key = (page, after or None) if after is not None else (page, f"line {number}")
                    found[key] = line
                after = None
    return found


def expected_before_lines(docs: Path = DOCS) -> dict[tuple[str, str | None], str]:
    """The "Before this" lines the table gives: (page, section or None) -> line."""
    return {(entry.page, entry.section): before_line(entry, docs) for entry in PREREQUISITES}


def write_before_lines(docs: Path = DOCS) -> list[str]:
    """Put the line the table gives under each heading it names; return the pages changed."""
    changed = []
    for entry in PREREQUISITES:
        path = docs / entry.page
        lines = path.read_text("utf-8").splitlines(keepends=True)
        wanted = "# " + title(entry.page, docs) if entry.section is None else "## " + entry.section
        at = next(
            k
            for k, line in enumerate(lines)
            if line.startswith("#") and line.replace("`", "").strip() == wanted
        )
        below = next(k for k in range(at + 1, len(lines)) if lines[k].strip())
        new = before_line(entry, docs) + "\n"
        if lines[below].startswith(BEFORE):
            if lines[below] == new:
                continue
            lines[below] = new
        else:
            lines[below:below] = [new, "\n"]
        path.write_text("".join(lines), "utf-8")
        changed.append(entry.page)
    return changed


def problems(nav: list[Any], docs: Path = DOCS) -> list[str]:
    """What in the tables no longer matches the nav or the pages (empty when all do)."""
    in_nav = {page for _, page in nav_pages(nav)}
    found = []
    have, want = before_lines(docs), expected_before_lines(docs)
    for key in sorted(set(have) | set(want), key=str):
        if have.get(key) != want.get(key):
            page, section = key
            where = f"{page}, " + (f"section {section!r}" if section else "under its title")
            found.append(
                f"site_map: the 'Before this' line of {where} is {have.get(key)!r}; "
                f"PREREQUISITES gives {want.get(key)!r}"
            )
    for entry in PREREQUISITES:
        for page, section in ((entry.page, entry.section), (entry.needs, entry.needs_section)):
            if page not in in_nav:
                found.append(f"site_map.PREREQUISITES names {page}, which is not in the nav")
            elif section is not None and section not in headings(page, docs):
                found.append(f"site_map.PREREQUISITES: {page} has no heading {section!r}")
    for path in READING_PATHS:
        found += [
            f"site_map.READING_PATHS ({path.reader}) names {page}, which is not in the nav"
            for page in path.steps
            if page not in in_nav
        ]
    return found


# --- the drawing ---------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    name: str
    width: int
    article_columns: int
    font: int  # px, the boxes' text; the headings are 2 px larger
    gap: int  # between the two lower columns (the cross arrows run there)
    margin: int  # right of the modern column (its own arrows bend there)


WIDE = Layout("wide", width=660, article_columns=4, font=12, gap=56, margin=36)
NARROW = Layout("narrow", width=340, article_columns=2, font=11, gap=30, margin=24)
PAD, ROW_GAP, LINE = 6, 8, 1.3  # box padding, space between boxes, line height (em)


@dataclass
class Box:
    page: str
    lines: list[str]
    x: float
    y: float
    w: float
    h: float = 0.0
    children: list[str] = field(default_factory=list)

    @property
    def mid_y(self) -> float:
        return self.y + self.h / 2


def wrap(text: str, width: float, font: int) -> list[str]:
    """``text`` in lines that fit ``width`` px (a sans-serif letter is ~0.55 em wide)."""
    most = max(8, int(width / (0.55 * font)))
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= most:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def _text(x: float, y: float, lines: list[str], font: int, cls: str, anchor: str = "") -> str:
    anchor_attr = f' text-anchor="{anchor}"' if anchor else ""
    spans = "".join(
        f'<tspan x="{x:.1f}" dy="{0 if k == 0 else LINE:g}{"" if k == 0 else "em"}">'
        f"{html.escape(line)}</tspan>"
        for k, line in enumerate(lines)
    )
    return (
        f'<text class="{cls}" x="{x:.1f}" y="{y:.1f}" font-size="{font}"{anchor_attr}>'
        f"{spans}</text>"
    )


def _box(box: Box, font: int, href: str) -> str:
    text_y = box.y + PAD + 0.9 * font
    return (
        f'<a href="{html.escape(href)}"><g class="attn-map-box">'
        f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}" height="{box.h:.1f}" rx="5"/>'
        f"{_text(box.x + PAD, text_y, box.lines, font, 'attn-map-label')}</g></a>"
    )


def _arrow(d: str, cls: str, marker: str, label: str = "") -> str:
    hint = f"<title>{html.escape(label)}</title>" if label else ""
    return f'<path class="{cls}" d="{d}" marker-end="url(#{marker})">{hint}</path>'


def draw(
    layout: Layout,
    nav: list[Any],
    href: Callable[[str], str],
    docs: Path = DOCS,
) -> str:
    """The map as one ``<svg>``, its boxes linked by ``href(page)``."""
    pages = nav_pages(nav)
    sections: dict[str, tuple[str, list[str]]] = {}
    for section, page in pages:
        folder = page.split("/")[0]
        if folder in MAP_SECTIONS:
            sections.setdefault(folder, (section, []))[1].append(page)
    font, big = layout.font, layout.font + 2
    line_h = LINE * font
    out: list[str] = []
    boxes: dict[str, Box] = {}
    ident = f"attn-map-{layout.name}"

    def box_height(lines: list[str]) -> float:
        return 2 * PAD + line_h * (len(lines) - 1) + font

    def heading(x: float, y: float, folder: str, width: float) -> float:
        name, members = sections[folder]
        lines = wrap(name, width, big)
        index = f"{folder}/index.md"
        text = _text(x, y + big, lines, big, "attn-map-heading")
        out.append(f'<a href="{html.escape(href(index))}">{text}</a>' if index in members else text)
        return y + big + LINE * big * (len(lines) - 1) + 8

    # The article: its chapters in reading order, a snake through a grid.
    y = heading(0, 0, "article", layout.width)
    chapters = [p for p in sections["article"][1] if not p.endswith("index.md")]
    cols = layout.article_columns
    col_w = (layout.width - (cols - 1) * 20) / cols
    rows = [chapters[k : k + cols] for k in range(0, len(chapters), cols)]
    for r, row in enumerate(rows):
        placed = []
        for c, page in enumerate(row):
            col = c if r % 2 == 0 else cols - 1 - c
            number = re.match(r"(\d+)-", Path(page).name)
            label = f"{int(number[1])}. " if number else ""
            lines = wrap(label + title(page, docs), col_w - 2 * PAD, font)
            placed.append(Box(page, lines, col * (col_w + 20), y, col_w))
        height = max(box_height(b.lines) for b in placed)
        for b in placed:
            b.h = height
            boxes[b.page] = b
        y += height + 22
    order = [boxes[p] for p in chapters]
    for a, b in itertools.pairwise(order):
        if abs(a.y - b.y) < 1:  # the same row: side to side
            x1, x2 = (a.x + a.w, b.x) if b.x > a.x else (a.x, b.x + b.w)
            d = f"M{x1:.1f},{a.mid_y:.1f} L{x2:.1f},{b.mid_y:.1f}"
        else:  # the next row starts under the end of this one
            d = f"M{a.x + a.w / 2:.1f},{a.y + a.h:.1f} L{b.x + b.w / 2:.1f},{b.y:.1f}"
        out.append(_arrow(d, "attn-map-path", f"{ident}-path"))

    # Beyond and modern, side by side under the article: each may be read after it.
    col_w = (layout.width - layout.gap - layout.margin) / 2
    lefts = {"beyond": 0.0, "modern": col_w + layout.gap}
    last = order[-1]
    top = y + 18  # the article's last row ends 22 px above y; arrows from it fill the gap
    bottoms = {}
    for folder, x in lefts.items():
        x1, y1, x2 = last.x + last.w / 2, last.y + last.h, x + col_w / 2
        d = f"M{x1:.1f},{y1:.1f} C{x1:.1f},{top - 8:.1f} {x2:.1f},{y1 + 8:.1f} "
        d += f"{x2:.1f},{top - 2:.1f}"
        out.append(_arrow(d, "attn-map-path", f"{ident}-path"))
        yy = heading(x, top, folder, col_w)
        for page in sections[folder][1]:
            if page.endswith("index.md"):
                continue
            lines = wrap(title(page, docs), col_w - 2 * PAD, font)
            b = Box(page, lines, x, yy, col_w, box_height(lines))
            boxes[page] = b
            yy += b.h + ROW_GAP
        bottoms[folder] = yy

    # "Read this first": from the chapter to read first to the one that needs it. Arrows
    # within one column bend out to its right, the longer ones further.
    found = [(e, boxes.get(e.needs), boxes.get(e.page)) for e in PREREQUISITES]
    found = [(e, a, b) for e, a, b in found if a is not None and b is not None]
    inside = sorted(
        (abs(b.mid_y - a.mid_y), k) for k, (_, a, b) in enumerate(found) if abs(a.x - b.x) < 1
    )
    bend = {k: layout.margin / 0.75 * (n + 1) / len(inside) for n, (_, k) in enumerate(inside)}
    for k, (entry, a, b) in enumerate(found):
        label = f"Read {title(entry.needs, docs)} before {title(entry.page, docs)}"
        if k in bend:  # the same column
            x, c = a.x + a.w, a.x + a.w + bend[k]
            d = (
                f"M{x:.1f},{a.mid_y:.1f} C{c:.1f},{a.mid_y:.1f} "
                f"{c:.1f},{b.mid_y:.1f} {x + 1:.1f},{b.mid_y:.1f}"
            )
        else:
            x1, x2 = (a.x + a.w, b.x) if b.x > a.x else (a.x, b.x + b.w)
            pull = (x2 - x1) * 0.6
            d = (
                f"M{x1:.1f},{a.mid_y:.1f} C{x1 + pull:.1f},{a.mid_y:.1f} "
                f"{x2 - pull:.1f},{b.mid_y:.1f} {x2:.1f},{b.mid_y:.1f}"
            )
        out.append(_arrow(d, "attn-map-needs", f"{ident}-needs", label))

    # A legend where the shorter lower column ends.
    legend_y = bottoms["beyond"] + 10
    sample = 26
    out.append(
        _arrow(
            f"M0,{legend_y + 6:.1f} L{sample},{legend_y + 6:.1f}",
            "attn-map-needs",
            f"{ident}-needs",
        )
    )
    out.append(
        _text(sample + 6, legend_y + 6 + 0.35 * font, ["read this first"], font, "attn-map-note")
    )
    out.append(
        _arrow(
            f"M0,{legend_y + 28:.1f} L{sample},{legend_y + 28:.1f}",
            "attn-map-path",
            f"{ident}-path",
        )
    )
    out.append(
        _text(sample + 6, legend_y + 28 + 0.35 * font, ["reading order"], font, "attn-map-note")
    )
    height = max(max(bottoms.values()), legend_y + 40) + 2

    body = "".join(_box(b, font, href(b.page)) for b in boxes.values()) + "".join(out)
    markers = "".join(
        f'<marker id="{ident}-{kind}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        f'markerHeight="7" orient="auto-start-reverse"><path class="attn-map-head-{kind}" '
        'd="M0,0 L10,5 L0,10 z"/></marker>'
        for kind in ("path", "needs")
    )
    return (
        f'<svg class="{ident}" xmlns="http://www.w3.org/2000/svg" width="{layout.width}" '
        f'height="{height:.0f}" viewBox="-1 -1 {layout.width + 2} {height + 2:.0f}" '
        f'aria-labelledby="{ident}-title {ident}-desc" data-search-exclude="">'
        f'<title id="{ident}-title">A map of the site</title>'
        f'<desc id="{ident}-desc">{html.escape(describe(nav, docs))}</desc>'
        f"<defs>{markers}</defs>{body}</svg>"
    )


def describe(nav: list[Any], docs: Path = DOCS) -> str:
    """The map in words (the drawing's description, for screen readers)."""
    counts = {
        section: sum(1 for s, p in nav_pages(nav) if s == section and not p.endswith("index.md"))
        for section, page in nav_pages(nav)
        if page.split("/")[0] in MAP_SECTIONS
    }
    parts = [f"{name}: {n} chapters" for name, n in counts.items()]
    needs = [
        f"read {title(e.needs, docs)} before {title(e.page, docs)}"
        + (f" (its section {e.section})" if e.section else "")
        for e in PREREQUISITES
    ]
    return (
        "; ".join(parts)
        + ". The article is read in order; the other two parts after it, in any order, "
        + "except: "
        + "; ".join(needs)
        + "."
    )


def reading_paths(href: Callable[[str], str], docs: Path = DOCS) -> str:
    """The three readers' paths, as an HTML list of links."""
    items = []
    for path in READING_PATHS:
        steps = " → ".join(
            f'<a href="{html.escape(href(page))}">{html.escape(title(page, docs))}</a>'
            for page in path.steps
        )
        items.append(f"<li><strong>{path.reader}</strong>: {steps}; {html.escape(path.note)}</li>")
    return f'<ul class="attn-map-paths">{"".join(items)}</ul>'


def map_html(nav: list[Any], href: Callable[[str], str], docs: Path = DOCS) -> str:
    """What replaces ``MARKER``: both drawings of the map, in a box that scrolls."""
    drawings = "".join(draw(layout, nav, href, docs) for layout in (WIDE, NARROW))
    return f'<div class="attn-map">{drawings}</div>'


# --- the hook --------------------------------------------------------------------------


def on_config(config: Any) -> Any:
    for problem in problems(config["nav"] or [], Path(config["docs_dir"])):
        log.warning(problem)
    return config


def on_page_content(html_: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in html_ and PATHS_MARKER not in html_:
        return html_
    from mkdocs.utils import get_relative_url

    def href(src: str) -> str:
        file = files.get_file_from_path(src)
        if file is None:
            log.warning(f"site_map: the map links {src}, which is not a page of the site")
            return "#"
        return get_relative_url(file.url, page.url)

    nav, docs = config["nav"] or [], Path(config["docs_dir"])
    html_ = html_.replace(MARKER, map_html(nav, href, docs))
    return html_.replace(PATHS_MARKER, reading_paths(href, docs))


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python docs/hooks/site_map.py --update")
    for page in write_before_lines():
        print(f"wrote the 'Before this' line of docs/{page}")
