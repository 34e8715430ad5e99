"""Run every Python block of a page and check the output shown under it.

A chapter shows a block's output in a fence right after it::

    ```python continuation
    print(torch.tensor([0.5, 1.0]))
    ```

    ```text title="Output"
    tensor([0.5000, 1.0000])
    ```

This module is used three ways, with one implementation (:class:`PageSession`):

- from ``conftest.py`` under pytest: pytest-markdown-docs' item for each fence runs it
  through the page's session, once, and one more item per block compares the output it
  shows with what that same run printed, failing with the Markdown file and line;
- as an MkDocs hook (``hooks:`` in ``mkdocs.yml``): each page's blocks run at build time,
  and a block that raises, prints something it does not show, or shows an output that
  differs from what it prints is a warning, so ``mkdocs build --strict`` fails; the run
  (markdown-exec's blocks included) is left on the page (``page.attnlab_run``), where
  ``notebook.py`` takes the chapter's outputs from instead of running its code again.
  The pages run in two worker processes while MkDocs reads the pages without code
  (:func:`reading_order`), so that their code and the rendering share the machine's
  cores; a build given recorded runs
  (``ATTNLAB_PAGE_RUNS``, as tests/test_site.py gives the test session's) checks those
  instead of running the pages again;
- as a script that rewrites the stored outputs after a deliberate change::

      python docs/hooks/outputs.py --update docs/article/*.md

Fences are read by ``blocks.py``, the parser the whole docs tooling shares: fences inside
an admonition (``!!! note``), a collapsible block (``??? success "Solution"``) or a
content tab (``=== "Tab"``) count like the others, at their lines in the file.

A block runs in the namespace the page's earlier blocks left when it says
``continuation`` (pytest-markdown-docs' rule), else in a fresh one. A block marked
``notest`` is skipped, and markdown-exec blocks (``exec="on"``) are left to markdown-exec
at build time (under pytest they run too, each in its own namespace, as markdown-exec
runs them). Numbers are compared with a tolerance of one unit in the last printed digit,
so a value that rounds differently on another BLAS (``-0.26265`` shown as ``-0.2626`` or
``-0.2627``) still matches; every other character must be equal, up to whitespace. A
rounding error is its size only: its digits depend on the CPU's kernels (AVX-512 or
AVX2, another summation order). A number printed in e-notation below 1e-3 on both sides,
of the same sign, whose text just before it names a difference (``diff``, ``error``,
``largest``, ``max`` or ``|``, as in ``max |a - b| = 2.2e-07``), matches within a factor
of 10 instead of a digit; a constant such as ``eps=1e-06`` is compared as any number.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    from hooks import blocks  # under pytest (pythonpath: docs)
except ImportError:  # as an MkDocs hook or a script: this folder is on sys.path
    import blocks  # type: ignore[no-redef]

NUMBER = re.compile(r"-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")

# The pages run transformers' own PyTorch code, never a compute kernel fetched from the
# Hugging Face Hub (the build works offline, and the pages compare against that code).
os.environ["USE_HUB_KERNELS"] = "NO"

log = logging.getLogger("mkdocs.hooks.outputs")

# The fence parser is shared with pytest-markdown-docs, the notebooks and the width test.
OUTPUT_INFO, PYTHON_LANGS = blocks.OUTPUT_INFO, blocks.PYTHON_LANGS
Block, unwrap_containers = blocks.Block, blocks.unwrap_containers


@dataclass
class Result:
    block: Block
    printed: str = ""
    error: str | None = None
    problem: str | None = None  # why the shown output is wrong, if it is
    exception: BaseException | None = None  # what the block raised, to raise it again

    def describe(self, path: str) -> str | None:
        """What is wrong with this block, located as `file:line`; None if nothing is."""
        if self.error is not None:
            return f"{path}:{self.block.line}: the block raised\n{self.error}"
        if self.problem is not None:
            return f"{path}:{self.block.output_line or self.block.line}: {self.problem}"
        return None


@dataclass
class PageRun:
    path: str
    results: list[Result] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [m for r in self.results if (m := r.describe(self.path)) is not None]


def parse_blocks(markdown: str) -> list[Block]:
    """The runnable Python blocks of a page, each with the output fence right after it."""
    return blocks.code_blocks(markdown)


def _tolerance(token: str) -> float:
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    if decimals == 0 and not exponent and "." not in mantissa:
        return 0.0  # integers (shapes, indices) must match exactly
    return 10.0 ** (int(exponent or 0) - decimals) * 1.000001


_ERROR_WORDS = re.compile(r"diff|error|largest|max|\|", re.IGNORECASE)


def _rounding_error(token: str, before: str) -> bool:
    """Whether `token`, after the text `before`, is a rounding error: a size printed in
    e-notation below 1e-3, which the 40 characters before it call a difference."""
    small = "e" in token.lower() and 0 < abs(float(token)) < 1e-3
    return small and _ERROR_WORDS.search(before[-40:]) is not None


def compare(shown: str, printed: str) -> str | None:
    """None if `printed` matches `shown`, else a short description of the first difference."""
    shown_text = NUMBER.split(" ".join(shown.split()))
    printed_text = NUMBER.split(" ".join(printed.split()))
    shown_nums = NUMBER.findall(" ".join(shown.split()))
    printed_nums = NUMBER.findall(" ".join(printed.split()))
    if [t.strip() for t in shown_text] != [t.strip() for t in printed_text] or len(
        shown_nums
    ) != len(printed_nums):
        return "the output shown differs from what the code prints"
    # The text before each shown number (the words are the same on both sides).
    flat = " ".join(shown.split())
    before = [flat[: m.start()] for m in NUMBER.finditer(flat)]
    for k, (a, b) in enumerate(zip(shown_nums, printed_nums, strict=True)):
        x, y = float(a), float(b)
        errors = _rounding_error(a, before[k]) and _rounding_error(b, before[k])
        if errors and x * y > 0 and max(abs(x), abs(y)) < 10 * min(abs(x), abs(y)):
            continue
        if abs(float(a) - float(b)) > max(_tolerance(a), _tolerance(b)):
            return f"number #{k + 1} differs: shown {a}, printed {b}"
    return None


def _fresh_state() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_printoptions(profile="default")


def _check(result: Result, path: Path) -> None:
    """Compare what the block printed with the output the page shows under it."""
    block = result.block
    if block.is_exec:
        return  # markdown-exec shows what it prints: there is no output fence to check
    if block.output is None:
        if result.printed.strip():
            result.problem = (
                f"block at line {block.line} prints output but the page does not show it; "
                'add a ```text title="Output" fence right after it'
            )
        return
    diff = compare(block.output, result.printed)
    if diff is not None:
        result.problem = (
            f"{diff}\n--- shown\n{block.output.rstrip()}\n+++ printed\n"
            f"{result.printed.rstrip()}\n(regenerate with: "
            f"python docs/hooks/outputs.py --update {path})"
        )


def execute(result: Result, namespace: dict[str, Any], filename: str) -> None:
    """Run ``result.block`` in ``namespace``; store what it prints, or what it raised."""
    # Pad with blank lines so tracebacks point at the Markdown line.
    source = "\n" * result.block.line + result.block.code
    buffer = io.StringIO()
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
        with contextlib.redirect_stdout(buffer):
            exec(code, namespace)
    except Exception as exc:
        result.exception = exc
        result.error = "".join(traceback.format_exception(*sys.exc_info(), limit=-3)).rstrip()
    result.printed = buffer.getvalue()


class PageSession:
    """A page's blocks, each run at most once, in order, when first asked for.

    A block runs in the namespace the page's earlier blocks left, as pytest-markdown-docs'
    ``continuation`` means; a block without ``continuation`` starts a fresh namespace,
    and a markdown-exec block (``exec_blocks``) runs in one of its own, as markdown-exec
    runs it. What a block prints is captured and compared with the output shown under
    it. Under pytest, ``conftest.py`` runs every fence through one session per page, so
    the fence's item and its shown-output item share one execution.
    """

    def __init__(
        self,
        path: str | Path,
        markdown: str | None = None,
        *,
        exec_blocks: bool = False,
        filename: str | None = None,
    ) -> None:
        self.path = Path(path)
        text = self.path.read_text(encoding="utf-8") if markdown is None else markdown
        self.markdown = text  # the text its blocks come from
        self.blocks = blocks.code_blocks(text, exec_blocks=exec_blocks)
        self.filename = filename or str(self.path)  # what tracebacks name
        self.run = PageRun(str(self.path))
        self._namespace: dict[str, Any] = {}
        self._failed: int | None = None  # line of the block that broke the namespace

    def index(self, line: int) -> int:
        """The position of the block whose fence opens on ``line`` (1-based)."""
        for k, block in enumerate(self.blocks):
            if block.line == line:
                return k
        raise KeyError(f"{self.path}: no runnable block opens on line {line}")

    def result(self, k: int) -> Result:
        """Block ``k``'s result, running it (and the blocks before it) if not yet run."""
        while len(self.run.results) <= k:
            self._run_next()
        return self.run.results[k]

    def run_all(self) -> PageRun:
        if self.blocks:
            self.result(len(self.blocks) - 1)
        return self.run

    def _run_next(self) -> None:
        block = self.blocks[len(self.run.results)]
        result = Result(block)
        self.run.results.append(result)
        if block.is_exec:
            namespace: dict[str, Any] = {"__name__": "__main__"}
        else:
            if not block.continuation or not self._namespace:
                self._namespace, self._failed = {"__name__": "__main__"}, None
                _fresh_state()
            namespace = self._namespace
            if self._failed is not None:
                result.error = f"  (not run: the block at line {self._failed} of this page raised)"
                return
        execute(result, namespace, self.filename)
        if result.error is None:
            _check(result, self.path)
        elif not block.is_exec:
            self._failed = block.line
        if len(self.run.results) == len(self.blocks):
            self._namespace = {}  # the page is done: free what its blocks made


