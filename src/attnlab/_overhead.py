"""Moved to [`attnlab.bench.overhead`][attnlab.bench.overhead]; this name stays for old imports.

Run `python -m attnlab.bench.overhead`; `python -m attnlab._overhead` still works.
"""

from attnlab.bench.overhead import main, measure

__all__ = ["main", "measure"]

if __name__ == "__main__":
    raise SystemExit(main())
