"""Opens the built site in headless Chromium, as a reader would, and checks three pages.

    python docs/check_site.py [SITE] [--screenshots DIR]

The home page, the API page of ``dropmask.linen`` and the search results for
"LayerDrop" (Sphinx's search runs in JavaScript: the check waits for the results). A
page fails on a console error (a missing script or image, a JavaScript exception) or
a missing element; a screenshot of each lands in ``DIR`` (``docs/_build/screenshots``).
Exits 1 naming each failure, 0 when all three pages pass.

It drives Debian's ``chromium`` through Debian's ``chromium-driver`` with Selenium:
the browser and its driver come from one Debian source package, so their versions
always match, and nothing downloads a browser build (``make docs-check`` installs
both with apt-get where they are missing).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import pathlib
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

HERE = pathlib.Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 30  # Sphinx's search loads its index and ranks in JavaScript


@dataclass(frozen=True)
class Page:
    """One page to load: its path in the site, and the CSS selectors that must match."""

    name: str
    path: str
    selectors: tuple[str, ...]
    text: str = ""  # text one of the last selector's matches must contain


PAGES = (
    Page(
        "home", "index.html", ("h1", "nav.bd-docs-nav a[href='api/index.html']", "form.bd-search")
    ),
    Page(
        "api-linen",
        "api/dropmask.linen.html",
        ("table.autosummary", "[id='dropmask.linen.Dropout']", "[id='dropmask.linen.LayerDrop']"),
    ),
    Page(
        "search-layerdrop",
        "search.html?q=LayerDrop",
        ("#search-results", "#search-results ul.search li a"),
        text="LayerDrop",
    ),
)


@contextlib.contextmanager
def serve(site: pathlib.Path) -> Iterator[str]:
    """The site over HTTP on a free loopback port, as a reader's browser loads it."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    handler = functools.partial(Quiet, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            server.shutdown()


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)  # --no-sandbox: CI runs as root, where the sandbox refuses
    options.add_argument("--window-size=1366,900")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def check_page(driver, base: str, page: Page, screenshots: pathlib.Path) -> list[str]:
    """The problems of one page; its screenshot is written whatever they are."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    problems = []
    driver.get(base + page.path)
    for selector in page.selectors:
        last = selector == page.selectors[-1]

        def found(d, selector=selector, last=last):
            hits = d.find_elements(By.CSS_SELECTOR, selector)
            if last and page.text:
                hits = [h for h in hits if page.text in h.text]
            return hits

        try:
            WebDriverWait(driver, WAIT_S if last else 5).until(found)
        except TimeoutException:
            wanted = f"{selector} containing {page.text!r}" if last and page.text else selector
            problems.append(f"{page.path}: no element {wanted}")
    for entry in driver.get_log("browser"):
        if entry["level"] == "SEVERE":
            problems.append(f"{page.path}: console error: {entry['message']}")
    driver.save_screenshot(str(screenshots / f"{page.name}.png"))
    return problems


def check_site(site: pathlib.Path, screenshots: pathlib.Path) -> list[str]:
    """Every problem of the three pages of ``site``, as lines."""
    if not (site / "index.html").is_file():
        return [f"{site}: no built site here (make docs)"]
    for program in (CHROMIUM, CHROMEDRIVER):
        if not pathlib.Path(program).is_file():
            return [f"{program} is missing: apt-get install chromium chromium-driver"]
    screenshots.mkdir(parents=True, exist_ok=True)
    problems = []
    with serve(site) as base:
        driver = browser()
        try:
            for page in PAGES:
                problems += check_page(driver, base, page, screenshots)
        finally:
            driver.quit()
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", nargs="?", type=pathlib.Path, default=HERE / "_build" / "html")
    parser.add_argument("--screenshots", type=pathlib.Path, default=HERE / "_build" / "screenshots")
    args = parser.parse_args(argv)
    problems = check_site(args.site, args.screenshots)
    for problem in problems:
        print(f"docs-check: {problem}", file=sys.stderr)
    if not problems:
        names = ", ".join(f"{p.name}.png" for p in PAGES)
        print(f"docs-check: {len(PAGES)} pages pass; screenshots in {args.screenshots}: {names}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
