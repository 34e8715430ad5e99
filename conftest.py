"""Runs the site's code blocks once each and checks the outputs they show (docs/hooks/).

pytest-markdown-docs collects every Python fence of `docs/` and `README.md` as an item;
this file makes those items run through one :class:`outputs.PageSession` per page, and
adds one item per block that compares the output shown under it with what that same
execution printed. So each block runs once per test session, however many items (and
tests/test_notebook.py, through the `page_run` fixture, or the site's build in
tests/test_site.py, through `page_record`) look at it. Fences are read by
docs/hooks/blocks.py, the parser the site's build, notebooks and width test use.

It lives at the repository root so that it applies to `docs/` and `README.md` as well as
`tests/`. It also tells pytest-xdist (`--numprocesses=auto`, in pyproject.toml) which
items must share a worker process: see `pytest_xdist_make_scheduler`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hooks import blocks, outputs  # docs/hooks/, via pythonpath in pyproject.toml

ROOT = Path(__file__).resolve().parent
# No test and no page fetches a compute kernel from the Hugging Face Hub: transformers
# then runs its own PyTorch code, the reference every port is held to (and the build
# runs offline). tests/test_compressed.py checks that this holds.
os.environ["USE_HUB_KERNELS"] = "NO"
_sessions: dict[Path, outputs.PageSession] = {}  # one per page, for the whole test run


def page_session(path: Path, markdown: str | None = None) -> outputs.PageSession:
    """The page's session: its blocks, markdown-exec ones too, each run once."""
    path = path.resolve()
    if path not in _sessions:
        text = path.read_text("utf-8") if markdown is None else markdown
        _sessions[path] = outputs.PageSession(
            path.relative_to(ROOT), text, exec_blocks=True, filename=str(path)
        )
    return _sessions[path]


@pytest.fixture(scope="session")
def page_run() -> Callable[[str], outputs.PageRun]:
    """`page_run("docs/article/05-x.md")`: the page's run in this session (run if need be)."""
    return lambda page: page_session(ROOT / page).run_all()


@pytest.fixture(scope="session")
def page_record() -> Callable[[str], dict[str, Any]]:
    """`page_record("docs/x.md")`: this session's run of the page, as a build can reuse it."""
    return lambda page: outputs.record(page_session(ROOT / page))


class SiteBuild:
    """The strict build of the whole site, in a process of its own, from this session's runs.

    The build checks every page's blocks with the runs the pages' own items use instead of
    running them a second time. It is a quarter of the test session's CPU time, so it
    starts as soon as the worker that holds the page runs begins its group (see
    `pytest_runtest_setup`) and goes on beside that worker's other tests;
    tests/test_site.py's `site` fixture waits for it.
    """

    def __init__(self) -> None:
        self.pages = sorted(
            str(page.relative_to(ROOT))
            for page in (ROOT / "docs").rglob("*.md")
            if "```" in page.read_text("utf-8")
        )  # the pages with code, which the build reads recorded runs of
        self.folder: Path | None = None
        self._process: subprocess.Popen[str] | None = None
        self._result: tuple[int, str] | None = None

    def start(self) -> None:
        """Run the pages that have not run yet and start the build (once)."""
        if self._process is not None:
            return
        self.folder = Path(tempfile.mkdtemp(prefix="attnlab-site-"))
        runs = self.folder / "runs.json"
        records = {page: outputs.record(page_session(ROOT / page)) for page in self.pages}
        runs.write_text(json.dumps(records), encoding="utf-8")
        env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "ATTNLAB_PAGE_RUNS": str(runs)}
        site = str(self.folder / "site")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", site],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait(self) -> tuple[int, Path, str]:
        """The build's exit status, the built site's folder and the build's log."""
        self.start()
        assert self._process is not None
        assert self.folder is not None
        if self._result is None:
            log, _ = self._process.communicate()
            self._result = (self._process.returncode, log)
        return self._result[0], self.folder / "site", self._result[1]

    def close(self) -> None:
        if self._process is not None and self._result is None:
            self._process.kill()
            self._process.communicate()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


_SITE_BUILD = pytest.StashKey[SiteBuild]()


@pytest.fixture(scope="session")
def site_build(request: pytest.FixtureRequest) -> SiteBuild:
    """This session's build of the site (started early, see `SiteBuild`)."""
    return request.config.stash[_SITE_BUILD]