def run_page(path: str | Path, markdown: str | None = None) -> PageRun:
    """Run the page's blocks in order and check each shown output (markdown-exec's not)."""
    return PageSession(path, markdown).run_all()


def update_page(path: str | Path) -> int:
    """Rewrite the page's output fences with what the code prints; return how many changed."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    run = run_page(path)
    changed = 0
    for result in reversed(run.results):
        if result.error is not None:
            raise SystemExit(f"{path}:{result.block.line}: the block raised\n{result.error}")
        span = result.block.output_span
        if span is None:
            continue
        pad = " " * result.block.output_indent
        new = [pad + line if line else line for line in result.printed.rstrip("\n").split("\n")]
        if lines[span[0] : span[1]] != new:
            lines[span[0] : span[1]] = new
            changed += 1
    path.write_text("\n".join(lines), encoding="utf-8")
    return changed


# Recorded runs ---------------------------------------------------------------------------
#
# A page's run travels between processes as what each block printed or raised, keyed by
# the page's path and the SHA-256 of its text: a record is used only for the text it was
# made from. The shown-output check itself (`_check`) is redone where the record is read.


def digest(markdown: str) -> str:
    """The SHA-256 of a page's text: a record holds for that text only."""
    return hashlib.sha256(markdown.encode("utf-8")).hexdigest()


