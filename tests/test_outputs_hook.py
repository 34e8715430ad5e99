"""docs/hooks/outputs.py finds the fences inside admonitions and collapsed solutions."""

from __future__ import annotations

from pathlib import Path

from hooks import outputs  # docs/hooks/outputs.py, via pythonpath in pyproject.toml

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
