"""`python -m attnlab.bench`: run the benchmark harness (see `attnlab.bench.cli`)."""

from attnlab.bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
