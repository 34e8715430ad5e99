"""The package's layout, read from its source: folders that import one way only.

`src/attnlab` has one folder per stage of the site's path. A module may import from its
own folder and from the folders below it, never from a folder above:

    rules <- functional (kernels) <- caches <- layers <- models <- serving <- tools

`article` (the article's teaching classes) and `distributed` (ring attention) stand
beside that line and import only the rules and the kernels; `tools` may import anything.
Only the rule modules may hand private (`_`-named) names or modules to another folder.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from hooks.package_graph import ALLOWED, MAX_CHAIN, Package, folder

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module")
def package() -> Package:
    return Package(SRC)


def test_every_module_lives_in_a_folder_of_the_layout(package: Package) -> None:
    stray = [m for m in package.modules() if folder(m) not in ALLOWED]
    assert stray == []


def test_imports_run_one_way_only(package: Package) -> None:
    assert package.wrong_way() == []


def test_no_import_circle_and_no_chain_over_seven_arrows(package: Package) -> None:
    chain = package.longest_chain()
    assert len(chain) - 1 <= MAX_CHAIN, " -> ".join(chain)


def test_private_names_cross_folders_only_from_the_rules(package: Package) -> None:
    assert package.private_crossings() == []


def _probe(tmp_path: Path, files: dict[str, str]) -> Package:
    for name, text in files.items():
        path = tmp_path / "attnlab" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return Package(tmp_path)


def test_the_layout_checks_can_fail(tmp_path: Path) -> None:
    """Each rule above finds a planted fault: an import against the direction (also one
    made through a package's `__init__`), a private name crossing folders, a circle and
    a chain that is too long."""
    files = {
        "__init__.py": "",
        "rules/__init__.py": "",
        "rules/_validation.py": "def _shape(): ...\n",
        "rules/masks.py": "from attnlab.rules._validation import _shape\n",
        "layers/__init__.py": "from attnlab.layers.gqa import GQA\n",
        "layers/gqa.py": "class GQA: ...\ndef _helper(): ...\n",
        "functional/__init__.py": "",
        "functional/flash.py": "from attnlab.layers import GQA\n",
        "models/__init__.py": "",
        "models/decoder.py": (
            "from attnlab.layers.gqa import _helper\nfrom attnlab.layers import gqa\n"
            "x = gqa._helper\n"
        ),
    }
    package = _probe(tmp_path, files)
    assert package.wrong_way() == ["attnlab.functional.flash -> attnlab.layers.gqa"]
    assert package.private_crossings() == [
        "attnlab.models.decoder:1: from attnlab.layers.gqa import _helper",
        "attnlab.models.decoder:3: gqa._helper",
    ]
    files = {"rules/a.py": "import attnlab.rules.b\n", "rules/b.py": "import attnlab.rules.a\n"}
    circle = _probe(tmp_path / "c", files)
    with pytest.raises(ValueError, match="import circle"):
        circle.longest_chain()
    long = {f"rules/m{i}.py": f"import attnlab.rules.m{i + 1}\n" for i in range(MAX_CHAIN + 1)}
    long[f"rules/m{MAX_CHAIN + 1}.py"] = ""
    assert len(_probe(tmp_path / "l", long).longest_chain()) - 1 == MAX_CHAIN + 1


def _exports(path: Path) -> list[str]:
    """The names a module's literal `__all__` lists (none if it has no `__all__`)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return []


def test_no_module_exports_an_unchecked_impl_twin() -> None:
    """The public API has no `_impl` names: a caller inside the package imports the
    unchecked twin it needs by name, and `from module import *` never hands it out."""
    exported = {
        f"{path.relative_to(SRC).with_suffix('')}.{name}"
        for path in SRC.rglob("*.py")
        for name in _exports(path)
        if name.endswith("_impl")
    }
    assert exported == set()
    # The reader sees the real lists (a parse that found none would pass vacuously).
    assert "causal" in _exports(SRC / "attnlab" / "rules" / "masks.py")
    assert _exports(SRC / "attnlab" / "functional" / "paged.py") == ["Method", "paged_attention"]


def _control_characters(source: str) -> list[int]:
    """Lines of the string literals in `source` that hold a control character (a newline
    aside): the trace of a backslash read as an escape, `\\text` turned into a TAB."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and any(ord(c) < 32 and c != "\n" for c in node.value)
    ]


def test_no_docstring_loses_a_backslash_to_an_escape() -> None:
    """Math in a docstring needs `r\"\"\"`: in a plain one `\\text` starts with a TAB and
    `\\frac` with a form feed, and the rendered formula breaks."""
    planted = 'def f():\n    """$\\frac{1}{\\text{gate}}$"""\n'
    assert _control_characters(planted) == [2]
    assert _control_characters(planted.replace('"""', 'r"""', 1)) == []
    found = {
        str(path.relative_to(SRC)): lines
        for path in SRC.rglob("*.py")
        if (lines := _control_characters(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def _docstring_fences(source: str) -> list[int]:
    """Lines of docstrings that open a Markdown code fence (```), for pytest-markdown-docs."""
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    lines = []
    for node in ast.walk(ast.parse(source)):
        doc = ast.get_docstring(node) if isinstance(node, owners) else None  # dedented
        # A fence opens with ``` indented by at most 3 spaces (CommonMark); deeper, the
        # lines are an indented code block, which pytest-markdown-docs does not run.
        if doc and any(re.match(r" {0,3}```", line) for line in doc.splitlines()):
            first = node.body[0]  # type: ignore[union-attr]
            lines.append(first.lineno)
    return lines


def test_no_docstring_holds_a_code_fence() -> None:
    """conftest.py keeps pytest-markdown-docs to the Markdown pages, so a fenced example in
    a docstring (shown on a reference page) would run nowhere: write it as a doctest."""
    planted = 'def f():\n    """Use it:\n\n    ```python\n    f()\n    ```\n    """\n'
    assert _docstring_fences(planted) == [2]
    assert _docstring_fences('def f():\n    """>>> f()"""\n') == []
    root = SRC.parent
    files = [*SRC.rglob("*.py"), *(root / "tests").rglob("*.py"), *(root / "docs").rglob("*.py")]
    found = {
        str(path.relative_to(root)): lines
        for path in [*files, root / "conftest.py"]
        if (lines := _docstring_fences(path.read_text(encoding="utf-8")))
    }
    assert found == {}