def record(session: PageSession) -> dict[str, Any]:
    """What the session's blocks printed and raised (all run), as JSON, with its text's hash."""
    return {
        "sha256": digest(session.markdown),
        "results": [
            {"line": r.block.line, "printed": r.printed, "error": r.error}
            for r in session.run_all().results
        ],
    }


def from_record(path: str | Path, markdown: str, entry: Any) -> PageRun | None:
    """The run that ``entry`` records for this page, checked again; None if it is not one.

    None when the entry was made from other text, or lacks a block of this text: the page
    must then run.
    """
    if not isinstance(entry, dict) or entry.get("sha256") != digest(markdown):
        return None
    by_line = {r["line"]: r for r in entry["results"]}
    run = PageRun(str(path))
    for block in blocks.code_blocks(markdown, exec_blocks=True):
        found = by_line.get(block.line)
        if found is None:
            return None
        result = Result(block, printed=found["printed"], error=found["error"])
        if result.error is None:
            _check(result, Path(path))
        run.results.append(result)
    return run


def work(out_dir: Path, pages: list[str], orders: list[list[int]]) -> None:
    """Run pages (markdown-exec blocks too) and write each one's record to ``out_dir``.

    A build's worker processes, one per order. They share the list, each in its own
    order of the pages' indices: each takes the next page no other has taken
    (``k.claim``, created exclusively) and writes ``k.json``, whole, when page ``k`` has
    run. The first process imports what every page imports first (torch and attnlab,
    3.3 s of CPU time), then forks the others, which so start with it done; it returns
    when they have ended. (Without ``os.fork`` it takes the first order alone, which
    holds every page.)
    """
    import torch  # noqa: F401  (the pages' own first import, done once for all workers)

    with contextlib.suppress(ImportError):
        import attnlab  # noqa: F401  (imports torch's attention modules: 1.5 s more)
    with contextlib.suppress(ImportError):  # both workers' pages draw and build HF models
        import matplotlib.pyplot  # noqa: F401  (0.4 s, once instead of once a worker)
        import transformers  # noqa: F401  (0.9 s with its model classes, likewise)
        from transformers import LlamaConfig, Qwen3NextConfig  # noqa: F401
    children = []
    for order in orders[1:] if hasattr(os, "fork") else []:
        pid = os.fork()
        if pid == 0:  # the child: run this order, and nothing of the parent's
            try:
                _take(out_dir, pages, order)
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        children.append(pid)
    _take(out_dir, pages, orders[0])
    for pid in children:
        os.waitpid(pid, 0)


