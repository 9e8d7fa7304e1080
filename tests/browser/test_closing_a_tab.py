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


def _delete(context, url: str):
    """DELETE `url` as a page of `context` would (its cookies and the _xsrf header Jupyter asks for)."""
    xsrf = next((c["value"] for c in context.cookies() if c["name"] == "_xsrf"), "")
    return context.request.delete(url, headers={"X-XSRFToken": xsrf})


def test_a_page_whose_kernel_is_gone_says_so_and_offers_a_reload(dashboard_url, chromium_browser):
    """Another session cannot end this page's kernel (only its owner's cookie may), and when the kernel
    does go (here its own page's cookies end it, as the culler or a crash would) the page says so and
    reloads into a working page, instead of showing "Opening…" forever."""
    context = chromium_browser.new_context()
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.goto(dashboard_url, wait_until="domcontentloaded")
    page.wait_for_selector(".bertlab-tabs")
    kernel_id = page.evaluate("JSON.parse(document.getElementById('jupyter-config-data').textContent).kernelId")
    stranger = chromium_browser.new_context()  # another student's browser: its own cookies
    try:
        stranger.add_cookies([{"name": "_xsrf", "value": "a-strangers-own", "url": dashboard_url}])
        refused = _delete(stranger, f"{dashboard_url}api/kernels/{kernel_id}")
        assert refused.status == 403 and "only the page that opened" in refused.text()
        assert _alive(dashboard_url, kernel_id)
    finally:
        stranger.close()
    assert _delete(context, f"{dashboard_url}api/kernels/{kernel_id}").status == 204
    gone = page.wait_for_selector(".bertlab-kernel-gone", timeout=30_000)
    assert "lost its kernel" in gone.inner_text()
    page.click(".bertlab-kernel-gone button")
    page.wait_for_selector(".bertlab-tabs")  # a new page, with a new kernel
    assert page.evaluate("JSON.parse(document.getElementById('jupyter-config-data').textContent).kernelId") != kernel_id
    assert page.query_selector(".bertlab-kernel-gone") is None
    context.close()
