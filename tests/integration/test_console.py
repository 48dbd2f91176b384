"""The web console in a real browser (headless Chromium driven by chromedriver, both from
Debian's packages; ``scripts/bootstrap.sh`` installs them) against a real coordinator: what the
page shows follows the queue. A missing browser fails the test, it never skips."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from layer.client import QueueClient

pytestmark = pytest.mark.integration

WAIT = 30.0  # seconds: the page polls once a second; the machine may be busy


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    chromium = shutil.which("chromium")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.fail(
            "the console test needs chromium and chromedriver "
            "(apt-get install chromium chromium-driver; scripts/bootstrap.sh does it as root)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1100",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def cell_text(driver: WebDriver, selector: str) -> str | None:
    """The text of the first element ``selector`` finds, or None. The page redraws its tables
    on every poll: an element found just before a redraw is gone (None, and the wait goes on)."""
    try:
        found = driver.find_elements(By.CSS_SELECTOR, selector)
        return found[0].text if found else None
    except StaleElementReferenceException:
        return None


def click(driver: WebDriver, selector: str) -> None:
    """Click, again if a redraw replaced the element in between."""

    def attempt(d: WebDriver) -> bool:
        try:
            d.find_element(By.CSS_SELECTOR, selector).click()
            return True
        except StaleElementReferenceException:
            return False

    WebDriverWait(driver, WAIT, poll_frequency=0.1).until(attempt, message=f"click {selector}")


def wait_for(driver: WebDriver, what: str, check) -> None:  # type: ignore[no-untyped-def]
    WebDriverWait(driver, WAIT, poll_frequency=0.2).until(lambda d: check(d), message=what)


def test_console_shows_a_message_arrive_and_leave(
    browser: WebDriver, coordinator_factory, names, tmp_path: Path
) -> None:
    topic, q, dlq = names("web"), names("web"), names("web-dlq")
    c = coordinator_factory(
        [{"name": q, "underlying_topic": topic, "dead_letter_topic": dlq}], http="127.0.0.1:0"
    )
    assert c.http_address is not None
    base = f"http://{c.http_address}"
    browser.get(base + "/")  # redirects to the console
    row = f'#queues tr[data-queue="{q}"]'
    wait_for(
        browser, "the queue listed, empty", lambda d: cell_text(d, row + " td.available") == "0"
    )

    with QueueClient(c.address, client_name="web-test") as client:
        client.publish(q, json.dumps({"order": 1, "sym": "IBM"}).encode())
        wait_for(
            browser,
            "the message in the depth",
            lambda d: cell_text(d, row + " td.available") == "1",
        )
        browser.save_screenshot(str(tmp_path / "console-overview.png"))
        with client.subscribe(q, max_backlog=1) as sub:
            msg = sub.next(timeout=WAIT)
            assert msg is not None
            wait_for(
                browser,
                "leased and a consumer",
                lambda d: (
                    cell_text(d, row + " td.leased") == "1"
                    and cell_text(d, row + " td.consumers") == "1"
                    and cell_text(d, row + " td.available") == "0"
                ),
            )
            msg.ack(wait=True)
            wait_for(browser, "acked: gone", lambda d: cell_text(d, row + " td.leased") == "0")

            # the queue page: figures, subscriptions with their leases, browse, dead letters
            client.publish(q, json.dumps({"order": 2, "sym": "MSFT"}).encode())
            client.publish(q, json.dumps({"order": 3, "sym": "IBM"}).encode())
            held = sub.next(timeout=WAIT)  # order 2, leased and kept
            assert held is not None and held.json()["order"] == 2
            click(browser, row)
            wait_for(
                browser,
                "the queue page with its subscription and lease",
                lambda d: (
                    q in (cell_text(d, "#q-name") or "")
                    and held.bookmark in (cell_text(d, "#q-subs tbody") or "")
                    and "web-test" in (cell_text(d, "#q-subs tbody") or "")
                    and cell_text(d, "#q-figures .consumers b") == "1"
                ),
            )
            browser.save_screenshot(str(tmp_path / "console-queue-leases.png"))
        with client.subscribe(q, max_backlog=1, filter="/order = 3") as sub:
            letter = sub.next(timeout=WAIT)
            assert letter is not None
            letter.expire(wait=True)  # dead-lettered: consumer_expire

    browser.find_element(By.ID, "browse-filter").send_keys("/sym = 'MSFT'")
    click(browser, "#browse-form button")
    wait_for(
        browser,
        "browse with a filter",
        lambda d: (
            '"MSFT"' in (cell_text(d, "#q-browse tbody") or "")
            and "IBM" not in (cell_text(d, "#q-browse tbody") or "")
        ),
    )
    click(browser, "#dl-form button[type=submit]")
    wait_for(
        browser,
        "the dead letter, decoded",
        lambda d: (
            "consumer_expire" in (cell_text(d, "#q-dead tbody") or "")
            and '"order": 3' in (cell_text(d, "#q-dead tbody") or "")
        ),
    )
    assert dlq in (cell_text(browser, "#q-config") or "")
    # an admin action from the page: redrive brings the letter back into the queue
    click(browser, "#redrive")
    wait_for(
        browser,
        "redriven",
        lambda d: (
            "moved" in (cell_text(d, "#admin-result") or "")
            and "(redriven)" in (cell_text(d, "#q-dead tbody") or "")
        ),
    )
    wait_for(
        browser,
        "back in the depth",
        lambda d: cell_text(d, "#q-figures .available b") == "2",
    )
    shot = tmp_path / "console-queue.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    # no script error on the page (the browser asking for a favicon is no error of ours)
    errors = [e for e in browser.get_log("browser") if "favicon" not in e["message"]]  # type: ignore[attr-defined]
    assert errors == [], errors


def test_console_counts_conflated_and_discarded(
    browser: WebDriver, coordinator_factory, names
) -> None:
    """A last-value queue whose dead letters are only for some: the page shows how many
    messages a newer one replaced and how many left at a limit without a dead letter."""
    topic, q, dlq = names("web"), names("web"), names("web-dlq")
    c = coordinator_factory(
        [
            {
                "name": q,
                "underlying_topic": topic,
                "dead_letter_topic": dlq,
                "conflate_key": "/sym",
                "max_cancels": 1,
                "dead_letter_if": "/keep = true",
            }
        ],
        http="127.0.0.1:0",
    )
    assert c.http_address is not None
    browser.get(f"http://{c.http_address}/#/queue/{q}")
    wait_for(
        browser,
        "both figures shown at 0 (the options make them possible)",
        lambda d: (
            cell_text(d, "#q-figures .conflated b") == "0"
            and cell_text(d, "#q-figures .discarded b") == "0"
        ),
    )
    with QueueClient(c.address) as client:
        for order in (1, 2, 3):  # 1 and 2 are replaced by the newer IBM
            client.publish(q, json.dumps({"order": order, "sym": "IBM"}).encode())
        client.publish(q, json.dumps({"order": 4, "sym": "MSFT", "keep": True}).encode())
        wait_for(browser, "two replaced", lambda d: cell_text(d, "#q-figures .conflated b") == "2")
        with client.subscribe(q, max_backlog=2) as sub:
            taken = [sub.next(timeout=WAIT), sub.next(timeout=WAIT)]
            assert sorted(m.json()["order"] for m in taken if m is not None) == [3, 4]
            for msg in taken:
                assert msg is not None
                msg.cancel(wait=True)  # max_cancels 1: order 3 discarded, order 4 dead-lettered
    wait_for(
        browser,
        "one discarded, one dead-lettered",
        lambda d: (
            cell_text(d, "#q-figures .discarded b") == "1"
            and cell_text(d, "#q-figures .dead b") == "1"
        ),
    )
    errors = [e for e in browser.get_log("browser") if "favicon" not in e["message"]]  # type: ignore[attr-defined]
    assert errors == [], errors