def _take(out_dir: Path, pages: list[str], order: list[int]) -> None:
    import torch

    # One thread each: two workers and MkDocs share the machine's two cores, and with
    # two threads each the build took longer (66 s against 47 s, measured here).
    torch.set_num_threads(1)
    for k in order:
        try:
            os.close(os.open(out_dir / f"{k}.claim", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue  # another worker runs it
        entry = record(PageSession(pages[k], exec_blocks=True))
        tmp = out_dir / f"{k}.json.tmp"
        tmp.write_text(json.dumps(entry), encoding="utf-8")
        os.replace(tmp, out_dir / f"{k}.json")


# Calls that take seconds: the pages that make them (the real model's) go to a worker of
# their own from the start, so that the pages MkDocs reads first are not behind them.
SLOW_CALLS = ("load_smollm2(", "smollm2_decoder(")


class _Worker:
    """The pages of one build, run ahead in worker processes while MkDocs renders.

    Page code is most of a build's time and MkDocs renders on one core, so running the
    blocks in processes of their own, in the order MkDocs reads the pages, takes them
    off the build's critical path. Two workers share the pages, one at a time each: one
    starts with the slow pages (``slow``), the other with the rest in MkDocs' order, and
    each goes on with the other's list. If the workers die, the pages they
    did not finish run in the build's own process.
    """

    def __init__(self, pages: dict[str, str], slow: Collection[str] = ()) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="attnlab-runs-")
        self.out = Path(self._tmp.name)
        self.index = {page: k for k, page in enumerate(pages)}
        first = [k for page, k in self.index.items() if page in slow]
        rest = [k for page, k in self.index.items() if page not in slow]
        # In the build's working folder, as the pages' code would run in the build.
        script = str(Path(__file__).resolve())
        files = list(pages.values())
        orders = [first + rest, rest + first]
        # One process, which forks the second worker (``work``): a session of its own, so
        # that killing its group ends both.
        command = [sys.executable, script, "--worker", str(self.out), "--orders"]
        self.procs = [
            subprocess.Popen(
                [*command, json.dumps(orders), *files],
                stdout=sys.stderr,  # what page code writes past the capture goes to the log
                start_new_session=True,
            )
        ]

    def entry(self, page: str) -> Any:
        """The record of ``page``, waiting for it; None if the workers cannot give it."""
        k = self.index.get(page)
        if k is None:
            return None
        done = self.out / f"{k}.json"
        while not done.exists():
            if all(p.poll() is not None for p in self.procs) and not done.exists():
                return None
            time.sleep(0.02)
        return json.loads(done.read_text(encoding="utf-8"))

    def kill(self) -> None:
        """End the workers, the forked ones too, now."""
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, AttributeError):
                proc.kill()  # not POSIX, or the group is gone: the process itself
            proc.wait()

    def close(self) -> None:
        self.kill()
        self._tmp.cleanup()


# MkDocs hook ---------------------------------------------------------------------------

RUNS_ENV = "ATTNLAB_PAGE_RUNS"
"""A JSON file of recorded runs, ``{path: record(...)}``, that a build may use instead of
running those pages again: tests/test_site.py passes the test session's own runs."""

_build: dict[str, Any] = {}


def _page_path(src_uri: str, config: Any) -> str:
    """The page as its messages name it: ``docs/modern/rope.md``."""
    docs_dir = Path(config["docs_dir"])
    path = docs_dir / src_uri
    return str(path.relative_to(docs_dir.parent) if docs_dir.is_absolute() else path)


def _runs_page(file: Any) -> bool:
    return bool(file.src_uri.endswith(".md") and not file.generated_by)


