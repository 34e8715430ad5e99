"""Rules about the package's own code, read from its source."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module an import reads from, `from ..x import y` made absolute."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _shared(module: str) -> bool:
    """A shared rule module (`attnlab._backends`, `attnlab._validation`, ...): made to
    be imported by the others."""
    return any(_is_private(part) for part in module.split(".")[1:])


def private_uses(path: Path, root: Path = SRC) -> list[str]:
    """Where `path` (under `root`) reads another attnlab module's private name:
    `from m import _x`, or `m._x` through a name bound to an attnlab module."""
    module = _module_name(path, root)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    modules: dict[str, str] = {}  # local name -> the attnlab module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("attnlab.") and alias.asname:
                    modules[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, module, path.name == "__init__.py")
            if not source.startswith("attnlab") or source == module:
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if _is_submodule(full):
                    modules[alias.asname or alias.name] = full
                elif _is_private(alias.name) and not _shared(source):
                    found.append(f"{node.lineno}: from {source} import {alias.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and _is_private(node.attr)
            and not _shared(modules[node.value.id])
        ):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return [f"{path.relative_to(root)}:{where}" for where in found]


def _is_submodule(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_no_module_reads_another_modules_private_names() -> None:
    """Shared rules live in the `_`-named modules made for them; any other module's
    private names stay inside it (a public name is the way in)."""
    uses = [use for path in sorted(SRC.rglob("*.py")) for use in private_uses(path)]
    assert uses == []


def test_the_rule_finds_a_private_import(tmp_path: Path) -> None:
    """The check above can fail: both spellings of a private read are found, a shared
    rule module's names and a module's own are not."""
    probe = tmp_path / "attnlab" / "probe.py"
    probe.parent.mkdir()
    probe.write_text(
        "from attnlab.multihead import _private_helper\n"
        "from attnlab import flash\n"
        "from attnlab._validation import _shape\n"
        "from .probe import _own\n"
        "x = flash._LOW_PRECISION\n",
        encoding="utf-8",
    )
    assert private_uses(probe, tmp_path) == [
        "attnlab/probe.py:1: from attnlab.multihead import _private_helper",
        "attnlab/probe.py:5: flash._LOW_PRECISION",
    ]
