"""The web page at ``/`` in a real headless Chromium, against the real API server and a real worker.

Debian's ``chromium`` and ``chromium-driver`` drive the browser (``scripts/test`` installs them); Selenium is
pointed at those binaries, so Selenium Manager downloads nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver import Chrome
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from tests.api_server import ApiProcess, create_key
from tests.conftest import Stack
from tests.pages import render_page, sample_lines

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
PAGE_TIMEOUT = 90  # upload -> worker -> event stream -> text on the page


@pytest.fixture
def api_server(stack: Stack) -> Iterator[ApiProcess]:
    """Started with the test (it comes up while the worker loads its engine); ready once waited for."""
    server = ApiProcess.of(stack)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def downloads(tmp_path: Path) -> Path:
    folder = tmp_path / "downloads"
    folder.mkdir()
    return folder


@pytest.fixture
def browser(downloads: Path) -> Iterator[Chrome]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.skip(f"no {' and '.join(missing)}: apt-get install chromium chromium-driver (scripts/test does)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000"):
        options.add_argument(arg)
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False,
                                              # several downloads from one page, without asking
                                              "profile.default_content_setting_values.automatic_downloads": 1})
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=DriverService(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _visible_text(driver: Chrome, css: str) -> str:
    return " ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, css) if e.is_displayed())


def _page_text(driver: Chrome, page_no: int) -> str:
    """The text of page ``page_no`` once shown; fails at once when the page reports an error instead."""
    errors = _visible_text(driver, ".error")
    if errors:
        raise AssertionError(f"the page shows an error: {errors}")
    return _visible_text(driver, f'.page-text[data-page-no="{page_no}"]')


def _wait(driver: Chrome, what: str, until: Callable[[Chrome], object], *, server: ApiProcess,
          timeout: float = PAGE_TIMEOUT) -> object:
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(until)
    except Exception as exc:
        console = "\n".join(str(e) for e in driver.get_log("browser"))
        body = driver.find_element(By.TAG_NAME, "body").text
        raise AssertionError(f"{what}: {exc!r}\n-- page:\n{body}\n-- console:\n{console}\n"
                             f"-- api log:\n{server.output()[-3000:]}") from exc


def _choose_and_upload(driver: Chrome, path: Path) -> None:
    driver.find_element(By.ID, "file").send_keys(str(path))
    driver.find_element(By.ID, "send").click()


def test_upload_a_scan_and_watch_its_page_finish(browser: Chrome, downloads: Path, stack: Stack, api_server: ApiProcess,
                                                 worker_factory, tmp_path: Path) -> None:
    worker_factory(stack)
    server = api_server.wait_ready()
    key, _ = create_key(stack, "web", interactive=True)
    lines = sample_lines(21)
    scan = tmp_path / "letter.png"
    scan.write_bytes(render_page(lines))

    browser.get(server.url + "/")
    key_field = browser.find_element(By.ID, "key")
    key_field.send_keys("not-a-key")
    _choose_and_upload(browser, scan)
    _wait(browser, "a bad key's refusal, readably", server=server, timeout=20,
          until=lambda d: "401" in d.find_element(By.ID, "message").text)
    message: WebElement = browser.find_element(By.ID, "message")
    assert "Upload failed" in message.text and "error" in (message.get_attribute("class") or "")
    assert "{" not in message.text, "the JSON error's message, not the JSON"

    key_field.clear()
    key_field.send_keys(key)
    browser.find_element(By.ID, "send").click()  # the file chosen before is still chosen
    first_words = " ".join(lines[0].split()[:2])
    _wait(browser, f"page 1's text with {first_words!r}", server=server,
          until=lambda d: first_words in _page_text(d, 1))

    image_loaded = "const i = document.querySelector('.page img'); return !!i && i.complete && i.naturalWidth > 0;"
    _wait(browser, "the annotated image", server=server, until=lambda d: d.execute_script(image_loaded))
    buttons = "[data-format=json], [data-format=md], [data-format=pdf]"
    _wait(browser, "the three download buttons", server=server,
          until=lambda d: len([b for b in d.find_elements(By.CSS_SELECTOR, buttons) if b.is_displayed()]) == 3)
    assert "1 / 1 pages" in browser.find_element(By.CSS_SELECTOR, ".document .count").text

    browser.find_element(By.CSS_SELECTOR, "[data-format=json]").click()
    saved = downloads / "letter.json"
    _wait(browser, "the downloaded document JSON", server=server, timeout=30, until=lambda d: saved.exists())
    assert first_words in json.dumps(json.loads(saved.read_text()))
    # The archive formats: ALTO built by the API on request (the workers write JSON, markdown and PDF), and the
    # page's PAGE XML from its card.
    alto, page_xml = downloads / "letter.alto.xml", downloads / "letter.page.xml"
    browser.find_element(By.CSS_SELECTOR, "[data-format=alto]").click()
    _wait(browser, "the downloaded ALTO", server=server, timeout=30, until=lambda d: alto.exists())
    browser.find_element(By.CSS_SELECTOR, ".page .page-xml").click()
    _wait(browser, "the downloaded PAGE XML", server=server, timeout=30, until=lambda d: page_xml.exists())
    assert lines[0].split()[0] in alto.read_text() and lines[0].split()[0] in page_xml.read_text()

    browser.refresh()
    assert browser.find_element(By.ID, "key").get_attribute("value") == key, "the key is kept for the tab"
    assert browser.execute_script("return [localStorage.length, sessionStorage.getItem('paperlane.apiKey')]") == [
        0, key], "in sessionStorage, never in localStorage"
    _same_origin_only(browser, server)


def _same_origin_only(driver: Chrome, server: ApiProcess) -> list[str]:
    """What the page loaded, all from the API's origin; nothing was refused (a CSP violation is a SEVERE console
    entry)."""
    loaded: list[str] = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(url.startswith(server.url + "/") or url.startswith("blob:") for url in loaded), loaded
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "401" not in e["message"]]
    assert severe == [], severe
    return loaded


def test_the_docs_render_with_scripts_from_this_origin_only(browser: Chrome, api_server: ApiProcess) -> None:
    server = api_server.wait_ready()
    browser.get(server.url + "/docs")
    _wait(browser, "Swagger UI rendering the API", server=server, timeout=30,
          until=lambda d: "/v1/documents" in _visible_text(d, ".swagger-ui .opblock-summary-path"))
    assert "paperlane API" in browser.title
    loaded = _same_origin_only(browser, server)
    assert f"{server.url}/docs/assets/swagger-ui-bundle.js" in loaded and f"{server.url}/openapi.json" in loaded