def _markdown_exec_runner() -> Any:
    """markdown-exec's Python runner module, or None if its layout is not the one known."""
    try:
        from markdown_exec._internal.formatters import python
    except ImportError:
        return None
    return python if callable(getattr(python, "_run_python", None)) else None


def _exec_key(code: str) -> str:
    return textwrap.dedent(code).strip()


def _reuse_exec_runs() -> None:
    """Let markdown-exec show what this build's run of a figure block printed.

    The page's run (the worker's, or the recorded one) has already executed every
    markdown-exec block of the page, each in a namespace of its own as markdown-exec
    runs it; so the runner that markdown-exec calls for a Python block returns that
    output, found by the block's code, instead of running the code a second time. A
    block with a ``session`` (shared state) or one that raised in the run is left to
    markdown-exec. markdown-exec has no public hook for this; if its private runner is
    not where this expects it, it simply runs the blocks itself.
    """
    module = _markdown_exec_runner()
    if module is None or getattr(module._run_python, "attnlab_reuse", False):
        return
    run_python = module._run_python

    def run(
        code: str, returncode: Any = None, session: Any = None, id: Any = None, **extra: Any
    ) -> Any:
        printed = None if session else _build.get("exec", {}).get(_exec_key(code))
        if printed is not None:
            _build["exec_reused"] = _build.get("exec_reused", 0) + 1
            return printed
        _build["exec_run"] = _build.get("exec_run", 0) + 1
        return run_python(code, returncode, session, id, **extra)

    run.attnlab_reuse = True  # type: ignore[attr-defined]
    module._run_python = run


def reading_order(files: Any, code: Collection[str], slow: Collection[str]) -> list[Any]:
    """The build's pages in the order MkDocs should read them, given the pages with code.

    First the pages with no code to run (the API pages, whose rendering is the longest),
    while the workers start; then the pages with code in the order a worker runs them,
    the slow pages last; each notebook page (``attnlab_chapter``, set by
    ``notebook.py``) right after its chapter, whose run it is made from. So MkDocs
    renders what is ready while the pages run, instead of waiting on each in turn.
    """
    pages = list(files.documentation_pages())
    after: dict[str, list[Any]] = {}
    for file in pages:
        chapter = getattr(file, "attnlab_chapter", None)
        if chapter is not None:
            after.setdefault(chapter, []).append(file)
    followers = {id(f) for fs in after.values() for f in fs}
    leaders = [f for f in pages if id(f) not in followers]
    rank = {f.src_uri: (f.src_uri in code) + (f.src_uri in slow) for f in leaders}
    order = []
    for file in sorted(leaders, key=lambda f: rank[f.src_uri]):  # stable: MkDocs' order
        order += [file, *after.pop(file.src_uri, [])]
    return order + [f for fs in after.values() for f in fs]


def _reorder(files: Any, order: list[Any]) -> None:
    """Put the files of ``order`` in that order, after the others (MkDocs reads in order)."""
    for file in order:
        files.remove(file)
    for file in order:
        files.append(file)


def _recorded() -> dict[str, Any]:
    """The recorded runs the build was given (``ATTNLAB_PAGE_RUNS``), if any."""
    if not os.environ.get(RUNS_ENV):
        return {}
    result: dict[str, Any] = json.loads(Path(os.environ[RUNS_ENV]).read_text(encoding="utf-8"))
    return result


def _scan(files: Any, config: Any, recorded: dict[str, Any]) -> dict[str, Any]:
    """The pages of ``files`` that no recorded run covers, and which of them are slow."""
    pending: dict[str, str] = {}  # the page's name in messages: its file
    slow: set[str] = set()
    code: set[str] = set()  # src_uri of the pending pages
    slow_uris: set[str] = set()
    reused = 0
    for file in files.documentation_pages():
        if not _runs_page(file):
            continue
        path = _page_path(file.src_uri, config)
        text = Path(file.abs_src_path).read_text(encoding="utf-8")
        if "```" not in text:
            continue
        if from_record(path, text, recorded.get(path)) is None:
            pending[path] = file.abs_src_path
            code.add(file.src_uri)
            if any(call in text for call in SLOW_CALLS):
                slow.add(path)
                slow_uris.add(file.src_uri)
        else:
            reused += 1
    return dict(pending=pending, slow=slow, code=code, slow_uris=slow_uris, reused=reused)


