"""Show math in search results as readable text, not as TeX source.

Pages keep their math as ``\\(...\\)`` and ``\\[...\\]`` for KaTeX to render in the
browser, so the search plugin indexes the TeX source and a result snippet reads
``the weights \\(\\alpha_{ij}\\) of query \\(i\\)``. After the build, this hook rewrites
``search/search_index.json``: each formula loses its delimiters and its commands become the
characters they stand for (``α_ij``, ``√d_k``, ``Kᵀ``), so the snippet reads
``the weights α_ij of query i``.
"""

from __future__ import annotations

import json
import re
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
    text = text.replace("{", "").replace("}", "").replace("&", " ")
    text = re.sub(r"√\s+", "√", text)
    return " ".join(text.split())


def strip_math(text: str) -> str:
    """Replace every ``\\(...\\)`` and ``\\[...\\]`` in `text` by its plain-text form."""
    return MATH.sub(lambda m: tex_to_text(m["inline"] or m["display"] or ""), text)


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


def _on_post_build(config: Any) -> None:
    path = Path(config["site_dir"]) / "search" / "search_index.json"
    if path.is_file():
        rewrite_index(path)


try:  # after the search plugin has written its index
    from mkdocs.plugins import event_priority

    on_post_build = event_priority(-100)(_on_post_build)
except ImportError:  # pragma: no cover
    on_post_build = _on_post_build
