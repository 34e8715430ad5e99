"""MkDocs hook: the package's layout, drawn from its real import graph at every build.

`src/attnlab` has one folder per stage of the site's path, and a folder imports only
from the folders below it (`ALLOWED`). This module reads the imports from the source
(`Package`), and the hook writes what it finds into the page *Inside the package*
(`docs/package.md`) in place of three markers:

- `<!-- package-graph -->`: an SVG of the folders, with an arrow for every pair of
  folders one of whose modules imports from the other, labelled with how many;
- `<!-- package-folders -->`: a table of each folder's modules and their sizes;
- `<!-- chapter-modules -->`: a table from each chapter to the attnlab modules its code
  blocks import, read from the chapters themselves.

So the page cannot drift from the code. `tests/test_package.py` checks the same graph:
the direction, no circle, no chain over `MAX_CHAIN` arrows, no private name crossing
folders except from the rules.
"""

from __future__ import annotations

import ast
import functools
import html
import re
from collections import Counter
from pathlib import Path
from typing import Any

# Who may import whom, by folder. tools may import everything.
ALLOWED: dict[str, set[str]] = {
    "rules": set(),
    "functional": {"rules"},
    "article": {"rules", "functional"},
    "distributed": {"rules", "functional"},
    "caches": {"rules", "functional"},
    "layers": {"rules", "functional", "caches"},
    "models": {"rules", "functional", "caches", "layers"},
    "serving": {"rules", "functional", "caches", "layers", "models"},
    "tools": {
        "rules", "functional", "caches", "layers", "models", "serving", "article",
        "distributed",
    },
}  # fmt: skip
MAX_CHAIN = 7  # arrows in the longest chain of module-level imports (benchmarks excluded)
# Rows of the drawing, top to bottom: each row imports only from rows below it.
ROWS = (("tools",), ("serving",), ("models",), ("layers",), ("caches", "article", "distributed"),
        ("functional",), ("rules",))  # fmt: skip
WHAT = {
    "article": "the article's classes",
    "rules": "masks, RoPE, checks",
    "functional": "kernels",
    "caches": "KV caches",
    "layers": "modules with weights",
    "models": "decoders, configs",
    "serving": "paged cache, engine",
    "tools": "train, plots, bench",
    "distributed": "ring attention",
}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def folder(module: str) -> str:
    """`attnlab.layers.gqa` -> `layers`; the root package (`attnlab`) -> `""`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module an import reads from, `from ..x import y` made absolute."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Module-level statements, `if`/`try` bodies included, `if TYPE_CHECKING:` left out."""
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                out.extend(_top_level(node.body + node.orelse))
        elif isinstance(node, ast.Try):
            out.extend(_top_level(node.body))
        else:
            out.append(node)
    return out


