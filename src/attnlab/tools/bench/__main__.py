"""`python -m attnlab.tools.bench`: run the benchmark harness (see `attnlab.tools.bench.cli`)."""

from attnlab.tools.bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
