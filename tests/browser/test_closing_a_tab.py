"""Closing a dashboard tab frees its kernel at once: Voila's page sends a shutdown
request on `beforeunload`, which Voila itself refuses for want of an `_xsrf` cookie (voila#1458);
`bertlab serve` sets that cookie, so the kernel does not wait for the culler."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _alive(base: str, kernel_id: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}api/kernels/{kernel_id}", timeout=30) as r:
            return r.status == 200
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return False
        raise


def test_closing_a_tab_shuts_its_kernel_down(dashboard_url, chromium_browser):
    context = chromium_browser.new_context()
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.goto(dashboard_url, wait_until="domcontentloaded")
    page.wait_for_selector(".bertlab-tabs")  # the widgets are up: the page holds its kernel
    kernel_id = page.evaluate("JSON.parse(document.getElementById('jupyter-config-data').textContent).kernelId")
    assert _alive(dashboard_url, kernel_id)
    page.close(run_before_unload=True)  # what closing the tab does
    deadline = time.monotonic() + 15  # far below the culler's timeout: this is the page's own request
    while _alive(dashboard_url, kernel_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    context.close()
    assert not _alive(dashboard_url, kernel_id), "the closed tab's kernel is still running"