class Package:
    """The modules under `root` (a folder holding `attnlab/`) and their imports."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.paths = {_module_name(p, root): p for p in sorted((root / "attnlab").rglob("*.py"))}
        self.trees = {m: ast.parse(p.read_text(encoding="utf-8")) for m, p in self.paths.items()}

    def is_package(self, module: str) -> bool:
        return self.paths[module].name == "__init__.py"

    @functools.cache  # noqa: B019 (a Package lives as long as one build or test)
    def defining(self, module: str, name: str) -> str:
        """The module that defines `module.name`: a submodule, or, through a package's
        `__init__`, the module that `__init__` imports the name from."""
        if f"{module}.{name}" in self.paths:
            return f"{module}.{name}"
        if module in self.paths and self.is_package(module):
            for node in _top_level(self.trees[module].body):
                if isinstance(node, ast.ImportFrom):
                    source = _absolute(node, module, True)
                    for alias in node.names:
                        if (alias.asname or alias.name) == name and source in self.paths:
                            return self.defining(source, alias.name)
        return module

    @functools.cache  # noqa: B019
    def imports(self, module: str) -> frozenset[str]:
        """The attnlab modules `module` imports at module level (their defining modules)."""
        found: set[str] = set()
        for node in _top_level(self.trees[module].body):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in self.paths}
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node, module, self.is_package(module))
                if source in self.paths:
                    found |= {self.defining(source, a.name) for a in node.names}
        return frozenset(found - {module, "attnlab"})

    def modules(self) -> list[str]:
        """Every module but the root package."""
        return [m for m in self.paths if m != "attnlab"]

    def wrong_way(self) -> list[str]:
        """Imports from a folder that the importing module's folder may not read."""
        bad = []
        for module in self.modules():
            here = folder(module)
            for dep in sorted(self.imports(module)):
                there = folder(dep)
                if here in ALLOWED and there != here and there not in ALLOWED[here]:
                    bad.append(f"{module} -> {dep}")
        return bad

    def longest_chain(self, skip: str = "attnlab.tools.bench") -> list[str]:
        """The longest chain of imports, as modules; raises ValueError on a circle."""
        graph = {
            m: [d for d in sorted(self.imports(m)) if not d.startswith(skip)]
            for m in self.modules()
            if not m.startswith(skip)
        }
        best: dict[str, list[str]] = {}

        def chain(m: str, stack: tuple[str, ...]) -> list[str]:
            if m in stack:
                raise ValueError("import circle: " + " -> ".join((*stack, m)))
            if m not in best:
                deps = [chain(d, (*stack, m)) for d in graph.get(m, [])]
                best[m] = [m, *max(deps, key=len, default=[])]
            return best[m]

        return max((chain(m, ()) for m in sorted(graph)), key=len)

    def private_crossings(self) -> list[str]:
        """Private names or modules read from another folder other than `rules`."""
        found = []
        for module, tree in self.trees.items():
            here = folder(module)
            bound: dict[str, str] = {}  # local name -> the attnlab module it is bound to
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    bound |= {
                        a.asname: a.name for a in node.names if a.asname and a.name in self.paths
                    }
                elif isinstance(node, ast.ImportFrom):
                    source = _absolute(node, module, self.is_package(module))
                    if source not in self.paths:
                        continue
                    for a in node.names:
                        full = f"{source}.{a.name}"
                        if full in self.paths:
                            bound[a.asname or a.name] = full
                        private = is_private(a.name) or any(map(is_private, source.split(".")))
                        if private and folder(source) not in (here, "rules"):
                            found.append(f"{module}:{node.lineno}: from {source} import {a.name}")
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in bound
                    and is_private(node.attr)
                    and folder(bound[node.value.id]) not in (here, "rules")
                ):
                    found.append(f"{module}:{node.lineno}: {node.value.id}.{node.attr}")
        return found

    def folder_edges(self) -> Counter[tuple[str, str]]:
        """(importer folder, imported folder) -> how many module-level imports."""
        edges: Counter[tuple[str, str]] = Counter()
        for module in self.modules():
            for dep in self.imports(module):
                if folder(dep) != folder(module):
                    edges[folder(module), folder(dep)] += 1
        return edges


# -- drawing --------------------------------------------------------------------------

_W, _H, _GAP_X, _GAP_Y, _PAD = 190, 46, 30, 44, 12


def _boxes() -> dict[str, tuple[float, float]]:
    """Top-left corner of each folder's box."""
    width = max(len(r) for r in ROWS) * (_W + _GAP_X) - _GAP_X
    out = {}
    for i, row in enumerate(ROWS):
        left = (width - (len(row) * (_W + _GAP_X) - _GAP_X)) / 2
        for j, name in enumerate(row):
            out[name] = (_PAD + left + j * (_W + _GAP_X), _PAD + i * (_H + _GAP_Y))
    return out


