"""The dashboard in a real browser: it updates live (no reload) as tasks are put over iproto and
over Zaqar, the tube's row and its plot change, paging/search work, and a screenshot of it is not
blank. Skipped, with the reason, where chromium or chromedriver is missing."""

from __future__ import annotations

import contextlib
import time
import uuid

import httpx
import pytest
import tarantool

from tests.integration.browser import blankness, open_chromium, screenshot
from tests.integration.queue_fixtures import QUEUE_SPACE_0
from tests.serverproc import ServerProcess, free_port


@pytest.fixture
def served(tmp_path):
    metrics_port, zaqar_port = free_port(), free_port()
    server = ServerProcess(
        tmp_path / "server",
        wal_mode="write",
        read_only=False,
        extra_config=QUEUE_SPACE_0 + f"""
[metrics]
listen = "127.0.0.1:{metrics_port}"

[zaqar]
listen = "127.0.0.1:{zaqar_port}"
""",
    )
    server.start()
    try:
        yield server, metrics_port, zaqar_port
    finally:
        server.stop()


@pytest.fixture
def browser():
    driver = open_chromium()
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(check, timeout: float = 20.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # the element is being re-rendered: look again
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def cell(driver, key: str, name: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'#tubes tr[data-key="{key}"] td.{name}').text


def depth_path(driver, key: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'#tubes tr[data-key="{key}"] svg.spark path.depth').get_attribute("d")


def test_dashboard_updates_live_for_iproto_and_zaqar_puts(served, browser, tmp_path):
    from selenium.webdriver.common.by import By

    server, metrics_port, zaqar_port = served
    conn = tarantool.connect("127.0.0.1", server.port)
    conn.call("box.queue.put", [0, "emails", 0, 0, 0, 0, "first"])

    browser.get(f"http://127.0.0.1:{metrics_port}/")
    wait_for(lambda: cell(browser, "queue/emails", "ready") == "1", what="the emails row with 1 ready task")
    browser.execute_script("window.__sameDocument = 42;")  # gone if the page reloads
    wait_for(lambda: depth_path(browser, "queue/emails").count("L") >= 1, what="a first plot segment")
    plot_before = depth_path(browser, "queue/emails")

    for i in range(5):
        conn.call("box.queue.put", [0, "emails", 0, 0, 0, 0, f"more {i}"])
    wait_for(lambda: cell(browser, "queue/emails", "ready") == "6", what="6 ready tasks in the emails row")
    wait_for(lambda: depth_path(browser, "queue/emails") != plot_before, what="the emails plot to change")

    headers = {"Client-ID": str(uuid.uuid4()), "X-Project-Id": "demo"}
    zaqar = f"http://127.0.0.1:{zaqar_port}/v1.1/queues/jobs"
    assert httpx.put(zaqar, headers=headers, json={}).status_code == 201
    posted = httpx.post(zaqar + "/messages", headers=headers,
                        json={"messages": [{"ttl": 300, "body": {"n": n}} for n in range(3)]})
    assert posted.status_code == 201
    wait_for(lambda: cell(browser, "zaqar/demo/jobs", "ready") == "3", what="the Zaqar queue's row")
    assert cell(browser, "zaqar/demo/jobs", "kind") == "zaqar"
    assert browser.execute_script("return window.__sameDocument;") == 42, "the page was reloaded"

    # The global plot of tasks per second has drawn the puts.
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, '#plot-tasks path[data-series="puts"]'),
             what="the puts line of the tasks plot")
    # An error shows in the list of recent errors.
    with contextlib.suppress(tarantool.DatabaseError):
        conn.call("box.queue.ack", [0, "no-such-task"])
    wait_for(lambda: "Task not found" in browser.find_element(By.ID, "errors").text, what="the error in the list")

    png = screenshot(browser, tmp_path / "dashboard.png")
    colours, top_share, size = blankness(png)
    assert size[0] >= 1000 and size[1] >= 800, size
    assert colours > 50 and top_share < 0.9, (colours, top_share)

    # The search box narrows the table to the matching tubes, without a reload.
    search = browser.find_element(By.ID, "search")
    search.send_keys("jobs")
    wait_for(lambda: [r.get_attribute("data-key") for r in browser.find_elements(By.CSS_SELECTOR, "#tubes tbody tr")]
             == ["zaqar/demo/jobs"], what="only the jobs row")
    assert browser.execute_script("return window.__sameDocument;") == 42
    conn.close()


def test_dashboard_pages_through_many_tubes(served, browser):
    from selenium.webdriver.common.by import By

    server, metrics_port, _zaqar_port = served
    conn = tarantool.connect("127.0.0.1", server.port)
    for i in range(120):
        conn.call("box.queue.put", [0, f"tube{i:03d}", 0, 0, 0, 0, "x"])
    browser.get(f"http://127.0.0.1:{metrics_port}/")

    def keys():
        return [r.get_attribute("data-key") for r in browser.find_elements(By.CSS_SELECTOR, "#tubes tbody tr")]

    wait_for(lambda: keys()[:1] == ["queue/tube000"] and len(keys()) == 50, what="the first page of 50")
    assert "page 1 of 3" in browser.find_element(By.ID, "page-info").text
    browser.find_element(By.ID, "next").click()
    wait_for(lambda: keys()[:1] == ["queue/tube050"], what="the second page")
    browser.find_element(By.ID, "next").click()
    wait_for(lambda: keys() == [f"queue/tube{i:03d}" for i in range(100, 120)], what="the last page of 20")
    conn.close()
