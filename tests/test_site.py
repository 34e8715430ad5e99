"""Build the whole site once, strictly, and check what a reader gets.

The build runs every page's blocks (docs/hooks/outputs.py as an MkDocs hook) and executes
the per-chapter notebooks (docs/hooks/notebook.py), so a block that raises or shows an
output it does not print fails here.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hooks import blocks  # docs/hooks/blocks.py, via pythonpath in pyproject.toml

from _browser import BROWSER, MISSING, headless  # tests/_browser.py

ROOT = Path(__file__).resolve().parent.parent
NUMBER = re.compile(r"-?\d+\.\d+|-?\d+")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, site_build: Any
) -> Iterator[tuple[Path, str]]:
    # The build (conftest.py's SiteBuild) checks every page's blocks with this session's
    # run of them instead of running them again; it started with the shared worker's
    # first test and has run beside the others since.
    returncode, out, log = site_build.wait()
    assert returncode == 0, log[-5000:]
    if BROWSER is None:
        yield out, log
        return
    # The browser measures the pages at a phone's width while the other tests run
    # (test_changed_pages_do_not_scroll_sideways_on_a_phone reads what it found).
    phone = _start_phone_driver(out, _phone_pages(out), tmp_path_factory.mktemp("phone"))
    request.config.stash[PHONE_DRIVER_RUN] = phone
    yield out, log
    phone.kill()  # where the phone test was deselected
    phone.communicate()


def _pages(site_dir: Path) -> list[Path]:
    return sorted(site_dir.rglob("*.html"))


def _text_of_code(page: Path) -> str:
    """The text of the page's code and output blocks, tags stripped."""
    source = page.read_text(encoding="utf-8")
    blocks = re.findall(r"<pre[^>]*>(.*?)</pre>", source, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", "\n".join(blocks)))


def test_the_build_checked_this_sessions_runs_instead_of_running_pages(
    site: tuple[Path, str], site_build: Any
) -> None:
    counts = re.search(r"pages with code: (\d+) to run, (\d+) from recorded runs", site[1])
    assert counts is not None, "the outputs hook did not report its pages"
    assert int(counts[1]) == 0
    assert int(counts[2]) == len(site_build.pages)
    # markdown-exec showed what those runs printed for its blocks instead of running them.
    shown = re.search(
        r"markdown-exec blocks: (\d+) shown from this build's run, (\d+) run", site[1]
    )
    assert shown is not None, "the outputs hook did not report markdown-exec's blocks"
    assert int(shown[1]) > 0
    assert int(shown[2]) == 0


def test_strict_build_has_no_warnings(site: tuple[Path, str]) -> None:
    _, log = site
    # The Jupyter kernel's own notice about its local TCP transport is not a build warning.
    warnings = [
        line for line in log.splitlines() if "WARNING" in line and "IPKernelApp" not in line
    ]
    assert warnings == []


EXTERNAL = re.compile(
    r"""<(?:script|img|iframe|source|audio|video|embed)\b[^>]*\bsrc=["'](?:https?:)?//"""
    r"""|<link\b[^>]*\bhref=["'](?:https?:)?//[^"']*["'][^>]*>"""
    r"""|url\(\s*["']?(?:https?:)?//"""
    r"""|@import\s+["'](?:https?:)?//""",
    re.I,
)


def test_pages_load_nothing_from_other_hosts(site: tuple[Path, str]) -> None:
    site_dir, _ = site
    offenders = {}
    for path in [*_pages(site_dir), *site_dir.rglob("*.css")]:
        text = path.read_text(encoding="utf-8", errors="replace")
        hits = [
            m.group(0)
            for m in EXTERNAL.finditer(text)
            # <link rel="canonical"> names the page's published address; it loads nothing.
            if 'rel="canonical"' not in m.group(0)
        ]
        if hits:
            offenders[str(path.relative_to(site_dir))] = hits[:3]
    assert offenders == {}


def test_no_page_loads_markdown_execs_pyodide(site: tuple[Path, str]) -> None:
    # markdown-exec enables pyodide by default: every page then loads its CSS (which
    # @imports a CDN stylesheet) and JS, for a feature this site does not use.
    site_dir, _ = site
    assert not list(site_dir.rglob("*pyodide*"))
    assert [p for p in _pages(site_dir) if "pyodide" in p.read_text("utf-8")] == []


RETURNS_TABLE = re.compile(
    r'doc-section-title">Returns:</span>.*?<tbody>(?P<rows>.*?)</tbody>', flags=re.S
)


def test_each_returns_table_is_one_row(site: tuple[Path, str]) -> None:
    # Google-style docstrings describe one return value; with mkdocstrings' default of
    # several items, a wrapped description became a second row ("row, which is all zeros.").
    site_dir, _ = site
    tables = {
        f"{page.relative_to(site_dir)} #{k}": match["rows"].count("<tr")
        for page in _pages(site_dir / "reference")
        for k, match in enumerate(RETURNS_TABLE.finditer(page.read_text("utf-8")))
    }
    assert len(tables) > 20
    assert {name: rows for name, rows in tables.items() if rows != 1} == {}


def test_no_paragraph_holds_a_figure(site: tuple[Path, str]) -> None:
    # markdown-exec's placeholder paragraph used to wrap a tab's figure (`<p><figure>`),
    # invalid nesting that browsers repair into an empty paragraph with stray margins;
    # docs/hooks/figures.py removes it.
    site_dir, _ = site
    wrapped = re.compile(r"<p>\s*<(figure|div|svg|table)\b")
    found = {
        str(page.relative_to(site_dir)): len(wrapped.findall(page.read_text("utf-8")))
        for page in _pages(site_dir)
        if "notebooks" not in page.parts
    }
    assert {name: n for name, n in found.items() if n} == {}


def test_search_index_holds_no_tex(site: tuple[Path, str]) -> None:
    # Result snippets are shown as text: "\\(\\alpha_{ij}\\)" must read "α_ij".
    site_dir, _ = site
    index = json.loads((site_dir / "search/search_index.json").read_text("utf-8"))
    text = " ".join(doc["title"] + " " + doc["text"] for doc in index["docs"])
    assert len(index["docs"]) > 100
    # Rendered math only: the API pages' source listings show docstrings' $...$ as code.
    assert "\\(" not in text
    assert "\\[" not in text
    assert "α_ij" in text
    assert "1/√d_k" in text
    # Entities in formulas survive ("j &gt; i", not "j gt; i").
    assert re.findall(r"(?<!&)\b(?:gt|lt|amp);", text) == []
    # Figures are not indexed: matplotlib's metadata, tick labels, heatmap buttons.
    assert "Matplotlib v" not in text
    assert "image/svg+xml" not in text
    assert "head 0head 1" not in text
    # Nor the heatmap's words for readers: the no-JavaScript line, the scroll hint and the
    # read-out's prompt (the API pages' source listings show them as code).
    pages = " ".join(d["text"] for d in index["docs"] if not d["location"].startswith("ref"))
    for words in ("need JavaScript to be shown", "scroll sideways", "Point at a cell, tap it"):
        assert words not in pages, words


def test_chapters_rank_above_api_entries(site: tuple[Path, str]) -> None:
    # Material multiplies a page's score by its boost: every section of a chapter has one.
    site_dir, _ = site
    index = json.loads((site_dir / "search/search_index.json").read_text("utf-8"))
    boost = {d["location"]: d.get("boost") for d in index["docs"]}
    chapters = [loc for loc in boost if loc.startswith(("article/", "beyond/", "modern/"))]
    assert len(chapters) > 100
    assert {boost[loc] for loc in chapters} == {4.0}
    assert {boost[loc] for loc in boost if loc.startswith("reference/")} == {None}


# Material's own search worker (lunr and its scoring), run in node on the built index.
SEARCH_DRIVER = r"""
const fs = require("fs"), vm = require("vm");
const [site, ...queries] = process.argv.slice(1);
const dir = site + "/assets/javascripts/workers/";
const worker = fs.readdirSync(dir).find(f => /^search\..*\.js$/.test(f));
const index = JSON.parse(fs.readFileSync(site + "/search/search_index.json", "utf8"));
let handler = null;
const replies = [];
const ctx = { addEventListener: (_, fn) => { handler = fn; }, postMessage: m => replies.push(m),
  importScripts: () => {}, console, setTimeout, clearTimeout };
ctx.self = ctx;
vm.createContext(ctx);
vm.runInContext(fs.readFileSync(dir + worker, "utf8"), ctx);
(async () => {
  // Send a message and wait for the worker's reply of type `want` (1 = index ready,
  // 3 = results): the worker answers asynchronously, later on a busy machine.
  const send = async (m, want) => {
    replies.length = 0;
    await handler({ data: m });
    for (let waited = 0; !replies.some(r => r.type === want); waited += 10) {
      if (waited > 60000) throw new Error("no reply of type " + want + " to " + m.type);
      await new Promise(r => setTimeout(r, 10));
    }
    return replies.find(r => r.type === want);
  };
  await send({ type: 0, data: { ...index, options: { suggest: false } } }, 1);
  const ranked = {};
  for (const q of queries) {
    const reply = await send({ type: 2, data: q }, 3);
    ranked[q] = reply.data.items.map(group => group[0].location);
  }
  console.log(JSON.stringify(ranked));
})();
"""


def test_search_ranks_chapters_first(site: tuple[Path, str]) -> None:
    # Before chapters were boosted, "ring attention" found five API entries before its
    # chapter, and "rope" four.
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node on PATH (install it with: apt-get install -y nodejs)")
    site_dir, _ = site
    queries = {
        "ring attention": "beyond/ring-attention/",
        "kv cache": "modern/kv-cache/",
        "flash attention": "beyond/flash-attention/",
        "grouped query": "modern/gqa/",
        "rope": "modern/rope/",  # its title names the abbreviation
        # lunr's wildcard search once failed on these ("Invalid query"), finding nothing
        "cache": "modern/kv-cache/",
        "mask": None,
    }
    proc = subprocess.run(
        [node, "-e", SEARCH_DRIVER, str(site_dir), *queries],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert "Invalid query" not in proc.stderr, proc.stderr[:500]
    ranked = json.loads(proc.stdout)
    for query, page in queries.items():
        first = ranked[query][0]
        assert first.startswith(("article/", "beyond/", "modern/")), (query, ranked[query][:5])
        if page is not None:
            assert first.split("#")[0] == page, (query, ranked[query][:5])


def test_display_math_scrolls_inside_its_box(site: tuple[Path, str]) -> None:
    # On a phone a wide equation must not widen the page (checked in a 390 px browser).
    site_dir, _ = site
    css = (site_dir / "assets/stylesheets/extra.css").read_text("utf-8")
    rule = re.search(r"\.katex-display\s*\{([^}]*)\}", css)
    assert rule is not None
    assert "overflow-x: auto" in rule[1]


# The pages at a phone's width -------------------------------------------------------------
#
# One headless Chromium opens the built pages in frames 390 px wide (an iPhone's width;
# the window itself cannot be that narrow), all in one driver page that reads the frames'
# documents (from file://, which --allow-file-access-from-files lets it do). The driver's
# load event waits for every frame's, so each page is measured as loaded: its math set by
# KaTeX, its heatmaps revealed. A page scrolls sideways when its root is wider than the
# frame; the driver then names the outermost elements that stick out (not those inside a
# box that scrolls on its own).

PHONE = 390
PHONE_DRIVER_RUN = pytest.StashKey[subprocess.Popen[str]]()  # started by the `site` fixture
PHONE_DRIVER = """<!doctype html><html><body>__FRAMES__<script>
function name(el) {
  return el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
    (typeof el.className === "string" && el.className ? "." + el.className.trim()
      .split(/\\s+/).join(".") : "");
}
function sticksOut(el, width) {
  if (el.getBoundingClientRect().right <= width + 0.5) return false;
  for (var up = el.parentElement; up && up.tagName !== "BODY"; up = up.parentElement) {
    if (/auto|scroll|hidden|clip/.test(getComputedStyle(up).overflowX)) return false;
    if (up.getBoundingClientRect().right > width + 0.5) return false;  // the outer one
  }
  return true;
}
function measure(doc) {
  doc.documentElement.style.scrollbarWidth = "none";  // a phone's scrollbars overlay
  var root = doc.documentElement, width = root.clientWidth, wide = [];
  if (root.scrollWidth > width) {
    doc.querySelectorAll("body *").forEach(function (el) {
      if (wide.length < 3 && sticksOut(el, width)) {
        wide.push(name(el) + " to " + Math.round(el.getBoundingClientRect().right) + " px");
      }
    });
  }
  return {width: width, scrollWidth: root.scrollWidth, wide: wide};
}
window.addEventListener("load", function () {
  var result = {};
  document.querySelectorAll("iframe").forEach(function (frame) {
    result[frame.getAttribute("data-page")] = measure(frame.contentDocument);
  });
  var out = document.createElement("pre");
  out.id = "result";
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
</script></body></html>
"""


def _start_phone_driver(site_dir: Path, pages: list[str], tmp_path: Path) -> subprocess.Popen[str]:
    """Start the browser on a driver page that measures `pages` in frames `PHONE` px wide."""
    frames = "".join(
        f'<iframe src="{(site_dir / page).as_uri()}" data-page="{page}" width="{PHONE}"'
        ' height="600"></iframe>'
        for page in pages
    )
    driver = tmp_path / "driver.html"  # outside the site, whose other tests read it
    driver.write_text(PHONE_DRIVER.replace("__FRAMES__", frames), encoding="utf-8")
    command = headless(
        tmp_path / "profile", "--allow-file-access-from-files", "--dump-dom", driver.as_uri()
    )
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _phone_widths(driver: subprocess.Popen[str]) -> dict[str, Any]:
    """Each page's root width and scroll width in a frame `PHONE` px wide, once measured."""
    stdout, stderr = driver.communicate(timeout=120)
    found = re.search(r'<pre id="result">(.*?)</pre>', stdout, flags=re.S)
    assert found, "the driver did not finish: " + stderr[-2000:]
    measured: dict[str, Any] = json.loads(html.unescape(found[1]))
    return measured


def _phone_pages(site_dir: Path) -> list[str]:
    """The pages issue 28 changed or added, found by where they live in the built site.

    The home page and every other page at the top of the site (a glossary, the notebooks'
    index, a section's own page), every page of the modern chapters, and the chapters
    beyond the article that issues 28 and 31 changed.
    """
    pages = [str(p.relative_to(site_dir)) for p in _pages(site_dir) if p.name == "index.html"]
    return [
        page
        for page in pages
        if page.count("/") <= 1
        or page.startswith("modern/")
        or page in ("beyond/induction-heads/index.html", "beyond/flash-attention/index.html")
    ]


def test_math_is_rendered_by_the_sites_own_katex(site: tuple[Path, str]) -> None:
    site_dir, _ = site
    assert (site_dir / "assets/katex/katex.min.js").is_file()
    assert (site_dir / "assets/katex/fonts/KaTeX_Main-Regular.woff2").is_file()
    pages_with_math = [p for p in _pages(site_dir) if 'class="arithmatex"' in p.read_text("utf-8")]
    assert pages_with_math, "no page has math: arithmatex is not configured"
    for page in pages_with_math:
        assert "assets/katex/katex.min.js" in page.read_text("utf-8"), page


def test_every_article_output_is_on_its_built_page(site: tuple[Path, str]) -> None:
    site_dir, _ = site
    data = json.loads((ROOT / "tests/data/article_outputs.json").read_text("utf-8"))
    missing = []
    for item in data["outputs"]:
        page = site_dir / Path(item["page"]).relative_to("docs").with_suffix("") / "index.html"
        shown = [float(n) for n in NUMBER.findall(_text_of_code(page))]
        wanted = [float(n) for n in NUMBER.findall(item["text"])]
        windows = (shown[i : i + len(wanted)] for i in range(len(shown) - len(wanted) + 1))
        found = any(
            all(abs(a - b) <= 1.01e-4 for a, b in zip(window, wanted, strict=True))
            for window in windows
        )
        if not found:
            missing.append(f"{item['id']} ({item['page']})")
    assert missing == []


def test_each_chapter_offers_its_executed_notebook(site: tuple[Path, str]) -> None:
    site_dir, _ = site
    chapters = sorted((site_dir / "article").glob("[0-9][0-9]-*/index.html"))
    buttons = {}
    for page in chapters:
        found = re.findall(r'<a class="md-button" href="([^"]+\.ipynb)" download', page.read_text())
        if found:
            buttons[page.parent.name] = (page.parent / found[0]).resolve()
    assert len(buttons) >= 10
    assert "11-conclusion" not in buttons  # no code, no notebook
    for name, path in buttons.items():
        assert path == site_dir / "notebooks" / name / f"{name}.ipynb"  # beside its page
        notebook = json.loads(path.read_text("utf-8"))
        code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
        assert code
        assert all(c["execution_count"] is not None for c in code), name
    # Executed: chapter 05's first weights are printed; chapter 07's heatmap is drawn.
    printed = "".join(
        o.get("text", "")
        for c in json.loads(
            (site_dir / "notebooks/05-attention-weights/05-attention-weights.ipynb").read_text()
        )["cells"]
        for o in c.get("outputs", [])
    )
    assert "0.0386" in printed
    figure = (
        site_dir / "notebooks/07-self-attention-class/07-self-attention-class.ipynb"
    ).read_text("utf-8")
    assert "<svg" in figure
    # Images are embedded: the downloaded notebook shows them offline.
    one = json.loads(
        (
            site_dir / "notebooks/01-introducing-self-attention/01-introducing-self-attention.ipynb"
        ).read_text("utf-8")
    )
    attached = [name for c in one["cells"] for name in c.get("attachments", {})]
    assert attached == ["self-attention-one-token.svg"]
    assert "assets/images/" not in json.dumps(one)
    # Links point at the published site, so they work in a downloaded notebook.
    site_url = "https://attnlab.github.io/attnlab/"
    assert f"]({site_url}article/05-attention-weights/)" in figure
    assert "](../" not in figure
    assert "__autoref__" not in figure  # API links resolved in the download too
    assert f"]({site_url}reference/" in figure


def test_notebook_pages_render_the_downloads(site: tuple[Path, str]) -> None:
    # The notebooks' pages (listed by notebooks/): mkdocs-jupyter renders each as a page,
    # with its stored outputs and figures, adapted to the site by docs/hooks/notebook.py.
    site_dir, log = site
    assert "Converting notebook (execute=True)" not in log  # executed once, by the hook
    pages = sorted((site_dir / "notebooks").glob("*/index.html"))
    assert len(pages) >= 21  # the article's chapters, beyond/ and modern/
    assert {p.parent.name for p in pages} >= {"beyond-ring-attention", "modern-rope"}
    stylesheet = site_dir / "assets/stylesheets/jupyter.css"
    assert stylesheet.stat().st_size > 100_000  # nbconvert's styles, once for all pages
    for page in pages:
        text = page.read_text("utf-8")
        name = page.parent.name
        assert "<style" not in text, name  # not inlined in each page
        assert 'href="../../assets/stylesheets/jupyter.css"' in text, name
        # "Skip to content" and the contents point at headings the page has.
        skip = re.search(r'<a href="#([^"]+)" class="md-skip">', text)
        assert skip is not None, name
        assert f'id="{skip[1]}"' in text, name
        assert 'class="jupyter-wrapper"' in text, name
        toc = text[text.index("md-nav--secondary") :]
        assert toc.count('class="md-nav__link"') >= 3, name  # the right-hand contents
        assert "__autoref__" not in text, name
        assert "alert-block" not in text, name
        # Pitfalls and solutions as the site's boxes (solutions closed): as many as the
        # chapter has, or more (a solution's code cell gets a box of its own).
        chapter = ROOT / "docs" / _chapter_of(name)
        fences = blocks.read(chapter.read_text("utf-8")).fences
        boxes = {c.line for f in fences for c in f.containers if c.marker != "==="}
        shown = text.count('class="admonition') + text.count("<details class=")
        assert shown >= len(boxes), name
        assert "https://attnlab.github.io/attnlab/" not in text.replace(
            'rel="canonical" href="https://attnlab.github.io/attnlab/', ""
        ), name  # links into the site are relative: they work on any host
        download = re.findall(r'<a class="md-button" href="([^"]+\.ipynb)" download', text)
        assert download == [f"{name}.ipynb"], name
        assert (page.parent / download[0]).is_file()
        assert f"/edit/main/docs/{_chapter_of(name)}" in text, name  # edits go to the chapter
    search = json.loads((site_dir / "search/search_index.json").read_text("utf-8"))
    # (notebooks/ itself is the page that lists them, found by search like any page.)
    assert not [d for d in search["docs"] if re.match(r"notebooks/[^#]", d["location"])]
    seven = (site_dir / "notebooks/07-self-attention-class/index.html").read_text("utf-8")
    notebook = seven[seven.index('class="jupyter-wrapper"') :]
    assert "<svg" in notebook  # a stored figure
    assert "0.5313" in notebook  # a stored output
    assert 'href="../../reference/' in notebook  # an API link, resolved


def test_the_notebooks_page_lists_every_built_notebook(site: tuple[Path, str]) -> None:
    # The navigation lists the chapters only; notebooks/ lists the notebooks, from the
    # list the build made them from (docs/hooks/notebook.py).
    site_dir, log = site
    built = {p.parent.name for p in (site_dir / "notebooks").glob("*/index.html")}
    assert len(built) == 29
    index = (site_dir / "notebooks/index.html").read_text("utf-8")
    content = index[index.index('<article class="md-content__inner') :]
    pages = set(re.findall(r'<a href="([\w-]+)/">page</a>', content))
    assert pages == built
    downloads = re.findall(r'<a href="([^"]+\.ipynb)" download>', content)
    assert len(downloads) == len(built)
    assert all((site_dir / "notebooks" / d).is_file() for d in downloads)
    assert 'href="../article/02-embedding/"' in content  # its chapter
    home = (site_dir / "index.html").read_text("utf-8")
    nav = home[home.index('class="md-nav md-nav--primary"') : home.index("md-sidebar--secondary")]
    assert "notebooks/02-embedding/" not in nav  # no notebook in the left column
    assert 'href="notebooks/"' in nav
    assert "pages exist in the docs directory, but are not included" not in log


def test_home_page_draws_the_map_and_the_reading_paths(site: tuple[Path, str]) -> None:
    site_dir, _ = site
    home = (site_dir / "index.html").read_text("utf-8")
    assert "attnlab:site-map" not in home  # the markers were replaced
    assert "attnlab:reading-paths" not in home
    drawn = re.search(r'<div class="attn-map">(.*?)</div>', home, flags=re.S)
    assert drawn is not None
    assert re.findall(r'<svg class="(attn-map-\w+)"', drawn[1]) == [
        "attn-map-wide",
        "attn-map-narrow",
    ]
    links = re.findall(r'<a href="([^"]+)"', drawn[1])
    assert len(links) == 2 * (12 + 7 + 13)  # each chapter (and part index) once per drawing
    assert all((site_dir / link / "index.html").is_file() for link in links), links
    paths = re.search(r'<ul class="attn-map-paths">(.*?)</ul>', home, flags=re.S)
    assert paths is not None
    assert paths[1].count("<li>") == 3
    assert 'href="beyond/flash-attention/"' in paths[1]


def test_before_this_lines_link_their_chapters(site: tuple[Path, str]) -> None:
    from hooks import site_map

    site_dir, _ = site
    for entry in site_map.PREREQUISITES:
        page = site_dir / entry.page.removesuffix(".md") / "index.html"
        text = page.read_text("utf-8")
        line = re.search(r"<p><strong>Before this:</strong> <a href=\"([^\"]+)\">", text)
        assert line is not None, entry.page
        target, _, anchor = line[1].partition("#")
        built = (page.parent / target / "index.html").resolve()
        assert built.is_file(), line[1]
        if anchor:
            assert f'id="{anchor}"' in built.read_text("utf-8"), line[1]


PROTECTED = re.compile(  # code, figures, math, and headings (docs/hooks/abbreviations.py)
    r"<pre\b.*?</pre>|<code\b.*?</code>|<svg\b.*?</svg>"
    r'|<(span|div) class="arithmatex">.*?</\1>|<(h[1-6])\b.*?</\2>',
    flags=re.S,
)


def test_no_abbreviation_shows_inside_code_or_math(site: tuple[Path, str]) -> None:
    # docs/includes/abbreviations.md is appended to every page (pymdownx.snippets): the
    # abbr extension marks each term in the text, never in code, math, a figure or a
    # heading.
    site_dir, _ = site
    inside, pages_with_abbr = {}, set()
    for page in _pages(site_dir):
        text = page.read_text("utf-8")
        if "<abbr" not in text:
            continue
        pages_with_abbr.add(str(page.relative_to(site_dir)))
        found = [m[0][:80] for m in PROTECTED.finditer(text) if "<abbr" in m[0]]
        if found:
            inside[str(page.relative_to(site_dir))] = found[:3]
    assert inside == {}
    assert PROTECTED.search('<p>x <code>a <abbr title="t">KV</abbr></code></p>')  # it can fail
    # The terms are marked in the text: the chapters' and the glossary's.
    assert {"modern/gqa/index.html", "glossary/index.html"} <= pages_with_abbr
    gqa = (site_dir / "modern/gqa/index.html").read_text("utf-8")
    assert '<abbr title="grouped-query attention: ' in gqa


def _chapter_of(notebook: str) -> str:
    """``beyond-masks`` -> ``beyond/masks.md``; ``07-x`` -> ``article/07-x.md``."""
    section, _, stem = notebook.partition("-")
    if section in ("beyond", "modern"):
        return f"{section}/{stem}.md"
    return f"article/{notebook}.md"


SOURCES = {
    "article": "https://magazine.sebastianraschka.com/p/understanding-and-coding-self-attention",
    "vaswani": "https://arxiv.org/abs/1706.03762",
    "flash1": "https://arxiv.org/abs/2205.14135",
    "flash2": "https://arxiv.org/abs/2307.08691",
    "online-softmax": "https://arxiv.org/abs/1805.02867",
}


@pytest.mark.parametrize(
    ("page", "sources"),
    [
        ("index.html", ["article"]),
        ("article/index.html", ["article"]),
        ("article/01-introducing-self-attention/index.html", ["vaswani", "flash1", "flash2"]),
        ("article/11-conclusion/index.html", ["online-softmax", "flash1"]),
    ],
)
def test_pages_link_the_sources_they_name(
    site: tuple[Path, str], page: str, sources: list[str]
) -> None:
    text = (site[0] / page).read_text("utf-8")
    for source in sources:
        assert f'href="{SOURCES[source]}"' in text, source


def test_every_local_image_exists(site: tuple[Path, str]) -> None:
    site_dir, _ = site
    broken = []
    for page in _pages(site_dir):
        for src in re.findall(r"<img\b[^>]*\bsrc=\"([^\"]+)\"", page.read_text("utf-8")):
            if src.startswith(("data:", "http:", "https:", "//")):
                continue
            if not (page.parent / src.split("#")[0]).resolve().is_file():
                broken.append(f"{page.relative_to(site_dir)}: {src}")
    assert broken == []


def test_the_search_reader_gives_the_entries_the_search_plugin_makes() -> None:
    # search_tex reads the later pages' HTML for Material's search plugin in a forked
    # process; the plugin's entries must be the ones its own reading gives.
    from types import SimpleNamespace

    from hooks import search_tex
    from material.plugins.search.plugin import SearchIndex

    figure = '<svg data-search-exclude width="9"><text>axis 0.5</text></svg>'
    contents = [
        '<h1 id="one">One</h1><p>The weights \\(\\alpha\\) sum to 1.</p>',
        f'<h1 id="two">Two</h1><p>Scores</p>{figure}<h2 id="s">Softmax</h2><p>exp</p>',
        '<h1 id="three">Three</h1>' + "<p><code>q @ k.T</code> scaled</p>" * 200,
        '<h1 id="four">Four</h1><pre><code>print(1)\n</code></pre>' * 100,
    ]
    pages = [
        SimpleNamespace(content=c, meta={}, toc=[], url=f"p{k}/", title=f"P{k}")
        for k, c in enumerate(contents)
    ]
    pages.append(
        SimpleNamespace(
            content="<h1>Skipped</h1>",
            meta={"search": {"exclude": True}},
            toc=[],
            url="x/",
            title="X",
        )
    )
    files = SimpleNamespace(documentation_pages=lambda: [SimpleNamespace(page=p) for p in pages])

    def entries() -> list[dict[str, Any]]:
        index = SearchIndex()
        for page in pages:
            index.add_entry_from_context(page)
        return index.entries

    own = entries()  # nothing read ahead: the plugin's parser reads every page
    search_tex.parse_ahead(files)
    try:
        assert search_tex._ahead.pending == set(contents[3:])  # the last half of the HTML
        ahead = entries()
        assert search_tex._ahead.parsed is not None
        assert set(search_tex._ahead.parsed) == set(contents[3:])  # the child read them
    finally:
        search_tex._ahead.finish()
    assert ahead == own
    assert [e["location"] for e in own][:3] == ["p0/", "p1/", "p1/#s"]
    assert "axis" not in json.dumps(own)  # the figure is not indexed


MODEL_VIEW_PAGE = "modern/real-llm/index.html"
# Reports, once the page's model view has decoded its first text, every text's decoded
# arrays (base64 of their bytes) and what the page shows.
MODEL_VIEW_DRIVER = """
window.addEventListener("load", function () {
  var root = document.querySelector("[data-attn-model-view]");
  function bytes(array) {
    var b = new Uint8Array(array.buffer, array.byteOffset, array.byteLength), s = "";
    for (var i = 0; i < b.length; i += 8192) {
      s += String.fromCharCode.apply(null, b.subarray(i, i + 8192));
    }
    return btoa(s);
  }
  (function wait() {
    if (!root || root.getAttribute("data-attn-mv-text") !== "0") return setTimeout(wait, 20);
    var entries = root.attnModelView.entries;
    Promise.all(entries.map(window.attnModelView.decode)).then(function (all) {
      var out = {thumbs: root.querySelectorAll(".attn-mv-thumb").length,
        tokens: root.querySelectorAll(".attn-mv-token").length,
        decoded: all.map(function (d) {
          return {thumbs: bytes(d.thumbs), full: d.full ? bytes(d.full) : null,
                  keys: d.keys ? bytes(d.keys) : null, values: d.values ? bytes(d.values) : null};
        })};
      var pre = document.createElement("pre");
      pre.id = "result";
      pre.textContent = JSON.stringify(out);
      document.body.appendChild(pre);
    });
  })();
});
"""


def _array(text: str, dtype: Any) -> Any:
    import base64

    import torch

    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=dtype).long()


@pytest.mark.skipif(BROWSER is None, reason=MISSING)
def test_model_view_page_shows_smollm2s_own_weights(
    site: tuple[Path, str], smollm2: tuple[Any, Any, Any], tmp_path: Path
) -> None:
    # The real page, opened from a file as an offline copy is: its script decodes the data
    # the build computed, which must be the model's weights within the encoding's step.
    import torch

    from attnlab.tools.model_view import _all_maps

    site_dir, _ = site
    page = site_dir / MODEL_VIEW_PAGE
    assert page.stat().st_size <= 2_000_000  # the whole page, its view's data included
    markup = page.read_text("utf-8")
    entries = json.loads(markup.split('class="attn-mv-data">')[1].split("</script>")[0])
    copy = site_dir / "modern/real-llm/driven.html"
    copy.write_text(markup.replace("</body>", f"<script>{MODEL_VIEW_DRIVER}</script></body>"))
    command = headless(
        tmp_path / "profile", "--virtual-time-budget=20000", "--dump-dom", copy.as_uri()
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    copy.unlink()
    found = re.search(r'<pre id="result">(.*?)</pre>', done.stdout, flags=re.S)
    assert found, "the model view did not decode its data: " + done.stderr[-2000:]
    shown = json.loads(html.unescape(found[1]))
    _, decoder, tokenizer = smollm2
    assert [e["name"] for e in entries][::4] == ["The article's sentence", "A passage of this site"]
    assert shown["thumbs"] == 270
    assert shown["tokens"] == entries[0]["t"] == 7
    step = 1 / 510 + 1e-6
    # The texts run as one padded batch (as the build ran them: each new length costs the
    # CPU's matrix kernels a first call); the model is causal, so each keeps its weights.
    every = _all_maps(decoder, [entry["ids"] for entry in entries])
    for entry, decoded, weights in zip(entries, shown["decoded"], every, strict=True):
        t, k, cells, pool = entry["t"], entry["k"], entry["cells"], entry["pool"]
        assert entry["tokens"] == [tokenizer.decode(i) for i in entry["ids"]]
        if entry["thumbs"]:
            padded = torch.zeros(30, 9, cells * pool, cells * pool)
            padded[..., :t, :t] = weights
            pooled = padded.reshape(30, 9, cells, pool, cells, pool).amax(dim=(3, 5))
            thumbs = _array(decoded["thumbs"], torch.uint8).reshape(30, 9, cells, cells) / 255
            torch.testing.assert_close(thumbs, pooled, atol=step, rtol=0)
        if decoded["full"] is not None:
            rows, cols = torch.tril_indices(t, t)
            full = _array(decoded["full"], torch.uint8).reshape(30, 9, -1) / 255
            torch.testing.assert_close(full, weights[..., rows, cols], atol=step, rtol=0)
            continue
        keys = _array(decoded["keys"], torch.int16).reshape(30, 9, t, k)
        values = _array(decoded["values"], torch.uint8).reshape(30, 9, t, k) / 255
        torch.testing.assert_close(values, weights.gather(-1, keys), atol=step, rtol=0)


# Last in the file, so that the browser the `site` fixture started has had the other
# tests' time to measure the pages.
@pytest.mark.skipif(BROWSER is None, reason=MISSING)
def test_changed_pages_do_not_scroll_sideways_on_a_phone(
    site: tuple[Path, str], request: pytest.FixtureRequest
) -> None:
    # A wide table, formula, figure or line of code must scroll in its own box, not the
    # page. Each page costs the browser about half a second of CPU, so the test keeps to
    # the pages that issue 28 changed instead of all of the site's, and the `site`
    # fixture starts the browser as soon as the site is built.
    site_dir, _ = site
    pages = _phone_pages(site_dir)
    assert {"index.html", "modern/serving/index.html", "modern/index.html"} <= set(pages)
    measured = _phone_widths(request.config.stash[PHONE_DRIVER_RUN])
    assert sorted(measured) == sorted(pages)
    assert {m["width"] for m in measured.values()} == {PHONE}
    wide = {page: m["wide"] for page, m in measured.items() if m["scrollWidth"] > m["width"]}
    assert wide == {}, f"pages wider than {PHONE} px, with what sticks out"