def svg(package: Package) -> str:
    """The folders as boxes, rows in import order, an arrow per importing pair."""
    boxes = _boxes()
    width = 2 * _PAD + max(len(r) for r in ROWS) * (_W + _GAP_X) - _GAP_X
    height = 2 * _PAD + len(ROWS) * (_H + _GAP_Y) - _GAP_Y
    sizes = Counter(folder(m) for m in package.modules() if not package.is_package(m))
    parts = [
        f'<svg class="package-graph" viewBox="0 0 {width} {height}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg" aria-labelledby="package-graph-title">',
        '<title id="package-graph-title">The folders of attnlab and which import which</title>',
        '<defs><marker id="pg-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="currentColor"/></marker></defs>',
    ]
    for (src, dst), n in sorted(package.folder_edges().items()):
        (x1, y1), (x2, y2) = boxes[src], boxes[dst]
        sx, sy = x1 + _W / 2, y1 + _H
        ex, ey = x2 + _W / 2, y2
        if y1 == y2:  # same row: side to side
            sy = ey = y1 + _H / 2
            sx, ex = (x1 + _W, x2) if x1 < x2 else (x1, x2 + _W)
        parts.append(
            f'<line x1="{sx:.0f}" y1="{sy:.0f}" x2="{ex:.0f}" y2="{ey:.0f}" '
            f'class="pg-edge" marker-end="url(#pg-arrow)"><title>{src} imports {dst}: '
            f"{n} import{'s' if n > 1 else ''}</title></line>"
        )
    for name, (x, y) in boxes.items():
        parts.append(
            f'<g class="pg-folder"><rect x="{x:.0f}" y="{y:.0f}" width="{_W}" height="{_H}" '
            f'rx="6"/><text x="{x + _W / 2:.0f}" y="{y + 19:.0f}" class="pg-name">{name}/ '
            f'({sizes[name]})</text><text x="{x + _W / 2:.0f}" y="{y + 36:.0f}" '
            f'class="pg-what">{html.escape(WHAT[name])}</text></g>'
        )
    parts.append("</svg>")
    return "".join(parts)


def folders_table(package: Package) -> str:
    rows = ["| folder | imports from | modules (lines) |", "| --- | --- | --- |"]
    edges = package.folder_edges()
    for row in ROWS:
        for name in row:
            deps = sorted({d for (s, d) in edges if s == name})
            mods = [
                f"`{m.rsplit('.', 1)[1]}` ({len(package.paths[m].read_text().splitlines())})"
                for m in package.modules()
                if folder(m) == name and not package.is_package(m) and m.count(".") == 2
            ]
            subs = sorted(
                {
                    m.split(".")[2]
                    for m in package.modules()
                    if folder(m) == name and m.count(".") > 2
                }
            )
            mods += [f"`{s}/`" for s in subs]
            rows.append(f"| `{name}/` | {', '.join(deps) or 'nothing'} | {', '.join(mods)} |")
    return "\n".join(rows)


_IMPORT = re.compile(
    r"^\s*(?:from (attnlab(?:\.\w+)*) import ([\w, ()]+)|import (attnlab(?:\.\w+)*))", re.M
)


def chapter_modules(package: Package, docs: Path, nav: list[Any]) -> str:
    """A table: each chapter of the nav and the attnlab modules its code imports."""
    rows = ["| chapter | its code comes from |", "| --- | --- |"]
    for path in _chapters(nav):
        text = (docs / path).read_text(encoding="utf-8")
        title = text.lstrip().splitlines()[0].lstrip("# ")
        found: set[str] = set()
        for source, names, plain in _IMPORT.findall(text):
            if plain:
                found.add(plain)
                continue
            for name in re.split(r"[,\s()]+", names):
                if name and source in package.paths:
                    found.add(package.defining(source, name))
        mods = sorted(m for m in found if m in package.paths and m != "attnlab")
        if mods:
            cells = ", ".join(f"`{m.removeprefix('attnlab.')}`" for m in mods)
            rows.append(f"| [{title}]({path}) | {cells} |")
    return "\n".join(rows)


def _chapters(nav: list[Any]) -> list[str]:
    """The chapters of the nav, in its order (the API pages left out)."""
    out = []
    for item in nav:
        if isinstance(item, dict):
            for value in item.values():
                out += _chapters(value if isinstance(value, list) else [value])
        elif (
            isinstance(item, str)
            and item.endswith(".md")
            and "/" in item
            and not item.startswith(("reference/", "notebooks/"))
        ):
            out.append(item)
    return out


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if "<!-- package-graph -->" not in markdown:
        return markdown
    package = Package(Path(config["config_file_path"]).parent / "src")
    table = chapter_modules(package, Path(config["docs_dir"]), config["nav"])
    return markdown.replace("<!-- package-folders -->", folders_table(package)).replace(
        "<!-- chapter-modules -->", table
    )


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    # The drawing goes in after Markdown, so that no extension (abbreviations) marks up
    # the text inside the SVG.
    if "<!-- package-graph -->" not in html:
        return html
    package = Package(Path(config["config_file_path"]).parent / "src")
    return html.replace("<!-- package-graph -->", svg(package))