def on_config(config: Any) -> Any:
    """Start the workers on the pages MkDocs will find, before the other plugins set up.

    ``on_files`` checks that the pages are those it gets (another plugin may add or drop
    some) and starts the workers again if not; starting here saves it the time the
    plugins take between the two events.
    """
    on_shutdown()
    _build.pop("started", None)
    try:
        from mkdocs.structure.files import get_files

        recorded = _recorded()
        scan = _scan(get_files(config), config, recorded)
    except Exception:  # on_files finds the pages in any case
        return config
    _build.update(recorded=recorded, started=scan)
    if scan["pending"]:
        _build["worker"] = _Worker(scan["pending"], scan["slow"])
    return config


def on_files(files: Any, config: Any) -> Any:
    """Run the pages that no recorded run covers (unless started), and read the others first.

    The build's pages are put in :func:`reading_order` until ``on_env``, where the order
    MkDocs found them in comes back, so the built site (its search index too) is the
    same whatever order the pages were read in.
    """
    _reuse_exec_runs()
    _build.update(exec={}, exec_reused=0, exec_run=0)
    started = _build.pop("started", None)
    recorded = _build["recorded"] if started is not None else _recorded()
    _build["recorded"] = recorded
    scan = _scan(files, config, recorded)
    if started is None or [list(started["pending"].items()), started["slow"]] != [
        list(scan["pending"].items()),
        scan["slow"],
    ]:
        on_shutdown()
        if scan["pending"]:
            _build["worker"] = _Worker(scan["pending"], scan["slow"])
    pending, reused = len(scan["pending"]), scan["reused"]
    log.info(f"pages with code: {pending} to run, {reused} from recorded runs")
    _build["found_order"] = list(files)
    _reorder(files, reading_order(files, scan["code"], scan["slow_uris"]))
    return files


def on_env(env: Any, config: Any, files: Any) -> Any:
    """Every page is read: give the pages back the order MkDocs found them in."""
    found = _build.pop("found_order", None)
    if found is not None:
        _reorder(files, found)
    return env


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if "```" not in markdown or not _runs_page(page.file):
        return markdown
    # Read the file itself: `markdown` has lost its front matter, which would shift lines.
    path = _page_path(page.file.src_uri, config)
    text = Path(page.file.abs_src_path).read_text(encoding="utf-8")
    run = from_record(path, text, _build.get("recorded", {}).get(path))
    worker = _build.get("worker")
    if run is None and worker is not None:
        run = from_record(path, text, worker.entry(path))
    if run is None:  # not recorded, and the worker did not run it: run it here
        run = PageSession(path, text, exec_blocks=True).run_all()
    page.attnlab_run = run  # notebook.py builds the chapter's notebook from it
    _build["exec"] = {  # what markdown-exec is about to show for this page
        _exec_key(r.block.code): r.printed
        for r in run.results
        if r.block.is_exec and r.error is None
    }
    for problem in run.problems:
        log.warning(problem)
    return markdown


def on_shutdown() -> None:
    worker = _build.pop("worker", None)
    if worker is not None:
        worker.close()


def on_post_build(config: Any) -> None:
    log.info(
        f"markdown-exec blocks: {_build.get('exec_reused', 0)} shown from this build's "
        f"run, {_build.get('exec_run', 0)} run by markdown-exec"
    )
    on_shutdown()  # `mkdocs serve` builds again: each build has its own worker
    try:
        import resource
    except ImportError:  # not POSIX: no figures to give
        return
    own, workers = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    log.info(  # what a change to the build saves is read here, whatever else loads the machine
        f"CPU time: {own.ru_utime + own.ru_stime:.1f} s in the build's own process, "
        f"{workers.ru_utime + workers.ru_stime:.1f} s in the page workers and the search "
        "reader "
        f"(load average {os.getloadavg()[0]:.1f})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--update", action="store_true", help="rewrite the stored outputs")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--orders", help=argparse.SUPPRESS)  # JSON: [[k, ...], ...]
    args = parser.parse_args(argv)
    if args.worker is not None:
        files = [str(f) for f in args.files]
        orders = json.loads(args.orders) if args.orders else [list(range(len(files)))]
        work(args.worker, files, orders)
        return 0
    status = 0
    for path in args.files:
        if args.update:
            print(f"{path}: {update_page(path)} output(s) updated")
            continue
        problems = run_page(path).problems
        for problem in problems:
            print(problem, file=sys.stderr)
        status |= bool(problems)
    return status


if __name__ == "__main__":
    sys.exit(main())
