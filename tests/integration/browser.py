"""A real browser for the dashboard tests: Debian's ``chromium`` driven by ``chromium-driver``
through selenium, headless. Both are optional system packages; :func:`open_chromium` skips the
calling test with the reason when one is missing."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
DRIVER_NAMES = ("chromedriver", "chromium-driver")
WINDOW = (1400, 1500)


def _find(names: tuple[str, ...], extra: tuple[str, ...] = ()) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    for path in extra:
        if os.access(path, os.X_OK):
            return path
    return None


def open_chromium():  # -> selenium.webdriver.Chrome
    """A headless Chromium, or skip: says which package is missing."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (it is in the test extra: make install)")
    browser = _find(CHROMIUM_NAMES, ("/usr/lib/chromium/chromium",))
    if browser is None:
        pytest.skip("chromium is not installed (optional system package: apt-get install chromium chromium-driver)")
    driver_path = _find(DRIVER_NAMES, ("/usr/lib/chromium/chromedriver",))
    if driver_path is None:
        pytest.skip("chromedriver is not installed (optional system package: apt-get install chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=options)


def screenshot(driver, path: Path) -> bytes:
    """Save what the browser shows as a PNG at ``path`` (and, with BOXQUEUE_DASHBOARD_PNG set, a
    copy there: how docs/metrics.md's picture is made); returns the PNG."""
    png = driver.get_screenshot_as_png()
    path.write_bytes(png)
    copy = os.environ.get("BOXQUEUE_DASHBOARD_PNG")
    if copy:
        Path(copy).write_bytes(png)
    return png


def blankness(png: bytes) -> tuple[int, float, tuple[int, int]]:
    """(distinct colours, share of the most common colour, size) of a PNG."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    small = image.resize((image.width // 2, image.height // 2))
    colours = small.getcolors(maxcolors=1 << 20) or []
    total = small.width * small.height
    top = max(count for count, _colour in colours) if colours else total
    return len(colours), top / total, image.size
