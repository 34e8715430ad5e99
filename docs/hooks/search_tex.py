"""What the search index holds: math as readable text, no figure internals, chapters first.

Pages keep their math as ``\\(...\\)`` and ``\\[...\\]`` for KaTeX to render in the
browser, so the search plugin indexes the TeX source and a result snippet reads
``the weights \\(\\alpha_{ij}\\) of query \\(i\\)``. After the build, this hook rewrites
``search/search_index.json``: each formula loses its delimiters and its commands become the
characters they stand for (``α_ij``, ``√d_k``, ``Kᵀ``), so the snippet reads
``the weights α_ij of query i``. The index stores HTML, so a formula's entities
(``j &gt; i``) are read as the characters they stand for and written back escaped.

Two more things, on each page before the search plugin reads it (``on_page_content``):

- figures drawn inline (matplotlib's SVG with its metadata and tick labels, the
  interactive heatmaps' panel buttons) are marked ``data-search-exclude``, which
  Material's search skips, so a result snippet is prose or code, not axis labels;
- the pages of the article, beyond/ and modern/ get a search boost (``search: boost``,
  as front matter would set it, unless the page sets its own), so a chapter ranks above
  the API entries that name the same thing.

And one thing for the build's time: Material's search plugin reads each page's HTML with
its own parser when it writes the page out, at the end of the build, when the pages' code
has run and only the build's own process works (4.5 s of CPU time for this site, measured
on its built pages). So once every page's HTML is final (``on_env``, after
autorefs has put in its links), a forked process reads the second half of the pages with
that same parser, on the machine's other core, and the search plugin takes its reading of
those pages instead of reading them again (:func:`parse_ahead`). The index is the same.
"""

from __future__ import annotations

import html
import json
import os
import pickle
import re
import tempfile
import traceback
from pathlib import Path
from typing import Any

MATH = re.compile(r"\\\((?P<inline>.*?)\\\)|\\\[(?P<display>.*?)\\\]", flags=re.S)
SYMBOLS = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "varepsilon": "ε",
    "theta": "θ", "lambda": "λ", "mu": "μ", "pi": "π", "sigma": "σ", "tau": "τ",
    "phi": "φ", "omega": "ω", "Omega": "Ω", "Sigma": "Σ", "Delta": "Δ",
    "sum": "Σ", "prod": "Π", "infty": "∞", "cdot": "·", "times": "×", "le": "≤", "leq": "≤",
    "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠", "approx": "≈", "in": "∈", "dots": "…",
    "ldots": "…", "cdots": "…", "ell": "ℓ", "partial": "∂", "to": "→", "rightarrow": "→",
    "mapsto": "↦", "odot": "⊙", "top": "ᵀ", "pm": "±", "sqrt": "√",
}  # fmt: skip
SPACES = {",", ";", ":", "!", " ", "quad", "qquad", "\\"}
DROPPED = {"left", "right", "big", "Big", "bigl", "bigr", "textstyle", "displaystyle"}
NAMED = re.compile(r"\\(?:operatorname|text|mathrm|mathbf|mathit|mathcal)\{([^{}]*)\}")
SQRT = re.compile(r"\\sqrt\{([^{}]*)\}")
FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
ENVIRONMENT = re.compile(r"\\(?:begin|end)\{[^{}]*\}")
BLACKBOARD = re.compile(r"\\mathbb\{([A-Z])\}")
COMMAND = re.compile(r"\\([A-Za-z]+|.)")


def _group(tex: str) -> str:
    tex = tex.strip()
    return tex if re.fullmatch(r"[\w.√]+", tex) else f"({tex})"


def _frac(match: re.Match[str]) -> str:
    return f"{_group(match[1])}/{_group(match[2])}"


def _command(match: re.Match[str]) -> str:
    name = match[1]
    if name in SYMBOLS:
        return SYMBOLS[name]
    if name in SPACES:
        return " "
    if name in DROPPED:
        return ""
    return name  # \max, \log, \exp, \{ ... read as their names


def tex_to_text(tex: str) -> str:
    """A formula's TeX as plain text: ``1/\\sqrt{d_k}`` becomes ``1/√d_k``."""
    text = ENVIRONMENT.sub(" ", tex)
    text = NAMED.sub(r"\1", text)
    text = BLACKBOARD.sub(lambda m: {"R": "ℝ", "N": "ℕ", "Z": "ℤ"}.get(m[1], m[1]), text)
    text = re.sub(r"\^\s*\\top\b", "ᵀ", text)
    for _ in range(3):  # roots and fractions of fractions, innermost first
        text = SQRT.sub(lambda m: "√" + _group(m[1]), text)
        text = FRAC.sub(_frac, text)
    text = COMMAND.sub(_command, text)
    text = re.sub(r"([_^])\{([^{}]*)\}", r"\1\2", text)  # x_{ij} -> x_ij
    text = text.replace("{", "").replace("}", "").replace("&", " ")  # & aligns columns
    text = re.sub(r"√\s+", "√", text)
    return " ".join(text.split())


def strip_math(text: str) -> str:
    """Replace every ``\\(...\\)`` and ``\\[...\\]`` in `text` (HTML) by its plain-text form.

    The formula's entities (``&gt;``, ``&amp;``) are decoded before its TeX is read and
    the result escaped again, so ``\\(j &gt; i\\)`` becomes ``j &gt; i``.
    """

    def plain(match: re.Match[str]) -> str:
        tex = html.unescape(match["inline"] or match["display"] or "")
        return html.escape(tex_to_text(tex), quote=False)

    return MATH.sub(plain, text)


