"""The one home of provenance: where, when and how a recorded measurement was made.

Every command of the package that writes a record for the site (`python -m
attnlab.tools.train`, `python -m attnlab.tools.bench`, `python -m attnlab.tools.bench.overhead`,
`python
-m attnlab.tools.bench.ring` and `python -m attnlab.distributed.demo`) stores the same
dict under its record's `"provenance"` key (the training record, which is the provenance
of the weights it saves, holds these keys at its top level), built here:

| key | what |
|:--|:--|
| `command` | the command line that made the record |
| `date` | when it started, ISO 8601 in UTC (`2026-12-01T05:24:00+00:00`) |
| `duration_s` | seconds from start to the record |
| `attnlab`, `torch`, `python` | versions |
| `platform` | `platform.platform()` |
| `cpu_model`, `logical_cpus` | the CPU's name and `os.cpu_count()` |
| `torch_threads` | `torch.get_num_threads()` when the record was made |
| `load_average_before`, `load_average_after` | 1, 5 and 15 min load, at start and end |
| `environment` | variables that change what is measured (`MALLOC_*`, `OMP_*`, `MKL_*`) |

A command may add keys of its own (the benchmark adds `repeats`, `seed`, `note`).

Records written before this module use other keys (`cpu_count`, `cpus`, `date_utc`,
`loadavg_after`, ...), some outside a `"provenance"` dict; `read_provenance` reads any
of them into the keys above, so that committed records need not be measured again.

API (internal; the recorders import these names, and `attnlab.tools.bench` re-exports
`read_provenance`):

- `begin() -> Start`: the clock, date and load at the start of a run.
- `provenance(command, since=None) -> dict`: the dict above, now.
- `command_line(module, argv) -> str`: `python -m module arg ...`, shell-quoted.
- `cpu_model() -> str`: the CPU's model name.
- `read_provenance(record) -> dict`: the provenance of any record, new keys or old.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import shlex
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "KEYS",
    "Start",
    "begin",
    "command_line",
    "cpu_model",
    "provenance",
    "read_provenance",
]

KEYS: tuple[str, ...] = (
    "command",
    "date",
    "duration_s",
    "attnlab",
    "torch",
    "python",
    "platform",
    "cpu_model",
    "logical_cpus",
    "torch_threads",
    "load_average_before",
    "load_average_after",
    "environment",
)
"""The keys of every provenance dict, in the order they are written."""

_ENVIRONMENT_PREFIXES = ("MALLOC_", "OMP_", "MKL_")
# Old name -> new name, for records written before this module.
_RENAMED = {
    "date_utc": "date",
    "cpu_count": "logical_cpus",
    "cpus": "logical_cpus",
    "threads": "torch_threads",
    "seconds": "duration_s",
    "load_average": "load_average_after",
    "loadavg_after": "load_average_after",
}


@dataclasses.dataclass(frozen=True)
class Start:
    """The moment a run started: wall-clock date, monotonic clock and load average."""

    date: datetime.datetime
    clock: float
    load_average: list[float] | None


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):  # not on every platform
        return None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def begin() -> Start:
    """Note the date, the clock and the machine's load at the start of a run.

    Examples:
        >>> begin().date.tzinfo
        datetime.timezone.utc
    """
    return Start(datetime.datetime.now(datetime.UTC), time.monotonic(), _load_average())


def command_line(module: str, argv: Sequence[str]) -> str:
    """The command `python -m module argv...`, quoted as a shell would need it.

    Examples:
        >>> command_line("attnlab.tools.bench", ["--note", "two runs"])
        "python -m attnlab.tools.bench --note 'two runs'"
    """
    return shlex.join(["python", "-m", module, *argv])


def provenance(command: str, since: Start | None = None) -> dict[str, Any]:
    """Where, when and how a record was made, with the keys of `KEYS`.

    Args:
        command: The command line that made the record (see `command_line`).
        since: What `begin()` returned when the run began; default now, so that the
            duration is 0 and the load before is the load after.

    Returns:
        A JSON-ready dict.

    Examples:
        >>> list(provenance("python -m attnlab.tools.train")) == list(KEYS)
        True
    """
    begun = begin() if since is None else since
    import attnlab  # here, not at the top: attnlab's __init__ need not know this module

    return {
        "command": command,
        "date": begun.date.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - begun.clock, 2),
        "attnlab": attnlab.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_before": begun.load_average,
        "load_average_after": _load_average(),
        "environment": {
            k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENVIRONMENT_PREFIXES)
        },
    }


def _iso_date(value: object) -> object:
    """`2026-12-01 05:24 UTC` or `2026-12-01 05:24` (both UTC) as ISO 8601."""
    if not isinstance(value, str):
        return value
    try:
        parsed = datetime.datetime.strptime(value.removesuffix(" UTC"), "%Y-%m-%d %H:%M")
    except ValueError:
        return value
    return parsed.replace(tzinfo=datetime.UTC).isoformat(timespec="seconds")


def read_provenance(record: Mapping[str, Any]) -> dict[str, Any]:
    """The provenance of a record written by any version of the package's commands.

    Reads the `"provenance"` dict of `record`, or for older records the keys they kept
    elsewhere (at the top level, or under `"machine"` and `"run"`), and returns them
    under the names of `KEYS`, dates as ISO 8601; a key the record lacks is None. Keys
    outside `KEYS` are kept.

    Args:
        record: A record as loaded from its JSON file.

    Returns:
        A new dict with every key of `KEYS` first.

    Examples:
        >>> old = {"machine": {"cpus": 2}, "run": {"date_utc": "2026-12-01 05:24"}}
        >>> prov = read_provenance(old)
        >>> prov["logical_cpus"], prov["date"], prov["attnlab"]
        (2, '2026-12-01T05:24:00+00:00', None)
        >>> read_provenance({"provenance": {"date": "2026-12-01 05:44 UTC"}})["date"]
        '2026-12-01T05:44:00+00:00'
    """
    found: dict[str, Any] = {}
    sources: list[Mapping[str, Any]] = []
    if isinstance(record.get("provenance"), Mapping):
        sources.append(record["provenance"])
    else:  # old records: overhead's "machine" and "run", train's top level
        sources += [record.get(k) or {} for k in ("machine", "run")]
        sources.append({k: v for k, v in record.items() if k in KEYS or k in _RENAMED})
    for source in sources:
        for key, value in source.items():
            found.setdefault(_RENAMED.get(key, key), value)
    found["date"] = _iso_date(found.get("date"))
    return {**{k: found.get(k) for k in KEYS}, **found}
