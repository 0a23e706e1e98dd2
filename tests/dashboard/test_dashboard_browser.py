"""The dashboard in a real browser: headless Chromium (Debian's) driven by Playwright, against
the server under uvicorn on loopback, while a worker double reports results over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_support import ProtocolWorker, serve, submit

from tuner_service.settings import Settings

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason=f"no Chromium at {CHROMIUM} (apt install chromium)"),
]

POINTS_JS = """() => [...document.querySelectorAll('#task-charts svg')]
    .reduce((n, svg) => n + Number(svg.dataset.points) + Number(svg.dataset.errors), 0)"""


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """SQLite only: the browser half does not depend on the database (the API tests cover both)."""
    return f"sqlite:///{tmp_path / 'tuner.db'}"


@pytest.fixture
def browser_page() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.errors = []
        page.on("pageerror", lambda error: page.errors.append(str(error)))
        page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
        try:
            yield page
        finally:
            browser.close()


def total_points(page: Any) -> int:
    return int(page.evaluate(POINTS_JS))


def test_job_page_shows_charts_and_table_and_follows_new_results(
        live_server: str, tokens: dict[str, str], browser_page: Any) -> None:
    page = browser_page
    with httpx.Client(base_url=live_server, timeout=30) as http:
        job_id = submit(http, tokens["user"], trials=24)
        worker = ProtocolWorker(http, tokens["worker"])
        worker.report(worker.claim_at_least(6), errors=1)

        page.goto(f"{live_server}/jobs/{job_id}")
        page.wait_for_function(f"({POINTS_JS})() === 6", timeout=10_000)
        assert page.locator("#task-charts .card").count() == 2
        assert page.locator("#task-charts svg").first.get_attribute("data-errors") == "1"
        rows = page.locator("#task-rows tr")
        assert rows.count() == 2
        assert "conv2d 8→8 channels, 8×8 input, 3×3 pad 1" in rows.nth(1).inner_text()
        assert "dense:M=8,N=16,K=32" in rows.nth(0).inner_text()
        page.wait_for_selector("#e2e-chart svg[data-points]:not([data-points='0'])")
        first_best = page.locator("#task-charts .card .best").first.inner_text()
        assert first_best.endswith("GFLOPS")

        # new results arrive: charts, table and counters follow without a reload
        page.evaluate("window.__sameDocument = true")
        worker.report(worker.claim_at_least(6), errors=2)
        page.wait_for_function(f"({POINTS_JS})() === 12", timeout=10_000)
        assert page.evaluate("window.__sameDocument") is True
        page.wait_for_function(
            "() => document.querySelector('#job-kpis').innerText.includes('12')")
        errors_cells = page.locator("#task-rows tr td:nth-child(8)").all_inner_texts()
        assert sum(int(text) for text in errors_cells) == 3

        # keyboard: a focused chart steps through its trials
        chart = page.locator("#task-charts .chart").first
        chart.focus()
        page.keyboard.press("End")
        tooltip = chart.locator(".tooltip")
        assert tooltip.is_visible() and "trial" in tooltip.inner_text()
        assert "trials" in (chart.get_attribute("aria-label") or "")

        # readable at both sizes: nothing wider than the window
        for width, height in ((1280, 800), (1920, 1080)):
            page.set_viewport_size({"width": width, "height": height})
            page.wait_for_timeout(100)
            assert page.evaluate("document.documentElement.scrollWidth") <= width

        # the other pages, reached through the navigation (no reload)
        page.get_by_role("link", name="Workers").click()
        page.wait_for_selector("text=protocol-double")
        assert "online" in page.locator("main tbody tr").first.inner_text()
        worker.finish(job_id, timeout_s=60)  # bests reach the log once re-measured
        page.get_by_role("link", name="Tuning log").click()
        page.wait_for_function("() => document.querySelectorAll('main tbody tr').length === 2")
        page.get_by_label("Operator").select_option("dense")
        page.wait_for_function("() => document.querySelectorAll('main tbody tr').length === 1")
        assert f"Job {job_id}" in page.locator("main tbody tr").first.inner_text()
        page.get_by_role("link", name="Jobs").click()
        page.wait_for_selector(f"a[href='/jobs/{job_id}']")
        assert page.evaluate("window.__sameDocument") is True
    assert page.errors == []


def test_a_token_pasted_into_the_page_unlocks_reads(
        settings: Settings, tokens: dict[str, str], browser_page: Any) -> None:
    locked = settings.with_overrides(read_requires_token=True, run_driver=False)
    with serve(locked) as url:
        page = browser_page
        page.goto(f"{url}/workers")
        token_input = page.get_by_label("API token")
        token_input.wait_for(state="visible")
        page.wait_for_selector("text=token needed")
        token_input.fill(tokens["user"])
        page.get_by_role("button", name="Save").click()
        page.wait_for_selector("text=No worker has registered")
        assert page.evaluate("localStorage.getItem('tuner.token')") == tokens["user"]
