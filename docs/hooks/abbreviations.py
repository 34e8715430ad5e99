"""MkDocs hook: the site's abbreviations on every page, explained in text, not headings.

``docs/includes/abbreviations.md`` lists them in the abbr extension's syntax
(``*[GQA]: grouped-query attention: ...``). Material's documentation appends such a
file to every page with ``pymdownx.snippets``' ``auto_append``; then every conversion
parses the file again, and mkdocstrings converts each docstring section on its own:
measured here, 3.6 ms a conversion (0.9 ms with a blank line between definitions),
seconds a build. Instead ``on_config`` reads the file once and hands it to the abbr
extension as its ``glossary`` (Python-Markdown 3.7), which every page's conversion and
every docstring's starts from: the same marks, for 0.02 ms a conversion.

The abbr extension marks each use of a term in the text with its expansion as a hover
title; code and math are never marked (``tests/test_site.py``). In a heading the mark is
a dotted underline under a title's word ("The KV cache") that the text below explains
anyway: ``on_page_content`` takes it out of headings again, keeping the word. Every term
has an entry in the glossary, ``docs/glossary.md`` (``tests/test_site_map.py``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

SOURCE = "includes/abbreviations.md"  # under docs/
DEFINITION = re.compile(r"^\*\[(?P<term>[^\]]+)\]:[ \t]*(?P<title>\S.*?)\s*$", flags=re.M)
HEADING = re.compile(r"<h([1-6])\b[^>]*>.*?</h\1>", flags=re.S)
ABBR = re.compile(r"<abbr\b[^>]*>(.*?)</abbr>", flags=re.S)


def read(path: Path) -> dict[str, str]:
    """The abbreviations of a file in the abbr extension's syntax: term -> expansion."""
    return {m["term"]: m["title"] for m in DEFINITION.finditer(path.read_text("utf-8"))}


def unmark_headings(html: str) -> str:
    """``html`` with the ``<abbr>`` marks of its headings replaced by their words."""
    return HEADING.sub(lambda heading: ABBR.sub(r"\1", heading[0]), html)


@event_priority(100)  # before the plugins (mkdocstrings) copy the Markdown settings
def on_config(config: Any) -> Any:
    glossary = read(Path(config["docs_dir"]) / SOURCE)
    config["mdx_configs"].setdefault("abbr", {})["glossary"] = glossary
    return config


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return unmark_headings(html) if "<abbr" in html else html