def rewrite_index(path: Path) -> int:
    """Rewrite a search index in place; return how many entries changed."""
    index = json.loads(path.read_text(encoding="utf-8"))
    changed = 0
    for doc in index.get("docs", []):
        for key in ("title", "text"):
            if isinstance(doc.get(key), str):
                new = strip_math(doc[key])
                changed += new != doc[key]
                doc[key] = new
    path.write_text(json.dumps(index, ensure_ascii=False, separators=(",", ":")), "utf-8")
    return changed


SECTIONS = ("article/", "beyond/", "modern/")  # the chapters, as opposed to the API pages
CHAPTER_BOOST = 4.0
FIGURE_TAGS = re.compile(r'<(?P<tag>svg|div class="attn-heatmap-select")(?=[\s>])')


def exclude_figures(page_html: str) -> str:
    """Mark inline SVG figures and heatmap panel buttons so that search skips them."""
    return FIGURE_TAGS.sub(lambda m: f"<{m['tag']} data-search-exclude", page_html)


def on_page_content(content: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri.startswith(SECTIONS):
        search = page.meta.setdefault("search", {})
        if isinstance(search, dict) and not search.get("exclude"):
            search.setdefault("boost", CHAPTER_BOOST)
    return exclude_figures(content)


def _on_post_build(config: Any) -> None:
    _ahead.finish()
    path = Path(config["site_dir"]) / "search" / "search_index.json"
    if path.is_file():
        rewrite_index(path)


# Reading the pages for search ahead, in a second process -------------------------------


def _search_module() -> Any:
    """Material's search plugin module, or None if its parser is not where this expects."""
    try:
        from material.plugins.search import plugin
    except ImportError:
        return None
    return plugin if isinstance(getattr(plugin, "Parser", None), type) else None


class _Ahead:
    """The sections Material's parser finds in pages' HTML, read by a forked process."""

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.pid: int | None = None
        self.out: Path | None = None
        self.tmp: tempfile.TemporaryDirectory[str] | None = None
        self.parsed: dict[str, list[Any]] | None = None
        self.pending: set[str] = set()  # the HTML the child reads

    def start(self, contents: list[str]) -> None:
        """Fork a process that parses ``contents`` (as the search plugin would)."""
        self.finish()
        module = _search_module()
        if module is None or not hasattr(os, "fork") or not contents:
            return
        self.tmp = tempfile.TemporaryDirectory(prefix="attnlab-search-")
        self.out = Path(self.tmp.name) / "sections.pickle"
        self.pending = set(contents)
        pid = os.fork()
        if pid == 0:  # the child: parse, write, and leave without running the parent's exit
            status = 0
            try:
                sections = {}
                for content in contents:
                    parser = module.Parser()
                    parser.feed(content)
                    parser.close()
                    sections[content] = parser.data
                tmp = self.out.with_suffix(".tmp")
                tmp.write_bytes(pickle.dumps(sections))
                os.replace(tmp, self.out)
            except BaseException:
                traceback.print_exc()
                status = 1
            os._exit(status)
        self.pid = pid

    def sections(self, content: str) -> list[Any] | None:
        """The child's reading of ``content``, waiting for it; None if it has none."""
        if content not in self.pending:
            return None
        if self.parsed is None:
            self.parsed = {}
            if self.pid is not None:
                os.waitpid(self.pid, 0)
                self.pid = None
            if self.out is not None and self.out.is_file():
                self.parsed = pickle.loads(self.out.read_bytes())
        return self.parsed.get(content)

    def finish(self) -> None:
        if self.pid is not None:
            os.waitpid(self.pid, 0)
        if self.tmp is not None:
            self.tmp.cleanup()
        self._clear()


_ahead = _Ahead()


def _use_ahead(module: Any) -> None:
    """Let the search plugin's parser take the child's reading of a page it has read."""
    parser = module.Parser
    if getattr(parser, "attnlab_ahead", False):
        return

    class Parser(parser):  # type: ignore[misc, valid-type]
        attnlab_ahead = True

        def feed(self, data: str) -> None:
            sections = _ahead.sections(data)
            if sections is None:
                super().feed(data)
            else:
                self.data, self._attnlab_read = sections, True

        def close(self) -> None:
            if not getattr(self, "_attnlab_read", False):
                super().close()

    module.Parser = Parser


def parse_ahead(files: Any) -> None:
    """Start reading for search the pages that MkDocs writes last (half the HTML).

    MkDocs writes the pages in order and the search plugin reads each as it is written;
    the build's own process reads the first half, the child the rest, so both are done
    about when the build reaches the child's pages.
    """
    module = _search_module()
    if module is None:
        return
    _use_ahead(module)
    pages = [f.page for f in files.documentation_pages() if f.page and f.page.content]
    contents = [p.content for p in pages if not (p.meta.get("search") or {}).get("exclude")]
    total, tail, k = sum(map(len, contents)), 0, len(contents)
    while k > 0 and 2 * (tail + len(contents[k - 1])) <= total:
        k -= 1
        tail += len(contents[k])
    _ahead.start(contents[k:])


try:
    from mkdocs.plugins import event_priority

    # After the search plugin has written its index.
    on_post_build = event_priority(-100)(_on_post_build)

    @event_priority(-90)  # after autorefs (-50) has put its links in every page
    def on_env(env: Any, config: Any, files: Any) -> Any:
        parse_ahead(files)
        return env

except ImportError:  # pragma: no cover
    on_post_build = _on_post_build


def on_shutdown() -> None:
    _ahead.finish()