class ShownOutputItem(pytest.Item):
    """One Python block of a page: the output shown under it is what its run printed."""

    def __init__(self, *, line: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.line = line

    def runtest(self) -> None:
        session = page_session(self.path)
        message = session.result(session.index(self.line)).describe(str(session.path))
        if message is not None:
            raise AssertionError(message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        return str(excinfo.value)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.line - 1, self.name


class MarkdownOutputsFile(pytest.File):
    def collect(self) -> Iterator[ShownOutputItem]:
        # The session reads the page as collected, as pytest-markdown-docs does.
        session = page_session(self.path, self.path.read_text(encoding="utf-8"))
        for block in session.blocks:
            if block.is_exec:
                continue  # markdown-exec shows its result: no output fence to compare
            label = f"output:line {block.output_line}" if block.output_line else "runs"
            yield ShownOutputItem.from_parent(
                self, name=f"[shown-{label}][block:line {block.line}]", line=block.line
            )


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix == ".md" and (
        file_path.is_relative_to(ROOT / "docs") or file_path == ROOT / "README.md"
    ):
        return MarkdownOutputsFile.from_parent(
            parent, path=file_path, name=f"{file_path.name}::outputs"
        )
    return None


# pytest-xdist runs the items in worker processes, a group of them per worker (the
# scheduler below). The items that share a process's state form one group: every page's
# blocks and their shown outputs, the two test files that read those runs
# (tests/test_notebook.py through `page_run`, tests/test_site.py through `page_record`),
# and the test files that use SmolLM2 (the `smollm2` fixture), which `real-llm.md`'s
# blocks load too. So each block runs once per session and the real model is loaded
# once. Every other file is a group of its own, so module-scoped fixtures are set up
# once as well. (xdist's own `xdist_group` marks cannot do this with pytest 9.2: xdist
# 3.8 renames the items through an attribute that pytest no longer reads.)
_PAGE_TESTS = ("tests/test_notebook.py", "tests/test_site.py")
_REAL_MODEL_TESTS = ("tests/test_llm.py", "tests/test_serving.py")
_SHARED_GROUP = "pages and SmolLM2"


def _xdist_group(nodeid: str) -> str:
    file = nodeid.split("::", 1)[0]
    if file.endswith(".md") or file in _PAGE_TESTS + _REAL_MODEL_TESTS:
        return _SHARED_GROUP
    return file


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (not called under -n 0)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None  # another --dist given on the command line: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """Each group to one worker, the largest groups (by item count) first."""

        def _split_scope(self, nodeid: str) -> str:
            return _xdist_group(nodeid)

    return GroupScheduling(config, log)


_SHARED_FIXTURES = {"page_run", "page_record", "smollm2", "site_build"}
_BUILDS_SITE = pytest.StashKey[bool]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that uses a shared fixture must live in a file of the shared group; the first
    test of that group starts the site's build if a test of this session reads it."""
    shared = _SHARED_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    group = _xdist_group(item.nodeid)
    if shared and group != _SHARED_GROUP:
        file = item.nodeid.split("::", 1)[0]
        pytest.fail(
            f"{item.nodeid} uses the `{min(shared)}` fixture: add {file} to the files of "
            "conftest.py's shared group, so that the worker that holds its state runs it",
            pytrace=False,
        )
    if group == _SHARED_GROUP and item.config.stash.setdefault(
        _BUILDS_SITE,
        any("site_build" in getattr(i, "fixturenames", ()) for i in item.session.items),
    ):
        item.config.stash[_SITE_BUILD].start()


class _PagesOnly:
    """Keeps pytest-markdown-docs to the Markdown files.

    With `--markdown-docs` it also imports every `.py` file a second time to look for
    code fences in its docstrings, about 3 s of collection on each worker. This
    project's docstrings hold doctests (run by `--doctest-modules`), not fences;
    `tests/test_package.py::test_no_docstring_holds_a_code_fence` keeps it so.
    """

    @pytest.hookimpl(wrapper=True)
    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> Any:
        from pytest_markdown_docs.plugin import MarkdownDocstringCodeModule

        found = yield
        return [c for c in found if not isinstance(c, MarkdownDocstringCodeModule)]


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_PagesOnly(), "attnlab-markdown-docs-pages-only")
    config.stash[_SITE_BUILD] = build = SiteBuild()
    config.add_cleanup(build.close)
    # Two workers on two cores: one intra-op thread each, not two threads fighting over
    # each core (the pages' printed values do not depend on it: the build runs them with
    # one thread per worker too).
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is not None:
        import torch

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        torch.set_num_threads(max(1, cores // int(workers)))


def pytest_markdown_docs_markdown_it() -> Any:
    """pytest-markdown-docs reads pages with the site's parser (fences in containers too)."""
    return blocks.markdown_it()


# pytest-markdown-docs runs a fence with its runner. Its public hooks (globals, parser) can
# neither keep a page's namespace without re-running every earlier block (`continuation`
# prepends them, quadratic in a chapter's length) nor capture what a fence prints (it
# turns pytest's capture off around the fence). So the one use of its private API is
# here: a default runner that hands the fence to the page's session, which runs it once
# and keeps what it printed for the fence's ShownOutputItem. (The session ignores the
# `fixture:` and globals options, which no page uses; fences in docstrings run as before.)
from pytest_markdown_docs._runners import DefaultRunner, register_runner  # noqa: E402


@register_runner(default=True)
class _PageSessionRunner(DefaultRunner):
    def runtest(self, test: Any, args: Any, *, asyncio_runner: Any = None) -> None:
        if Path(test.source_path).suffix != ".md":  # a fence in a docstring: as before
            with contextlib.redirect_stdout(io.StringIO()):
                super().runtest(test, args, asyncio_runner=asyncio_runner)
            return
        session = page_session(Path(test.source_path))
        result = session.result(session.index(test.start_line))
        if result.exception is not None:
            raise result.exception
        if result.error is not None:  # not run: an earlier block raised
            raise RuntimeError(result.error.strip())
