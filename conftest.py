"""Collects the outputs shown on the site's pages as pytest items (see docs/hooks/outputs.py).

It lives at the repository root so that it applies to `docs/` and `README.md` as well as
`tests/`.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from hooks import outputs  # docs/hooks/outputs.py, via pythonpath in pyproject.toml

ROOT = Path(__file__).resolve().parent


class ShownOutputItem(pytest.Item):
    """One Python block of a page: it runs, and the output shown under it is what it prints."""

    def __init__(self, *, index: int, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.index = index

    def runtest(self) -> None:
        parent = self.parent
        assert isinstance(parent, MarkdownOutputsFile)
        run = parent.page_run()
        message = run.results[self.index].describe(run.path)
        if message is not None:
            raise AssertionError(message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:  # type: ignore[no-untyped-def,override]
        return str(excinfo.value)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, self.name


class MarkdownOutputsFile(pytest.File):
    _run = None

    def page_run(self):  # type: ignore[no-untyped-def]
        if self._run is None:
            self._run = outputs.run_page(self.path.relative_to(ROOT))
        return self._run

    def collect(self) -> Iterator[ShownOutputItem]:
        blocks = outputs.parse_blocks(self.path.read_text(encoding="utf-8"))
        for i, block in enumerate(blocks):
            label = f"output:line {block.output_line}" if block.output_line else "runs"
            yield ShownOutputItem.from_parent(
                self, name=f"[shown-{label}][block:line {block.line}]", index=i
            )


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix == ".md" and (
        file_path.is_relative_to(ROOT / "docs") or file_path == ROOT / "README.md"
    ):
        return MarkdownOutputsFile.from_parent(
            parent, path=file_path, name=f"{file_path.name}::outputs"
        )
    return None


# pytest-markdown-docs turns pytest's capture off while a fence runs, so every print of every
# chapter would flood the test log. Swallow it here; `ShownOutputItem` checks what is printed.
from pytest_markdown_docs._runners import DefaultRunner, register_runner  # noqa: E402


@register_runner(default=True)
class _QuietRunner(DefaultRunner):
    def runtest(self, test, args, *, asyncio_runner=None):  # type: ignore[no-untyped-def]
        with contextlib.redirect_stdout(io.StringIO()):
            super().runtest(test, args, asyncio_runner=asyncio_runner)


# Fences inside admonitions and collapsible "Solution" blocks are indented; unwrap them the
# same way docs/hooks/outputs.py does, so pytest-markdown-docs runs them too.
from markdown_it import MarkdownIt  # noqa: E402


class _ContainerAwareMarkdownIt(MarkdownIt):
    def parse(self, src: str, env=None):  # type: ignore[no-untyped-def,override]
        return super().parse(outputs.unwrap_containers(src)[0], env)


def pytest_markdown_docs_markdown_it() -> MarkdownIt:
    return _ContainerAwareMarkdownIt()
