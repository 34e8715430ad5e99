"""Headless Chromium for the tests that look at pages as a reader's browser shows them.

tests/test_browser.py (the heatmaps, diagrams and live model) and tests/test_site.py (the
built site at a phone's width) both run it; they skip where none is installed
(`apt-get install -y chromium`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((path for name in BROWSERS if (path := shutil.which(name))), None)
MISSING = "no Chromium on PATH (install it with: apt-get install -y chromium)"


def headless(profile: Path, *args: str) -> list[str]:
    """The command line that runs the browser headless and offline, with `args` after."""
    assert BROWSER is not None, MISSING
    return [
        BROWSER,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *args,
    ]
