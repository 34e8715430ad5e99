"""docs/hooks/outputs.py finds the fences inside containers and runs each block once."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from hooks import blocks, outputs  # docs/hooks/, via pythonpath in pyproject.toml

PAGE = """\
# Page

```python continuation
x = 2
```

```python continuation
print("??? success not a header: inside a fence")
```

```text title="Output"
??? success not a header: inside a fence
```

1. Predict `x + 1`.

    ??? success "Solution"

        ```python continuation
        print(x + 1)
        ```

        ```text title="Output"
        0
        ```

!!! note
    Text first.

    ```python continuation
    print(x * 10)
    ```

    ```text title="Output"
    20
    ```

After the note.
"""


def test_unwrap_containers_keeps_lines_and_dedents_bodies() -> None:
    text, removed = outputs.unwrap_containers(PAGE)
    lines = text.split("\n")
    assert len(lines) == len(PAGE.split("\n"))
    # Headers become blank lines; bodies lose their container's four spaces per level.
    assert lines[16] == ""  # ??? success "Solution"
    assert lines[18] == "```python continuation"
    assert removed[18] == 8
    assert lines[27] == "Text first."
    assert removed[27] == 4
    assert lines[37] == "After the note."
    assert removed[37] == 0
    # A line inside a fence that looks like a header is output text, left alone.
    assert lines[11] == "??? success not a header: inside a fence"
    assert removed[11] == 0


def test_parse_blocks_finds_fences_in_containers() -> None:
    blocks = outputs.parse_blocks(PAGE)
    assert [b.code for b in blocks] == [
        "x = 2\n",
        'print("??? success not a header: inside a fence")\n',
        "print(x + 1)\n",
        "print(x * 10)\n",
    ]
    assert [b.line for b in blocks] == [3, 7, 19, 30]  # the fences' lines in the file
    assert [b.output for b in blocks[2:]] == ["0\n", "20\n"]
    assert [b.output_indent for b in blocks] == [0, 0, 8, 4]


def test_run_and_update_check_outputs_inside_solutions(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE, encoding="utf-8")
    problems = outputs.run_page(page).problems
    assert len(problems) == 1
    assert problems[0].startswith(f"{page}:23: number #1 differs: shown 0, printed 3")

    assert outputs.update_page(page) == 1
    updated = page.read_text(encoding="utf-8")
    assert updated == PAGE.replace("        0\n", "        3\n")  # indentation kept
    assert outputs.run_page(page).problems == []


TABS = """\
=== "First"

    ```python
    runs = [1]
    print(len(runs))
    ```

    ```text title="Output"
    1
    ```

=== "Second"

    ```python continuation
    runs.append(2)
    print(len(runs))
    ```

```python exec="on"
print("<b>made by markdown-exec</b>")
```

```python
print("fresh" if "runs" not in globals() else "stale")
```

