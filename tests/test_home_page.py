"""The home page's line on the modern part names every chapter the nav lists there.

It once named four of twelve (issue 28): a chapter added to the nav without a link on
the home page fails here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SECTION = "Attention in modern LLMs"


class _Loader(yaml.SafeLoader):
    """Reads mkdocs.yml, leaving its `!!python/name:` tags (superfences' hooks) as None."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)


def _nav_pages(section: str) -> list[str]:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)
    (entries,) = [
        item[section] for item in config["nav"] if isinstance(item, dict) and section in item
    ]
    pages: list[str] = []
    for entry in entries:
        value: Any = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages.append(value)
    return pages


def test_home_page_names_every_modern_chapter() -> None:
    chapters = [page for page in _nav_pages(SECTION) if not page.endswith("index.md")]
    assert len(chapters) >= 12
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    line = re.search(rf"^- \*\*\[{SECTION}\]\(modern/index\.md\)\*\*(.*?)^- ", home, re.M | re.S)
    assert line is not None, f"no bullet for {SECTION!r} on the home page"
    linked = re.findall(r"\]\((modern/[^)#]+)\)", line[1])
    assert sorted(set(linked)) == sorted(chapters)
    assert linked == chapters, "the home page names the chapters in another order than the nav"
