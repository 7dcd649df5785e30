"""A real browser for the status page: Playwright driving Debian's Chromium.

Playwright's own browser download does not work on every machine, so the tests use the
system's Chromium (`/usr/bin/chromium`, or `ZDMQ_CHROMIUM`), headless, with a fresh
profile each. They skip, saying what is missing, where Playwright or Chromium is not
installed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("ZDMQ_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def browser_page(tmp_path: Path) -> Iterator[Any]:
    """A page of a fresh headless Chromium (its own user-data dir under tmp_path)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: pip install -e '.[dev]'")
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set ZDMQ_CHROMIUM)")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 1000},
            ignore_https_errors=True,
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(10_000)
            yield page
        finally:
            context.close()