```text title="Output"
fresh
```
"""


def test_blocks_in_tabs_are_found_with_their_containers() -> None:
    page = blocks.read(TABS)
    python = [f for f in page.fences if f.is_python]
    assert [f.line for f in python] == [3, 14, 19, 23]
    assert [c.title for c in python[0].containers] == ["First"]
    assert [c.marker for c in python[1].containers] == ["==="]
    assert python[2].containers == ()
    assert [b.line for b in outputs.parse_blocks(TABS)] == [3, 14, 23]  # exec is left out


def test_a_session_runs_each_block_once_with_continuation_rules(tmp_path: Path) -> None:
    path = tmp_path / "tabs.md"
    path.write_text(TABS, encoding="utf-8")
    session = outputs.PageSession(path, exec_blocks=True)
    assert [b.line for b in session.blocks] == [3, 14, 19, 23]
    # Asking for the second block runs the first too, once; asking again runs nothing.
    second = session.result(session.index(14))
    assert second.printed == "2\n"
    assert second.problem is not None  # it prints but shows no output
    assert session.result(0).printed == "1\n"
    assert session.result(0).problem is None
    assert session.result(1) is second
    # The markdown-exec block runs in its own namespace and is not compared with a fence;
    # a block without `continuation` starts afresh.
    run = session.run_all()
    assert [r.printed for r in run.results[2:]] == ["<b>made by markdown-exec</b>\n", "fresh\n"]
    assert [r.problem for r in run.results[2:]] == [None, None]
    assert len(run.results) == 4
    # At build time markdown-exec runs the exec block; the checker leaves it out.
    assert [r.block.line for r in outputs.run_page(path).results] == [3, 14, 23]


def test_an_error_stops_only_the_blocks_that_continue_from_it(tmp_path: Path) -> None:
    path = tmp_path / "page.md"
    path.write_text(
        "```python\nx = 1 / 0\n```\n\n```python continuation\nprint(x)\n```\n\n"
        '```python\nprint(2)\n```\n\n```text title="Output"\n2\n```\n',
        encoding="utf-8",
    )
    run = outputs.run_page(path)
    assert isinstance(run.results[0].exception, ZeroDivisionError)
    assert run.results[1].error == "  (not run: the block at line 1 of this page raised)"
    assert run.results[2].error is None
    assert run.problems[0].startswith(f"{path}:1: the block raised")
    assert len(run.problems) == 2


def test_a_recorded_run_is_checked_again_and_only_for_its_own_text(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE, encoding="utf-8")
    entry = json.loads(json.dumps(outputs.record(outputs.PageSession(page, exec_blocks=True))))
    run = outputs.from_record(page, PAGE, entry)
    assert run is not None
    assert run.problems == outputs.run_page(page).problems  # the wrong `0` at line 23
    assert [r.printed for r in run.results] == [
        "",
        "??? success not a header: inside a fence\n",
        "3\n",
        "20\n",
    ]
    # Made from other text, or missing a block of this one: the page must run again.
    assert outputs.from_record(page, PAGE.replace("x = 2", "x = 3"), entry) is None
    entry["results"].pop()
    assert outputs.from_record(page, PAGE, entry) is None


def test_the_build_worker_runs_pages_ahead_and_a_lost_one_runs_in_the_build(
    tmp_path: Path,
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "tabs.md").write_text(TABS, encoding="utf-8")
    (docs / "slow.md").write_text("```python\nimport time\ntime.sleep(60)\n```\n", "utf-8")
    worker = outputs._Worker({"docs/tabs.md": str(docs / "tabs.md")})
    try:
        entry = worker.entry("docs/tabs.md")
    finally:
        worker.close()
    assert entry == outputs.record(outputs.PageSession(docs / "tabs.md", exec_blocks=True))
    assert not worker.out.exists()  # its records are removed with it

    # A worker that dies before a page is done: the hook runs that page itself.
    lost = outputs._Worker(
        {"docs/slow.md": str(docs / "slow.md"), "docs/tabs.md": str(docs / "tabs.md")}
    )
    lost.kill()  # both workers: the second is forked by the first
    assert lost.entry("docs/tabs.md") is None
    page = SimpleNamespace(file=SimpleNamespace(src_uri="tabs.md", generated_by=None))
    page.file.abs_src_path = str(docs / "tabs.md")
    outputs._build.update(recorded={}, worker=lost)
    try:
        outputs.on_page_markdown(TABS, page, {"docs_dir": str(docs)}, None)
    finally:
        outputs.on_shutdown()
    assert [r.printed for r in page.attnlab_run.results] == [
        "1\n",
        "2\n",
        "<b>made by markdown-exec</b>\n",
        "fresh\n",
    ]
    assert "worker" not in outputs._build


def test_the_build_reads_the_pages_without_code_first_and_the_slow_ones_last() -> None:
    def page(src_uri: str, chapter: str | None = None) -> SimpleNamespace:
        file = SimpleNamespace(src_uri=src_uri)
        if chapter is not None:
            file.attnlab_chapter = chapter  # a notebook page, made from its chapter's run
        return file

    pages = [
        page("index.md"),
        page("a.md"),
        page("reference.md"),
        page("slow.md"),
        page("b.md"),
        page("notebooks/a.ipynb", "a.md"),
        page("notebooks/slow.ipynb", "slow.md"),
        page("notebooks/b.ipynb", "b.md"),
    ]
    files = SimpleNamespace(documentation_pages=lambda: pages)
    order = outputs.reading_order(files, code={"a.md", "slow.md", "b.md"}, slow={"slow.md"})
    assert [f.src_uri for f in order] == [
        "index.md",
        "reference.md",
        "a.md",
        "notebooks/a.ipynb",
        "b.md",
        "notebooks/b.ipynb",
        "slow.md",
        "notebooks/slow.ipynb",
    ]
    # With every run recorded (no code to run), MkDocs' order, each notebook after its page.
    order = outputs.reading_order(files, code=(), slow=())
    assert [f.src_uri for f in order][:4] == [
        "index.md",
        "a.md",
        "notebooks/a.ipynb",
        "reference.md",
    ]


def test_numbers_match_to_their_last_digit_and_rounding_errors_to_their_size() -> None:
    assert outputs.compare("-0.2626", "-0.2627") is None  # one unit in the last digit
    assert (
        outputs.compare("-0.2626", "-0.2628") == "number #1 differs: shown -0.2626, printed -0.2628"
    )
    assert outputs.compare("shape (2, 3)", "shape (2, 4)") is not None  # integers: exact
    # A rounding error's digits depend on the CPU's kernels: its size must hold.
    assert outputs.compare("max diff 5.0e-05", "max diff 1.9e-04") is None
    assert outputs.compare("max diff 5.0e-05", "max diff 6.0e-04") is not None
    assert outputs.compare("max diff 5.0e-04", "max diff 2.0e-03") is not None  # not an error
    assert outputs.compare("diff 2.2e-07 and 0.5", "diff 1.8e-07 and 0.7") is not None
    assert outputs.compare("max |a - b| = 2.2e-07", "max |a - b| = 1.2e-07") is None
    assert outputs.compare("eps=1.0e-06", "eps=3.0e-06") is not None  # a constant
    assert outputs.compare("frequency 5.32e-05", "frequency 2.00e-04") is not None
    assert outputs.compare("max diff -2.0e-04", "max diff 2.0e-04") is not None  # signs
    assert outputs.compare("max diff 1.0e-06", "max diff 1.0e-05") is not None  # 10 times
    # The words may come before an earlier number of the same line.
    shown = "sinks, largest difference: 2.4e-07 from SDPA, 2.4e-07 from flash"
    assert (
        outputs.compare(shown, "sinks, largest difference: 2.4e-07 from SDPA, 3.6e-07 from flash")
        is None
    )
